"""The straight-line plan of a Sequential call against its reference loop.

``functd._modules._plan.reference`` runs the loop the plan replaces; every call here is
compared with it: outputs (values, key order, batch size), intermediates,
selected out keys, error messages, and the same under fd.vmap, fd.grad and
torch.compile. The plan cache is bounded and lives on the module.
"""

import gc
import linecache
import re
import traceback
import weakref

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import distributions as D
from torch import nn

import functd as fd
from functd._modules import _plan
from functd._modules._plan import plan_source, reference


def same(a: fd.TensorDict, b: fd.TensorDict) -> None:
    """Equal values, bit for bit, the same keys in the same order and batch size."""
    assert list(a.keys(True)) == list(b.keys(True))
    assert a.batch_size == b.batch_size
    for k, v in a.items(True, True):
        assert torch.equal(v, b[k]), k


def both(seq, params, td, **kw):
    out = seq(params, td, **kw)
    ref = reference(seq, params, td, **kw)
    same(out, ref)
    assert any(not hasattr(p, "gives_up") for p in seq._plans.values())  # a plan served
    return out


def error_of(fn):
    try:
        fn()
    except Exception as e:  # the test compares whatever is raised
        return type(e), str(e)
    raise AssertionError("no error raised")


def same_error(seq, params, td, **kw):
    """The plan path and the reference loop raise the same error, message included."""
    a = error_of(lambda: seq(params, td, **kw))
    b = error_of(lambda: reference(seq, params, td, **kw))
    assert a == b
    return a


def block(sel=("y",)):
    torch.manual_seed(0)
    return fd.Sequential(
        fd.Module(nn.Linear(3, 8), ["x"], ["h0"]),
        fd.Module(torch.relu, ["h0"], ["a0"]),
        fd.Module(nn.Linear(8, 3), ["a0"], ["h1"]),
        fd.Module(lambda x, h: x + h, ["x", "h1"], ["y"]),
        selected_out_keys=None if sel is None else list(sel),
    )


# ---------------------------------------------------------------- random chains
FNS = {
    "relu": (1, 1, torch.relu),
    "neg": (1, 1, torch.neg),
    "sin": (1, 1, torch.sin),
    "add": (2, 1, lambda a, b: a + b),
    "mul": (2, 1, lambda a, b: a * b),
    "split": (1, 2, lambda a: (a * 2, a - 1)),
    "dict": (1, 1, None),  # keyword in_keys
    "nested": (1, 1, None),  # a Sequential kept whole (a selection): an opaque step
    "nested_key": (1, 1, None),  # a write under a nested key: an opaque step
}


@st.composite
def chains(draw):
    """A Sequential of elementwise modules over keys k0..k5 (reads of present keys,
    writes of new keys or overwrites), an optional selection, and the td's keys."""
    names = [f"k{i}" for i in range(6)]
    present = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    avail = list(present)
    mods = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(sorted(FNS)))
        n_in, n_out, fn = FNS[kind]
        ins = [draw(st.sampled_from(avail)) for _ in range(n_in)]
        outs = draw(st.lists(st.sampled_from(names), min_size=n_out, max_size=n_out, unique=True))
        if kind == "dict":
            mods.append(fd.Module(lambda *, a: a.cos(), {ins[0]: "a"}, outs))
        elif kind == "nested":  # its intermediate may be a key of the td: it drops it
            tmp = draw(st.sampled_from([n for n in names if n not in (ins[0], outs[0])]))
            inner = fd.Sequential(
                fd.Module(torch.neg, ins, [tmp]),
                fd.Module(torch.exp, [tmp], outs),
                selected_out_keys=outs,
            )
            mods.append(inner)
            if tmp in avail and tmp != ins[0]:
                avail.remove(tmp)
        elif kind == "nested_key":
            mods.append(fd.Module(torch.sin, ins, [("nest", outs[0])]))
            continue
        else:
            mods.append(fd.Module(fn, ins, outs))
        avail += [o for o in outs if o not in avail]
    written = [o for m in mods for o in m.out_keys if type(o) is str]
    sel = None
    if written:
        sel = draw(
            st.one_of(st.none(), st.lists(st.sampled_from(written), min_size=1, unique=True))
        )
    return fd.Sequential(*mods, selected_out_keys=sel), present


@given(chains(), st.sampled_from([[], [3], [2, 3]]))
def test_plan_equals_reference_on_random_chains(chain, bs):
    seq, present = chain
    td = fd.TensorDict({k: torch.randn(*bs, 2) for k in present}, bs)
    params = fd.TensorDict({})
    both(seq, params, td)  # the hot path (early drops)
    both(seq, None, td)  # no params: the general path
    both(seq, params, td, key=fd.random.key(1))


def test_intermediates_and_selection():
    td = fd.TensorDict({"x": torch.randn(4, 3), "extra": torch.zeros(4)}, [4])
    full = both(block(None), fd.from_module(block(None)), td)
    assert list(full.keys()) == ["x", "extra", "h0", "a0", "h1", "y"]
    sel = both(block(("y", "a0")), fd.from_module(block()), td)
    assert list(sel.keys()) == ["x", "extra", "a0", "y"]
    # a td entry written by a module and not selected is dropped, as in the loop
    td2 = td.set("h0", torch.ones(4, 8))
    assert "h0" not in both(block(), fd.from_module(block()), td2)


def test_plan_is_straight_line_code():
    src = plan_source(block(), fd.TensorDict({"x": torch.randn(2, 3)}, [2]))
    assert "for " not in src and "while " not in src
    x = re.search(r"^# (K\d+) = 'x'$", src, re.M).group(1)
    assert src.count(f"base[{x}]") == 1  # the input is read once


def test_opaque_children_nested_keys_and_nested_sequentials():
    inner = fd.Sequential(
        fd.Module(torch.neg, ["h"], ["n"]),
        fd.Module(torch.exp, ["n"], ["e"]),
        selected_out_keys=["e"],
    )  # kept whole (a selection): its own call inside the plan
    seq = fd.Sequential(
        fd.Module(nn.Linear(3, 4, bias=False), ["x"], ["h"]),  # inlined F.linear, no bias
        inner,
        fd.Module(lambda e: e * 2, ["e"], [("out", "e2")]),  # a nested key
        fd.Module(torch.relu, ["h"], ["r"]),
        selected_out_keys=[("out", "e2"), "r", "e"],
    )
    params = fd.from_module(seq)
    td = fd.TensorDict({"x": torch.randn(5, 3), "obs": {"p": torch.zeros(5, 1)}}, [5])
    out = both(seq, params, td)
    assert ("out", "e2") in out.keys(True) and "h" not in out


# ---------------------------------------------------------------- errors
def test_errors_are_the_reference_errors():
    seq, params = block(), fd.from_module(block())
    td = fd.TensorDict({"x": torch.randn(2, 3)}, [2])
    t, msg = same_error(seq, params, fd.TensorDict({"z": torch.randn(2, 3)}, [2]))
    assert t is KeyError and "reads 'x', which the tensordict lacks; it has: 'z'" in msg
    t, msg = same_error(seq, params.exclude("2"), td)
    assert "params lack entry '2'" in msg
    t, msg = same_error(seq, None, td)
    assert "has parameters but was given nothing" in msg
    t, msg = same_error(seq, params.set("0", torch.zeros(1)), td)
    assert t is TypeError
    bad = params.set(("2", "bias"), torch.zeros(1))
    t, msg = same_error(seq, bad, td)
    assert "params entry 'bias' has shape [1], expected [3]" in msg
    # outputs: wrong batch dims, not a tensor, wrong count
    for fn, outs, pat in [
        (lambda x: x[0], ["y"], "does not start with the batch size"),
        (lambda x: 1.0, ["y"], "is a float, not a tensor"),
        (lambda x: (x, x, x), ["a", "b"], "returned 3 output"),
        (lambda x: x.sum(-1, keepdim=True).T, ["y"], "does not start with the batch size"),
    ]:
        s = fd.Sequential(fd.Module(torch.relu, ["x"], ["r"]), fd.Module(fn, ["r"], outs))
        t, msg = same_error(s, None, td)
        assert pat in msg
    # a Linear fed a leaf without feature dims loses the batch dim: the inline check sees it
    lin = fd.Module(nn.Linear(2, 4), ["v"], ["y"])
    s = fd.Sequential(lin, fd.Module(torch.relu, ["y"], ["z"]))
    t, msg = same_error(s, fd.from_module(s), fd.TensorDict({"v": torch.randn(2)}, [2]))
    assert "output 'y' has shape [4]" in msg


def test_plan_runs_nothing_before_giving_up_on_params():
    calls = []

    def spy(x):
        calls.append(1)
        return x

    seq = fd.Sequential(fd.Module(spy, ["x"], ["a"]), fd.Module(nn.Linear(3, 3), ["a"], ["b"]))
    with pytest.raises(KeyError, match="params lack entry '1'"):
        seq(fd.TensorDict({}), fd.TensorDict({"x": torch.randn(2, 3)}, [2]))
    assert len(calls) == 1  # once, by the reference loop


# ---------------------------------------------------------------- transforms
def test_under_vmap_and_grad():
    seq = block(None)
    keys = fd.random.split(fd.random.key(0), 3)
    ens = fd.vmap(seq.init)(keys)
    td = fd.TensorDict({"x": torch.randn(5, 3)}, [5])
    out = fd.vmap(seq, in_dims=(0, None))(ens, td)
    ref = fd.vmap(lambda p, t: reference(seq, p, t), in_dims=(0, None))(ens, td)
    same(out, ref)
    p = seq.init(fd.random.key(1))

    def loss(call):
        return lambda p: call(p)["y"].pow(2).sum()

    g = fd.grad(loss(lambda p: seq(p, td)))(p)
    g_ref = fd.grad(loss(lambda p: reference(seq, p, td)))(p)
    same(g, g_ref)
    same(
        fd.vmap(fd.grad(loss(lambda p: seq(p, td))))(ens),
        fd.vmap(fd.grad(loss(lambda p: reference(seq, p, td))))(ens),
    )


def test_compiled_call_equals_reference():
    seq, params = block(), fd.from_module(block())
    td = fd.TensorDict({"x": torch.randn(2, 3)}, [2])
    torch._dynamo.reset()
    out = torch.compile(lambda p, t: seq(p, t), fullgraph=True, backend="eager")(params, td)
    same(out, reference(seq, params, td))


# ---------------------------------------------------------------- probabilistic
def policy(sel=None):
    torch.manual_seed(0)
    return fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(4, 8), ["input", "hidden"], ["hidden"]),
        fd.Module(fd.NormalParamExtractor(), ["hidden"], ["loc", "scale"]),
        fd.Probabilistic(["loc", "scale"], ["action"], D.Normal, return_log_prob=True),
        fd.Module(torch.tanh, ["action"], ["squashed"]),
        selected_out_keys=sel,
    )


@pytest.mark.parametrize("sel", [None, ["squashed", "action_log_prob"]])
def test_probabilistic_sequential_plan(sel):
    pol = policy(sel)
    params = fd.from_module(pol)
    td = fd.TensorDict({"input": torch.randn(3, 4), "hidden": torch.randn(3, 8)}, [3])
    for it in (None, "mode", "random"):
        k = fd.random.key(2) if it == "random" else None
        both(pol, params, td, key=k, interaction=it)
    with fd.set_interaction_type(fd.InteractionType.RANDOM):
        both(pol, params, td, key=fd.random.key(3))
        _, msg = same_error(pol, params, td)
    assert "needs a PRNG key" in msg
    ens = fd.stack([params, params])
    out = fd.vmap(
        lambda p, t: pol(p, t, key=fd.random.key(0), interaction="random"), in_dims=(0, None)
    )(ens, td)
    ref = fd.vmap(
        lambda p, t: reference(pol, p, t, key=fd.random.key(0), interaction="random"),
        in_dims=(0, None),
    )(ens, td)
    same(out, ref)


# ---------------------------------------------------------------- cache
class Neg:
    """A callable we can hold a weak reference to."""

    def __call__(self, x):
        return -x


def test_plan_cache_is_bounded_and_dies_with_the_module():
    fn = Neg()
    seq = fd.Sequential(fd.Module(fn, ["x"], ["y"]))
    x = torch.randn(2)
    for i in range(_plan.MAX_PLANS + 5):
        td = fd.TensorDict({"x": x, f"extra{i}": x}, [2])
        same(seq(None, td), reference(seq, None, td))
    assert len(seq._plans) == _plan.MAX_PLANS  # further layouts evict the oldest
    ref = weakref.ref(fn)
    del seq, fn
    gc.collect()  # (a Module's call closures refer to it: it is freed by the collector)
    assert ref() is None  # the plans (which call fn) went with the module


def test_plan_cache_evicts_the_least_recently_used_layout():
    seq = fd.Sequential(fd.Module(torch.neg, ["x"], ["y"]), fd.Module(torch.exp, ["y"], ["z"]))
    x = torch.randn(2)

    def layout(i):
        return fd.TensorDict({"x": x, f"extra{i}": x}, [2])

    def cached(td):
        return seq._plans.get((tuple(td._data), 1, False))

    hot = layout(0)
    same(seq(None, hot), reference(seq, None, hot))
    for i in range(1, 3 * _plan.MAX_PLANS):
        td = layout(i)
        same(seq(None, td), reference(seq, None, td))
        plan = cached(td)  # the 17th and later layouts get plans too, and they run
        assert plan is not None and not hasattr(plan, "gives_up") and seq._plan_mru is plan
        same(seq(None, hot), reference(seq, None, hot))  # the hot layout stays recent
        assert len(seq._plans) <= _plan.MAX_PLANS
    assert cached(hot) is not None  # used all along: never evicted
    assert all(cached(layout(i)) is None for i in range(1, 2 * _plan.MAX_PLANS))  # evicted
    assert list(seq._plans)[-1] == (tuple(hot._data), 1, False)  # the most recent is last


# ---------------------------------------------------------------- tracebacks
def test_a_traceback_through_a_plan_shows_the_plans_line():
    def boom(x):
        raise ArithmeticError("boom")

    seq = fd.Sequential(fd.Module(torch.neg, ["x"], ["a"]), fd.Module(boom, ["a"], ["b"]))
    td = fd.TensorDict({"x": torch.zeros(2)}, [2])
    with pytest.raises(ArithmeticError) as info:
        seq(None, td)
    frames = [f for f in traceback.extract_tb(info.tb) if f.filename.startswith("<functd plan")]
    assert len(frames) == 1 and frames[0].name == "plan"
    assert re.fullmatch(r"v\d+ = F1\(v\d+\)", frames[0].line)  # the call of the second step
    assert frames[0].line in plan_source(seq, td)
    text = "".join(traceback.format_exception(info.value))
    assert frames[0].line in text  # printed in the traceback itself
    name = frames[0].filename
    del seq, info, frames
    gc.collect()
    assert name not in linecache.cache  # the source goes with the plan


def test_a_layer_writes_out_its_own_call_and_an_overriding_subclass_is_called():
    class Doubled(fd.nn.Linear):
        def __call__(self, params, x, *, key=None):
            return 2 * super().__call__(params, x)

    for layer, inlined in ((fd.nn.Linear(3, 2), True), (Doubled(3, 2), False)):
        seq = fd.Sequential(fd.Module(layer, ["x"], ["y"]), fd.Module(torch.tanh, ["y"], ["z"]))
        params = seq.init(fd.random.key(0))
        td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])
        assert ("F_linear(" in plan_source(seq, td)) is inlined
        # the plan and the reference loop agree, and with torch's own Linear
        ref = reference(seq, params, td)
        out = seq(params, td)
        torch.testing.assert_close(out["z"], ref["z"])
        want = torch.nn.functional.linear(td["x"], params["0", "weight"], params["0", "bias"])
        torch.testing.assert_close(out["y"], want if inlined else 2 * want)


def test_a_written_out_layer_tests_its_input_once_and_the_loop_serves_an_input_of_batch_dims():
    """Linear keeps its input's leading dims, so one test of the first input's rank
    covers the chain (the later outputs keep the batch dims by shape); an input with
    no dim beyond the batch dims goes to the loop, whose checks run (here: [4] read as
    4 features, written back as a [4] output that passes the batch check)."""
    seq = fd.Sequential(
        fd.Module(fd.nn.Linear(4, 4), ["x"], ["h"]),
        fd.Module(torch.relu, ["h"], ["a"]),
        fd.Module(fd.nn.Linear(4, 4), ["a"], ["y"]),
    )
    params = seq.init(fd.random.key(0))
    deep = fd.TensorDict({"x": torch.randn(4, 4)}, [4])
    src = plan_source(seq, deep)
    assert src.count(".ndim == 1") == 1 and src.count("F_linear(") == 2
    both(seq, params, deep)
    flat = fd.TensorDict({"x": torch.randn(4)}, [4])
    out = seq(params, flat)
    same(out, reference(seq, params, flat))
    assert out["y"].shape == (4,)
    (plan,) = seq._plans.values()  # the same layout: the same plan, which handed it over
    assert plan(params, flat._data, flat.batch_size, None) is None
    assert plan(params, deep._data, deep.batch_size, None) is not None
    bad = fd.Sequential(fd.Module(fd.nn.Linear(3, 2), ["x"], ["y"]))  # [3] -> [2]: no batch
    assert same_error(bad, bad.init(fd.random.key(1)), fd.TensorDict({"x": torch.randn(3)}, [3]))
