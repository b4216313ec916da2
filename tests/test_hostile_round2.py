"""The second hostile battery (issue 41), beside tests/test_io_hostile_files.py and
tests/test_io_atomic.py: forged safetensors metadata, an empty TensorDict of batch size
2**40, full disks and file size limits, two processes checkpointing to one path, and
the temporaries of killed writers. Cases and children: tests/_support/hostile_round2.py.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import functd as fd
from functd._checkpoint import Checkpoints
from functd._td import _atomic
from functd.testing import assert_close
from tests._support import hostile_round2 as H

ROOT = Path(__file__).resolve().parents[1]
TRACE_SLACK = 256 << 10  # Python bookkeeping of one load: the parsed metadata, the error


# ------------------------------------------------------------------ forged metadata
@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    pytest.importorskip("safetensors")
    return H.forged_safetensors(tmp_path_factory.mktemp("forged"))


def test_forged_safetensors_metadata_is_a_clear_error_without_allocating(forged):
    wrong = []
    for name, path, says in forged:
        tracemalloc.start()
        try:
            fd.load(path)
            err: BaseException | None = None
        except Exception as e:
            err = e
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if peak > 4 * path.stat().st_size + TRACE_SLACK:
            wrong.append(f"{name}: traced {peak} bytes for a {path.stat().st_size}-byte file")
        msg = str(err)
        if type(err) is not ValueError or not re.search(says, msg):
            wrong.append(f"{name}: expected ValueError /{says}/, got {type(err).__name__}: {msg}")
        elif not msg.startswith(f"functd.load({str(path)!r}): "):
            wrong.append(f"{name}: the message does not name the call and file: {msg}")
    assert not wrong, "\n".join(wrong)
    assert len(forged) >= 30


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 80), 1 << 80) | st.floats() | st.text(max_size=4),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=8,
)  # fmt: skip


def _positions(doc, at=()):
    """Every place in a parsed JSON document (as a path of keys and indices)."""
    yield at
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for k, v in items:
        yield from _positions(v, (*at, k))


def _replaced(doc, at, value):
    if not at:
        return value
    doc = dict(doc) if isinstance(doc, dict) else list(doc)
    doc[at[0]] = _replaced(doc[at[0]], at[1:], value)
    return doc


_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or None  # a larger run: FUZZ_EXAMPLES=2000


@settings(
    max_examples=_EXAMPLES or settings.default.max_examples,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(value=_JSON, pick=st.integers(0, 10_000), field=st.sampled_from(["functd", "functd.crc32"]))
def test_fuzzed_safetensors_metadata_loads_or_is_a_clear_error(
    tmp_path_factory, value, pick, field
):
    """Any value put anywhere in a valid file's metadata: the right tree or functd's
    ValueError naming the file, never a raw TypeError, KeyError or RecursionError.
    ``FUZZ_COUNT=1`` prints how many loaded and how many were refused."""
    sts = pytest.importorskip("safetensors.torch")
    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    td = fd.TensorDict({"w": torch.arange(4.0), "n": {"b": torch.ones(4, 2)}}, [4])
    fd.save({"td": td, "k": [1, "s", None]}, path)
    meta = sts.safe_open(str(path), "pt").metadata()
    doc = json.loads(meta[field])
    places = list(_positions(doc))
    meta[field] = json.dumps(_replaced(doc, places[pick % len(places)], value))
    sts.save_file(sts.load_file(str(path)), str(path), metadata=meta)
    try:
        fd.load(path)
        outcome = "loaded"
    except ValueError as e:
        assert str(e).startswith(f"functd.load({str(path)!r}): "), e
        outcome = "refused"
    if os.environ.get("FUZZ_COUNT"):
        print(f"FUZZ {outcome}")


# ------------------------------------------------------------------ a huge batch size
@pytest.mark.parametrize("kind", [".pt", ".safetensors"])
def test_an_empty_tensordict_of_batch_2_40_loads_and_indexes_without_allocating(tmp_path, kind):
    if kind == ".safetensors":
        pytest.importorskip("safetensors")
    path = tmp_path / f"huge{kind}"
    (H.huge_batch_pt if kind == ".pt" else H.huge_batch_safetensors)(path, [H.HUGE])
    H.reset_peak()
    before = H.rss_kb()
    td = fd.load(path)["td"]
    got = [td[0], td[-1], td[3:9], td[None], td[torch.tensor([0, H.HUGE - 1])], td.unsqueeze(0)]
    got.append(td.reshape(1 << 20, -1)[5])
    wide = fd.TensorDict({}, [4, H.HUGE])
    got += [wide[torch.tensor([True, False, True, False])], wide[:, torch.tensor([[0, 7]])]]
    grown = H.peak_kb() - before
    assert [list(t.batch_size) for t in got] == [
        [], [], [6], [1, H.HUGE], [2], [1, H.HUGE], [1 << 20], [2, H.HUGE], [4, 1, 2],
    ]  # fmt: skip
    assert grown < 16 << 10, f"the RSS grew by {grown} KB"  # today: a 1 TB allocation
    with pytest.raises(IndexError, match=r"1099511627776 is out of range for batch dim 0"):
        td[H.HUGE]
    with pytest.raises(IndexError, match=r"index tensor holds values out of range for batch dim 1"):
        wide[:, torch.tensor([0, H.HUGE])]


_INDICES = [
    (0,), (-1, slice(1, 3)), (None, Ellipsis, 2), (torch.tensor([1, 0, -1]),),
    (slice(None), torch.tensor([[1], [0]]), None),
    (torch.tensor([0, 1]), None, torch.tensor([[1], [2]])),
    (torch.tensor([[True, False, True], [False, False, True]]),),
    (1, torch.tensor([True, False, True])),
    (Ellipsis, torch.tensor([], dtype=torch.long)), (torch.tensor(1), slice(None, None, 2)),
    (torch.tensor(True), 0), (torch.tensor(False),),
]  # fmt: skip


@pytest.mark.parametrize("idx", _INDICES, ids=[str(i) for i in range(len(_INDICES))])
def test_indexing_a_tensordict_without_leaves_gives_the_shape_a_tensor_gets(idx):
    shape = torch.zeros(2, 3, 4)[idx].shape  # the reference: a tensor of the batch shape
    assert fd.TensorDict({}, [2, 3, 4])[idx].batch_size == shape
    nested = fd.TensorDict({"n": fd.TensorDict({}, [2, 3, 4])}, [2, 3, 4])
    assert nested[idx]["n"].batch_size == shape


@pytest.mark.parametrize("batch", [[1 << 70], [H.HUGE, H.HUGE]])
def test_a_batch_size_past_int64_is_refused_at_load(tmp_path, batch):
    path = tmp_path / "past.pt"
    H.huge_batch_pt(path, batch)
    with pytest.raises(ValueError, match=r"holds an invalid TensorDict.*more than torch can index"):
        fd.load(path)
    with pytest.raises(ValueError, match=r"has \d+ elements, more than torch can index \(2\*\*63"):
        fd.TensorDict({}, batch)


# ------------------------------------------------------------------ full disk
def test_a_save_past_the_file_size_limit_names_the_limit_and_keeps_the_old_file(tmp_path):
    pytest.importorskip("safetensors")
    cmd = [sys.executable, "-m", "tests._support.hostile_round2", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    for ext in (".pt", ".safetensors"):
        err = res[ext]["error"]
        assert err.startswith(f"OSError: [Errno {errno.EFBIG}] functd.save('{tmp_path}/c{ext}'): ")
        assert "the file size limit was reached" in err and "RLIMIT_FSIZE" in err, err
        assert "The file at the path is unchanged" in err, err
        assert res[ext]["rows"] == 10  # the old file
    err = res["fit"]["error"]
    assert err.startswith(f"OSError: [Errno {errno.EFBIG}] fd.fit: the checkpoint '{tmp_path}/fit")
    assert "the file size limit was reached" in err and "resume=True continues" in err, err
    assert res["fit"]["epoch"] == 2  # the checkpoint of the epoch before
    assert res["files"] == ["c.pt", "c.safetensors", "fit", "ckpt.pt", "ckpt.pt.1"]


class _FullDisk:
    """``os.fdopen`` whose files take ``room`` bytes, then fail with ENOSPC."""

    def __init__(self, room: int):
        self.room, self.real = room, os.fdopen

    def __call__(self, fd_, *a, **kw):
        f = self.real(fd_, *a, **kw)
        outer = self

        class Full:
            def __getattr__(self, name):
                return getattr(f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                if len(memoryview(data).cast("B")) > outer.room:
                    raise OSError(errno.ENOSPC, "No space left on device")
                outer.room -= len(memoryview(data).cast("B"))
                return f.write(data)

        return Full()


@pytest.mark.parametrize("ext", [".pt", ".safetensors"])
def test_a_full_device_says_no_space_left_and_keeps_the_old_file(tmp_path, monkeypatch, ext):
    if ext == ".safetensors":
        pytest.importorskip("safetensors")
    path = tmp_path / f"c{ext}"
    fd.save(fd.TensorDict({"x": torch.ones(10)}, [10]), path)
    monkeypatch.setattr(os, "fdopen", _FullDisk(1000))
    with pytest.raises(OSError, match=r"functd.save\('.*c\.(pt|safetensors)'\): no space left on "
                       r"the device that holds '.*' \(ENOSPC\)") as e:  # fmt: skip
        fd.save(fd.TensorDict({"x": torch.zeros(100_000)}, [100_000]), path)
    assert e.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert_close(fd.load(path), fd.TensorDict({"x": torch.ones(10)}, [10]))
    assert os.listdir(tmp_path) == [path.name]  # the temporary was removed


def test_a_fit_checkpoint_on_a_full_device_says_so_and_keeps_the_older_ones(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    full = _FullDisk(0)
    real_batches = []

    def fill_disk_at_epoch_2(epoch):
        if epoch == 2:
            monkeypatch.setattr(os, "fdopen", full)
        real_batches.append(epoch)
        x = fd.random.normal(fd.random.fold_in(fd.random.key(9), epoch), (4, 3))
        return [fd.TensorDict({"x": x, "y": x.sum(-1, keepdim=True)}, [4])]

    model = fd.Module(fd.nn.MLP(3, 1, num_cells=(8,)), in_keys=["x"], out_keys=["pred"])
    params = model.init(fd.random.key(0))
    opt = fd.optim.adam(1e-2)
    step = fd.train_step(lambda p, b, k: ((model(p, x=b["x"]) - b["y"]) ** 2).mean(), opt)
    with pytest.raises(OSError, match=r"fd.fit: the checkpoint '.*ckpt.pt' could not be written: "
                       r".*no space left on the device .*resume=True continues") as e:  # fmt: skip
        fd.fit(step, params, opt.init(params), fill_disk_at_epoch_2, fd.random.key(1), epochs=3,
               checkpoint=path, progress=False)  # fmt: skip
    assert e.value.errno == errno.ENOSPC and real_batches == [0, 1, 2]
    monkeypatch.undo()
    assert int(fd.load(path)["epoch"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt.pt.1"]


# ------------------------------------------------------------------ concurrent writers
def _writer(path: str, me: int, rounds: int, start, out: str) -> None:
    ckpt = Checkpoints("fd.fit", path, keep=2)
    start.wait()
    error = ""
    try:
        for i in range(rounds):
            ckpt.write({"who": torch.full((20_000,), float(me)), "i": torch.tensor(i)})
    except BaseException as e:  # reported to the test
        error = f"writer {me}: {type(e).__name__}: {e}"
    Path(out).write_text(error)
    os._exit(0)


def test_two_processes_checkpointing_to_one_path_take_turns(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = str(folder / "ckpt.pt")
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(2)
    outs = [str(tmp_path / f"writer{me}.txt") for me in (1, 2)]
    procs = [
        ctx.Process(target=_writer, args=(path, me, 25, start, out))
        for me, out in zip((1, 2), outs)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    errors = [e for e in (Path(out).read_text() for out in outs) if e]
    assert not errors, errors  # today: FileNotFoundError on ckpt.pt.tmp
    for name in (path, path + ".1"):
        state = fd.load(name)  # each a whole checkpoint of one writer
        assert state["who"].unique().numel() == 1 and int(state["i"]) <= 24
    assert int(fd.load(path)["i"]) == 24  # the last write of the writer that finished last
    assert sorted(os.listdir(folder)) == ["ckpt.pt", "ckpt.pt.1"]  # no lock, no temporary


# ------------------------------------------------------------------ killed writers
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_next_save_removes_dead_writers_temporaries_before_writing(tmp_path):
    """A save that fails (or is killed) still removes the leftovers of dead writers of
    that path: kills that keep landing inside writes do not pile files up."""
    path = tmp_path / "c.pt"
    dead, alive = _dead_pid(), os.getppid()
    prefix = _atomic.temp_prefix(str(path))
    stale = [tmp_path / f"{prefix}{dead}-{i:08x}.tmp" for i in range(3)]
    live = tmp_path / f"{prefix}{alive}-00000000.tmp"
    other = tmp_path / f".c.pt.other-{dead}-00000000.tmp"  # not functd's naming
    for f in (*stale, live, other):
        f.write_bytes(b"partial")
    with pytest.raises(Exception, match=r"pickle|lambda"):
        fd.save({"f": lambda: 0}, path)  # fails inside the write
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other.name])


def test_killed_checkpoint_writes_leave_at_most_one_temporary(tmp_path):
    """kill -9 of a process checkpointing 4 MB in a loop, 12 times: the files of killed
    writes do not pile up (each kill inside a write once left one behind: 358 MB after
    25 kills of a 14 MB checkpoint)."""
    res = H.kill_checkpoints(str(tmp_path), kills=12, mb=4)
    assert res["inside_a_write"] >= 3, res  # enough kills landed inside a write to matter
    assert max(res["temps_after_each_kill"]) <= 1, res
    assert res["newest_loads"], res
