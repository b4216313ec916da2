"""Convolutions (1d/2d/3d) and transposed convolutions (1d/2d/3d)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer, ParamSpec, fan_in_bound, set_derived, tup, uniform

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
IntOrTuple = int | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _ConvBase(Layer):
    """What convolutions and transposed convolutions share: the dimension ``n`` and
    the functional ``fn`` (class keywords of each concrete class), the leading
    fields, their checks and the parameters."""

    if TYPE_CHECKING:  # fields of the subclasses, read here

        @property
        def bias(self) -> bool: ...
        @property
        def groups(self) -> int: ...

    _n: ClassVar[int]
    _fn: ClassVar[Any]
    _tuples: ClassVar[tuple[str, ...]]  # the fields normalised to n-tuples, in order

    in_channels: int
    out_channels: int
    kernel_size: IntOrTuple
    stride: IntOrTuple = 1
    # groups, bias and the rest are fields of each family: torch orders them differently

    def __init_subclass__(cls, n: int | None = None, fn: Any = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if n is not None:
            cls._n, cls._fn = n, staticmethod(fn)

    def __post_init__(self) -> None:
        for name in self._tuples:
            object.__setattr__(self, name, tup(getattr(self, name), self._n, name))
        if self.groups <= 0:
            raise ValueError("groups must be a positive integer")
        if self.in_channels % self.groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if self.out_channels % self.groups != 0:
            raise ValueError("out_channels must be divisible by groups")

    def _weight_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def _specs(self) -> dict[str, Any]:
        # torch: kaiming_uniform_(a=sqrt(5)) on the weight, fan_in = weight.size(1) * prod(kernel)
        shape = self._weight_shape()
        init = uniform(fan_in_bound(shape[1] * math.prod(shape[2:])))
        specs = {"weight": ParamSpec(shape, init)}
        if self.bias:
            specs["bias"] = ParamSpec((self.out_channels,), init)
        return specs


@dataclasses.dataclass(frozen=True)
class _ConvNd(_ConvBase):
    """Shared implementation of Conv1d/2d/3d (see ``Conv2d``)."""

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        _conv_padding: ClassVar[Any]
        _pad: ClassVar[Any]

    _tuples: ClassVar[tuple[str, ...]] = ("kernel_size", "stride", "dilation")

    padding: IntOrTuple | str = 0
    dilation: IntOrTuple = 1
    groups: int = 1
    bias: bool = True
    padding_mode: str = "zeros"

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self._n
        if isinstance(self.padding, str):
            if self.padding not in ("same", "valid"):
                raise ValueError(
                    f"Invalid padding string {self.padding!r}, should be one of {{'same', 'valid'}}"
                )
            if self.padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
        else:
            object.__setattr__(self, "padding", tup(self.padding, n, "padding"))
        if self.padding_mode not in _PADDING_MODES:
            raise ValueError(
                f"padding_mode must be one of {set(_PADDING_MODES)}, but got "
                f"padding_mode={self.padding_mode!r}"
            )
        if self.padding_mode == "zeros":
            set_derived(self, _pad=None, _conv_padding=self.padding)
        else:  # as torch: F.pad with the reversed padding repeated twice, then no padding
            set_derived(self, _pad=_reversed_padding(self), _conv_padding=(0,) * n)

    def _weight_shape(self) -> tuple[int, ...]:
        return (self.out_channels, self.in_channels // self.groups, *self.kernel_size)

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        d = params._data
        if self._pad is not None:
            x = F.pad(x, self._pad, mode=self.padding_mode)
        return self._fn(
            x,
            d["weight"],
            d.get("bias"),
            self.stride,
            self._conv_padding,
            self.dilation,
            self.groups,
        )


def _reversed_padding(layer: _ConvNd) -> tuple[int, ...]:
    if layer.padding == "valid":
        return (0, 0) * layer._n
    if layer.padding == "same":
        out = [0, 0] * layer._n
        for d, k, i in zip(layer.dilation, layer.kernel_size, range(layer._n - 1, -1, -1)):
            total = d * (k - 1)
            out[2 * i], out[2 * i + 1] = total // 2, total - total // 2
        return tuple(out)
    return tuple(p for p in reversed(layer.padding) for _ in range(2))


@dataclasses.dataclass(frozen=True)
class Conv1d(_ConvNd, n=1, fn=F.conv1d):
    """1d convolution over ``(N, C, L)`` or ``(C, L)``; as ``torch.nn.Conv1d``.

    Takes the same arguments as ``Conv2d``, with 1-tuples.

    Example:
        >>> conv = Conv1d(2, 4, kernel_size=3, padding=1)
        >>> conv(conv.init(0), torch.zeros(5, 2, 8)).shape
        torch.Size([5, 4, 8])
    """


@dataclasses.dataclass(frozen=True)
class Conv2d(_ConvNd, n=2, fn=F.conv2d):
    """2d convolution over ``(N, C, H, W)`` or ``(C, H, W)``; as ``torch.nn.Conv2d``.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or a 2-tuple.
        stride: an int or a 2-tuple.
        padding: an int, a 2-tuple, ``"same"`` or ``"valid"``.
        dilation: an int or a 2-tuple.
        groups: blocked connections from input to output channels.
        bias: whether to add a learned bias.
        padding_mode: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.

    Parameters: ``weight`` ``(out, in/groups, *kernel)`` and ``bias`` ``(out,)``,
    both ``U(±1/sqrt(fan_in))`` with ``fan_in = in/groups * prod(kernel)``.

    Example:
        >>> conv = Conv2d(3, 8, kernel_size=3, stride=2)
        >>> conv(conv.init(0), torch.zeros(1, 3, 9, 9)).shape
        torch.Size([1, 8, 4, 4])
    """


@dataclasses.dataclass(frozen=True)
class Conv3d(_ConvNd, n=3, fn=F.conv3d):
    """3d convolution over ``(N, C, D, H, W)`` or ``(C, D, H, W)``; as ``torch.nn.Conv3d``.

    Takes the same arguments as ``Conv2d``, with 3-tuples.

    Example:
        >>> conv = Conv3d(1, 2, kernel_size=2)
        >>> conv(conv.init(0), torch.zeros(1, 1, 3, 3, 3)).shape
        torch.Size([1, 2, 2, 2, 2])
    """


@dataclasses.dataclass(frozen=True)
class _ConvTransposeNd(_ConvBase):
    """Shared implementation of ConvTranspose1d/2d/3d (see ``ConvTranspose2d``)."""

    _tuples: ClassVar[tuple[str, ...]] = (
        "kernel_size",
        "stride",
        "padding",
        "output_padding",
        "dilation",
    )

    padding: IntOrTuple = 0
    output_padding: IntOrTuple = 0
    groups: int = 1
    bias: bool = True
    dilation: IntOrTuple = 1

    def _weight_shape(self) -> tuple[int, ...]:
        return (self.in_channels, self.out_channels // self.groups, *self.kernel_size)

    def __call__(
        self,
        params: TensorDict,
        x: Tensor,
        output_size: Sequence[int] | None = None,
        *,
        key: Tensor | None = None,
    ) -> Tensor:
        d = params._data
        out_pad = (
            self.output_padding if output_size is None else self._output_padding(x, output_size)
        )
        return self._fn(
            x,
            d["weight"],
            d.get("bias"),
            self.stride,
            self.padding,
            out_pad,
            self.groups,
            self.dilation,
        )

    def _output_padding(self, x: Tensor, output_size: Sequence[int]) -> tuple[int, ...]:
        """The output padding that yields ``output_size`` (torch's ``_output_padding``)."""
        n = self._n
        non_spatial = 2 if x.dim() == n + 2 else 1
        output_size = list(output_size)
        if len(output_size) == non_spatial + n:
            output_size = output_size[non_spatial:]
        if len(output_size) != n:
            raise ValueError(
                f"ConvTranspose{n}D: for {x.dim()}D input, output_size must have {n} "
                f"or {non_spatial + n} elements (got {len(output_size)})"
            )
        mins = [
            (x.size(d + non_spatial) - 1) * self.stride[d]
            - 2 * self.padding[d]
            + self.dilation[d] * (self.kernel_size[d] - 1)
            + 1
            for d in range(n)
        ]
        maxs = [m + s - 1 for m, s in zip(mins, self.stride)]
        for size, lo, hi in zip(output_size, mins, maxs):
            if size < lo or size > hi:
                raise ValueError(
                    f"requested an output size of {output_size}, but valid sizes range "
                    f"from {mins} to {maxs} (for an input of {x.size()[non_spatial:]})"
                )
        return tuple(s - m for s, m in zip(output_size, mins))


@dataclasses.dataclass(frozen=True)
class ConvTranspose1d(_ConvTransposeNd, n=1, fn=F.conv_transpose1d):
    """1d transposed convolution; as ``torch.nn.ConvTranspose1d``.

    Takes the same arguments as ``ConvTranspose2d``, with 1-tuples. Note the
    weight's layout, ``(in, out/groups, *kernel)``, the transpose of ``Conv1d``'s.

    Example:
        >>> ConvTranspose1d(4, 2, kernel_size=3).param_shapes()
        {('weight',): (4, 2, 3), ('bias',): (2,)}
    """


@dataclasses.dataclass(frozen=True)
class ConvTranspose2d(_ConvTransposeNd, n=2, fn=F.conv_transpose2d):
    """2d transposed convolution; as ``torch.nn.ConvTranspose2d``.

    The arguments come in torch's order: ``in_channels, out_channels, kernel_size,
    stride, padding, output_padding, groups, bias, dilation``; those ``Conv2d`` also
    takes mean what they mean there, except:

    Args:
        padding: an int or a 2-tuple (implicit zero padding removed from the output).
        output_padding: extra size added to one side of the output.

    Only torch's ``padding_mode="zeros"`` exists for transposed convolutions.
    Parameters: ``weight`` ``(in, out/groups, *kernel)`` and ``bias`` ``(out,)``,
    both ``U(±1/sqrt(fan_in))`` with torch's ``fan_in = out/groups * prod(kernel)``.
    The call takes an optional ``output_size``, as the torch module's forward.

    Example:
        >>> up = ConvTranspose2d(8, 3, kernel_size=3, stride=2)
        >>> up(up.init(0), torch.zeros(1, 8, 4, 4), output_size=(10, 10)).shape
        torch.Size([1, 3, 10, 10])
    """


@dataclasses.dataclass(frozen=True)
class ConvTranspose3d(_ConvTransposeNd, n=3, fn=F.conv_transpose3d):
    """3d transposed convolution; as ``torch.nn.ConvTranspose3d``.

    Takes the same arguments as ``ConvTranspose2d``, with 3-tuples.

    Example:
        >>> up = ConvTranspose3d(2, 1, kernel_size=2, stride=2)
        >>> up(up.init(0), torch.zeros(1, 2, 2, 2, 2)).shape
        torch.Size([1, 1, 4, 4, 4])
    """
