"""The calling protocol of the module kinds (``functd/_modules/_call.py``).

A module kind written here, in the tests, with nothing but the protocol
(``children``, ``with_children``, ``run`` with explicit call options) gets
``fd.nn.eval_mode``, ``split_state``/``merge_state``/``buffer_paths``,
``apply_with_state``, ``fd.from_module``, composition in a Sequential and fd.vmap:
each checked against the same computation written with ``torch.nn``. (The
registry sweeps of test_conformance.py / test_transform_conformance.py run over
it too: ``conformance.Residual``.) Also: ProbabilisticSequential with a stateful
(BatchNorm) child, in training and eval mode and under fd.vmap, against torch.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import functd as fd
from functd._modules._call import ModuleKind
from functd.testing import assert_close
from tests._support.conformance import Residual

D = torch.float64


def _torch_body() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Tanh()).to(D)


def _fd_body(net: nn.Sequential) -> fd.Sequential:
    return fd.Sequential(
        fd.Module(net[0], ["x"], ["h"]),
        fd.Module(net[1], ["h"], ["h"]),
        fd.Module(net[2], ["h"], ["y"]),
    )


def _x(step: int = 0) -> torch.Tensor:
    return torch.randn(8, 3, generator=torch.Generator().manual_seed(step), dtype=D)


def test_user_kind_is_a_module_kind_and_not_a_module():
    res = Residual(_fd_body(_torch_body()))
    assert isinstance(res, ModuleKind) and not isinstance(res, fd.Module | fd.Sequential)
    assert res.children()[0][0] == "body" and res.stateful and res.has_params
    assert res == Residual(res.body) and hash(res) == hash(Residual(res.body))
    with pytest.raises(TypeError, match="Residual is immutable"):
        res.body = None


def test_frozen_values_share_one_base():
    """Module kinds, optim.Partial, fd.trainable's filter and fd.train_step's step are
    one kind of value (``functd/_frozen.py``): equal and hashed by what they hold;
    setting or deleting a field raises FrozenError, a TypeError and an AttributeError."""
    from functd._errors import FrozenError
    from functd._frozen import Frozen

    lin, opt = nn.Linear(3, 4), fd.optim.sgd(0.1)

    def loss(p, b, k):
        return p["weight"].sum()

    def values():
        model = fd.Module(lin, ["x"], ["y"])
        return [
            model,
            fd.optim.Partial(pow, exp=2),
            fd.trainable(model),
            fd.train_step(loss, opt),
        ]

    for v, w in zip(values(), values()):
        assert isinstance(v, Frozen) and v is not w and v == w and hash(v) == hash(w)
        for attempt in (setattr, delattr):
            with pytest.raises(FrozenError) as info:
                attempt(v, "x", 1) if attempt is setattr else attempt(v, "x")
            assert isinstance(info.value, TypeError) and isinstance(info.value, AttributeError)
    assert fd.optim.Partial(pow, exp=2) != fd.optim.Partial(pow, exp=3)


def test_user_kind_trains_and_evaluates_like_torch():
    net = _torch_body()
    res = Residual(_fd_body(net))
    params = fd.from_module(res)  # through children() and the Modules' torch sources
    assert set(params.keys(True, True)) == {
        ("body", "0", "weight"),
        ("body", "0", "bias"),
        ("body", "1", "weight"),
        ("body", "1", "bias"),
        ("body", "1", "running_mean"),
        ("body", "1", "running_var"),
        ("body", "1", "num_batches_tracked"),
    }
    ref = copy.deepcopy(net).train()
    trainable, state = fd.nn.split_state(res, params)
    assert set(state.keys(True, True)) == {
        ("body", "1", k) for k in ("running_mean", "running_var", "num_batches_tracked")
    }
    for step in range(3):  # training mode: new statistics each step, as torch's
        x = _x(step)
        out, new_state = res.apply_with_state(
            fd.nn.merge_state(trainable, state), fd.TensorDict({"x": x}, [8])
        )
        assert_close(out["y"], x + ref(x))
        state = fd.nn.update_state(state, new_state)
    assert_close(state["body", "1", "running_mean"], ref[1].running_mean)
    assert_close(state["body", "1", "running_var"], ref[1].running_var)
    with pytest.raises(RuntimeError, match="apply_with_state"):
        res(fd.nn.merge_state(trainable, state), fd.TensorDict({"x": _x()}, [8]))
    # eval mode through the protocol: the kind rebuilt around its switched child
    ev = fd.nn.eval_mode(res)
    assert type(ev) is Residual and not ev.stateful
    assert fd.nn.train_mode(ev) == res and fd.nn.eval_mode(ev) is ev
    ref.eval()
    x = _x(9)
    out = ev(fd.nn.merge_state(trainable, state), fd.TensorDict({"x": x}, [8]))
    assert_close(out["y"], x + ref(x))


def test_user_kind_composes_and_maps():
    net = _torch_body()
    res = fd.nn.eval_mode(Residual(_fd_body(net)))
    seq = fd.Module(torch.neg, ["x"], ["x"]) >> res  # a child of a Sequential
    params = fd.from_module(seq)
    assert list(params.keys()) == ["1"]
    x = _x(1)
    out = seq(params, fd.TensorDict({"x": x}, [8]))
    ref = copy.deepcopy(net).eval()
    assert_close(out["y"], -x + ref(-x))
    # an ensemble of 3 members under fd.vmap equals the loop
    ps = [params.apply(lambda v, i=i: v * (1 + 0.1 * i) if v.is_floating_point() else v)
          for i in range(3)]  # fmt: skip
    td = fd.TensorDict({"x": x}, [8])
    got = fd.vmap(lambda p: seq(p, td), in_dims=0)(fd.stack(ps))
    assert_close(got, fd.stack([seq(p, td) for p in ps]))


def test_protocol_defaults_of_a_minimal_kind():
    class Scale(ModuleKind):  # a leaf kind: no children, no params
        __slots__ = ("in_keys", "out_keys")

        def __init__(self):
            object.__setattr__(self, "in_keys", ("x",))
            object.__setattr__(self, "out_keys", ("y",))

        def _identity(self):
            return ()

        def run(self, params, data, bs, opts):
            data["y"] = data["x"] * 2

    s = Scale()
    x = torch.ones(2, 3)
    assert fd.nn.eval_mode(s) is s and fd.nn.buffer_paths(s) == ()
    assert s.init(0).is_empty() and fd.from_module(s).is_empty()
    assert torch.equal(s(None, x=x), 2 * x) and torch.equal(s(None, x), 2 * x)
    out, state = s.apply_with_state(None, fd.TensorDict({"x": x}, [2]))
    assert torch.equal(out["y"], 2 * x) and state.is_empty()
    with pytest.raises(TypeError, match="has no children"):
        s.with_children([s])


# ------------------------------------------------------------ probabilistic + BatchNorm
def _policy_torch():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(D)


def _policy(net):
    return fd.ProbabilisticSequential(
        fd.Module(net[0], ["x"], ["h"]),
        fd.Module(net[1], ["h"], ["h"]),
        fd.Module(fd.NormalParamExtractor(), ["h"], ["loc", "scale"]),
        fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal,
                         return_log_prob=True),
    )  # fmt: skip


def _extract(h):
    """tensordict's NormalParamExtractor (biased_softplus_1.0), written out."""
    loc, scale = h.chunk(2, -1)
    bias = math.log(math.expm1(0.99))
    return loc, (torch.nn.functional.softplus(scale + bias) + 0.01).clamp_min(1e-4)


def test_probabilistic_sequential_with_batchnorm_trains_and_evaluates_like_torch():
    net = _policy_torch()
    policy = _policy(net)
    assert policy.stateful and not isinstance(policy, fd.Sequential)
    params = fd.from_module(policy)
    ref = copy.deepcopy(net).train()
    key = fd.random.key(0)
    for step in range(3):
        x = _x(step)
        out, new_state = policy.apply_with_state(
            params, fd.TensorDict({"x": x}, [8]), key=fd.random.fold_in(key, step),
            interaction="random",
        )  # fmt: skip
        h = ref(x)
        loc, scale = _extract(h)
        assert_close(out["h"], h)
        assert_close(out["loc"], loc)
        lp = torch.distributions.Normal(loc, scale).log_prob(out["action"])
        assert_close(out["action_log_prob"], lp)
        assert not torch.equal(out["action"], loc)  # drawn
        # get_dist / log_prob in training mode: batch statistics, new ones dropped
        dist = policy.get_dist(params, fd.TensorDict({"x": x}, [8]))
        assert_close(dist.loc, loc)
        lp2 = policy.log_prob(params, out)
        assert_close(lp2, lp)
        params = fd.nn.update_state(params, new_state)
    assert_close(params["1", "running_mean"], ref[1].running_mean)
    assert_close(params["1", "running_var"], ref[1].running_var)
    assert int(params["1", "num_batches_tracked"]) == 3
    with pytest.raises(RuntimeError, match=r"ProbabilisticSequential.*apply_with_state"):
        policy(params, fd.TensorDict({"x": _x()}, [8]))
    ev = fd.nn.eval_mode(policy)
    assert type(ev) is fd.ProbabilisticSequential and not ev.stateful
    ref.eval()
    x = _x(7)
    out = ev(params, fd.TensorDict({"x": x}, [8]))  # deterministic: action == loc
    loc, _ = _extract(ref(x))
    assert_close(out["action"], loc)
    assert_close(ev.get_dist(params, fd.TensorDict({"x": x}, [8])).loc, loc)


def test_probabilistic_sequential_with_batchnorm_under_vmap_equals_loop():
    net = _policy_torch()
    policy = _policy(net)
    params = fd.from_module(policy)
    ps = [params.apply(lambda v, i=i: v + 0.1 * i if v.is_floating_point() else v)
          for i in range(3)]  # fmt: skip
    td = fd.TensorDict({"x": _x(3)}, [8])
    key = fd.random.key(5)

    def step(p):
        return policy.apply_with_state(p, td, key=key, interaction="random")

    out, state = fd.vmap(step, in_dims=0)(fd.stack(ps))
    loop = [step(p) for p in ps]
    assert_close(out, fd.stack([o for o, _ in loop]))
    assert_close(state, fd.stack([s for _, s in loop]))
    # each member's statistics are torch's for its own weights
    for i, p in enumerate(ps):
        ref = copy.deepcopy(net).train()
        fd.to_module(p, ref)
        ref(td["x"])
        assert_close(state[i]["1", "running_mean"], ref[1].running_mean)


def test_probabilistic_kinds_are_siblings_of_module_and_sequential():
    head = fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal)
    policy = _policy(_policy_torch())
    assert not isinstance(head, fd.Module) and isinstance(head, ModuleKind)
    assert not isinstance(policy, fd.Sequential) and isinstance(policy, ModuleKind)
    assert fd.nn.eval_mode(head) is head and fd.nn.buffer_paths(head) == ()
    with pytest.raises(TypeError, match=r"Probabilistic\(Normal -> 'action'\)\.select_out_keys"):
        head.select_out_keys("action")
    # a ProbabilisticSequential without a selection splices into a Sequential, as before
    seq = fd.Sequential(fd.Module(torch.neg, ["x"], ["x"]), policy)
    assert type(seq) is fd.Sequential and len(seq) == 1 + len(policy)
    assert seq.modules[1:] == policy.modules
    chained = fd.Module(torch.tanh, ["h"], ["h"]) >> head
    assert type(chained) is fd.Sequential and chained.modules[1] is head


def test_the_interaction_option_reaches_a_nested_sequence():
    inner = fd.ProbabilisticSequential(
        fd.Module(torch.neg, ["loc"], ["m"]),
        fd.Probabilistic({"m": "loc", "scale": "scale"}, ["a"], torch.distributions.Normal),
        selected_out_keys=["a"],
    )
    outer = fd.ProbabilisticSequential(
        fd.Module(torch.tanh, ["loc"], ["loc"]),
        inner,
        fd.Probabilistic(["loc", "scale"], ["b"], torch.distributions.Normal),
    )
    assert outer.modules[1] is inner  # kept whole: its own child loop
    td = fd.TensorDict({"loc": torch.zeros(4), "scale": torch.ones(4)}, [4])
    det = outer(None, td)
    assert torch.equal(det["a"], torch.zeros(4)) and torch.equal(det["b"], torch.zeros(4))
    key = fd.random.key(3)
    out = outer(None, td, key=key, interaction="random")
    # the nested head draws with the outer call's interaction and its own key stream
    assert not torch.equal(out["a"], det["a"]) and not torch.equal(out["b"], det["b"])
    ref = inner(None, td.set("loc", torch.tanh(td["loc"])), key=fd.random.fold_in(key, 1),
                interaction="random")  # fmt: skip
    assert torch.equal(out["a"], ref["a"])


def test_every_kind_is_called_through_the_one_entry():
    # one __call__ (forms, checks); the kinds differ through run / run_td / call_options
    for kind in (fd.Module, fd.Sequential, fd.Probabilistic, fd.ProbabilisticSequential):
        assert kind.__call__ is ModuleKind.__call__, kind
    head = fd.Probabilistic(["loc", "scale"], ["a"], torch.distributions.Normal, num_samples=3)
    policy = fd.ProbabilisticSequential(fd.Module(torch.neg, ["x"], ["loc"]), head)
    assert policy.num_samples == head.num_samples == (3,)
    td = fd.TensorDict({"x": torch.zeros(2), "scale": torch.ones(2)}, [2])
    out = policy(None, td, key=fd.random.key(0), interaction="random")
    assert out["a"].shape == (3, 2) and out["x"].shape == (3, 2)
    with pytest.raises(ValueError, match="call the ProbabilisticSequential itself"):
        fd.Sequential(fd.Module(torch.neg, ["x"], ["y"]), policy.select_out_keys("a"))(None, td)
    with pytest.raises(ValueError, match=r"which a plain fd\.Sequential cannot do"):
        fd.Sequential(fd.Module(torch.neg, ["x"], ["loc"]), head)(None, td)
