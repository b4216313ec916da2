"""Activations: parameter-free layers over ``torch.nn.functional`` (and PReLU).

Each takes ``(params, x)`` and ignores ``params`` (an empty TensorDict from
``init``), so activations compose in a ``Chain`` like any other layer. The
``inplace`` options of the torch modules are not offered: a pure layer never
writes into its input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer, ParamSpec, constant

__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "LeakyReLU",
    "LogSigmoid",
    "LogSoftmax",
    "Mish",
    "PReLU",
    "ReLU",
    "ReLU6",
    "SELU",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softplus",
    "Softsign",
    "Tanh",
    "Tanhshrink",
]

_Key = Tensor | None


@dataclasses.dataclass(frozen=True)
class ReLU(Layer):
    """``max(x, 0)``.

    Example:
        >>> ReLU()(ReLU().init(0), torch.tensor([-1.0, 2.0])).tolist()
        [0.0, 2.0]
    """

    def function(self) -> Callable[[Tensor], Tensor]:
        """The plain function of the inputs (``fd.Module`` calls it directly)."""
        return torch.relu

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return torch.relu(x)


@dataclasses.dataclass(frozen=True)
class ReLU6(Layer):
    """``min(max(x, 0), 6)``.

    Example:
        >>> ReLU6()(ReLU6().init(0), torch.tensor([7.0])).tolist()
        [6.0]
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.relu6(x)


@dataclasses.dataclass(frozen=True)
class LeakyReLU(Layer):
    """``x if x >= 0 else negative_slope * x``.

    Example:
        >>> LeakyReLU(0.1)(LeakyReLU().init(0), torch.tensor([-1.0])).tolist()
        [-0.10000000149011612]
    """

    negative_slope: float = 0.01

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)


@dataclasses.dataclass(frozen=True)
class ELU(Layer):
    """``x if x > 0 else alpha * (exp(x) - 1)``.

    Example:
        >>> y = ELU(alpha=1.0)(ELU().init(0), torch.randn(3))
    """

    alpha: float = 1.0

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.elu(x, self.alpha)


@dataclasses.dataclass(frozen=True)
class CELU(Layer):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    Example:
        >>> y = CELU(alpha=0.5)(CELU().init(0), torch.randn(3))
    """

    alpha: float = 1.0

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.celu(x, self.alpha)


@dataclasses.dataclass(frozen=True)
class SELU(Layer):
    """Scaled ELU with the self-normalising constants.

    Example:
        >>> y = SELU()(SELU().init(0), torch.randn(3))
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.selu(x)


@dataclasses.dataclass(frozen=True)
class GELU(Layer):
    """Gaussian error linear unit; ``approximate`` is ``"none"`` or ``"tanh"``.

    Example:
        >>> y = GELU(approximate="tanh")(GELU().init(0), torch.randn(3))
    """

    approximate: str = "none"

    def __post_init__(self) -> None:
        if self.approximate not in ("none", "tanh"):
            raise ValueError(
                f"GELU(approximate=...) must be 'none' or 'tanh'; got {self.approximate!r}"
            )

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.gelu(x, approximate=self.approximate)


@dataclasses.dataclass(frozen=True)
class SiLU(Layer):
    """``x * sigmoid(x)`` (a.k.a. swish).

    Example:
        >>> y = SiLU()(SiLU().init(0), torch.randn(3))
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.silu(x)


@dataclasses.dataclass(frozen=True)
class Mish(Layer):
    """``x * tanh(softplus(x))``.

    Example:
        >>> y = Mish()(Mish().init(0), torch.randn(3))
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.mish(x)


@dataclasses.dataclass(frozen=True)
class Sigmoid(Layer):
    """``1 / (1 + exp(-x))``.

    Example:
        >>> Sigmoid()(Sigmoid().init(0), torch.zeros(1)).tolist()
        [0.5]
    """

    def function(self) -> Callable[[Tensor], Tensor]:
        """The plain function of the inputs (``fd.Module`` calls it directly)."""
        return torch.sigmoid

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return torch.sigmoid(x)


@dataclasses.dataclass(frozen=True)
class Tanh(Layer):
    """Hyperbolic tangent.

    Example:
        >>> Tanh()(Tanh().init(0), torch.zeros(1)).tolist()
        [0.0]
    """

    def function(self) -> Callable[[Tensor], Tensor]:
        """The plain function of the inputs (``fd.Module`` calls it directly)."""
        return torch.tanh

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return torch.tanh(x)


@dataclasses.dataclass(frozen=True)
class Hardtanh(Layer):
    """``clamp(x, min_val, max_val)``.

    Example:
        >>> Hardtanh()(Hardtanh().init(0), torch.tensor([3.0])).tolist()
        [1.0]
    """

    min_val: float = -1.0
    max_val: float = 1.0

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.hardtanh(x, self.min_val, self.max_val)


@dataclasses.dataclass(frozen=True)
class Hardsigmoid(Layer):
    """Piecewise-linear sigmoid: ``relu6(x + 3) / 6``.

    Example:
        >>> Hardsigmoid()(Hardsigmoid().init(0), torch.zeros(1)).tolist()
        [0.5]
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.hardsigmoid(x)


@dataclasses.dataclass(frozen=True)
class Hardswish(Layer):
    """``x * relu6(x + 3) / 6``.

    Example:
        >>> y = Hardswish()(Hardswish().init(0), torch.randn(3))
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.hardswish(x)


@dataclasses.dataclass(frozen=True)
class Softplus(Layer):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold``.

    Example:
        >>> y = Softplus(beta=2.0)(Softplus().init(0), torch.randn(3))
    """

    beta: float = 1.0
    threshold: float = 20.0

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)


@dataclasses.dataclass(frozen=True)
class Softsign(Layer):
    """``x / (1 + |x|)``.

    Example:
        >>> Softsign()(Softsign().init(0), torch.ones(1)).tolist()
        [0.5]
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.softsign(x)


@dataclasses.dataclass(frozen=True)
class Tanhshrink(Layer):
    """``x - tanh(x)``.

    Example:
        >>> y = Tanhshrink()(Tanhshrink().init(0), torch.randn(3))
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.tanhshrink(x)


@dataclasses.dataclass(frozen=True)
class LogSigmoid(Layer):
    """``log(sigmoid(x))``, computed stably.

    Example:
        >>> y = LogSigmoid()(LogSigmoid().init(0), torch.randn(3))
    """

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.logsigmoid(x)


@dataclasses.dataclass(frozen=True)
class Softmax(Layer):
    """Softmax over ``dim`` (required: torch's implicit-dim choice is deprecated).

    Example:
        >>> Softmax(-1)(Softmax(-1).init(0), torch.zeros(2)).tolist()
        [0.5, 0.5]
    """

    dim: int

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.softmax(x, self.dim)


@dataclasses.dataclass(frozen=True)
class LogSoftmax(Layer):
    """Log-softmax over ``dim``.

    Example:
        >>> y = LogSoftmax(-1)(LogSoftmax(-1).init(0), torch.randn(2, 3))
    """

    dim: int

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.log_softmax(x, self.dim)


@dataclasses.dataclass(frozen=True)
class PReLU(Layer):
    """``x if x >= 0 else weight * x`` with a learned slope, as ``torch.nn.PReLU``.

    Args:
        num_parameters: 1 (one shared slope) or the number of channels (dim 1).
        init_value: the initial slope (``nn.PReLU``'s ``init``; renamed because
            ``init`` is the method that draws parameters).

    Parameters: ``weight`` ``(num_parameters,)``, filled with ``init_value``.
    Computed as ``where(x > 0, x, weight * x)`` with the slope along dim 1 (as
    ``F.prelu``, whose vmap rule fails for a batch of weights); a 1-d input
    with ``num_parameters > 1`` is taken as channels, where torch raises.

    Example:
        >>> prelu = PReLU()
        >>> prelu(prelu.init(0), torch.tensor([-1.0])).tolist()
        [-0.25]
    """

    num_parameters: int = 1
    init_value: float = 0.25

    def _specs(self) -> dict[str, Any]:
        return {"weight": ParamSpec((self.num_parameters,), constant(self.init_value))}

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        # F.prelu's vmap batching rule breaks for a batch of weights (ensembles), so
        # this is its formula: the slope broadcasts along dim 1 (the channels).
        w = params._data["weight"]
        if x.dim() == 0:
            w = w.reshape(())
        elif self.num_parameters > 1 and x.dim() >= 2:
            w = w.reshape(-1, *([1] * (x.dim() - 2)))
        return torch.where(x > 0, x, w * x)
