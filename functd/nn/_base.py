"""The layer protocol: a frozen dataclass of static config, parameters passed in.

A layer holds no tensors. ``layer.init(key)`` builds a fresh TensorDict of
parameters (named exactly like the matching torch module's ``state_dict()``),
and ``layer(params, *inputs, key=None)`` is a pure function of its arguments.

Each layer declares its parameters once, in ``_specs()``: a nested dict of
``name -> ParamSpec(shape, initializer)``. ``init`` and ``param_shapes`` are
derived from it, so the shapes used to initialise and the shapes reported can
never disagree.

Example:
    >>> import torch, functd.nn as fnn
    >>> lin = fnn.Linear(3, 4)
    >>> params = lin.init(0)
    >>> lin(params, torch.zeros(2, 3)).shape
    torch.Size([2, 4])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from .. import random as fr
from .._td import TensorDict
from ..random import as_key as as_key  # (defined with the PRNG; re-exported here)

__all__ = [
    "Layer",
    "ParamSpec",
    "as_key",
    "constant",
    "normal",
    "uniform",
]

# (key, feature shape, dtype) -> tensor of shape (*key.shape[:-1], *shape)
Initializer = Callable[[Tensor, tuple[int, ...], torch.dtype], Tensor]


class ParamSpec(NamedTuple):
    """The shape of one parameter and how ``init`` draws it."""

    shape: tuple[int, ...]
    initializer: Initializer


# --------------------------------------------------------------- initializers
def uniform(bound: float) -> Initializer:
    """``U(-bound, bound)``, as ``torch.nn.init.uniform_(w, -bound, bound)``."""

    def draw(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        return fr.uniform(key, shape, dtype=dtype, minval=-bound, maxval=bound)

    return draw


def normal(std: float = 1.0) -> Initializer:
    """``N(0, std**2)``, as ``torch.nn.init.normal_(w, 0, std)``."""

    def draw(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        z = fr.normal(key, shape, dtype=dtype)
        return z if std == 1.0 else z * std

    return draw


def constant(value: float) -> Initializer:
    """Every entry ``value`` (``ones_``/``zeros_``/``constant_``)."""

    def draw(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        return torch.full((*key.shape[:-1], *shape), value, dtype=dtype, device=key.device)

    return draw


def fan_in_bound(fan_in: int) -> float:
    """``1/sqrt(fan_in)``: the bound of torch's default ``kaiming_uniform_(a=sqrt(5))``
    for weights and of the matching bias (0 when ``fan_in`` is 0)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def xavier_uniform(fan_in: int, fan_out: int) -> Initializer:
    """``torch.nn.init.xavier_uniform_``: ``U(±sqrt(6 / (fan_in + fan_out)))``."""
    return uniform(math.sqrt(6.0 / (fan_in + fan_out)))


# ---------------------------------------------------------------------- Layer
class Inline(NamedTuple):
    """How a Sequential's straight-line plan may write out a layer's call instead of
    calling it (``Layer.plan_inline``): ``expr`` formatted with the params variable
    ``p`` and the input variable ``x``, the ``names`` it uses, and ``keeps_lead``: the
    output keeps the input's leading dims. ``call`` is the ``__call__`` it writes out (a
    subclass that overrides ``__call__`` is called, not inlined)."""

    call: Callable[..., Any]
    expr: str
    names: dict[Any, Any]
    keeps_lead: bool


class Layer:
    """Base class of the pure layers: frozen dataclasses of static config.

    Subclasses are ``@dataclasses.dataclass(frozen=True)``: hashable, equal by
    value, holding no tensors. They define ``_specs`` (the parameters) and
    ``__call__(params, *inputs, key=None)``.

    Attributes:
        random: True when ``__call__`` needs a PRNG ``key`` (e.g. ``Dropout``
            outside inference).

    Example:
        >>> lin = Linear(3, 4)
        >>> params = lin.init(functd.random.key(0))
        >>> y = lin(params, torch.zeros(3))
    """

    random: ClassVar[bool] = False
    plan_inline: ClassVar[Inline | None] = None  # see Inline

    def _specs(self) -> dict[str, Any]:
        """Nested dict ``name -> ParamSpec`` in ``state_dict()`` order; ``{}`` if none."""
        return {}

    def init(
        self,
        key: int | Tensor,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> TensorDict:
        """Draw fresh parameters with torch's default initialisation distributions.

        Deterministic in ``key`` and pure: under ``torch.func.vmap`` over a
        batch of keys it builds an ensemble. A batch of keys of shape
        ``(*B, 2)`` also works directly and gives ``batch_size`` ``B``.

        Args:
            key: a ``functd.random`` key, or an int seed.
            dtype: floating dtype of the parameters.
            device: where to create them (default: the key's device).

        Returns:
            A TensorDict named like the torch module's ``state_dict()``;
            empty for a layer without parameters.

        Example:
            >>> params = Linear(3, 4).init(0, dtype=torch.float64)
        """
        flat = list(_flatten_specs(self._specs(), ()))
        if not flat:
            return TensorDict({}, [])
        key = as_key(key)
        if device is not None:
            key = key.to(device)
        keys = fr.split(key, len(flat))
        out: dict[str, Any] = {}
        for i, (path, spec) in enumerate(flat):
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = spec.initializer(keys[..., i, :], spec.shape, dtype)
        return TensorDict(out, key.shape[:-1])

    def param_shapes(self) -> dict[tuple[str, ...], tuple[int, ...]]:
        """The layout of ``init``'s result: ``{path: shape}`` in ``state_dict()`` order.

        Paths are tuples of str, also at the top level (``("weight",)``,
        ``("out_proj", "weight")``); computed without drawing anything.

        Example:
            >>> Linear(3, 4).param_shapes()
            {('weight',): (4, 3), ('bias',): (4,)}
        """
        return {path: tuple(spec.shape) for path, spec in _flatten_specs(self._specs(), ())}

    @property
    def has_params(self) -> bool:
        """Whether the layer has any parameter (``init`` returns a non-empty TensorDict)."""
        return bool(self.param_shapes())

    @property
    def stateful(self) -> bool:
        """True when a call returns ``(out, new_state)``: new running statistics
        (``BatchNorm*`` in training mode) for ``functd.nn.update_state``."""
        return False

    def buffer_paths(self) -> tuple[tuple[str, ...], ...]:
        """Paths of the entries of params that are buffers (running statistics), not
        trainable parameters; ``functd.nn.split_state`` separates them."""
        return ()

    def with_training(self, training: bool) -> Layer:
        """The same layer in training (``True``) or eval mode, as ``nn.Module.train()``
        but returning a new layer (``self`` when unchanged); ``functd.nn.eval_mode`` and
        ``train_mode`` call it. A layer's mode is its ``training`` field (``Dropout``,
        ``BatchNorm*``, ``RNN``/``GRU``/``LSTM``, ``MultiheadAttention``); a layer
        without one has no mode. Layers holding others (``Chain``) or a torch module
        (``FunctionalCall``) override it.

        Example:
            >>> Dropout(0.5).with_training(False)
            Dropout(p=0.5, training=False)
        """
        fields = getattr(self, "__dataclass_fields__", ())
        if "training" not in fields or self.training == training:  # type: ignore[attr-defined]
            return self
        return dataclasses.replace(self, training=training)  # type: ignore[type-var]

    if TYPE_CHECKING:
        # ``layer(params, *inputs, key=None)``: each layer types its own inputs (as
        # ``nn.Module.forward`` is typed ``Callable[..., Any]`` in torch).
        __call__: Callable[..., Any]
    else:

        def __call__(self, params: TensorDict, *inputs: Any, key: Tensor | None = None) -> Any:
            raise NotImplementedError(f"{type(self).__name__} does not define __call__")


def _flatten_specs(specs: dict[Any, Any], prefix: tuple[Any, ...]):
    for name, spec in specs.items():
        if isinstance(spec, dict):
            yield from _flatten_specs(spec, (*prefix, name))
        else:
            yield (*prefix, name), spec


def tup(value: int | tuple[int, ...] | list[int], n: int, name: str) -> tuple[int, ...]:
    """Normalise an int or a sequence of ints to an ``n``-tuple (like torch's ``_ntuple``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    value = tuple(value)
    if len(value) != n or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{name} must be an int or a tuple of {n} ints; got {value!r}")
    return value


def set_derived(obj: object, **values: Any) -> None:
    """Store derived, non-field attributes on a frozen dataclass (from ``__post_init__``)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)
