"""Pooling layers against torch.nn's pooling modules: outputs, grads, lowering, config values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import functd as fd
import functd.nn as fnn

D = torch.float64
KINDS = ("MaxPool", "AvgPool", "LPPool", "AdaptiveMaxPool", "AdaptiveAvgPool")


@st.composite
def pools(draw):
    """A torch pooling module of any kind and dim with a random config, and an input."""
    kind = draw(st.sampled_from(KINDS))
    n = draw(st.integers(1, 3))
    cls = getattr(nn, f"{kind}{n}d")
    ints = st.integers(1, 3)
    kernel = tuple(draw(ints) for _ in range(n))
    k_arg = kernel[0] if n == 1 else kernel  # torch's LPPool1d takes an int only
    batched = draw(st.booleans())
    if kind.startswith("Adaptive"):
        out = tuple(draw(st.one_of(st.integers(1, 4), st.none())) for _ in range(n))
        out = out if n > 1 else draw(st.integers(1, 4))  # 1d: ints only, as torch
        args = [out] + ([draw(st.booleans())] if kind == "AdaptiveMaxPool" else [])
        spatial = [draw(st.integers(1, 7)) for _ in range(n)]
    else:
        stride = draw(st.one_of(st.none(), st.integers(1, 3)))
        ceil = draw(st.booleans())
        dil = tuple(draw(st.integers(1, 2)) for _ in range(n)) if kind == "MaxPool" else (1,) * n
        pad = tuple(draw(st.integers(0, k // 2)) for k in kernel)
        if kind == "MaxPool":
            args = [k_arg, stride, pad, dil, draw(st.booleans()), ceil]
        elif kind == "AvgPool":
            args = [k_arg, stride, pad, ceil, draw(st.booleans())]
            args += [draw(st.one_of(st.none(), st.integers(1, 4)))] if n > 1 else []
        else:
            args = [draw(st.sampled_from([1.0, 2.0, 3.5])), k_arg, stride, ceil]
        spatial = [d * (k - 1) + 1 + draw(st.integers(0, 4)) for k, d in zip(kernel, dil)]
    shape = ([2] if batched else []) + [3, *spatial]
    return cls(*args), shape


def _grads(f, x):
    x = x.clone().requires_grad_()
    out = f(x)
    y = out[0] if isinstance(out, tuple) else out
    (g,) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel(), dtype=D).view_as(y)).sum(), x)
    return out, g


@given(pools())
def test_pool_matches_torch_module(case):
    module, shape = case
    layer = fnn.lower(module)
    assert type(layer).__name__ == type(module).__name__
    x = torch.rand(shape, dtype=D) + 0.1  # positive: LPPool with an odd power is NaN below 0
    out, g = _grads(lambda t: layer(fnn.state_to_td(module), t), x)
    ref, g_ref = _grads(module, x)
    for a, b in zip(
        out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)
    ):
        assert torch.equal(a, b)
    assert torch.equal(g, g_ref)
    # the layer built from the module's (unnormalised) config is the lowered value
    assert fnn.lower(module) == layer and hash(fnn.lower(module)) == hash(layer)


def test_configs_normalise_to_one_value():
    assert fnn.MaxPool2d(2) == fnn.MaxPool2d((2, 2), stride=(2, 2), padding=0, dilation=(1, 1))
    assert fnn.MaxPool2d(2).stride == (2, 2)
    assert fnn.AvgPool1d(3) == fnn.AvgPool1d((3,), 3, (0,))
    assert fnn.LPPool2d(2, 3) == fnn.LPPool2d(2.0, (3, 3), (3, 3))
    assert fnn.AdaptiveAvgPool2d(3) == fnn.AdaptiveAvgPool2d((3, 3))
    assert fnn.AdaptiveMaxPool3d((2, None, 1)).output_size == (2, None, 1)
    assert fnn.lower(nn.MaxPool2d(3, padding=1)) == fnn.MaxPool2d(3, 3, 1)
    assert fnn.lower(nn.AvgPool2d(2, divisor_override=3)) == fnn.AvgPool2d(2, divisor_override=3)
    assert fnn.MaxPool2d(2) != fnn.MaxPool2d(2, return_indices=True)


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="kernel_size must be an int or a tuple of 2 ints"):
        fnn.MaxPool2d((1, 2, 3))
    with pytest.raises(ValueError, match="stride must be an int or a tuple of 3 ints"):
        fnn.AvgPool3d(2, stride=(1, 2))
    with pytest.raises(ValueError, match=r"output_size must be an int or a tuple of 1 int"):
        fnn.AdaptiveAvgPool1d(None)
    with pytest.raises(ValueError, match=r"tuple of 2 ints or None"):
        fnn.AdaptiveMaxPool2d((1, 2, 3))


def test_return_indices_feed_max_unpool():
    x = torch.randn(2, 3, 6, 6, dtype=D)
    pool = fnn.MaxPool2d(2, return_indices=True)
    y, idx = pool(pool.init(0), x)
    ref_y, ref_idx = nn.MaxPool2d(2, return_indices=True)(x)
    assert torch.equal(y, ref_y) and torch.equal(idx, ref_idx)
    torch.testing.assert_close(nn.MaxUnpool2d(2)(y, idx).amax((-1, -2)), x.amax((-1, -2)))


def test_adaptive_none_keeps_the_input_size():
    x = torch.randn(2, 3, 5, 7)
    pool = fnn.AdaptiveAvgPool2d((1, None))
    assert pool(pool.init(0), x).shape == (2, 3, 1, 7)
    torch.testing.assert_close(pool(pool.init(0), x), nn.AdaptiveAvgPool2d((1, None))(x))


def test_cnn_with_pooling_is_lowered_and_vmaps():
    """Conv-BN-ReLU-MaxPool-AdaptiveAvgPool-Flatten-Linear: all lowered, an ensemble
    over fd.vmap equals the loop."""
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    ).eval()
    chain = fnn.lower(net)
    assert isinstance(chain, fnn.Chain)
    assert not any(isinstance(layer, fnn.FunctionalCall) for layer in chain.layers)
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(chain(fd.from_module(net), x), net(x))
    ens = fd.stack([chain.init(k) for k in range(3)])
    out = fd.vmap(chain, in_dims=(0, None))(ens, x)
    for i in range(3):
        torch.testing.assert_close(out[i], chain(ens[i], x))
