"""Pooling: max, average, adaptive max/average and power-average, 1d/2d/3d.

Parameter-free layers over ``torch.nn.functional``'s pooling ops, one per
``torch.nn`` pooling module, with the same constructor arguments in the same
order. Every argument is normalised in ``__post_init__`` (an int to an
n-tuple, ``stride=None`` to the kernel size, as the torch modules and
functionals do), so ``MaxPool2d(2) == MaxPool2d((2, 2), stride=2)``. The
inputs are batched ``(N, C, *spatial)`` or unbatched ``(C, *spatial)``, as
torch's; torch's ops have ``vmap`` batching rules, so the layers vmap and
compile as they are.

Example:
    >>> pool = MaxPool2d(2)
    >>> pool(pool.init(0), torch.zeros(1, 3, 8, 8)).shape
    torch.Size([1, 3, 4, 4])
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer, set_derived, tup

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
]

IntOrTuple = int | tuple[int, ...]
_Key = Tensor | None


class _Pool(Layer):
    """The dimension ``n`` and the functional(s) of each concrete class (class keywords)."""

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        kernel_size: Any
        stride: Any

    _n: ClassVar[int]
    _fns: ClassVar[tuple[Any, ...]]

    def __init_subclass__(
        cls, n: int | None = None, fns: tuple[Any, ...] = (), **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if n is not None:
            cls._n, cls._fns = n, fns

    def _window(self) -> None:
        """Normalise kernel_size, stride (None -> kernel_size) and padding to n-tuples."""
        n = self._n
        kernel = tup(self.kernel_size, n, "kernel_size")
        stride = kernel if self.stride is None else tup(self.stride, n, "stride")
        object.__setattr__(self, "kernel_size", kernel)
        object.__setattr__(self, "stride", stride)
        if hasattr(self, "padding"):
            object.__setattr__(self, "padding", tup(self.padding, n, "padding"))


# ------------------------------------------------------------------- max pool
@dataclasses.dataclass(frozen=True)
class _MaxPoolNd(_Pool):
    """Shared implementation of MaxPool1d/2d/3d (see ``MaxPool2d``)."""

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        _fn: ClassVar[Any]

    kernel_size: IntOrTuple
    stride: IntOrTuple | None = None
    padding: IntOrTuple = 0
    dilation: IntOrTuple = 1
    return_indices: bool = False
    ceil_mode: bool = False

    def __post_init__(self) -> None:
        self._window()
        object.__setattr__(self, "dilation", tup(self.dilation, self._n, "dilation"))
        object.__setattr__(self, "return_indices", bool(self.return_indices))
        object.__setattr__(self, "ceil_mode", bool(self.ceil_mode))
        set_derived(self, _fn=self._fns[self.return_indices])

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Any:
        return self._fn(
            x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode
        )


@dataclasses.dataclass(frozen=True)
class MaxPool1d(_MaxPoolNd, n=1, fns=(torch.max_pool1d, F.max_pool1d_with_indices)):
    """Max over sliding windows of ``(N, C, L)`` or ``(C, L)``; as ``torch.nn.MaxPool1d``.

    Takes the arguments of ``MaxPool2d`` with 1-tuples.

    Example:
        >>> MaxPool1d(2)(MaxPool1d(2).init(0), torch.arange(4.0).view(1, 4)).tolist()
        [[1.0, 3.0]]
    """


@dataclasses.dataclass(frozen=True)
class MaxPool2d(_MaxPoolNd, n=2, fns=(torch.max_pool2d, F.max_pool2d_with_indices)):
    """Max over sliding windows of ``(N, C, H, W)`` or ``(C, H, W)``; as ``torch.nn.MaxPool2d``.

    Args:
        kernel_size: window size (an int or one per spatial dim).
        stride: window step; None (default) is ``kernel_size``.
        padding: implicit ``-inf`` padding on both sides.
        dilation: spacing between the window's elements.
        return_indices: also return the flat indices of the maxima, as torch
            (a call then returns ``(y, indices)``).
        ceil_mode: use ``ceil`` instead of ``floor`` for the output size.

    Example:
        >>> pool = MaxPool2d(3, stride=2, padding=1)
        >>> pool(pool.init(0), torch.zeros(2, 3, 8, 8)).shape
        torch.Size([2, 3, 4, 4])
    """


@dataclasses.dataclass(frozen=True)
class MaxPool3d(_MaxPoolNd, n=3, fns=(torch.max_pool3d, F.max_pool3d_with_indices)):
    """Max over sliding windows of ``(N, C, D, H, W)`` or ``(C, D, H, W)``; as
    ``torch.nn.MaxPool3d``. Takes the arguments of ``MaxPool2d`` with 3-tuples.

    Example:
        >>> MaxPool3d(2)(MaxPool3d(2).init(0), torch.zeros(1, 2, 4, 4, 4)).shape
        torch.Size([1, 2, 2, 2, 2])
    """


# ------------------------------------------------------------------- avg pool
@dataclasses.dataclass(frozen=True)
class AvgPool1d(_Pool, n=1, fns=(F.avg_pool1d,)):
    """Mean over sliding windows of ``(N, C, L)`` or ``(C, L)``; as ``torch.nn.AvgPool1d``.

    Takes the arguments of ``AvgPool2d`` but ``divisor_override`` (torch's
    ``AvgPool1d`` has none).

    Example:
        >>> AvgPool1d(2)(AvgPool1d(2).init(0), torch.arange(4.0).view(1, 4)).tolist()
        [[0.5, 2.5]]
    """

    kernel_size: IntOrTuple
    stride: IntOrTuple | None = None
    padding: IntOrTuple = 0
    ceil_mode: bool = False
    count_include_pad: bool = True

    def __post_init__(self) -> None:
        self._window()

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return F.avg_pool1d(
            x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad
        )


@dataclasses.dataclass(frozen=True)
class _AvgPoolNd(_Pool):
    """Shared implementation of AvgPool2d/3d (see ``AvgPool2d``)."""

    kernel_size: IntOrTuple
    stride: IntOrTuple | None = None
    padding: IntOrTuple = 0
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None

    def __post_init__(self) -> None:
        self._window()

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return self._fns[0](
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )


@dataclasses.dataclass(frozen=True)
class AvgPool2d(_AvgPoolNd, n=2, fns=(F.avg_pool2d,)):
    """Mean over sliding windows of ``(N, C, H, W)`` or ``(C, H, W)``; as ``torch.nn.AvgPool2d``.

    Args:
        kernel_size: window size (an int or one per spatial dim).
        stride: window step; None (default) is ``kernel_size``.
        padding: implicit zero padding on both sides.
        ceil_mode: use ``ceil`` instead of ``floor`` for the output size.
        count_include_pad: count the padding zeros in the mean's divisor.
        divisor_override: divide by this instead of the window size.

    Example:
        >>> pool = AvgPool2d(2, divisor_override=1)  # sums
        >>> pool(pool.init(0), torch.ones(1, 1, 2, 2)).item()
        4.0
    """


@dataclasses.dataclass(frozen=True)
class AvgPool3d(_AvgPoolNd, n=3, fns=(F.avg_pool3d,)):
    """Mean over sliding windows of ``(N, C, D, H, W)`` or ``(C, D, H, W)``; as
    ``torch.nn.AvgPool3d``. Takes the arguments of ``AvgPool2d`` with 3-tuples.

    Example:
        >>> AvgPool3d(2)(AvgPool3d(2).init(0), torch.zeros(1, 2, 4, 4, 4)).shape
        torch.Size([1, 2, 2, 2, 2])
    """


# ----------------------------------------------------------- power-average pool
@dataclasses.dataclass(frozen=True)
class _LPPoolNd(_Pool):
    """Shared implementation of LPPool1d/2d/3d (see ``LPPool2d``)."""

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        _kernel: ClassVar[Any]

    norm_type: float
    kernel_size: IntOrTuple
    stride: IntOrTuple | None = None
    ceil_mode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "norm_type", float(self.norm_type))
        self._window()
        # F.lp_pool1d multiplies by kernel_size: it takes an int there
        set_derived(self, _kernel=self.kernel_size[0] if self._n == 1 else self.kernel_size)

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return self._fns[0](x, self.norm_type, self._kernel, self.stride, self.ceil_mode)


@dataclasses.dataclass(frozen=True)
class LPPool1d(_LPPoolNd, n=1, fns=(F.lp_pool1d,)):
    """Power-average pooling of ``(N, C, L)`` or ``(C, L)``; as ``torch.nn.LPPool1d``.

    Takes the arguments of ``LPPool2d`` with 1-tuples.

    Example:
        >>> pool = LPPool1d(2, 2)
        >>> pool(pool.init(0), torch.tensor([[3.0, 4.0]])).tolist()
        [[5.0]]
    """


@dataclasses.dataclass(frozen=True)
class LPPool2d(_LPPoolNd, n=2, fns=(F.lp_pool2d,)):
    """``(sum over the window of x**p)**(1/p)`` over ``(N, C, H, W)`` or ``(C, H, W)``;
    as ``torch.nn.LPPool2d``.

    Args:
        norm_type: the power ``p``.
        kernel_size: window size (an int or one per spatial dim).
        stride: window step; None (default) is ``kernel_size``.
        ceil_mode: use ``ceil`` instead of ``floor`` for the output size.

    Example:
        >>> pool = LPPool2d(2, 2)
        >>> pool(pool.init(0), torch.ones(1, 1, 2, 2)).item()
        2.0
    """


@dataclasses.dataclass(frozen=True)
class LPPool3d(_LPPoolNd, n=3, fns=(F.lp_pool3d,)):
    """Power-average pooling of ``(N, C, D, H, W)`` or ``(C, D, H, W)``; as
    ``torch.nn.LPPool3d``. Takes the arguments of ``LPPool2d`` with 3-tuples.

    Example:
        >>> LPPool3d(2, 2)(LPPool3d(2, 2).init(0), torch.ones(1, 1, 2, 2, 2)).shape
        torch.Size([1, 1, 1, 1, 1])
    """


# -------------------------------------------------------------- adaptive pools
def _output_size(value: Any, n: int) -> tuple[int | None, ...]:
    """An int, or n entries each an int or None (None: keep the input's size there;
    not for 1d, where torch's op takes ints only)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    try:
        value = tuple(value)
    except TypeError:
        value = (value,)
    ok = (int, type(None)) if n > 1 else (int,)
    if len(value) != n or not all(isinstance(v, ok) and not isinstance(v, bool) for v in value):
        what = "ints or None" if n > 1 else "int"
        raise ValueError(f"output_size must be an int or a tuple of {n} {what}; got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class _AdaptiveMaxPoolNd(_Pool):
    """Shared implementation of AdaptiveMaxPool1d/2d/3d (see ``AdaptiveMaxPool2d``)."""

    output_size: int | tuple[int | None, ...]
    return_indices: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_size", _output_size(self.output_size, self._n))
        object.__setattr__(self, "return_indices", bool(self.return_indices))

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Any:
        return self._fns[0](x, self.output_size, self.return_indices)


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd, n=1, fns=(F.adaptive_max_pool1d,)):
    """Max pooling of ``(N, C, L)`` or ``(C, L)`` to a given length; as
    ``torch.nn.AdaptiveMaxPool1d``. Takes the arguments of ``AdaptiveMaxPool2d``
    (``output_size`` an int: no None in 1d, as torch).

    Example:
        >>> pool = AdaptiveMaxPool1d(2)
        >>> pool(pool.init(0), torch.arange(6.0).view(1, 6)).tolist()
        [[2.0, 5.0]]
    """


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd, n=2, fns=(F.adaptive_max_pool2d,)):
    """Max pooling of ``(N, C, H, W)`` or ``(C, H, W)`` to a given size; as
    ``torch.nn.AdaptiveMaxPool2d``.

    Args:
        output_size: the output's spatial size: an int, or one int per dim
            where None keeps the input's size.
        return_indices: also return the indices of the maxima (a call then
            returns ``(y, indices)``).

    Example:
        >>> pool = AdaptiveMaxPool2d((1, None))
        >>> pool(pool.init(0), torch.zeros(2, 3, 5, 7)).shape
        torch.Size([2, 3, 1, 7])
    """


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd, n=3, fns=(F.adaptive_max_pool3d,)):
    """Max pooling of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` to a given size; as
    ``torch.nn.AdaptiveMaxPool3d``. Takes the arguments of ``AdaptiveMaxPool2d``.

    Example:
        >>> pool = AdaptiveMaxPool3d(1)
        >>> pool(pool.init(0), torch.zeros(1, 2, 3, 3, 3)).shape
        torch.Size([1, 2, 1, 1, 1])
    """


@dataclasses.dataclass(frozen=True)
class _AdaptiveAvgPoolNd(_Pool):
    """Shared implementation of AdaptiveAvgPool1d/2d/3d (see ``AdaptiveAvgPool2d``)."""

    output_size: int | tuple[int | None, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_size", _output_size(self.output_size, self._n))

    def __call__(self, params: TensorDict, x: Tensor, *, key: _Key = None) -> Tensor:
        return self._fns[0](x, self.output_size)


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd, n=1, fns=(F.adaptive_avg_pool1d,)):
    """Average pooling of ``(N, C, L)`` or ``(C, L)`` to a given length; as
    ``torch.nn.AdaptiveAvgPool1d`` (``output_size`` an int).

    Example:
        >>> pool = AdaptiveAvgPool1d(1)
        >>> pool(pool.init(0), torch.arange(4.0).view(1, 4)).tolist()
        [[1.5]]
    """


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd, n=2, fns=(F.adaptive_avg_pool2d,)):
    """Average pooling of ``(N, C, H, W)`` or ``(C, H, W)`` to a given size; as
    ``torch.nn.AdaptiveAvgPool2d``.

    Args:
        output_size: the output's spatial size: an int, or one int per dim
            where None keeps the input's size.

    Example:
        >>> pool = AdaptiveAvgPool2d(1)  # global average pooling
        >>> pool(pool.init(0), torch.zeros(2, 3, 5, 7)).shape
        torch.Size([2, 3, 1, 1])
    """


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd, n=3, fns=(F.adaptive_avg_pool3d,)):
    """Average pooling of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` to a given size; as
    ``torch.nn.AdaptiveAvgPool3d``. Takes the arguments of ``AdaptiveAvgPool2d``.

    Example:
        >>> pool = AdaptiveAvgPool3d((None, 1, 1))
        >>> pool(pool.init(0), torch.zeros(1, 2, 3, 4, 5)).shape
        torch.Size([1, 2, 3, 1, 1])
    """
