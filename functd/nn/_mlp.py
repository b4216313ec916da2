"""MLP: Linear layers with an activation between them."""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any, ClassVar

import torch.nn.functional as F
from torch import Tensor

from .._td import EMPTY, TensorDict
from ._activation import ReLU
from ._base import Layer, set_derived
from ._linear import Linear

__all__ = ["MLP"]

_RELU = ReLU()


@dataclasses.dataclass(frozen=True)
class MLP(Layer):
    """A multi-layer perceptron, laid out like ``nn.Sequential(Linear, act, ..., Linear)``.

    The parameters are those of that ``nn.Sequential``'s ``state_dict()``:
    ``"0"``, ``"2"``, ``"4"``... each with ``weight`` and ``bias`` (the
    activations take the odd positions and have no parameters). No activation
    follows the last Linear.

    Args:
        in_features: size of the input's last dim.
        out_features: size of the output's last dim.
        num_cells: the hidden sizes, one per hidden layer (``()``: one Linear).
        activation: a parameter-free layer applied after each hidden Linear.
        bias: whether the Linear layers learn a bias.

    Example:
        >>> mlp = MLP(3, 2, num_cells=(16, 16), activation=Tanh())
        >>> params = mlp.init(0)
        >>> params.keys()
        ('0', '2', '4')
        >>> mlp(params, torch.zeros(5, 3)).shape
        torch.Size([5, 2])
    """

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        _linears: ClassVar[Any]
        _names: ClassVar[Any]

    in_features: int
    out_features: int
    num_cells: tuple[int, ...] = (128, 128)
    activation: Layer = _RELU
    bias: bool = True

    def __post_init__(self) -> None:
        cells = (self.num_cells,) if isinstance(self.num_cells, int) else tuple(self.num_cells)
        object.__setattr__(self, "num_cells", cells)
        act = self.activation
        if not isinstance(act, Layer) or act.has_params or act.random:
            raise TypeError(
                f"MLP(activation=...) must be a parameter-free, deterministic functd.nn layer "
                f"such as functd.nn.ReLU(); got {act!r}"
            )
        sizes = (self.in_features, *cells, self.out_features)
        linears = tuple(Linear(a, b, self.bias) for a, b in itertools.pairwise(sizes))
        set_derived(
            self,
            _linears=linears,
            _names=tuple(str(2 * i) for i in range(len(linears))),
        )

    def _specs(self) -> dict[str, Any]:
        return {name: lin._specs() for name, lin in zip(self._names, self._linears)}

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Tensor:
        d = params._data
        act = self.activation
        names = self._names
        for name in names[:-1]:
            p = d[name]._data
            x = act(EMPTY, F.linear(x, p["weight"], p.get("bias")))
        p = d[names[-1]]._data
        return F.linear(x, p["weight"], p.get("bias"))
