"""Linear, Bilinear, Identity, Flatten and Unflatten."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from .._td import _dtensor as _dt
from ._base import Inline, Layer, ParamSpec, fan_in_bound, uniform

__all__ = ["Bilinear", "Flatten", "Identity", "Linear", "Unflatten"]


@dataclasses.dataclass(frozen=True)
class Linear(Layer):
    """``y = x @ weight.T + bias``; the pure counterpart of ``torch.nn.Linear``.

    Args:
        in_features: size of the last input dim.
        out_features: size of the last output dim.
        bias: whether to add a learned bias (else the ``"bias"`` key is absent).

    Parameters (as ``nn.Linear``): ``weight`` ``(out_features, in_features)``
    and ``bias`` ``(out_features,)``, both ``U(-1/sqrt(in_features), 1/sqrt(in_features))``.

    Example:
        >>> lin = Linear(3, 4)
        >>> params = lin.init(functd.random.key(0))
        >>> lin(params, torch.zeros(2, 3)).shape
        torch.Size([2, 4])
    """

    in_features: int
    out_features: int
    bias: bool = True

    def _specs(self) -> dict[str, Any]:
        init = uniform(fan_in_bound(self.in_features))
        specs = {"weight": ParamSpec((self.out_features, self.in_features), init)}
        if self.bias:
            specs["bias"] = ParamSpec((self.out_features,), init)
        return specs

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        d = params._data
        w = d["weight"]
        if _dt.SEEN and x.ndim == 1 and _dt.is_dtensor(w):
            # torch 2.13: DTensor's in-place squeeze_ (inside matmul of a 1-d input)
            # keeps the size-1 dim; go through a batch of one instead
            return F.linear(x.unsqueeze(0), w, d.get("bias")).squeeze(0)
        return F.linear(x, w, d.get("bias"))


# The plan writes Linear's call out (its DTensor branch is not needed there: DTensor
# params are placed by the params check and take the loop, never the inline line).
Linear.plan_inline = Inline(
    Linear.__call__,
    "F_linear({x}, {p}._data['weight'], {p}._data.get('bias'))",
    {"F_linear": F.linear},
    True,
)


@dataclasses.dataclass(frozen=True)
class Bilinear(Layer):
    """``y = x1 @ weight @ x2 + bias``; the pure counterpart of ``torch.nn.Bilinear``.

    Args:
        in1_features: size of the last dim of the first input.
        in2_features: size of the last dim of the second input.
        out_features: size of the last output dim.
        bias: whether to add a learned bias.

    Parameters: ``weight`` ``(out, in1, in2)`` and ``bias`` ``(out,)``, both
    ``U(-1/sqrt(in1_features), 1/sqrt(in1_features))``.

    Example:
        >>> bil = Bilinear(2, 3, 4)
        >>> bil(bil.init(0), torch.zeros(5, 2), torch.zeros(5, 3)).shape
        torch.Size([5, 4])
    """

    in1_features: int
    in2_features: int
    out_features: int
    bias: bool = True

    def _specs(self) -> dict[str, Any]:
        init = uniform(fan_in_bound(self.in1_features))
        shape = (self.out_features, self.in1_features, self.in2_features)
        specs = {"weight": ParamSpec(shape, init)}
        if self.bias:
            specs["bias"] = ParamSpec((self.out_features,), init)
        return specs

    def __call__(
        self, params: TensorDict, x1: Tensor, x2: Tensor, *, key: Tensor | None = None
    ) -> Tensor:
        # F.bilinear has no vmap batching rule (a slow per-sample fallback): use einsum
        d = params._data
        y = torch.einsum("...i,oij,...j->...o", x1, d["weight"], x2)
        b = d.get("bias")
        return y if b is None else y + b


@dataclasses.dataclass(frozen=True)
class Identity(Layer):
    """Return the first input unchanged (extra inputs are ignored, as ``nn.Identity``).

    Example:
        >>> Identity()(Identity().init(0), torch.ones(2)).tolist()
        [1.0, 1.0]
    """

    def __call__(
        self, params: TensorDict, x: Any, *args: Any, key: Tensor | None = None, **kwargs: Any
    ) -> Any:
        return x


@dataclasses.dataclass(frozen=True)
class Flatten(Layer):
    """``x.flatten(start_dim, end_dim)``, as ``torch.nn.Flatten``.

    Example:
        >>> Flatten()(Flatten().init(0), torch.zeros(2, 3, 4)).shape
        torch.Size([2, 12])
    """

    start_dim: int = 1
    end_dim: int = -1

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


@dataclasses.dataclass(frozen=True)
class Unflatten(Layer):
    """``x.unflatten(dim, unflattened_size)``, as ``torch.nn.Unflatten`` (with an int ``dim``;
    torch's named-tensor form is not offered).

    Example:
        >>> un = Unflatten(1, (3, 4))
        >>> un(un.init(0), torch.zeros(2, 12)).shape
        torch.Size([2, 3, 4])
    """

    dim: int
    unflattened_size: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = tuple(self.unflattened_size)
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise TypeError(f"Unflatten: dim must be an int; got {self.dim!r}")
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes):
            raise TypeError(f"Unflatten: unflattened_size must be ints; got {sizes!r}")
        object.__setattr__(self, "unflattened_size", sizes)

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        return x.unflatten(self.dim, self.unflattened_size)
