"""Padding and resampling of spatial dims: Pad, Upsample, PixelShuffle, PixelUnshuffle.

Parameter-free layers over ``F.pad``, ``F.interpolate``, ``F.pixel_shuffle``
and ``F.pixel_unshuffle``. One ``Pad`` layer stands for torch's fifteen
padding modules (``ZeroPad*``, ``ConstantPad*``, ``ReflectionPad*``,
``ReplicationPad*``, ``CircularPad*``): they differ only in the mode and the
value they hand to ``F.pad``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer

__all__ = ["Pad", "PixelShuffle", "PixelUnshuffle", "Upsample"]

_Key = Tensor | None
_MODES = ("constant", "reflect", "replicate", "circular")


@dataclasses.dataclass(frozen=True)
class Pad(Layer):
    """Pad the last dims of the input; the pure counterpart of torch's padding modules.

    ``F.pad(x, padding, mode, value)``: ``padding`` lists (left, right) pairs
    starting from the last dim, as torch's modules store it
    (``nn.ZeroPad2d(1).padding == (1, 1, 1, 1)``).

    Args:
        padding: an even number of ints (before/after for each padded dim,
            the last dim first).
        mode: ``"constant"`` (``ZeroPad*``, ``ConstantPad*``), ``"reflect"``,
            ``"replicate"`` or ``"circular"``.
        value: the fill of ``"constant"`` mode (0.0 for the other modes).

    Raises:
        ValueError: ``padding`` has an odd length or ``mode`` is unknown.

    Example:
        >>> pad = Pad((1, 2), "reflect")  # nn.ReflectionPad1d((1, 2))
        >>> pad(pad.init(0), torch.arange(3.0).view(1, 3)).tolist()
        [[1.0, 0.0, 1.0, 2.0, 1.0, 0.0]]
    """

    padding: tuple[int, ...]
    mode: str = "constant"
    value: float = 0.0

    def __post_init__(self) -> None:
        padding = tuple(self.padding)
        if len(padding) % 2 or not all(isinstance(p, int) for p in padding):
            raise ValueError(f"Pad: padding must be an even number of ints; got {padding!r}")
        if self.mode not in _MODES:
            raise ValueError(f"Pad: mode must be one of {_MODES}; got {self.mode!r}")
        object.__setattr__(self, "padding", padding)
        object.__setattr__(self, "value", float(self.value) if self.mode == "constant" else 0.0)

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        if self.mode == "constant":
            return F.pad(x, self.padding, "constant", self.value)
        return F.pad(x, self.padding, self.mode)


def _floats(value: Any) -> Any:
    """torch's ``nn.Upsample`` reading of ``scale_factor``: a tuple of floats, a
    float, or None (also for 0)."""
    if isinstance(value, tuple | list):
        return tuple(float(v) for v in value)
    return float(value) if value else None


@dataclasses.dataclass(frozen=True)
class Upsample(Layer):
    """Resize the spatial dims of ``(N, C, *spatial)``; as ``torch.nn.Upsample``
    (and ``UpsamplingNearest2d``/``UpsamplingBilinear2d``, which it also stands for).

    ``F.interpolate(x, size, scale_factor, mode, align_corners,
    recompute_scale_factor=...)``; the input must have a batch dim, as torch's.

    Args:
        size: the output's spatial size (an int or one per dim).
        scale_factor: the multiplier of the spatial size (a float or one per dim).
        mode: ``"nearest"``, ``"linear"``, ``"bilinear"``, ``"bicubic"``,
            ``"trilinear"``, ``"area"`` or ``"nearest-exact"``.
        align_corners: for the linear modes, as torch.
        recompute_scale_factor: as torch.

    Example:
        >>> up = Upsample(scale_factor=2)
        >>> up(up.init(0), torch.zeros(1, 3, 4, 4)).shape
        torch.Size([1, 3, 8, 8])
    """

    size: int | tuple[int, ...] | None = None
    scale_factor: float | tuple[float, ...] | None = None
    mode: str = "nearest"
    align_corners: bool | None = None
    recompute_scale_factor: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size, list):
            object.__setattr__(self, "size", tuple(self.size))
        object.__setattr__(self, "scale_factor", _floats(self.scale_factor))

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.interpolate(
            x,
            self.size,
            self.scale_factor,
            self.mode,
            self.align_corners,
            recompute_scale_factor=self.recompute_scale_factor,
        )


@dataclasses.dataclass(frozen=True)
class PixelShuffle(Layer):
    """``(*, C * r**2, H, W) -> (*, C, H * r, W * r)``; as ``torch.nn.PixelShuffle``.

    Example:
        >>> ps = PixelShuffle(2)
        >>> ps(ps.init(0), torch.zeros(1, 8, 3, 3)).shape
        torch.Size([1, 2, 6, 6])
    """

    upscale_factor: int

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.pixel_shuffle(x, self.upscale_factor)


@dataclasses.dataclass(frozen=True)
class PixelUnshuffle(Layer):
    """``(*, C, H * r, W * r) -> (*, C * r**2, H, W)``; as ``torch.nn.PixelUnshuffle``.

    Example:
        >>> pu = PixelUnshuffle(2)
        >>> pu(pu.init(0), torch.zeros(1, 2, 6, 6)).shape
        torch.Size([1, 8, 3, 3])
    """

    downscale_factor: int

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.pixel_unshuffle(x, self.downscale_factor)
