"""Normalisation layers without running statistics: LayerNorm, GroupNorm, RMSNorm."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer, ParamSpec, constant

__all__ = ["GroupNorm", "LayerNorm", "RMSNorm"]

_ONES, _ZEROS = constant(1.0), constant(0.0)


def _shape(value: int | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else tuple(value)


def _affine(shape: tuple[int, ...], weight: bool, bias: bool) -> dict[str, Any]:
    """The affine parameters of a norm, as torch: ``weight`` ones, ``bias`` zeros."""
    if not weight:
        return {}
    specs = {"weight": ParamSpec(shape, _ONES)}
    if bias:
        specs["bias"] = ParamSpec(shape, _ZEROS)
    return specs


@dataclasses.dataclass(frozen=True)
class LayerNorm(Layer):
    """Normalise over the trailing ``normalized_shape`` dims; as ``torch.nn.LayerNorm``.

    Args:
        normalized_shape: an int or a tuple: the trailing dims normalised over.
        eps: added to the variance.
        elementwise_affine: learn ``weight`` (ones) and ``bias`` (zeros).
        bias: with ``elementwise_affine``, whether to learn the bias.

    Example:
        >>> ln = LayerNorm(4)
        >>> ln(ln.init(0), torch.randn(2, 4)).shape
        torch.Size([2, 4])
    """

    normalized_shape: int | tuple[int, ...]
    eps: float = 1e-5
    elementwise_affine: bool = True
    bias: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "normalized_shape", _shape(self.normalized_shape))

    def _specs(self) -> dict[str, Any]:
        return _affine(self.normalized_shape, self.elementwise_affine, self.bias)

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        d = params._data
        return F.layer_norm(x, self.normalized_shape, d.get("weight"), d.get("bias"), self.eps)


@dataclasses.dataclass(frozen=True)
class GroupNorm(Layer):
    """Normalise ``(N, C, *)`` over groups of channels; as ``torch.nn.GroupNorm``.

    Args:
        num_groups: number of groups (must divide ``num_channels``).
        num_channels: ``C``.
        eps: added to the variance.
        affine: learn per-channel ``weight`` (ones) and ``bias`` (zeros).
        bias: with ``affine``, whether to learn the bias.

    Example:
        >>> gn = GroupNorm(2, 4)
        >>> gn(gn.init(0), torch.randn(3, 4, 5)).shape
        torch.Size([3, 4, 5])
    """

    num_groups: int
    num_channels: int
    eps: float = 1e-5
    affine: bool = True
    bias: bool = True

    def __post_init__(self) -> None:
        if self.num_channels % self.num_groups != 0:
            raise ValueError(
                f"num_channels ({self.num_channels}) must be divisible by num_groups "
                f"({self.num_groups})"
            )

    def _specs(self) -> dict[str, Any]:
        return _affine((self.num_channels,), self.affine, self.bias)

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        d = params._data
        return F.group_norm(x, self.num_groups, d.get("weight"), d.get("bias"), self.eps)


@dataclasses.dataclass(frozen=True)
class RMSNorm(Layer):
    """Root-mean-square normalisation over trailing dims; as ``torch.nn.RMSNorm``.

    Args:
        normalized_shape: an int or a tuple: the trailing dims normalised over.
        eps: added to the mean square; None means ``torch.finfo(x.dtype).eps``.
        elementwise_affine: learn ``weight`` (ones).

    Example:
        >>> rms = RMSNorm(4)
        >>> rms(rms.init(0), torch.randn(2, 4)).shape
        torch.Size([2, 4])
    """

    normalized_shape: int | tuple[int, ...]
    eps: float | None = None
    elementwise_affine: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "normalized_shape", _shape(self.normalized_shape))

    def _specs(self) -> dict[str, Any]:
        return _affine(self.normalized_shape, self.elementwise_affine, bias=False)

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, params._data.get("weight"), self.eps)
