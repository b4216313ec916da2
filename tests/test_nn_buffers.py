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
        grads, (y, new) = torch.func.grad(loss, has_aux=True)(trainable, state, fd.TensorDict({"x": x}, [3]))
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
        grads, new = torch.func.grad(loss, has_aux=True)(trainable, state, fd.TensorDict({"x": x}, [3]))
        state = fd.nn.update_state(state, new)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        trainable = fd.optim.apply_updates(trainable, updates)
        torch_opt.zero_grad()
        _loss(ref(x)).backward()
        torch_opt.step()
    after = fd.nn.merge_state(trainable, state)
    for path, v in fd.from_module(ref).items(True, True):
        torch.testing.assert_close(after.get(path), v, atol=1e-10, rtol=0)
