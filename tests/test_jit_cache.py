"""fd.jit's warm starts: a second process compiling the same function with the same
signature loads the compiled code from inductor's cache on disk (and says so in
``cache_info().from_disk`` and ``lower(...).from_disk``), also with other string hashes
(``PYTHONHASHSEED``: the trace must not follow a set's order); a cache directory another
user can write is not read (one warning naming it and the fix)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings

import pytest
import torch

import functd as fd
from functd._transforms import _jit_disk
from functd._transforms._jit import JitWarning

# the function compiled in both processes: a constant of its own, so no other test's
# compiled code (in this process's memory) answers for it; a torch module with buffers,
# which fd.Module clones in a fixed order (a set's order, which string hashes decide and
# which differs from process to process, would change the graph and so the cache key)
SOURCE = """
import json, torch, functd as fd

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for i, name in enumerate("abcdefgh"):
            self.register_buffer(name, torch.full((3,), float(i)))

    def forward(self, x):
        return torch.sin(x) * 1.2345 + sum(getattr(self, n) for n in "hgfedcba") * x.sum()

m = fd.Module(M(), ["x"], ["y"])
params, td = fd.from_module(m), fd.TensorDict({"x": torch.linspace(-1, 2, 3)})
jf = fd.jit(m)
y = jf(params, td)["y"]
info = jf.cache_info()
lowered = jf.lower(params, td)
print(json.dumps({"y": y.tolist(), "from_disk": info.from_disk, "compiles": info.compiles,
                  "lowered": lowered.from_disk, "str": str(lowered).splitlines()[0]}))
"""


def _run_child(cache: str, seed: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONWARNINGS": "ignore"}
    env["PYTHONHASHSEED"] = seed  # string hashes unlike the other child's
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    out = subprocess.run(
        [sys.executable, "-c", SOURCE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_compiled_code_from_disk(tmp_path):
    """Both compiles in fresh processes: this one has run other tests (inductor may hold
    another cache directory, other config), which is not what a user's rerun sees."""
    cache = str(tmp_path / "inductor")
    first = _run_child(cache, "1")  # the first compile: built
    assert (first["compiles"], first["from_disk"], first["lowered"]) == (1, 0, False)
    second = _run_child(cache, "12345")  # a fresh process, the same cache directory
    assert second["compiles"] == 1 and second["from_disk"] == 1
    assert second["lowered"] is True and second["str"].endswith("(from disk)")
    ns: dict = {}
    exec(SOURCE.split("m = fd.Module")[0], ns)  # the torch module's class, for its own call
    expected = ns["M"]()(torch.linspace(-1, 2, 3))
    torch.testing.assert_close(torch.tensor(second["y"]), expected)
    torch.testing.assert_close(torch.tensor(first["y"]), expected)


def test_cache_info_keeps_its_first_four_fields_in_order():
    j = fd.jit(lambda x: x + 1, backend="fx")
    j(torch.zeros(2))
    compiles, calls, size, maxsize, *rest = j.cache_info()
    assert (compiles, calls, size, maxsize, rest) == (1, 1, 1, 8, [0])


def test_a_missing_cache_dir_is_created_private(tmp_path):
    path = str(tmp_path / "a" / "cache")
    old = os.umask(0o002)  # a umask that would make it group-writable
    try:
        assert _jit_disk.unsafe_reason(path) is None
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700  # its parent too


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_a_cache_dir_others_can_write_turns_the_caches_off_with_one_warning(
    tmp_path, monkeypatch, mode
):
    from functd._torch.inductor import config

    path = tmp_path / f"shared{mode:o}"
    path.mkdir()
    path.chmod(mode)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(path))
    with config.patch(force_disable_caches=False), pytest.warns(JitWarning) as rec:
        with _jit_disk.disk_cache("fd.jit(f)", JitWarning) as disk:
            assert config.force_disable_caches is True  # for this compile only
            private = os.environ["TORCHINDUCTOR_CACHE_DIR"]  # its files go elsewhere
            assert private != str(path) and _jit_disk.unsafe_reason(private) is None
        assert config.force_disable_caches is False
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    assert not disk.enabled and not disk.hit
    (w,) = rec.list
    assert str(w.message).startswith(f"fd.jit(f): inductor's cache directory {path} can be")
    assert f"chmod go-w {path}" in str(w.message)
    assert "TORCHINDUCTOR_CACHE_DIR" in str(w.message)
    with config.patch(force_disable_caches=False), warnings.catch_warnings():
        warnings.simplefilter("error")  # once per directory
        with _jit_disk.disk_cache("fd.jit(f)", JitWarning):
            assert config.force_disable_caches is True


def test_a_cache_dir_inside_a_directory_others_can_write_is_not_read(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "mine").mkdir(mode=0o700)
    why = _jit_disk.unsafe_reason(str(shared / "mine")) or ""
    assert why.startswith(f"is inside {shared}, which others can write")
    shared.chmod(0o1777)  # sticky, as /tmp: others cannot rename what is ours
    assert _jit_disk.unsafe_reason(str(shared / "mine")) is None


@pytest.mark.skipif(getattr(os, "getuid", lambda: 1)() != 0, reason="chown needs root")
def test_a_cache_dir_owned_by_another_user_is_not_read(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o755)
    os.chown(path, 12345, -1)
    assert "belongs to another user (uid 12345" in (_jit_disk.unsafe_reason(str(path)) or "")


def test_a_private_cache_dir_marks_the_loop_ops_cacheable(tmp_path, monkeypatch):
    from functd._torch.inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    with config.patch(force_disable_caches=False), warnings.catch_warnings():
        warnings.simplefilter("error")
        with _jit_disk.disk_cache("fd.jit(f)", JitWarning) as disk:
            marked = dict(config.unsafe_marked_cacheable_functions)
    assert disk.enabled
    assert {"torch.ops.higher_order.scan", "torch.ops.higher_order.while_loop"} <= set(marked)
    from functd._torch.hop import scan_op, while_loop_op

    for op in (scan_op, while_loop_op):  # the names inductor checks (HigherOrderOperator)
        assert f"{op.__module__}.{op.__name__}" in marked
    assert "torch.ops.higher_order.scan" not in config.unsafe_marked_cacheable_functions
