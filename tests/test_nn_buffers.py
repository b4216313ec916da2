"""Buffers a torch module writes in forward, run through fd.Module (FunctionalCall).

Reference: the torch module itself, called the same number of times (its buffers
move in place), and torch.optim on it. spectral_norm (both APIs) is known state in
training mode; a custom module's buffers are declared with
``FunctionalCall(module, state=[...])``; any other write is refused, naming it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import functd as fd
from functd.testing import assert_close


def _old_spectral_norm():
    return nn.utils.spectral_norm(nn.Linear(6, 4))


def _old_weight_norm():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(nn.Linear(6, 4))


BUILDERS = {
    "spectral_norm": lambda: nn.utils.parametrizations.spectral_norm(nn.Linear(6, 4)),
    "spectral_norm_conv": lambda: nn.utils.parametrizations.spectral_norm(nn.Conv1d(6, 4, 3)),
    "old_spectral_norm": _old_spectral_norm,
    "weight_norm": lambda: nn.utils.parametrizations.weight_norm(nn.Linear(6, 4)),
    "old_weight_norm": _old_weight_norm,
    "sequential_spectral_norm": lambda: nn.Sequential(  # lowered onto a Chain around it
        nn.utils.parametrizations.spectral_norm(nn.Linear(6, 5)), nn.Tanh(), nn.Linear(5, 4)
    ),
}


def _pair(name, dtype=torch.float32):
    """Two equal modules, built from the same seed (torch cannot deepcopy the older
    weight_norm): the reference, and the one functd wraps."""
    torch.manual_seed(0)
    ref = BUILDERS[name]().to(dtype)
    torch.manual_seed(0)
    return ref, fd.Module(BUILDERS[name]().to(dtype), ["x"], ["y"])


def _x(name, i, dtype=torch.float32):
    shape = (3, 6, 5) if name.endswith("conv") else (3, 6)
    return torch.randn(shape, generator=torch.Generator().manual_seed(i), dtype=dtype)


def _flat(td):
    return torch.cat([v.flatten() for _, v in sorted(td.items(True, True))])


def _loss(y):
    return (y.sin() * torch.arange(y.numel()).reshape(y.shape)).sum()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_training_calls_in_lockstep_with_torch(name):
    """Four calls threading the new state equal four calls of the torch module: the
    outputs, the buffers after each call and the gradients w.r.t. the parameters."""
    ref, m = _pair(name)
    assert m.stateful == ("spectral" in name)
    trainable, state = fd.nn.split_state(m, fd.from_module(m).clone())
    first = state

    def loss(p, s, td):
        out, new = m.apply_with_state(fd.nn.merge_state(p, s), td)
        return _loss(out["y"]), (out["y"], new)

    for i in range(4):
        x = _x(name, i)
        grads, (y, new) = torch.func.grad(loss, has_aux=True)(
            trainable, state, fd.TensorDict({"x": x}, [3])
        )
        state = fd.nn.update_state(state, new)
        ref.zero_grad()
        y_ref = ref(x)
        _loss(y_ref).backward()
        torch.testing.assert_close(y, y_ref, atol=1e-6, rtol=1e-6)
        assert_close(state, fd.nn.split_state(m, fd.from_module(ref))[1], rtol=0, atol=0)
        for path, g in grads.items(True, True):
            p = ref.get_parameter(".".join(path) if isinstance(path, tuple) else path)
            torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-6)
    if "spectral" in name:  # the power iteration moved the vectors from where they began
        assert not torch.equal(_flat(state), _flat(first))


@pytest.mark.parametrize("name", ["spectral_norm", "old_spectral_norm", "weight_norm"])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_float64_optimizer_steps_in_lockstep_with_torch_optim(name, opt):
    ref, m = _pair(name, torch.float64)
    trainable, state = fd.nn.split_state(m, fd.from_module(m).clone())
    tx = fd.optim.adam(1e-2) if opt == "adam" else fd.optim.sgd(1e-1, momentum=0.9)
    opt_state = tx.init(trainable)
    torch_opt = (
        torch.optim.Adam(ref.parameters(), lr=1e-2)
        if opt == "adam"
        else torch.optim.SGD(ref.parameters(), lr=1e-1, momentum=0.9)
    )

    def loss(p, s, td):
        out, new = m.apply_with_state(fd.nn.merge_state(p, s), td)
        return _loss(out["y"]), new

    for i in range(3):
        x = _x(name, i, torch.float64)
        grads, new = torch.func.grad(loss, has_aux=True)(
            trainable, state, fd.TensorDict({"x": x}, [3])
        )
        state = fd.nn.update_state(state, new)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        trainable = fd.optim.apply_updates(trainable, updates)
        torch_opt.zero_grad()
        _loss(ref(x)).backward()
        torch_opt.step()
    after = fd.nn.merge_state(trainable, state)
    for path, v in fd.from_module(ref).items(True, True):
        torch.testing.assert_close(after.get(path), v, atol=1e-10, rtol=0)


class RunningMean(nn.Module):
    """Normalises by a running mean it keeps itself, written in forward (``how``)."""

    def __init__(self, how):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("mean", torch.zeros(3))
        self.how = how

    def forward(self, x):
        new = 0.9 * self.mean + 0.1 * x.detach().mean(0)
        if self.how == "add_":
            self.count.add_(1)
            self.mean.mul_(0.9).add_(0.1 * x.detach().mean(0))
        elif self.how == "copy_":
            self.count += 1
            self.mean.copy_(new)
        elif self.how == "setitem":
            self.count[...] = self.count + 1
            self.mean[:] = new
        else:  # reassign
            self.count = self.count + 1
            self.mean = new
        return self.lin(x - self.mean)


HOW = ["add_", "copy_", "setitem", "reassign"]


def _custom(how):
    torch.manual_seed(0)
    ref = RunningMean(how)
    torch.manual_seed(0)
    net = RunningMean(how)
    m = fd.Module(fd.nn.FunctionalCall(net, state=["count", "mean"]), ["x"], ["y"])
    return ref, m, fd.nn.state_to_td(net).clone()


@pytest.mark.parametrize("how", HOW)
def test_declared_buffers_written_in_forward_come_back_as_state(how):
    ref, m, params = _custom(how)
    before = params.clone()
    assert m.stateful
    for i in range(3):
        x = _x("custom", i)[:, :3]
        out, new = m.apply_with_state(params, fd.TensorDict({"x": x}, [3]))
        assert sorted(new.keys()) == ["count", "mean"]
        assert_close(params, before) if i == 0 else None  # the given params are not written
        params = fd.nn.update_state(params, new)
        torch.testing.assert_close(out["y"], ref(x), atol=1e-6, rtol=1e-6)
        assert_close(
            fd.nn.split_state(m, params)[1], fd.nn.split_state(m, fd.nn.state_to_td(ref))[1]
        )
    assert params["count"].item() == 3
    assert fd.nn.eval_mode(m).stateful  # declared state is state in both modes


UNDECLARED = (
    r"FunctionalCall\(RunningMean\): forward wrote the buffer\(s\) 'count', 'mean' \(in place "
    r"or by assignment\).*FunctionalCall\(module, state=\['count', 'mean'\]\).*"
    r"apply_with_state.*eval mode"
)


@pytest.mark.parametrize("how", HOW)
def test_a_write_to_an_undeclared_buffer_is_refused_naming_it(how):
    m = fd.Module(RunningMean(how), ["x"], ["y"])
    params = fd.from_module(m)
    before = params.clone()
    td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])
    assert not m.stateful
    with pytest.raises(RuntimeError, match=UNDECLARED):
        m(params, td)
    with pytest.raises(RuntimeError, match=UNDECLARED):
        m.apply_with_state(params, td)
    assert_close(params, before)


@pytest.mark.parametrize("how", ["add_", "reassign"])
def test_undeclared_writes_are_refused_under_vmap_and_grad(how):
    m = fd.Module(RunningMean(how), ["x"], ["y"])
    params = fd.from_module(m)
    td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])
    stacked = fd.stack([params, params.apply(lambda t: t + 1)])  # the buffers batched too
    with pytest.raises(RuntimeError, match=UNDECLARED):
        fd.vmap(lambda p: m(p, td)["y"])(stacked)
    trainable, held = fd.partition(params, fd.trainable(m))
    with pytest.raises(RuntimeError, match=UNDECLARED):
        torch.func.grad(lambda p: m(fd.combine(p, held), td)["y"].sum())(trainable)


def test_declared_state_of_a_vmapped_ensemble_equals_a_loop():
    _, m, params = _custom("add_")
    stacked = fd.stack([params, params.apply(lambda t: t * 2), params.apply(lambda t: t - 1)])
    td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])
    outs, states = fd.vmap(lambda p: m.apply_with_state(p, td))(stacked)
    for i in range(3):
        out, state = m.apply_with_state(stacked[i], td)
        torch.testing.assert_close(outs[i]["y"], out["y"])
        assert_close(states[i], state)


@pytest.mark.parametrize("name", ["spectral_norm", "old_spectral_norm"])
def test_eval_mode_writes_nothing(name):
    ref, m = _pair(name)
    params = fd.from_module(m)
    before = fd.from_module(ref).clone()
    evaluate = fd.nn.eval_mode(m)
    assert m.stateful and not evaluate.stateful
    x = _x(name, 0)
    y = evaluate(params, fd.TensorDict({"x": x}, [3]))["y"]
    torch.testing.assert_close(y, ref.eval()(x), atol=1e-6, rtol=1e-6)
    assert_close(fd.from_module(ref), before)  # torch's eval call did not move them either
    assert_close(params, before)


def test_a_plain_call_in_training_mode_refuses_to_drop_spectral_norms_vectors():
    _, m = _pair("spectral_norm")
    with pytest.raises(
        RuntimeError, match=r"Module\(ParametrizedLinear -> 'y'\).*apply_with_state"
    ):
        m(fd.from_module(m), fd.TensorDict({"x": _x("spectral_norm", 0)}, [3]))


def test_state_names_must_be_buffers_of_the_module():
    with pytest.raises(
        KeyError,
        match=r"FunctionalCall\(RunningMean, state=...\): \['lin.weight'\] are not buffers.*\['count', 'mean'\]",
    ):
        fd.nn.FunctionalCall(RunningMean("add_"), state=["lin.weight"])
    with pytest.raises(TypeError, match=r"state takes a list of dotted buffer names"):
        fd.nn.FunctionalCall(RunningMean("add_"), state="count")


@pytest.mark.compile
def test_compiled_calls_return_the_same_state_and_refuse_the_same_writes():
    _, m = _pair("spectral_norm")
    params, td = fd.from_module(m), fd.TensorDict({"x": _x("spectral_norm", 0)}, [3])
    f = torch.compile(m.apply_with_state, backend="eager", fullgraph=True)
    (out, new), (out_e, new_e) = f(params, td), m.apply_with_state(params, td)
    torch.testing.assert_close(out["y"], out_e["y"])
    assert_close(new, new_e)
    plain = fd.Module(RunningMean("add_"), ["x"], ["y"])
    with pytest.raises(Exception, match=UNDECLARED):
        torch.compile(plain, backend="eager")(fd.from_module(plain), td.set("x", td["x"][:, :3]))


@pytest.mark.parametrize("name", ["spectral_norm", "old_spectral_norm"])
def test_a_vmapped_ensemble_of_spectral_norm_layers_equals_a_loop(name):
    """torch.func.vmap has no rule for the out= of the power iteration: functd runs those
    writes as copies under torch.func, so an ensemble trains its vectors too."""
    _, m = _pair(name)
    params = fd.from_module(m)
    members = [params, params.apply(lambda t: t * 2), params.apply(lambda t: -t)]
    stacked = fd.stack(members)
    for i in range(2):
        td = fd.TensorDict({"x": _x(name, i)}, [3])
        outs, states = fd.vmap(lambda p, td=td: m.apply_with_state(p, td))(stacked)
        for j in range(3):
            out, state = m.apply_with_state(members[j], td)
            torch.testing.assert_close(outs[j]["y"], out["y"], atol=1e-6, rtol=1e-6)
            assert_close(states[j], state, atol=1e-6, rtol=1e-6)
            members[j] = fd.nn.update_state(members[j], state)
        stacked = fd.nn.update_state(stacked, states)
