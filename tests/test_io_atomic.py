"""fd.save is atomic: kill -9 at random moments (tests/_support/kill_save.py), failures midway,
symlinks, permissions, fsync order and the sweep of temporary files."""

import io
import json
import os
import stat
import subprocess
import sys

import pytest
import torch

import functd as fd
from functd._td import _atomic
from functd.testing import assert_close


def _td(v: float = 1.0) -> fd.TensorDict:
    return fd.TensorDict({"x": torch.full((4, 3), v), "n": {"y": torch.arange(4)}}, [4])


def test_kill_9_during_save_leaves_the_old_or_the_new_file(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "_support", "kill_save.py")
    cmd = [sys.executable, script, "--kills", "10", "--mb", "4", "--path", str(tmp_path / "c.pt")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert res["lost"] == 0 and res["wrong"] == [], res
    assert res["inside_write"] >= 1, res  # some kills did land inside a write
    assert res["temps_left"] == [], res  # the last save swept the killed writers' files


def test_a_save_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "c.pt"
    fd.save(_td(1.0), path)
    with pytest.raises(Exception, match=r"pickle|lambda"):
        fd.save({"td": _td(2.0), "f": lambda: 0}, path)  # torch.save fails while writing
    assert_close(fd.load(path), _td(1.0))
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]


def test_save_replaces_a_symlink_and_leaves_its_target(tmp_path):
    target, link = tmp_path / "target.pt", tmp_path / "link.pt"
    fd.save(_td(1.0), target)
    link.symlink_to(target.name)
    fd.save(_td(2.0), link)
    assert not link.is_symlink()
    assert_close(fd.load(link), _td(2.0))
    assert_close(fd.load(target), _td(1.0))  # not written through the link


def test_save_keeps_the_permission_bits_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "c.pt"
    fd.save(_td(), path)
    os.chmod(path, 0o600)
    fd.save(_td(2.0), path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_save_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd_):
        calls.append(("fsync", stat.S_ISDIR(os.fstat(fd_).st_mode)))
        real_fsync(fd_)

    def replace(a, b):
        calls.append(("replace", os.path.basename(b)))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    fd.save(_td(), tmp_path / "c.pt")
    assert calls == [("fsync", False), ("replace", "c.pt"), ("fsync", True)]


def test_save_errors_name_the_folder_or_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"functd.save\(.*: the folder .*nope' does not"):
        fd.save(_td(), tmp_path / "nope" / "c.pt")
    with pytest.raises(IsADirectoryError, match=r"functd.save\(.*\): this is a folder"):
        fd.save(_td(), tmp_path)


def test_the_sweep_removes_temporaries_of_dead_writers_only(tmp_path):
    path = tmp_path / "c.pt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    prefix = _atomic.temp_prefix(str(path))
    stale = tmp_path / f"{prefix}{dead}-00000000.tmp"
    alive = tmp_path / f"{prefix}{os.getppid()}-00000000.tmp"
    other = tmp_path / ".other.pt.fdsave-x-1-0.tmp"
    for f in (stale, alive, other):
        f.write_bytes(b"partial")
    fd.save(_td(), path)
    assert not stale.exists() and alive.exists() and other.exists()


def test_save_to_a_file_object_still_works():
    buf = io.BytesIO()
    fd.save(_td(), buf)
    assert_close(fd.load(io.BytesIO(buf.getvalue())), _td())
