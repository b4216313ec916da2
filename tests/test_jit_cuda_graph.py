"""fd.jit's default on CUDA (``cuda_graph=None``): one CUDA graph per signature where it
can record, the compiled call elsewhere. On the CPU through the fake recorder of
test_cuda_graph.py (it takes the CPU for a GPU, "records" by running the compiled code
on the static buffers and "replays" by recomputing into the same output buffers, so an
output that is not copied out is overwritten by the next call); the real recorder runs
in the tests marked ``cuda``. Everything traces with ``backend="fx"`` (no inductor)."""

from __future__ import annotations

import gc
import logging
import threading
import warnings

import pytest
import torch
from test_cuda_graph import BLOCK, FakeRecorder, _snapshot, _td, _unchanged

import functd as fd
from functd._transforms._cuda_graph import EntryGraph
from functd.testing import assert_close

FX = {"backend": "fx"}


def _jit(f, recorder=None, **kw):
    j = fd.jit(f, **{**FX, **kw})
    j._recorder = recorder or FakeRecorder()
    return j


def _graphs(j):
    """The recording state of each compiled signature: an EntryGraph or None."""
    return [e.outputs if isinstance(e.outputs, EntryGraph) else None for e in j._lru]


@pytest.fixture
def debug_lines(caplog):
    caplog.set_level(logging.DEBUG, logger="functd.jit")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "functd.jit"]


# ---------------------------------------------------------------- the default records
def test_default_warms_up_twice_records_once_then_replays_eager_values(debug_lines):
    j = _jit(BLOCK)
    rec = j._recorder
    for i in range(6):
        params, td = BLOCK.init(i), _td()
        snap = _snapshot((params, td))
        assert_close(j(params, td), BLOCK(params, td))
        _unchanged((params, td), snap)
    (g,) = _graphs(j)
    assert g is not None and g.replay is not None and "graphed" in repr(g)
    assert (rec.warm_calls, rec.records, rec.modes) == (2, 1, ["thread_local"])
    assert j.cache_info().compiles == 1
    assert any("recorded as a CUDA graph" in m for m in debug_lines())


def test_held_outputs_stay_intact_after_later_calls():
    j = _jit(BLOCK)
    params = BLOCK.init(0)
    for _ in range(2):
        j(params, _td())  # warm-up
    tds = [_td() for _ in range(3)]
    outs = [j(params, td) for td in tds]  # recorded, replayed, replayed
    for td, out in zip(tds, outs):  # each still holds its own call's values
        assert_close(out, BLOCK(params, td))
        assert out["x"] is td["x"]  # an input passed through is the caller's tensor
    (g,) = _graphs(j)
    ptrs = lambda o: {v.data_ptr() for v in fd.tree.leaves(o.exclude("x"))}  # noqa: E731
    buffers = {t.data_ptr() for t in (*g.static_in, *g.srcs)}
    assert not ptrs(outs[0]) & ptrs(outs[1]) and not ptrs(outs[1]) & ptrs(outs[2])
    assert not (ptrs(outs[0]) | ptrs(outs[1]) | ptrs(outs[2])) & buffers


def test_an_output_twice_stays_one_tensor():
    def f(x):
        y = x * 2
        return y, y

    j = _jit(f)
    x = torch.randn(3)
    for _ in range(4):
        a, b = j(x)
    assert a is b and torch.equal(a, x * 2)


def test_random_keys_are_inputs_so_replays_draw_anew():
    drop = fd.Module(fd.nn.Dropout(0.5), ["x"], ["y"])
    j = _jit(lambda td, key: drop(None, td, key=key))
    td = fd.TensorDict({"x": torch.ones(64)}, [64])
    keys = fd.random.split(fd.random.key(0), 5)
    outs = [j(td, k)["y"] for k in keys]
    for k, o in zip(keys, outs):
        assert torch.equal(o, drop(None, td, key=k)["y"])
    assert not torch.equal(outs[3], outs[4])
    assert j._recorder.records == 1


# ---------------------------------------------------------------- where it does not
def _batch_then(n):
    return lambda: [_td(4), _td(4), _td(4), _td(n)]


@pytest.mark.parametrize(
    ("make", "kw", "why"),
    [
        # a CPU tensor beside the GPU's ("meta" stands for the second device here)
        (lambda: (torch.randn(3), torch.zeros(2, device="meta")), {}, "several devices"),
        (lambda: (torch.randn(4, 3)[:, :1].expand(4, 3), torch.zeros(2)), {}, "overlaps itself"),
        (lambda: (torch.randn(3), torch.zeros(2)), {"gpus": {"cuda"}}, None),  # nothing to say
    ],
    ids=["cpu-tensor-mixed-in", "expanded-input", "no-input-on-a-gpu"],
)
def test_default_runs_the_compiled_call_where_it_cannot_record(make, kw, why, debug_lines):
    rec = FakeRecorder(**kw)
    j = _jit(lambda x, other: (x * 2, other + 1), rec)
    for _ in range(4):
        x, other = make()
        y, o = j(x, other)
        assert torch.equal(y, x * 2) and o.shape == other.shape
    assert _graphs(j) == [None] and (rec.warm_calls, rec.records) == (0, 0)
    lines = [m for m in debug_lines() if "without a CUDA graph" in m]
    assert any(why in m for m in lines) if why else lines == []


def test_dynamic_shapes_are_not_recorded_static_ones_still_are(debug_lines):
    j = _jit(BLOCK)
    params = BLOCK.init(0)
    for n in (4, 4, 4, 4, 5, 6, 7, 5):  # batch 4 static; 5.. one symbolic compile
        td = _td(n)
        assert_close(j(params, td), BLOCK(params, td))
    static, symbolic = _graphs(j)
    assert static is not None and static.replay is not None and symbolic is None
    assert j._recorder.records == 1 and j.cache_info().compiles == 2
    assert any("symbolic dims" in m for m in debug_lines())


def test_donated_inputs_are_not_recorded(debug_lines):
    j = _jit(lambda a, b: (a + b, b * 2), donate_argnums=0)
    for _ in range(4):
        a, b = torch.randn(3), torch.randn(3)
        expect = a + b
        s, d = j(a, b)
        assert torch.equal(s, expect) and torch.equal(d, b * 2)
    assert _graphs(j) == [None] and j._recorder.records == 0
    assert any("donated inputs" in m for m in debug_lines())


def test_failed_recording_falls_back_for_good_without_an_error(debug_lines):
    j = _jit(BLOCK)
    j._recorder.fail = True  # e.g. a host sync in the compiled code
    params = BLOCK.init(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(6):
            td = _td()
            assert_close(j(params, td), BLOCK(params, td))
    (g,) = _graphs(j)
    assert g.replay is None and "not graphed: recording failed" in repr(g)
    assert j._recorder.modes == ["thread_local"]  # tried once, never again
    assert any(
        "recording failed (RuntimeError: operation not permitted" in m for m in debug_lines()
    )


def test_inside_an_outer_recording_the_compiled_call_is_recorded_there():
    j = _jit(BLOCK)
    rec = j._recorder
    params = BLOCK.init(0)
    rec.capture = True  # e.g. fd.cuda_graph(fd.jit(f)) recording
    for _ in range(4):
        td = _td()
        assert_close(j(params, td), BLOCK(params, td))
    assert (rec.warm_calls, rec.records) == (0, 0)
    rec.capture = False
    for _ in range(3):
        j(params, _td())
    assert (rec.warm_calls, rec.records) == (2, 1)


def test_under_an_outer_trace_or_transform_nothing_is_recorded():
    inner = _jit(lambda x: torch.sin(x) * 2)
    outer = fd.jit(lambda x: inner(x) + 1, **FX)
    x = torch.randn(5, 3)
    for _ in range(4):
        assert_close(outer(x), torch.sin(x) * 2 + 1)
    assert inner.cache_size() == 0  # traced as part of the outer function
    with pytest.warns(fd.JitWarning, match="inside fd.vmap"):
        for _ in range(4):
            assert_close(torch.func.vmap(inner)(x), torch.sin(x) * 2)
    assert inner._recorder.records == 0 and inner._recorder.warm_calls == 0


def test_cuda_graph_false_never_records():
    j = _jit(BLOCK, cuda_graph=False)
    params = BLOCK.init(0)
    for _ in range(5):
        td = _td()
        assert_close(j(params, td), BLOCK(params, td))
    assert _graphs(j) == [None] and j._recorder.records == j._recorder.warm_calls == 0
    assert "cuda_graph=False" in repr(j) and "cuda_graph" not in repr(fd.jit(BLOCK))
    assert "cuda_graph=False" in repr(fd.grad(j))  # a transform keeps the option


# ---------------------------------------------------------------- memory, streams, threads
def test_eviction_and_cache_clear_free_the_recording():
    j = _jit(BLOCK, cache_size=1, dynamic=False)
    rec = j._recorder
    params = BLOCK.init(0)
    for _ in range(3):
        j(params, _td(4))
    (alive,) = rec.recordings
    assert alive() is not None
    with pytest.warns(fd.JitWarning, match="more than cache_size=1"):
        for _ in range(3):
            j(params, _td(5))  # a second signature evicts the first, and records
    gc.collect()
    assert alive() is None and len(rec.recordings) == 2 and rec.recordings[1]() is not None
    j.cache_clear()
    gc.collect()
    assert rec.recordings[1]() is None


def test_a_call_on_another_stream_waits_for_the_previous_one():
    j = _jit(BLOCK)
    rec = j._recorder
    params = BLOCK.init(0)
    for _ in range(4):
        j(params, _td())
    assert rec.waits == []
    rec.current = "s1"  # e.g. inside `with torch.cuda.stream(side):`
    td = _td()
    assert_close(j(params, td), BLOCK(params, td))
    j(params, _td())
    assert rec.waits == [("s1", "s0")]  # once, at the switch


def test_threads_calling_one_graph_get_their_own_values():
    j = _jit(BLOCK)
    params = BLOCK.init(0)
    for _ in range(3):
        j(params, _td(8))
    j._recorder.delay = 1e-3  # a thread's replay lasts: the others' copies would land in it
    errors = []

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(10):
            td = fd.TensorDict({"x": torch.randn(8, 3, generator=g)}, [8])
            if not torch.allclose(j(params, td)["y"], BLOCK(params, td)["y"], atol=1e-6):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and j._recorder.records == 1


# ---------------------------------------------------------------- CUDA
@pytest.mark.cuda
def test_cuda_jit_default_replays_and_outputs_stay_intact():
    params = BLOCK.init(0, device="cuda")
    j = fd.jit(BLOCK)
    outs, tds = [], []
    for _ in range(6):
        tds.append(_td(4, "cuda"))
        outs.append(j(params, tds[-1]))
    torch.cuda.synchronize()
    for td, out in zip(tds, outs):
        assert_close(out, BLOCK(params, td), rtol=1e-5, atol=1e-6)
    (g,) = _graphs(j)
    assert g is not None and g.replay is not None


@pytest.mark.cuda
def test_cuda_jit_default_dropout_stays_random():
    drop = fd.Module(fd.nn.Dropout(0.5), ["x"], ["y"])
    j = fd.jit(lambda td, key: drop(None, td, key=key))
    td = fd.TensorDict({"x": torch.ones(256, device="cuda")}, [256])
    keys = fd.random.split(fd.random.key(0), 6).cuda()
    outs = [j(td, k)["y"] for k in keys]
    for k, o in zip(keys, outs):
        assert torch.equal(o, drop(None, td, key=k)["y"])
    assert not torch.equal(outs[4], outs[5]) and _graphs(j)[0].replay is not None


@pytest.mark.cuda
def test_cuda_jit_default_cpu_scalar_mixed_in_runs_compiled():
    j = fd.jit(lambda x, s: x * s)
    x = torch.randn(4, device="cuda")
    for v in (1.0, 2.0, 3.0, 4.0):
        assert_close(j(x, torch.tensor(v)), x * v)
    assert _graphs(j) == [None]


@pytest.mark.cuda
def test_cuda_jit_default_inside_fd_cuda_graph_and_on_a_side_stream():
    params = BLOCK.init(0, device="cuda")
    outer = fd.cuda_graph(fd.jit(BLOCK), warmup=2)
    for _ in range(5):  # the inner jit warms up, then is recorded into the outer graph
        td = _td(4, "cuda")
        assert_close(outer(params, td), BLOCK(params, td), rtol=1e-5, atol=1e-6)
    assert outer.cache_info().replays == 2
    j = fd.jit(BLOCK)
    side = torch.cuda.Stream()
    for i in range(6):
        td = _td(4, "cuda")
        if i % 2:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = j(params, td)
            torch.cuda.current_stream().wait_stream(side)
        else:
            out = j(params, td)
        assert_close(out, BLOCK(params, td), rtol=1e-5, atol=1e-6)


def test_recorded_under_inference_mode_replays_outside_it():
    j = _jit(BLOCK)
    params = BLOCK.init(0)
    with torch.inference_mode():
        for _ in range(3):  # warm-up, warm-up, recording
            j(params, _td())
    for _ in range(2):
        td = _td()
        assert_close(j(params, td), BLOCK(params, td))
    assert j._recorder.records == 1


def test_cuda_recorder_records_thread_local_and_reads_the_current_stream(monkeypatch):
    """The real recorder's torch.cuda calls for fd.jit's default, with stand-ins."""
    from contextlib import nullcontext

    from functd._transforms._cuda_graph import _CudaRecorder

    seen = {}

    class Graph:
        def replay(self):
            seen["replayed"] = True

    class Stream:
        def wait_stream(self, other):
            seen["waited"] = other

    def graph(g, **kw):
        seen.update(kw)
        return nullcontext()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "device", lambda d: nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream", device))
    cpu = torch.device("cpu")
    replay, out = _CudaRecorder.record(lambda x: x + 1, (torch.zeros(2),), {}, cpu, "thread_local")
    replay()
    assert seen == {"capture_error_mode": "thread_local", "replayed": True}
    assert torch.equal(out, torch.ones(2))
    assert _CudaRecorder.capturing(cpu) and _CudaRecorder.stream(cpu) == ("stream", cpu)
    s = Stream()
    _CudaRecorder.wait(s, "before")
    assert seen["waited"] == "before"


def test_outputs_keep_the_strides_of_the_compiled_call():
    # strides are part of the signature: a loop feeding outputs back must not recompile
    def f(x):
        y = x * 2
        return y[:, :2], y.t(), y[:1].expand(3, 3)

    j, plain = _jit(f), fd.jit(f, cuda_graph=False, **FX)
    x = torch.randn(4, 3)
    for _ in range(4):
        got, want = j(x), plain(x)
        for g, w in zip(got, want):
            assert torch.equal(g, w) and g.shape == w.shape
        assert [g.stride() for g in got[:2]] == [w.stride() for w in want[:2]]
    assert j._recorder.records == 1
