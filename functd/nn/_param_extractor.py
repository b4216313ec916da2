"""NormalParamExtractor and the scale mappings: the same numbers as tensordict's.

Example:
    >>> ext = fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"])
    >>> loc, scale = fd.NormalParamExtractor()(torch.zeros(4))
    >>> scale.tolist()                       # biased_softplus_1.0: an input 0 gives 1
    [1.0, 1.0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["NormalParamExtractor", "mapping"]

_NAMES = ("softplus", "exp", "relu", "none", "expln", "biased_softplus[_<bias>[_<min_val>]]")


def _inv_softplus(bias: float) -> float:
    """tensordict's ``inv_softplus`` of a float: ``log(expm1(bias))`` in float32."""
    return torch.tensor(bias, dtype=torch.float32).expm1().clamp_min(1e-6).log().item()


def _expln(x: Tensor) -> Tensor:
    """``exp(x)`` for ``x <= 0``, ``log1p(x) + 1`` above (tensordict's ``expln``, without
    in-place writes, so it works under vmap and keeps finite gradients)."""
    neg = x <= 0
    return torch.where(neg, torch.exp(torch.clamp_max(x, 0.0)), torch.log1p(x.clamp_min(0.0)) + 1)


def _identity(x: Tensor) -> Tensor:
    return x


@dataclasses.dataclass(frozen=True)
class _BiasedSoftplus:
    bias: float
    min_val: float

    def __call__(self, x: Tensor) -> Tensor:
        return F.softplus(x + self.bias) + self.min_val


def mapping(name: str) -> Callable[[Tensor], Tensor]:
    """The elementwise map ``name`` names, as ``tensordict.nn.mappings(name)``.

    ``biased_softplus_<b>`` is ``softplus(x + inv_softplus(b - 0.01)) + 0.01`` (an
    input 0 gives ``b``); ``biased_softplus_<b>_<m>`` uses ``min_val=m``.

    Raises:
        ValueError: an unknown name, or a malformed ``biased_softplus_...`` one.

    Example:
        >>> mapping("biased_softplus_2.0_0.1")(torch.zeros(1))
        tensor([2.])
    """
    simple = {"softplus": F.softplus, "exp": torch.exp, "relu": torch.relu, "none": _identity}
    if name in simple:
        return simple[name]  # type: ignore[return-value]
    if name == "expln":
        return _expln
    if isinstance(name, str) and name.startswith("biased_softplus"):
        parts = name.split("_")
        try:
            if len(parts) == 2:
                bias, min_val = 1.0, 0.01
            elif len(parts) == 3:
                bias, min_val = float(parts[2]), 0.01
            elif len(parts) == 4:
                bias, min_val = float(parts[2]), float(parts[3])
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"NormalParamExtractor: malformed scale_mapping {name!r}; write "
                "'biased_softplus_<bias>' or 'biased_softplus_<bias>_<min_val>', e.g. "
                "'biased_softplus_1.0' or 'biased_softplus_2.0_0.1'."
            ) from None
        return _BiasedSoftplus(_inv_softplus(bias - min_val), min_val)
    raise ValueError(
        f"NormalParamExtractor: unknown scale_mapping {name!r}; use one of {', '.join(_NAMES)}."
    )


@dataclasses.dataclass(frozen=True)
class NormalParamExtractor:
    """Split the last dim into ``loc`` and a positive ``scale``, like tensordict's.

    ``loc, scale = x.chunk(2, -1)``; ``scale = scale_mapping(scale).clamp_min(scale_lb)``.
    A pure function without parameters: wrap it in ``fd.Module``. Extra inputs
    pass through: ``f(x, *others) -> (loc, scale, *others)``.

    Args:
        scale_mapping: ``"biased_softplus_1.0"`` (default: ``softplus(x + b) + 0.01``
            with ``b`` the inverse softplus of 0.99), ``"softplus"``, ``"exp"``,
            ``"relu"``, ``"expln"``, ``"none"``, ``"biased_softplus_<v>[_<min_val>]"``.
        scale_lb: the smallest scale.

    Raises:
        ValueError: an unknown ``scale_mapping``.

    Example:
        >>> m = fd.Module(fd.NormalParamExtractor(), in_keys=["h"], out_keys=["loc", "scale"])
        >>> out = m(None, fd.TensorDict({"h": torch.randn(3, 8)}, [3]))
    """

    scale_mapping: str = "biased_softplus_1.0"
    scale_lb: float = 1e-4

    def __post_init__(self) -> None:
        object.__setattr__(self, "_map", mapping(self.scale_mapping))

    def __call__(self, x: Tensor, *others: Tensor) -> tuple[Tensor, ...]:
        loc, scale = x.chunk(2, -1)
        return (loc, self._map(scale).clamp_min(self.scale_lb), *others)  # type: ignore[attr-defined]
