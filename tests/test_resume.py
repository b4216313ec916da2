"""fd.fit(checkpoint=..., resume=True): a crashed or killed run continues bitwise.

The reference is always the same run never interrupted; equality is bit for bit
(``torch.equal`` on every leaf of params, optimizer state and history). The loss
draws noise from its key and the batches depend on the epoch, so a resume that
restarted the step counter or the epoch would differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import functd as fd

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 5
JOB_ARGS = ["--kills", "3", "--write-kills", "--seed", "0"]


class Crash(Exception):
    pass


def problem(crash_at=None):
    """(step, params, opt_state, batches(epoch)); ``crash_at=(epoch, batch)`` raises there."""
    model = fd.Module(fd.nn.MLP(3, 1, num_cells=(8,)), in_keys=["x"], out_keys=["pred"])
    params = model.init(fd.random.key(0))

    def loss_fn(params, batch, key):
        noisy = batch["x"] + 0.1 * fd.random.normal(key, batch["x"].shape)
        return ((model(params, x=noisy) - batch["y"]) ** 2).mean(), {"n": batch["x"][0, 0]}

    def batches(epoch):
        x = fd.random.normal(fd.random.fold_in(fd.random.key(9), epoch), (12, 3))
        for i in range(3):
            if crash_at == (epoch, i):
                raise Crash(f"crash at epoch {epoch}, batch {i}")
            rows = x[4 * i : 4 * i + 4]
            yield fd.TensorDict({"x": rows, "y": rows.sum(-1, keepdim=True).cos()}, [4])

    opt = fd.optim.adamw(1e-2)
    return fd.train_step(loss_fn, opt), params, opt.init(params), batches


def run(path=None, crash_at=None, epochs=EPOCHS, key=3, **kw):
    step, params, state, batches = problem(crash_at)
    kw = {"progress": False, **kw}
    if path is not None:
        kw["checkpoint"] = path
    return fd.fit(step, params, state, batches, fd.random.key(key), epochs=epochs, **kw)


def bitwise(a, b) -> None:
    assert fd.tree.structure(a) == fd.tree.structure(b)
    for x, y in zip(fd.tree.leaves(a), fd.tree.leaves(b)):
        assert x.dtype == y.dtype and torch.equal(x, y)


@pytest.fixture(scope="module")
def reference():
    return run()


def test_resume_after_a_crash_is_bitwise_the_uninterrupted_run(tmp_path, reference):
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Crash):
        run(path, crash_at=(3, 1), resume=True)  # mid-epoch 3: epochs 0-2 are saved
    assert int(fd.load(path)["epoch"]) == 3 and int(fd.load(path)["step"]) == 9
    with pytest.raises(Crash):
        run(path, crash_at=(4, 2), resume=True)  # resumes at 3, crashes again in 4
    bitwise(run(path, resume=True), reference)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt.pt.1"]


def test_a_restarted_step_counter_would_differ(tmp_path, reference):
    # the test above can fail: restarting from the saved params at step 0 gives other numbers
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Crash):
        run(path, crash_at=(3, 0))
    saved = fd.load(path)
    step, _, _, batches = problem()
    p, _, _ = fd.fit(
        step, saved["params"], saved["opt_state"], lambda e: batches(e + 3), fd.random.key(3),
        epochs=2, progress=False,
    )  # fmt: skip
    assert not torch.equal(p["0", "weight"], reference[0]["0", "weight"])


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, reference, capsys):
    bitwise(run(tmp_path / "ckpt.pt", resume=True), reference)
    assert capsys.readouterr().out == ""


def test_resume_of_a_finished_run_takes_no_step(tmp_path, reference):
    path = tmp_path / "ckpt.pt"
    run(path)
    _, params, state, batches = problem()

    def step(*args):
        raise AssertionError("a finished run was stepped again")

    out = fd.fit(
        step, params, state, batches, fd.random.key(3), epochs=EPOCHS, progress=False,
        checkpoint=path, resume=True,
    )  # fmt: skip
    bitwise(out, reference)


def test_resume_says_where_it_resumed(tmp_path, capsys):
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Crash):
        run(path, crash_at=(2, 0))
    run(path, resume=True, progress=True)
    out = capsys.readouterr()
    assert f"fd.fit: resumed from {path} after epoch 2/{EPOCHS} (step 6)" in out.out


def test_checkpoints_rotate_keeping_k_files(tmp_path, reference):
    path = tmp_path / "ckpt.pt"
    bitwise(run(path, keep=3), reference)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt.pt.1", "ckpt.pt.2"]
    assert [int(fd.load(f"{path}{s}")["epoch"]) for s in ("", ".1", ".2")] == [5, 4, 3]
    saved = fd.load(path)
    bitwise((saved["params"], saved["opt_state"], saved["history"]), reference)
    assert int(saved["step"]) == 3 * EPOCHS
    one = tmp_path / "one"
    one.mkdir()
    run(one / "c.pt", keep=1)
    assert os.listdir(one) == ["c.pt"]


def test_rotation_without_hard_links(tmp_path, reference, monkeypatch):
    def no_link(*a, **k):
        raise OSError("hard links are not supported here")

    monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Crash):
        run(path, crash_at=(4, 0), keep=2, resume=True)
    assert [int(fd.load(f"{path}{s}")["epoch"]) for s in ("", ".1")] == [4, 3]
    os.replace(path, f"{path}.1")  # the moment between the two renames of a write
    bitwise(run(path, resume=True), reference)


def test_a_checkpoint_that_does_not_load_is_skipped_with_a_warning(tmp_path, reference):
    path = tmp_path / "ckpt.pt"
    with pytest.raises(Crash):
        run(path, crash_at=(3, 1))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the newest file is damaged
    with pytest.warns(RuntimeWarning, match=r"ckpt\.pt' could not be loaded and is skipped"):
        out = run(path, resume=True)  # from ckpt.pt.1 (epoch 2)
    bitwise(out, reference)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(epochs=7), r"\(it is a run of epochs=2, this one has epochs=7\)"),
        (dict(key=4), r"its key was int32\[2\] \[0, 3\], this run's is int32\[2\] \[0, 4\]"),
    ],
)
def test_a_checkpoint_of_another_run_is_refused(tmp_path, change, message):
    path = tmp_path / "ckpt.pt"
    run(path, epochs=2)
    kw = dict(epochs=2) | change
    with pytest.raises(ValueError, match=r"refused to resume from .*ckpt\.pt': .*another run") as e:
        run(path, resume=True, **kw)
    assert e.match(message)


def test_a_checkpoint_of_another_layout_names_the_key(tmp_path):
    path = tmp_path / "ckpt.pt"
    run(path, epochs=1)
    step, params, state, batches = problem()
    wide = params.set(("0", "weight"), torch.zeros(8, 4))
    with pytest.raises(
        ValueError,
        match=r"at the params key '0\.weight', it has float32\[8, 3\] and this run has "
        r"float32\[8, 4\]",
    ):
        fd.fit(step, wide, state, batches, fd.random.key(3), checkpoint=path, resume=True)
    more = state.set("extra", torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"this run's opt_state have the key 'extra' \(float64"):
        fd.fit(step, params, more, batches, fd.random.key(3), checkpoint=path, resume=True)


def test_a_checkpoint_without_fingerprint_is_refused(tmp_path):
    path = tmp_path / "ckpt.pt"
    _, params, state, _ = problem()
    fd.save({"params": params, "opt_state": state, "epoch": torch.tensor(1)}, path)
    with pytest.raises(ValueError, match=r"not written by this version of fd\.fit"):
        run(path, resume=True)


def test_the_checkpoint_folder_is_checked_before_the_first_step(tmp_path):
    _, params, state, batches = problem()

    def step(*args):
        raise AssertionError("stepped before the folder was checked")

    missing = tmp_path / "nope" / "ckpt.pt"
    with pytest.raises(ValueError, match=r"checkpoint folder '.*nope' does not exist.*makedirs"):
        fd.fit(step, params, state, batches, checkpoint=missing)
    with pytest.raises(ValueError, match=r"is a folder; give a file name in it"):
        fd.fit(step, params, state, batches, checkpoint=tmp_path)
    if os.name == "posix" and os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match=r"checkpoint folder '.*ro' is not writable"):
            fd.fit(step, params, state, batches, checkpoint=ro / "ckpt.pt")


def test_bad_resume_arguments(tmp_path):
    step, params, state, batches = problem()
    with pytest.raises(ValueError, match=r"resume needs the checkpoint path"):
        fd.fit(step, params, state, batches, resume=True)
    with pytest.raises(TypeError, match=r"resume must be True or False"):
        fd.fit(step, params, state, batches, checkpoint=tmp_path / "c.pt", resume="yes")
    with pytest.raises(ValueError, match=r"keep must be an int >= 1"):
        fd.fit(step, params, state, batches, checkpoint=tmp_path / "c.pt", keep=0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill driver forks")
def test_sigkill_at_random_moments_and_inside_writes_then_resume_is_bitwise(tmp_path):
    """A driver kills the training with SIGKILL 3 times at random moments and 6
    times inside checkpoint writes (half-written temp file, before each rename),
    resuming each time (tests/_support/resume_job.py; the larger battery is in
    notes/reliability.md)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests._support.resume_job", str(tmp_path), *JOB_ARGS],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads((tmp_path / "summary.json").read_text())
    assert stats["trials"] == 7 and stats["equal"] == 7, stats  # every resumed run bitwise
    assert stats["kills"] >= 8 and stats["newest_lost"] == 0, stats  # 6 in writes, 2+ random
    assert stats["files_left"] == ["ckpt.pt", "ckpt.pt.1", "result.pt"], stats
