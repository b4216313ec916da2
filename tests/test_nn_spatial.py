"""Pad, Upsample, PixelShuffle/Unshuffle and Unflatten against their torch.nn modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import functd.nn as fnn
from functd._torch import TORCH_VERSION

D = torch.float64


def _check(module: nn.Module, x: torch.Tensor, cls: type) -> None:
    """Lowered to ``cls``; same output and same input grad as the module."""
    layer = fnn.lower(module)
    assert type(layer) is cls, (module, layer)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = layer(fnn.state_to_td(module), xa), module(xb)
    assert torch.equal(out, ref), module
    w = torch.randn(ref.shape, dtype=ref.dtype)
    (ga,) = torch.autograd.grad((out * w).sum(), xa)
    (gb,) = torch.autograd.grad((ref * w).sum(), xb)
    assert torch.equal(ga, gb), module


PADS = [
    (nn.ZeroPad1d(2), (2, 3, 5)),
    (nn.ZeroPad2d((1, 0, 2, 3)), (2, 3, 4, 5)),
    (nn.ZeroPad3d(1), (3, 2, 2, 2)),
    (nn.ConstantPad1d((1, 2), 3.5), (3, 5)),
    (nn.ConstantPad2d(1, -1.0), (2, 3, 4, 5)),
    (nn.ConstantPad3d((1, 0, 0, 1, 2, 0), 2.0), (1, 2, 3, 3, 3)),
    (nn.ReflectionPad1d((2, 1)), (2, 3, 5)),
    (nn.ReflectionPad2d(1), (3, 4, 5)),
    (nn.ReflectionPad3d((1, 0, 1, 0, 0, 1)), (1, 2, 3, 3, 3)),
    (nn.ReplicationPad1d(3), (2, 3, 5)),
    (nn.ReplicationPad2d((0, 1, 2, 0)), (2, 3, 4, 5)),
    (nn.ReplicationPad3d(1), (1, 2, 3, 3, 3)),
    (nn.CircularPad1d(2), (2, 3, 5)),
    (nn.CircularPad2d((1, 2, 0, 1)), (2, 3, 4, 5)),
    (nn.CircularPad3d(1), (1, 2, 3, 3, 3)),
]


@pytest.mark.parametrize("module, shape", PADS, ids=[type(m).__name__ for m, _ in PADS])
def test_every_torch_padding_module_is_one_pad(module, shape):
    _check(module, torch.randn(shape, dtype=D), fnn.Pad)


def test_pad_values_and_errors():
    assert fnn.lower(nn.ZeroPad2d(1)) == fnn.Pad((1, 1, 1, 1)) == fnn.lower(nn.ConstantPad2d(1, 0))
    assert fnn.Pad([1, 2], "reflect", value=7) == fnn.Pad((1, 2), "reflect")  # value: constant only
    with pytest.raises(ValueError, match="even number of ints"):
        fnn.Pad((1, 2, 3))
    with pytest.raises(ValueError, match="mode must be one of"):
        fnn.Pad((1, 1), "mirror")


UPSAMPLES = [
    nn.Upsample(scale_factor=2),
    nn.Upsample(size=(5, 7), mode="bilinear"),
    nn.Upsample(scale_factor=(1.5, 2.0), mode="bilinear", align_corners=True),
    nn.Upsample(scale_factor=1.7, mode="bicubic", recompute_scale_factor=True),
    nn.Upsample(size=9, mode="nearest-exact"),
    nn.Upsample(size=3, mode="area"),
    nn.UpsamplingNearest2d(scale_factor=3),
    nn.UpsamplingBilinear2d(size=(6, 6)),
]


@pytest.mark.parametrize("module", UPSAMPLES, ids=repr)
def test_upsample_matches_torch(module):
    _check(module, torch.randn(2, 3, 4, 5, dtype=D), fnn.Upsample)


def test_upsample_1d_3d_and_values():
    _check(nn.Upsample(scale_factor=2, mode="linear"), torch.randn(2, 3, 5, dtype=D), fnn.Upsample)
    _check(
        nn.Upsample(size=(3, 4, 5), mode="trilinear"),
        torch.randn(1, 2, 2, 2, 2, dtype=D),
        fnn.Upsample,
    )
    assert fnn.Upsample(scale_factor=2) == fnn.Upsample(scale_factor=2.0)
    assert fnn.Upsample(scale_factor=[2, 3]).scale_factor == (2.0, 3.0)
    assert fnn.lower(nn.UpsamplingBilinear2d(scale_factor=2)) == fnn.Upsample(
        scale_factor=2, mode="bilinear", align_corners=True
    )


def test_pixel_shuffle_and_unshuffle():
    _check(nn.PixelShuffle(2), torch.randn(2, 8, 3, 3, dtype=D), fnn.PixelShuffle)
    _check(nn.PixelUnshuffle(3), torch.randn(2, 1, 6, 9, dtype=D), fnn.PixelUnshuffle)
    _check(nn.PixelShuffle(2), torch.randn(5, 2, 4, 3, 3, dtype=D), fnn.PixelShuffle)  # extra dims


def test_unflatten():
    _check(nn.Unflatten(1, (2, 3)), torch.randn(4, 6, 5, dtype=D), fnn.Unflatten)
    _check(nn.Unflatten(-1, [3, -1]), torch.randn(4, 6, dtype=D), fnn.Unflatten)
    assert fnn.Unflatten(1, [2, 3]) == fnn.Unflatten(1, (2, 3))
    # a named dim (torch before 2.13 takes its sizes as (name, size) pairs)
    sizes = (2, 3) if TORCH_VERSION >= (2, 13) else (("a", 2), ("b", 3))
    assert fnn.lower(nn.Unflatten("features", sizes)) is None
    with pytest.raises(TypeError, match="Unflatten: dim must be an int"):
        fnn.Unflatten("features", (2, 3))
