"""BatchNorm: new running statistics are returned, never written; checked step by
step against ``torch.nn.BatchNorm1d/2d`` trained with ``torch.optim.SGD``."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import functd as fd
import functd.nn as fnn
from functd.testing import assert_close

D = torch.float64
LR = 0.1


def _net(kind: str, momentum, affine: bool) -> nn.Sequential:
    torch.manual_seed(0)
    if kind == "1d":
        net = nn.Sequential(
            nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=momentum, affine=affine), nn.Tanh()
        )
    elif kind == "1d_seq":  # (N, C, L) input
        net = nn.Sequential(
            nn.Conv1d(2, 4, 3), nn.BatchNorm1d(4, momentum=momentum, affine=affine), nn.ReLU()
        )
    else:
        net = nn.Sequential(
            nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, momentum=momentum, affine=affine), nn.ReLU()
        )
    return net.to(D)


def _input(kind: str, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    shape = {"1d": (8, 3), "1d_seq": (6, 2, 7), "2d": (5, 2, 6, 6)}[kind]
    return (torch.randn(shape, generator=g, dtype=D) * 2 + 1).to(D)


def _fd_model(net: nn.Sequential) -> fd.Sequential:
    """One fd.Module per child, so the params nest by position like net.state_dict()."""
    keys = ["x", "h0", "h1", "y"]
    return fd.Sequential(
        *[fd.Module(copy.deepcopy(c), [keys[i]], [keys[i + 1]]) for i, c in enumerate(net)]
    )


def _sgd_step(model, trainable, state, td):
    """A hand-written SGD step differentiating only the trainable half."""

    def loss_fn(tr, st, td):
        out, new_state = model.apply_with_state(fnn.merge_state(tr, st), td)
        return (out["y"] ** 2).mean(), (out, new_state)

    grads, (out, new_state) = torch.func.grad(loss_fn, has_aux=True)(trainable, state, td)
    trainable = trainable.apply(lambda p, g: p - LR * g, grads)
    return trainable, fnn.update_state(state, new_state), out


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("kind", ["1d", "1d_seq", "2d"])
def test_matches_torch_over_5_training_steps_then_eval(kind, momentum, affine):
    net = _net(kind, momentum, affine)
    model = _fd_model(net)
    assert model.stateful
    params = fd.from_module(model).clone()  # a copy: net trains in place below
    trainable, state = fnn.split_state(model, params)
    assert state.keys(True, True) == (
        ("1", "running_mean"),
        ("1", "running_var"),
        ("1", "num_batches_tracked"),
    )
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(5):
        x = _input(kind, step)
        trainable, state, out = _sgd_step(model, trainable, state, fd.TensorDict({"x": x}, []))
        opt.zero_grad()
        y = net(x)
        (y**2).mean().backward()
        opt.step()
        torch.testing.assert_close(out["y"], y.detach(), rtol=1e-10, atol=1e-12)
        assert_close(fnn.merge_state(trainable, state), fd.from_module(net), rtol=1e-10, atol=1e-12)
    assert state["1", "num_batches_tracked"].item() == 5
    net.eval()
    evaluate = fnn.eval_mode(model)
    assert not evaluate.stateful and evaluate.modules[1].fn.training is False
    x = _input(kind, 99)
    torch.testing.assert_close(
        evaluate(fnn.merge_state(trainable, state), x=x)[-1], net(x), rtol=1e-10, atol=1e-12
    )


def test_without_running_stats_uses_batch_stats_in_both_modes():
    bn = nn.BatchNorm2d(3, track_running_stats=False).to(D)
    m = fd.Module(bn, ["x"], ["y"])
    assert not m.stateful and fnn.buffer_paths(m) == ()
    params = fd.from_module(m)
    assert params.keys() == ("weight", "bias")
    x = torch.randn(4, 3, 5, 5, dtype=D)
    torch.testing.assert_close(m(params, x=x), bn(x))
    out, new_state = m.apply_with_state(params, fd.TensorDict({"x": x}, [4]))
    assert new_state.is_empty()
    torch.testing.assert_close(out["y"], bn(x))
    bn.eval()
    torch.testing.assert_close(fnn.eval_mode(m)(params, x=x), bn(x))
    trainable, state = fnn.split_state(m, params)
    assert state.is_empty() and trainable.keys() == ("weight", "bias")


def test_layer_call_returns_new_state_and_writes_nothing():
    bn = fnn.BatchNorm1d(3)
    params = bn.init(0).set("running_mean", torch.randn(3)).clone()
    before = params.clone()
    x = torch.randn(8, 3)
    x0 = x.clone()
    y, new_state = bn(params, x)
    assert new_state.keys() == ("running_mean", "running_var", "num_batches_tracked")
    assert_close(params, before)
    assert torch.equal(x, x0)
    ref = nn.BatchNorm1d(3)
    fd.to_module(params, ref)
    torch.testing.assert_close(y, ref(x))
    torch.testing.assert_close(new_state["running_mean"], ref.running_mean)
    torch.testing.assert_close(new_state["running_var"], ref.running_var)


def test_torch_functional_call_writes_the_buffers_it_is_given_functd_does_not():
    bn = nn.BatchNorm1d(3)
    x = torch.randn(8, 3) * 3 + 1
    given = {k: v.clone() for k, v in bn.state_dict().items()}
    kept = {k: v.clone() for k, v in given.items()}
    expected = torch.func.functional_call(bn, given, (x,))
    assert not torch.equal(given["running_mean"], kept["running_mean"])  # the peer mutates
    m = fd.Module(bn, ["x"], ["y"])
    params = fd.from_module(m).clone()
    td = fd.TensorDict({"x": x}, [8])
    snapshot = [v.clone() for v in fd.tree.leaves((params, td))]
    out, new_state = m.apply_with_state(params, td)
    for a, b in zip(fd.tree.leaves((params, td)), snapshot):
        assert torch.equal(a, b)
    torch.testing.assert_close(out["y"], expected)
    torch.testing.assert_close(new_state["running_mean"], given["running_mean"])
    torch.testing.assert_close(new_state["running_var"], given["running_var"])
    assert new_state["num_batches_tracked"].item() == 1
    assert torch.equal(bn.running_mean, torch.zeros(3))  # the torch module is untouched


def _ensemble(n: int = 4):
    model = fd.Sequential(
        fd.Module(fnn.Linear(3, 4), ["x"], ["h"]),
        fd.Module(fnn.BatchNorm1d(4), ["h"], ["h"]),
        fd.Module(torch.relu, ["h"], ["y"]),
    )
    members = []
    for i in range(n):
        p = model.init(fd.random.key(i))
        members.append(p.set(("1", "running_var"), torch.full((4,), 1.0 + i)))
    return model, members


def test_vmap_ensemble_keeps_per_member_statistics():
    model, members = _ensemble()
    ens = fd.stack(members)
    td = fd.TensorDict({"x": torch.randn(4, 8, 3)}, [4])  # one batch of 8 per member
    out, new_state = torch.func.vmap(model.apply_with_state)(ens, td)
    assert new_state.batch_size == torch.Size([4])
    for i, p in enumerate(members):
        o, s = model.apply_with_state(p, td[i])
        assert_close(out[i], o, rtol=1e-5, atol=1e-6)
        assert_close(new_state[i], s, rtol=1e-5, atol=1e-6)
    # the same data for every member
    shared = fd.TensorDict({"x": torch.randn(8, 3)}, [8])
    out, new_state = torch.func.vmap(model.apply_with_state, in_dims=(0, None))(ens, shared)
    for i, p in enumerate(members):
        assert_close(new_state[i], model.apply_with_state(p, shared)[1], rtol=1e-5, atol=1e-6)
    # eval mode of the ensemble uses each member's statistics
    evaluate = fnn.eval_mode(model)
    updated = fnn.update_state(ens, new_state)
    outs = torch.func.vmap(evaluate, in_dims=(0, None))(updated, shared)
    for i in range(4):
        assert_close(outs[i], evaluate(updated[i], shared), rtol=1e-5, atol=1e-6)


def test_vmap_ensemble_training_loop_equals_loop_over_members():
    model, members = _ensemble(3)
    ens = fd.stack(members)
    tr, st = fnn.split_state(model, ens)
    step = torch.func.vmap(lambda tr, st, td: _sgd_step(model, tr, st, td)[:2])
    loop = [fnn.split_state(model, p) for p in members]
    for _ in range(3):
        td = fd.TensorDict({"x": torch.randn(3, 6, 3)}, [3])
        tr, st = step(tr, st, td)
        loop = [_sgd_step(model, t, s, td[i])[:2] for i, (t, s) in enumerate(loop)]
    for i, (t, s) in enumerate(loop):
        assert_close(tr[i], t, rtol=1e-5, atol=1e-6)
        assert_close(st[i], s, rtol=1e-5, atol=1e-6)
    assert torch.equal(st["1", "num_batches_tracked"], torch.full((3,), 3))


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(2, 6),
    momentum=st.sampled_from([0.1, 0.5, None]),
    steps=st.integers(1, 3),
)
def test_property_layer_matches_torch_module(n, momentum, steps):
    ref = nn.BatchNorm1d(2, momentum=momentum).to(D)
    layer = fnn.lower(ref)
    params = fd.from_module(ref).clone()
    g = torch.Generator().manual_seed(n)
    for _ in range(steps):
        x = torch.randn(n, 2, generator=g, dtype=D)
        y, new_state = layer(params, x)
        params = fnn.update_state(params, new_state)
        torch.testing.assert_close(y, ref(x))
    assert_close(params, fd.from_module(ref))


def test_grad_in_training_mode_matches_autograd():
    net = _net("2d", 0.1, True)
    model = _fd_model(net)
    params = fd.from_module(model).clone()
    trainable, state = fnn.split_state(model, params)
    x = _input("2d", 0)

    def loss(tr):
        out, _ = model.apply_with_state(fnn.merge_state(tr, state), fd.TensorDict({"x": x}, []))
        return out["y"].pow(3).mean()

    grads = torch.func.grad(loss)(trainable)
    net(x).pow(3).mean().backward()
    expected = fd.TensorDict(
        {name: {k: v.grad for k, v in c.named_parameters()} for name, c in net.named_children()}
    ).exclude("2")
    assert_close(grads, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.compile
def test_compile_fullgraph_equals_eager():
    torch._dynamo.reset()
    model, members = _ensemble(1)
    params = members[0]
    td = fd.TensorDict({"x": torch.randn(8, 3)}, [8])
    compiled = torch.compile(model.apply_with_state, fullgraph=True, backend="aot_eager")
    assert_close(compiled(params, td), model.apply_with_state(params, td), rtol=1e-5, atol=1e-6)
    step = torch.compile(lambda tr, st, td: _sgd_step(model, tr, st, td), fullgraph=True)
    tr, st = fnn.split_state(model, params)
    assert_close(step(tr, st, td), _sgd_step(model, tr, st, td), rtol=1e-5, atol=1e-6)


def test_from_module_to_module_round_trip_after_training():
    net = _net("1d", 0.1, True)
    model = _fd_model(net)
    trainable, state = fnn.split_state(model, fd.from_module(model).clone())
    for step in range(3):
        td = fd.TensorDict({"x": _input("1d", step)}, [])
        trainable, state, _ = _sgd_step(model, trainable, state, td)
    params = fnn.merge_state(trainable, state)
    fresh = _net("1d", 0.1, True)
    fd.to_module(params, fresh)
    assert fresh[1].num_batches_tracked.item() == 3
    assert_close(fd.from_module(fresh), params)
    fresh.eval()
    x = _input("1d", 7)
    torch.testing.assert_close(fnn.eval_mode(model)(params, x=x)[-1], fresh(x))


def test_chain_from_lowered_sequential_returns_nested_state():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.BatchNorm1d(4)).to(D)
    chain = fnn.lower(net)
    assert isinstance(chain, fnn.Chain) and chain.stateful
    assert chain.buffer_paths() == fnn.buffer_paths(net)
    params = fd.from_module(net).clone()
    x = torch.randn(6, 3, dtype=D)
    y, new_state = chain(params, x)
    torch.testing.assert_close(y, net(x))
    assert new_state.keys() == ("1", "3")
    assert_close(fnn.update_state(params, new_state), fd.from_module(net))
    net.eval()
    torch.testing.assert_close(fnn.eval_mode(chain)(params, x), fnn.lower(net)(params, x))
    m = fd.Module(net.train(), ["x"], ["y"])
    assert m.stateful and fnn.split_state(m, params)[1].keys() == ("1", "3")


def test_modes_switch_batchnorm_dropout_and_functional_call():
    model = fd.Sequential(
        fd.Module(nn.Linear(3, 4), ["x"], ["h"]),
        fd.Module(nn.BatchNorm1d(4), ["h"], ["h"]),
        fd.Module(nn.Dropout(0.5), ["h"], ["h"]),
        fd.Module(nn.Softmin(-1), ["h"], ["y"]),  # runs through FunctionalCall
    )
    ev = fnn.eval_mode(model)
    assert ev.modules[1].fn == fnn.BatchNorm1d(4, training=False)
    assert ev.modules[2].fn == fnn.Dropout(0.5, training=False) and not ev.random
    assert ev.modules[3].fn.module.training is False
    assert model.modules[3].fn.module.training is True  # unchanged
    assert fnn.train_mode(ev).modules[:3] == model.modules[:3]
    assert fnn.eval_mode(ev) == ev
    assert_close(fd.from_module(ev), fd.from_module(model))  # still reads the torch weights
    assert fnn.eval_mode(fnn.BatchNorm2d(3)) == fnn.BatchNorm2d(3, training=False)


def test_one_mode_switch_one_field_on_every_layer_and_kind():
    """Every layer and module kind answers ``with_training`` itself (``fd.nn.eval_mode``
    only asks); a layer's mode is its ``training`` field, whatever the layer."""
    from functd.nn._state import HasMode

    moded = [
        fnn.Dropout(0.5),
        fnn.BatchNorm1d(3),
        fnn.GRU(3, 4, num_layers=2, dropout=0.1),
        fnn.MultiheadAttention(8, 2, dropout=0.1, training=True),
    ]
    for layer in moded:
        ev = layer.with_training(False)
        assert ev.training is False and ev == dataclasses.replace(layer, training=False)
        assert ev.with_training(False) is ev and layer.with_training(True) is layer
        assert fnn.eval_mode(layer) == ev and fnn.train_mode(ev) == layer
    lin = fnn.Linear(3, 4)  # no mode: itself
    assert lin.with_training(False) is lin and fnn.eval_mode(lin) is lin
    chain = fnn.Chain((lin, fnn.Dropout(0.5)))
    assert chain.with_training(False).layers == (lin, fnn.Dropout(0.5, training=False))
    m = fd.Module(fnn.Dropout(0.5), ["x"], ["y"])
    for obj in (*moded, lin, chain, m, fd.Sequential(m)):
        assert isinstance(obj, HasMode)
    assert not isinstance(nn.Dropout(0.5), HasMode)
    assert fd.Sequential(m).with_training(False).modules[0].fn == fnn.Dropout(0.5, training=False)
    with pytest.raises(TypeError):  # `training` is keyword-only: no silent flip of Dropout(p, True)
        fnn.Dropout(0.5, True)
    with pytest.raises(TypeError, match=r"buffer_paths\(module\): expected a module"):
        fnn.buffer_paths(fnn.BatchNorm1d)  # the class, not a layer


def test_plain_call_in_training_mode_is_an_error_not_a_silent_drop():
    m = fd.Module(nn.BatchNorm1d(3), ["x"], ["y"])
    params = fd.from_module(m).clone()
    td = fd.TensorDict({"x": torch.randn(5, 3)}, [5])
    snapshot = [v.clone() for v in fd.tree.leaves((params, td))]
    with pytest.raises(RuntimeError, match=r"Module\(BatchNorm1d -> 'y'\).*apply_with_state"):
        m(params, td)
    with pytest.raises(RuntimeError, match="eval_mode"):
        m(params, x=td["x"])
    seq = fd.Sequential(fd.Module(torch.tanh, ["x"], ["h"]), m.__class__(m.fn, ["h"], ["y"]))
    with pytest.raises(RuntimeError, match=r"module 1 \(Module\(BatchNorm1d -> 'y'\)\)"):
        seq(fd.TensorDict({"1": params}), td)
    for a, b in zip(fd.tree.leaves((params, td)), snapshot):
        assert torch.equal(a, b)


def test_bad_inputs_have_clear_errors():
    bn = fnn.BatchNorm1d(4)
    params = bn.init(0)
    with pytest.raises(
        ValueError, match=r"BatchNorm1d\(4\): expected an input of shape \(N, 4, \*\)"
    ):
        bn(params, torch.randn(5, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(params, torch.randn(1, 4))
    m = fd.Module(bn, ["x"], ["y"])
    with pytest.raises(KeyError, match=r"lack the buffer\(s\) 'running_mean'"):
        fnn.split_state(m, params.exclude("running_mean"))
    trainable, state = fnn.split_state(m, params)
    assert_close(fnn.merge_state(trainable, state), params)
    with pytest.raises(KeyError, match=r"'weight' in both parts"):
        fnn.merge_state(params, state.set("weight", torch.ones(4)))
    with pytest.raises(KeyError, match=r"new_state has \('1', 'running_mean'\), which params lack"):
        fnn.update_state(params, fd.TensorDict({"1": state}))
    with pytest.raises(ValueError, match=r"new_state\['running_mean'\] has shape \[3\]"):
        fnn.update_state(params, state.set("running_mean", torch.zeros(3)))
    with pytest.raises(TypeError, match="second argument must be a TensorDict"):
        fnn.update_state(params, {"running_mean": torch.zeros(4)})
    with pytest.raises(TypeError, match=r"eval_mode\(module\) switches functd modules.*Wrap it"):
        fnn.eval_mode(nn.BatchNorm1d(3))
    with pytest.raises(TypeError, match=r"eval_mode\(module\): expected an fd\.Module"):
        fnn.eval_mode("bn")
    assert_close(params, bn.init(0))  # nothing changed by the failed calls


class _ConvBN(nn.Module):
    """A custom module holding a BatchNorm: functd runs it through FunctionalCall."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3, momentum=0.3)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_functional_call_of_a_custom_module_returns_its_new_statistics():
    torch.manual_seed(0)
    net = _ConvBN().to(D)
    m = fd.Module(copy.deepcopy(net), ["x"], ["y"])
    assert isinstance(m.fn, fnn.FunctionalCall) and m.stateful
    params = fd.from_module(m).clone()
    trainable, state = fnn.split_state(m, params)
    assert state.keys(True, True) == (
        ("bn", "running_mean"),
        ("bn", "running_var"),
        ("bn", "num_batches_tracked"),
    )
    with pytest.raises(RuntimeError, match="apply_with_state"):
        m(params, x=_input("2d", 0))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(3):
        x = _input("2d", step)
        trainable, state, out = _sgd_step(m, trainable, state, fd.TensorDict({"x": x}, []))
        opt.zero_grad()
        y = net(x)
        (y**2).mean().backward()
        opt.step()
        torch.testing.assert_close(out["y"], y.detach(), rtol=1e-10, atol=1e-12)
    assert_close(fnn.merge_state(trainable, state), fd.from_module(net), rtol=1e-10, atol=1e-12)
    ev = fnn.eval_mode(m)
    assert not ev.stateful and m.stateful
    x = _input("2d", 9)
    torch.testing.assert_close(
        ev(fnn.merge_state(trainable, state), x=x), net.eval()(x), rtol=1e-10, atol=1e-12
    )


def test_instance_norm_with_running_stats_through_functional_call():
    norm = nn.InstanceNorm1d(3, track_running_stats=True, affine=True).to(D)
    m = fd.Module(copy.deepcopy(norm), ["x"], ["y"])
    assert isinstance(m.fn, fnn.FunctionalCall) and m.stateful
    params = fd.from_module(m).clone()
    x = torch.randn(4, 3, 6, dtype=D)
    out, new_state = m.apply_with_state(params, fd.TensorDict({"x": x}, [4]))
    torch.testing.assert_close(out["y"], norm(x))
    assert_close(fnn.update_state(params, new_state), fd.from_module(norm))
    assert not fnn.eval_mode(m).stateful


def test_nested_selected_sequential_nests_its_state_like_its_params():
    inner = fd.Sequential(
        fd.Module(fnn.Linear(3, 4), ["x"], ["h"]),
        fd.Module(fnn.BatchNorm1d(4), ["h"], ["z"]),
        selected_out_keys=["z"],
    )
    model = fd.Sequential(
        fd.Module(torch.tanh, ["x"], ["x"]), inner, fd.Module(fnn.BatchNorm1d(4), ["z"], ["y"])
    )
    assert model.stateful and inner.stateful
    params = model.init(0)
    assert fnn.buffer_paths(model) == (
        ("1", "1", "running_mean"),
        ("1", "1", "running_var"),
        ("1", "1", "num_batches_tracked"),
        ("2", "running_mean"),
        ("2", "running_var"),
        ("2", "num_batches_tracked"),
    )
    td = fd.TensorDict({"x": torch.randn(6, 3)}, [6])
    out, new_state = model.apply_with_state(params, td)
    assert set(out.keys()) == {"x", "z", "y"}
    _, s_inner = inner.apply_with_state(params["1"], td.set("x", torch.tanh(td["x"])))
    assert_close(new_state["1"], s_inner)
    y, s_bn = fnn.BatchNorm1d(4)(params["2"], out["z"])
    assert_close(new_state["2"], s_bn)
    torch.testing.assert_close(out["y"], y)
