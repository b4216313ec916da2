"""Chain: the pure counterpart of ``torch.nn.Sequential``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Size, Tensor

from .. import random as fr
from .._td import EMPTY, TensorDict, from_parts
from ._base import Layer, as_key, set_derived

__all__ = ["Chain"]


@dataclasses.dataclass(frozen=True)
class Chain(Layer):
    """Apply layers one after the other: ``layers[1](layers[0](*inputs))``.

    The first layer gets all the inputs, every later one the previous output
    (as ``nn.Sequential``, which passes one value along). Parameters nest by
    position (``params["0", "weight"]``), so a Chain mirrors an
    ``nn.Sequential``'s ``state_dict()``; a layer without parameters
    contributes no key. With a stateful layer (``BatchNorm*`` in training
    mode) a call returns ``(y, new_state)``, the new statistics nested by
    position like the params. When some layers are random, the call's ``key`` is
    split among them in order.

    Args:
        layers: the layers (a tuple; a list is converted).
        names: optional child names instead of the positions ``"0"``, ``"1"``...
            (for an ``nn.Sequential`` built from an ``OrderedDict``).

    Example:
        >>> mlp = Chain((Linear(3, 8), ReLU(), Linear(8, 1)))
        >>> params = mlp.init(0)
        >>> params.keys()
        ('0', '2')
        >>> mlp(params, torch.zeros(5, 3)).shape
        torch.Size([5, 1])
    """

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        _n_random: ClassVar[Any]
        _names: ClassVar[Any]
        _plan: ClassVar[Any]
        _stateful: ClassVar[Any]

    layers: tuple[Layer, ...]
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        object.__setattr__(self, "layers", layers)
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(
                    f"Chain(layers): entry {i} is a {type(layer).__name__}, not a functd.nn "
                    f"layer; wrap a torch module with functd.nn.lower(module, fallback=True)."
                )
        if self.names is not None:
            names = tuple(self.names)
            if len(names) != len(layers) or len(set(names)) != len(names):
                raise ValueError(
                    f"Chain(names=...) needs one distinct name per layer; got {names!r} "
                    f"for {len(layers)} layers"
                )
            object.__setattr__(self, "names", names)
        names = self.names or tuple(str(i) for i in range(len(layers)))
        n_random = sum(layer.random for layer in layers)
        plan, r = [], 0
        for name, layer in zip(names, layers):
            plan.append((name if layer.has_params else None, layer, r if layer.random else None))
            r += layer.random
        set_derived(
            self,
            _plan=tuple(plan),
            _names=names,
            _n_random=n_random,
            _stateful=any(layer.stateful for layer in layers),
        )

    @property
    def random(self) -> bool:  # type: ignore[override]
        """True when some layer needs a PRNG key."""
        return self._n_random > 0

    @property
    def stateful(self) -> bool:
        """True when some layer returns new running statistics (a call then
        returns ``(y, new_state)``, the state nested by layer name)."""
        return self._stateful

    def buffer_paths(self) -> tuple[tuple[str, ...], ...]:
        return tuple(
            (name, *path)
            for name, layer in zip(self._names, self.layers)
            for path in layer.buffer_paths()
        )

    def with_training(self, training: bool) -> Chain:
        """The Chain with every layer switched (``self`` when none changes)."""
        layers = tuple(layer.with_training(training) for layer in self.layers)
        if all(a is b for a, b in zip(layers, self.layers)):
            return self
        return dataclasses.replace(self, layers=layers)

    def _specs(self) -> dict[str, Any]:
        out = {}
        for name, layer in zip(self._names, self.layers):
            specs = layer._specs()
            if specs:
                out[name] = specs
        return out

    def param_shapes(self) -> dict[tuple[str, ...], tuple[int, ...]]:
        return {
            (name, *path): shape
            for name, layer in zip(self._names, self.layers)
            for path, shape in layer.param_shapes().items()
        }

    def __call__(self, params: TensorDict, *inputs: Any, key: Tensor | int | None = None) -> Any:
        d = params._data
        keys = None
        if key is not None and self._n_random:
            keys = fr.split(as_key(key), self._n_random)
        first = True
        x: Any = None
        states: dict[str, TensorDict] = {}
        for name, layer, r in self._plan:
            p = d[name] if name is not None else EMPTY
            k = keys[r] if r is not None and keys is not None else None
            if first:
                x = layer(p, *inputs, key=k)
                first = False
            else:
                x = layer(p, x, key=k)
            if self._stateful and layer.stateful:
                x, states[name] = x
        x = inputs[0] if first else x
        return (x, from_parts(states, Size([]))) if self._stateful else x

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> Layer:
        return self.layers[i]
