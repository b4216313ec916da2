"""fd.cuda_graph: the CPU fallback, the signature cache and the errors run everywhere
(the cache logic through a fake recorder that replays by recomputing on the static
buffers); recording and replaying on a GPU are marked ``cuda``."""

from __future__ import annotations

import time
import warnings
import weakref

import pytest
import torch
import torch.nn as nn

import functd as fd
from functd._transforms._cuda_graph import signature
from functd.testing import assert_close
from tests._support.conformance import ENTRIES, call, params_for


def _block():
    return fd.Sequential(
        fd.Module(nn.Linear(3, 8), ["x"], ["h"]),
        fd.Module(torch.relu, ["h"], ["a"]),
        fd.Module(nn.Linear(8, 3), ["a"], ["z"]),
        fd.Module(lambda x, z: x + z, ["x", "z"], ["y"]),
    )


BLOCK = _block()


def _td(n=4, device="cpu"):
    return fd.TensorDict({"x": torch.randn(n, 3, device=device)}, [n])


def _snapshot(tree):
    return [(id(v), v.clone()) for v in fd.tree.leaves(tree)]


def _unchanged(tree, snap):
    leaves = fd.tree.leaves(tree)
    assert [i for i, _ in snap] == [id(v) for v in leaves], "an input leaf was swapped"
    for (_, before), now in zip(snap, leaves):
        assert torch.equal(before, now), "an input was written"


class FakeRecorder:
    """Records by running ``f`` on the static buffers; replays by recomputing on them
    and copying into the static outputs, as a CUDA graph replay would. ``gpus``: the
    device types it takes for GPUs (None: every device); ``capture``: an outer
    recording is under way; ``current``: the current stream's name."""

    def __init__(self, gpus=None):
        self.warm_calls = 0
        self.records = 0
        self.fail = False
        self.gpus = gpus
        self.capture = False
        self.current = "s0"
        self.waits = []  # (stream, the stream it waited for)
        self.modes = []  # capture_error_mode of each recording
        self.recordings = []  # a weak reference to each recording's replay
        self.delay = 0.0  # seconds a replay sleeps first (other threads run meanwhile)

    def available(self, device):
        return self.gpus is None or device.type in self.gpus

    def capturing(self, device):
        return self.capture

    def stream(self, device):
        return self.current

    def wait(self, stream, before):
        self.waits.append((stream, before))

    def warm(self, f, args, kwargs, device):
        self.warm_calls += 1
        return f(*args, **kwargs)

    def record(self, f, args, kwargs, device, mode="global"):
        self.modes.append(mode)
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.records += 1
        out = f(*args, **kwargs)
        static_out = [v for v in fd.tree.leaves(out) if isinstance(v, torch.Tensor)]

        def replay():
            if self.delay:
                time.sleep(self.delay)
            new = [v for v in fd.tree.leaves(f(*args, **kwargs)) if isinstance(v, torch.Tensor)]
            for s, n in zip(static_out, new):
                if s is n:
                    continue
                if s._base is not None and n._base is not None:  # views: their buffers
                    s, n = s._base, n._base
                s.copy_(n)

        # the recording holds no values yet: poison the outputs until the first replay
        ins = {id(v) for v in fd.tree.leaves((args, kwargs))}
        for t in static_out:
            if t.is_floating_point() and id(t) not in ins:
                t.fill_(float("nan"))
        self.recordings.append(weakref.ref(replay))
        return replay, out


def _faked(f, **kw):
    g = fd.cuda_graph(f, **kw)
    g._recorder = FakeRecorder()
    return g


# ---------------------------------------------------------------- fallback, wrapper
def test_cpu_fallback_runs_eagerly_and_warns_once():
    step = fd.cuda_graph(BLOCK)
    params, td = BLOCK.init(0), _td()
    with pytest.warns(fd.CudaGraphWarning, match=r"cuda_graph\(.*runs eagerly"):
        out = step(params, td)
    assert_close(out, BLOCK(params, td))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        td2 = _td(5)
        assert_close(step(params, td2), BLOCK(params, td2))
    info = step.cache_info()
    assert (info.recordings, info.replays, info.eager, info.size) == (0, 0, 2, 0)


def test_keeps_wrapped_doc_and_name():
    def train_step(p, td):
        """Docs of the step."""
        return BLOCK(p, td)

    step = fd.cuda_graph(train_step, warmup=3)
    assert step.__wrapped__ is train_step
    assert step.__doc__ == "Docs of the step."
    assert step.__name__ == "train_step"
    deco = fd.cuda_graph(warmup=1, clone_outputs=False)(train_step)
    assert deco.__wrapped__ is train_step
    assert "warmup=1" in repr(deco) and "clone_outputs=False" in repr(deco)


def test_bad_arguments():
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        fd.cuda_graph(BLOCK, warmup=-1)
    with pytest.raises(ValueError, match="cache_size must be an int >= 1"):
        fd.cuda_graph(BLOCK, cache_size=0)
    with pytest.raises(TypeError, match="takes a function"):
        fd.cuda_graph(3)


# ---------------------------------------------------------------- errors
def test_error_input_requires_grad_names_the_path():
    params, td = BLOCK.init(0), _td()
    params = params.apply(lambda v: v.requires_grad_())
    snap = _snapshot((params, td))
    step = _faked(BLOCK)
    with pytest.raises(ValueError, match=r"args\[0\]\['0'\]\['bias'\].*require grad.*detach"):
        step(params, td)
    _unchanged((params, td), snap)
    assert step.cache_info().size == 0


def test_error_inputs_on_several_devices():
    step = _faked(lambda a, b: a + b.sum())
    a, b = torch.zeros(2), torch.zeros(2, device="meta")
    with pytest.raises(
        ValueError, match=r"several devices \(args\[0\] on cpu, args\[1\] on meta\)"
    ):
        step(a, b)
    with pytest.raises(ValueError, match=r"several devices.*x= on cpu.*y=\['k'\] on meta"):
        step2 = _faked(lambda x, y: x)
        step2(x=a, y={"k": b})


def test_error_unhashable_static_input():
    step = _faked(lambda x, opts: x * len(opts))
    with pytest.raises(TypeError, match=r"non-tensor input args\[1\] is not hashable"):
        step(torch.zeros(2), bytearray(b"ab"))  # lists are trees; a bytearray is a leaf


def test_recording_failure_is_explained_and_not_cached():
    step = _faked(BLOCK, warmup=0)
    step._recorder.fail = True
    params, td = BLOCK.init(0), _td()
    with pytest.raises(
        RuntimeError, match=r"(?s)recording the function into a CUDA graph failed.*\.item\(\)"
    ):
        step(params, td)
    assert step.cache_info().size == 0
    step._recorder.fail = False
    assert_close(step(params, td), BLOCK(params, td))


# ---------------------------------------------------------------- signature
def test_signature_same_structure_new_values_is_equal():
    p = BLOCK.init(0)
    assert signature((p, _td()), {}) == signature((BLOCK.init(1), _td()), {})
    assert hash(signature((p, _td()), {"lr": 0.1})) == hash(signature((p, _td()), {"lr": 0.1}))


@pytest.mark.parametrize(
    "other",
    [
        lambda: (_td(5),),  # batch size
        lambda: (_td().double(),),  # dtype
        lambda: (_td().set("y", torch.zeros(4)),),  # keys
        lambda: (_td(), 1.0),  # an extra static arg
        lambda: (fd.TensorDict({"x": torch.zeros(4, 3)}, [4, 3]),),  # same shapes, batch [4, 3]
        lambda: ({"x": torch.zeros(4, 3)},),  # a dict, not a TensorDict
        lambda: (_td().to("meta"),),  # device
    ],
)
def test_signature_differs(other):
    assert signature((_td(),), {}) != signature(other(), {})


def test_signature_static_values():
    x = torch.zeros(2)
    assert signature((x, 2), {}) != signature((x, 3), {})
    assert signature((x,), {"mode": "a"}) != signature((x,), {"mode": "b"})
    assert signature((x, 1), {}) != signature((x, 1.0), {})  # type too


# ---------------------------------------------------------------- cache (fake recorder)
def test_warmup_then_record_then_replay_equals_eager():
    step = _faked(BLOCK, warmup=2)
    for i in range(6):
        params, td = BLOCK.init(i), _td()
        snap = _snapshot((params, td))
        out = step(params, td)
        assert_close(out, BLOCK(params, td))
        _unchanged((params, td), snap)
    info = step.cache_info()
    assert (info.recordings, info.replays, info.eager, info.size) == (1, 3, 2, 1)
    assert step._recorder.warm_calls == 2 and step._recorder.records == 1


def test_outputs_are_fresh_and_not_aliased():
    step = _faked(BLOCK, warmup=0)
    params, td = BLOCK.init(0), _td()
    out1 = step(params, td)
    keep = out1.clone()
    td2 = _td()
    out2 = step(params, td2)
    assert_close(out1, keep)  # the second replay did not touch the first outputs
    assert out2["x"] is td2["x"]  # an input passed through is the caller's tensor, as in eager
    ptrs = lambda t: {v.data_ptr() for v in fd.tree.leaves(t.exclude("x"))}  # noqa: E731
    assert not ptrs(out1) & ptrs(out2)
    assert not ptrs(out2) & ptrs(params)
    entry = next(iter(step._cache.values()))
    assert not ptrs(out2) & {t.data_ptr() for t in entry.static_in}


def test_clone_outputs_false_returns_the_static_buffers():
    step = _faked(lambda p, td: BLOCK(p, td)["y"], warmup=0, clone_outputs=False)
    params = BLOCK.init(0)
    td1, td2 = _td(), _td()
    y1 = step(params, td1)
    expect1 = BLOCK(params, td1)["y"]
    assert_close(y1, expect1)
    y2 = step(params, td2)
    assert y2 is y1  # documented: the next replay overwrites the buffers
    assert y1 is next(iter(step._cache.values())).out_leaves[0]
    assert_close(y1, BLOCK(params, td2)["y"])


def test_new_signature_records_again_and_lru_evicts():
    step = _faked(BLOCK, warmup=1, cache_size=2)
    params = BLOCK.init(0)
    for n in (1, 2, 3):  # three signatures: each warms up once, then records
        for _ in range(3):
            td = _td(n)
            assert_close(step(params, td), BLOCK(params, td))
    info = step.cache_info()
    assert (info.recordings, info.replays, info.size, info.maxsize) == (3, 3, 2, 2)
    td = _td(1)  # evicted: warm-up and recording again
    assert_close(step(params, td), BLOCK(params, td))
    assert step.cache_info().recordings == 3
    assert_close(step(params, td), BLOCK(params, td))
    assert step.cache_info().recordings == 4


def test_signature_change_during_warmup_starts_its_own_warmup():
    step = _faked(BLOCK, warmup=2)
    params = BLOCK.init(0)
    step(params, _td(4))  # warm-up 1 of batch 4
    step(params, _td(5))  # warm-up 1 of batch 5 (no error, no recording)
    assert step.cache_info().recordings == 0
    step(params, _td(4))  # warm-up 2 of batch 4
    td = _td(4)
    assert_close(step(params, td), BLOCK(params, td))  # recorded now
    assert step.cache_info().recordings == 1


def test_static_args_are_part_of_the_signature():
    step = _faked(lambda x, scale: x * scale, warmup=0)
    x = torch.randn(3)
    assert torch.equal(step(x, 2.0), x * 2.0)
    assert torch.equal(step(x, 3.0), x * 3.0)
    assert step.cache_info().recordings == 2


def test_random_stays_random_because_keys_are_inputs():
    drop = fd.Module(fd.nn.Dropout(0.5), ["x"], ["y"])
    step = _faked(lambda td, key: drop(None, td, key=key), warmup=0)
    td = fd.TensorDict({"x": torch.ones(64)}, [64])
    keys = fd.random.split(fd.random.key(0), 3)
    outs = [step(td, k)["y"] for k in keys]
    for k, o in zip(keys, outs):
        assert torch.equal(o, drop(None, td, key=k)["y"])
    assert not torch.equal(outs[1], outs[2])
    assert step.cache_info().replays == 2


def test_training_step_with_torch_func_grad():
    step = _faked(_sgd_step, warmup=1)
    params, params_ref = BLOCK.init(0), BLOCK.init(0)
    for i in range(4):
        batch = _batch(i)
        params = step(params, batch, 0.1)
        params_ref = _sgd_step(params_ref, batch, 0.1)
        assert_close(params, params_ref, rtol=1e-5, atol=1e-6)
    assert step.cache_info().replays == 2


def _sgd_step(params, batch, lr):
    def loss(p):
        out = BLOCK(p, batch)
        return ((out["y"] - batch["target"]) ** 2).mean()

    grads = torch.func.grad(loss)(params)
    return params.apply(lambda p, g: p - lr * g, grads)


def _batch(i, device="cpu"):
    g = torch.Generator().manual_seed(i)
    return fd.TensorDict(
        {"x": torch.randn(16, 3, generator=g), "target": torch.randn(16, 3, generator=g)}, [16]
    ).to(device)


def test_cuda_graph_warns_once_naming_the_changed_structure():
    step = _faked(lambda td: td["x"] * 2, warmup=0)
    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(fd.TensorDict({"x": x}, [2]))
        step(fd.TensorDict({"x": x[:1]}, [1]))  # a new batch size: no warning
    with pytest.warns(
        fd.CudaGraphWarning,
        match=r"structure of args\[0\] changed \(keys added: 'y'; removed: none\).*select",
    ):
        step(fd.TensorDict({"x": x, "y": x}, [2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per wrapper
        step(fd.TensorDict({"x": x, "z": x}, [2]))
    assert step.cache_info().recordings == 4


# ---------------------------------------------------------------- CUDA
@pytest.mark.cuda
def test_cuda_record_replay_equals_eager():
    params = BLOCK.init(0, device="cuda")
    step = fd.cuda_graph(BLOCK, warmup=2)
    for _ in range(5):
        td = _td(4, "cuda")
        snap = _snapshot((params, td))
        out = step(params, td)
        assert_close(out, BLOCK(params, td), rtol=1e-5, atol=1e-6)
        _unchanged((params, td), snap)
    info = step.cache_info()
    assert (info.recordings, info.replays, info.eager) == (1, 2, 2)


@pytest.mark.cuda
def test_cuda_outputs_not_aliased():
    params = BLOCK.init(0, device="cuda")
    step = fd.cuda_graph(BLOCK, warmup=1)
    step(params, _td(4, "cuda"))
    out1 = step(params, _td(4, "cuda"))  # recorded
    keep = out1.clone()
    out2 = step(params, _td(4, "cuda"))  # replayed
    torch.cuda.synchronize()
    assert_close(out1, keep)
    ptrs = lambda t: {v.data_ptr() for v in fd.tree.leaves(t)}  # noqa: E731
    assert not ptrs(out1) & ptrs(out2)


@pytest.mark.cuda
def test_cuda_recapture_on_new_signature():
    params = BLOCK.init(0, device="cuda")
    step = fd.cuda_graph(BLOCK, warmup=0)
    for n in (4, 8, 4, 8):
        td = _td(n, "cuda")
        assert_close(step(params, td), BLOCK(params, td), rtol=1e-5, atol=1e-6)
    info = step.cache_info()
    assert (info.recordings, info.replays) == (2, 2)


@pytest.mark.cuda
def test_cuda_dropout_stays_random_across_replays():
    drop = fd.Module(fd.nn.Dropout(0.5), ["x"], ["y"])
    step = fd.cuda_graph(lambda td, key: drop(None, td, key=key), warmup=1)
    td = fd.TensorDict({"x": torch.ones(256, device="cuda")}, [256])
    keys = fd.random.split(fd.random.key(0), 4).cuda()
    outs = [step(td, k)["y"] for k in keys]
    for k, o in zip(keys, outs):
        assert torch.equal(o, drop(None, td, key=k)["y"])
    assert not torch.equal(outs[2], outs[3])


@pytest.mark.cuda
def test_cuda_captured_training_step():
    step = fd.cuda_graph(_sgd_step, warmup=2)
    params, params_ref = BLOCK.init(0, device="cuda"), BLOCK.init(0, device="cuda")
    for i in range(6):
        batch = _batch(i, "cuda")
        params = step(params, batch, 0.1)
        params_ref = _sgd_step(params_ref, batch, 0.1)
        assert_close(params, params_ref, rtol=1e-5, atol=1e-6)
    info = step.cache_info()
    assert (info.recordings, info.replays) == (1, 3)


@pytest.mark.cuda
def test_cuda_cpu_inputs_run_eagerly_and_mixed_inputs_fail():
    step = fd.cuda_graph(BLOCK)
    params = BLOCK.init(0)
    with pytest.warns(fd.CudaGraphWarning, match="on cpu"):
        step(params, _td())
    with pytest.raises(ValueError, match="several devices"):
        step(params, _td(4, "cuda"))


def test_same_params_object_reads_its_current_values():
    # the description of a TensorDict argument is memoised by identity; values are
    # still copied at every call (a tensor's values may change, its shape may not)
    step = _faked(BLOCK, warmup=0)
    params = BLOCK.init(0).apply(lambda v: v.clone())
    td = _td()
    step(params, td)
    with torch.no_grad():
        params["0", "bias"].add_(1.0)  # the caller's own in-place write
    assert_close(step(params, td), BLOCK(params, td))
    assert step.cache_info().replays == 1


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_cuda_graph_every_registry_entry(name):
    e = ENTRIES[name]
    m = e.make()
    params = params_for(m).apply(lambda v: v.detach()).to("cuda")
    key = fd.random.key(7).cuda()

    def caller(p, td, key):
        return call(m, p, td, key)

    step = fd.cuda_graph(caller, warmup=1)
    for i in range(3):  # warm-up, recording, replay: each with new values
        td = e.example().to("cuda")
        td = td.apply(lambda v, i=i: v + i if v.is_floating_point() else v)
        assert_close(step(params, td, key), caller(params, td, key), rtol=1e-5, atol=1e-6)
    assert step.cache_info().replays == 1


def test_cuda_recorder_call_sequence(monkeypatch):
    """The real recorder's use of torch.cuda, checked on the CPU with stand-ins:
    warm-up on a side stream that waits for the current one (and back), recording
    inside ``torch.cuda.graph`` on the inputs' device."""
    from contextlib import contextmanager

    from functd._transforms._cuda_graph import _CudaRecorder

    log = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            log.append(f"{self.name} waits {other.name}")

    class Graph:
        def replay(self):
            log.append("replay")

    @contextmanager
    def ctx(what):
        log.append(f"enter {what}")
        yield
        log.append(f"exit {what}")

    current = Stream("current")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream("side"))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: ctx(f"stream {s.name}"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, **kw: ctx("graph"))
    monkeypatch.setattr(torch.cuda, "device", lambda d: ctx(f"device {d}"))

    def f(x):
        log.append("f")
        return {"y": x + 1}

    x = torch.zeros(2)
    out = _CudaRecorder.warm(f, (x,), {}, torch.device("cpu"))
    assert torch.equal(out["y"], x + 1)
    assert log == ["side waits current", "enter stream side", "f", "exit stream side",
                   "current waits side"]  # fmt: skip
    log.clear()
    replay, out = _CudaRecorder.record(f, (x,), {}, torch.device("cpu"))
    assert log == ["enter device cpu", "enter graph", "f", "exit graph", "exit device cpu"]
    replay()
    assert log[-1] == "replay"


def test_as_a_method_decorator():
    class Model:
        def __init__(self):
            self.scale = 2.0

        @fd.cuda_graph(warmup=0)
        def forward(self, x):
            return x * self.scale

    Model.forward._recorder = FakeRecorder()
    m = Model()
    x = torch.randn(3)
    assert torch.equal(m.forward(x), x * 2.0)
    assert torch.equal(m.forward(x + 1), (x + 1) * 2.0)
    assert Model.forward.cache_info().replays == 1
