"""nn.Sequential lowered child by child: a custom child runs through FunctionalCall
inside an otherwise lowered Chain (outputs, weights, running statistics, keys)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import functd as fd
import functd.nn as fnn


class Scale(nn.Module):
    """A custom module functd cannot lower: a learned scale and a buffer."""

    def __init__(self, c: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(c, 1, 1))
        self.register_buffer("shift", torch.randn(c, 1, 1))

    def forward(self, x):
        return x * self.w + self.shift


class NormBlock(nn.Module):
    """A custom module holding a BatchNorm: stateful in training mode."""

    def __init__(self, c: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(x))


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        Scale(4),
        NormBlock(4),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(4 * 4 * 4, 3),
    )


def test_one_custom_child_leaves_the_rest_lowered():
    net = cnn().eval()
    chain = fnn.lower(net)  # no fallback needed
    assert isinstance(chain, fnn.Chain)
    kinds = [type(layer).__name__ for layer in chain.layers]
    assert kinds == [
        "Conv2d",
        "BatchNorm2d",
        "ReLU",
        "FunctionalCall",
        "FunctionalCall",
        "MaxPool2d",
        "Flatten",
        "Dropout",
        "Linear",
    ]
    assert fnn.lower(net, fallback=True) == chain or isinstance(
        fnn.lower(net, fallback=True), fnn.Chain
    )
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(chain(fnn.state_to_td(net), x), net(x))
    with pytest.raises(NotImplementedError, match="from_module"):
        chain.init(0)  # a FunctionalCall child has no pure init


def test_module_from_module_and_grads():
    net = cnn().eval()
    m = fd.Module(net, ["x"], ["y"])
    assert isinstance(m.fn, fnn.Chain)
    params = fd.from_module(m)  # read from the torch module
    flat = dict(params.items(True, True))
    assert {".".join(k) for k in flat} == set(net.state_dict())
    td = fd.TensorDict({"x": torch.randn(5, 1, 8, 8)}, [5])
    torch.testing.assert_close(m(params, td)["y"], net(td["x"]))
    trainable, state = fnn.split_state(m, params)  # buffers through the FunctionalCall too
    assert ("3", "shift") in dict(state.items(True, True))
    grads = torch.func.grad(lambda t: m(fnn.merge_state(t, state), td)["y"].square().sum())(
        trainable
    )
    net(td["x"]).square().sum().backward()
    for name, t in net.named_parameters():
        torch.testing.assert_close(grads[tuple(name.split("."))], t.grad, rtol=1e-5, atol=1e-6)


def test_training_mode_state_and_keys():
    """BatchNorm lowered and inside a FunctionalCall child, both in training mode: the
    Chain is stateful and returns both new statistics (equal to torch's after one
    forward); the Dropout child takes the key, the FunctionalCall children none."""
    net = cnn().train()
    chain = fnn.lower(net)
    assert chain.stateful and chain.random
    assert chain.buffer_paths() == (
        ("1", "running_mean"),
        ("1", "running_var"),
        ("1", "num_batches_tracked"),
        ("3", "shift"),
        ("4", "bn", "running_mean"),
        ("4", "bn", "running_var"),
        ("4", "bn", "num_batches_tracked"),
    )
    m = fd.Module(net, ["x"], ["y"])
    params = fd.from_module(m)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    td = fd.TensorDict({"x": torch.randn(5, 1, 8, 8)}, [5])
    out, state = m.apply_with_state(params, td, key=fd.random.key(0))
    out2, _ = m.apply_with_state(params, td, key=fd.random.key(0))
    assert torch.equal(out["y"], out2["y"])  # keyed dropout: pure
    out3, _ = m.apply_with_state(params, td, key=fd.random.key(1))
    assert not torch.equal(out["y"], out3["y"])
    for k, v in before.items():  # nothing written
        assert torch.equal(net.state_dict()[k], v)
    net(td["x"])  # torch updates its buffers (dropout comes after both BatchNorms)
    for path in [("1", "running_mean"), ("1", "running_var"), ("4", "bn", "running_var")]:
        torch.testing.assert_close(state[path], net.state_dict()[".".join(path)])
    with pytest.raises(ValueError, match="needs a PRNG key"):
        m.apply_with_state(params, td)


def test_ensemble_over_a_chain_with_a_fallback_child():
    net = cnn().eval()
    chain = fnn.lower(net)
    base = fnn.state_to_td(net)
    ens = fd.stack(
        [base.apply(lambda t, i=i: t + 0.01 * i if t.is_floating_point() else t) for i in range(3)]
    )
    x = torch.randn(2, 1, 8, 8)
    out = fd.vmap(chain, in_dims=(0, None))(ens, x)
    for i in range(3):
        torch.testing.assert_close(out[i], chain(ens[i], x), rtol=1e-5, atol=1e-6)


def test_names_nesting_and_what_stays_a_whole_fallback():
    named = nn.Sequential(OrderedDict(enc=nn.Linear(3, 3), odd=nn.Softmin(-1)))
    chain = fnn.lower(named)
    assert chain.names == ("enc", "odd") and isinstance(chain.layers[1], fnn.FunctionalCall)
    nested = fnn.lower(nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.Softmin(-1)), nn.ReLU()))
    assert isinstance(nested.layers[0], fnn.Chain)
    assert isinstance(nested.layers[0].layers[1], fnn.FunctionalCall)
    # shared weights across children: only a whole-module fallback keeps them tied
    lin = nn.Linear(3, 3)
    assert fnn.lower(nn.Sequential(lin, nn.Softmin(-1), lin)) is None
    # a random child in training mode runs through FunctionalCall, keyed
    rrelu = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.RReLU()))
    chain = fnn.lower(rrelu)
    assert isinstance(chain.layers[1].layers[0], fnn.FunctionalCall) and chain.random
    m = fd.Module(rrelu, ["x"], ["y"])
    p, x = fd.from_module(m), -torch.rand(4, 3) - 5
    with pytest.raises(ValueError, match=r"FunctionalCall\(RReLU\): rrelu draws random"):
        m(p, x=x)
    k = fd.random.key(0)
    assert torch.equal(m(p, x=x, key=k), m(p, x=x, key=k))
