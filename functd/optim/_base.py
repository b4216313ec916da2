"""The optimizer protocol: ``GradientTransformation(init, update)``, ``chain``, ``apply_updates``.

A gradient transformation is a pair of pure functions, as in optax:

- ``init(params) -> state``: a TensorDict (shaped like ``params`` where it
  holds per-parameter statistics, plus a scalar ``count``);
- ``update(updates, state, params=None) -> (updates, state)``: new updates and
  a new state; nothing given is modified.

``init`` and ``update`` are :class:`Partial` values (a function with its
hyper-parameters bound), so transformations compare and hash by value:
``adam(1e-3) == adam(1e-3)``, and ``chain`` is associative.

Example:
    >>> opt = fd.optim.chain(fd.optim.clip_by_global_norm(1.0), fd.optim.adam(1e-3))
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> params = fd.optim.apply_updates(params, updates)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch

from .._frozen import Frozen
from .._td import TensorDict, from_parts
from .._td._tree import unflatten_like
from . import _listops as L

__all__ = ["GradientTransformation", "Partial", "apply_updates", "chain", "identity"]


class Partial(Frozen):
    """A function with keyword hyper-parameters bound; equal when both are.

    Like ``functools.partial`` (keywords only), but frozen, hashable and compared
    by value, so the transformations built from it are values too.

    Example:
        >>> Partial(pow, exp=2)(base=3)
        9
    """

    __slots__ = ("func", "kwargs")

    func: Callable[..., Any]
    kwargs: dict[str, Any]

    def __init__(self, func: Callable[..., Any], /, **kwargs: Any) -> None:
        object.__setattr__(self, "func", func)
        object.__setattr__(self, "kwargs", kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs, **self.kwargs)

    def _identity(self) -> tuple[Any, ...]:
        return (self.func, tuple(sorted((k, _hashable(v)) for k, v in self.kwargs.items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{getattr(self.func, '__name__', self.func)}({args})"


def _hashable(v: Any) -> Any:
    # tensors (hyper-parameters injected as tensors) compare by identity
    return ("tensor", id(v)) if isinstance(v, torch.Tensor) else v


class TransformUpdateFn(Protocol):
    """The type of ``update`` (optax's name): ``update(updates, state, params=None)``."""

    def __call__(
        self, updates: TensorDict, state: TensorDict, /, params: TensorDict | None = None
    ) -> tuple[TensorDict, TensorDict]: ...


class GradientTransformation(NamedTuple):
    """A pair ``(init, update)`` of pure functions; see the module docstring.

    Attributes:
        init: ``init(params) -> state``.
        update: ``update(updates, state, params=None) -> (updates, state)``.

    Example:
        >>> opt = fd.optim.sgd(0.1)
        >>> state = opt.init(params)
        >>> updates, state = opt.update(grads, state)
    """

    init: Callable[[TensorDict], TensorDict]
    update: TransformUpdateFn

    def __repr__(self) -> str:
        name = getattr(self.update, "kwargs", {}).get("name")
        if name is None:
            return f"GradientTransformation(init={self.init!r}, update={self.update!r})"
        kw = {
            k: v
            for k, v in self.update.kwargs.items()  # type: ignore[attr-defined]
            if k not in ("name", "kernel", "decoupled", "fn", "factory")
            and not (k == "lr" and v is None)
        }
        return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"


def transformation(
    name: str, init: Callable[..., Any], update: Callable[..., Any], **hparams: Any
) -> GradientTransformation:
    """Build a GradientTransformation from module-level ``init``/``update`` functions
    taking ``name`` and the hyper-parameters as keywords (internal helper)."""
    return GradientTransformation(
        Partial(init, name=name, **hparams), Partial(update, name=name, **hparams)
    )


# ------------------------------------------------------------------ identity
def _identity_init(params: TensorDict, *, name: str) -> TensorDict:
    L.check_params(f"fd.optim.{name}.init", params)
    return from_parts({}, torch.Size([]))


def _identity_update(
    updates: TensorDict, state: TensorDict, params: TensorDict | None = None, *, name: str
) -> tuple[TensorDict, TensorDict]:
    L.check_state(f"fd.optim.{name}.update", state, ())
    return updates, state


def identity() -> GradientTransformation:
    """The transformation that returns the updates unchanged (empty state).

    Example:
        >>> fd.optim.chain(fd.optim.identity(), opt) == opt
        True
    """
    return transformation("identity", _identity_init, _identity_update)


# ------------------------------------------------------------------ chain
def _chain_init(params: TensorDict, *, name: str, txs: tuple[Any, ...]) -> TensorDict:
    return from_parts({str(i): tx.init(params) for i, tx in enumerate(txs)}, torch.Size([]))


def _chain_update(
    updates: TensorDict,
    state: TensorDict,
    params: TensorDict | None = None,
    *,
    name: str,
    txs: tuple[Any, ...],
) -> tuple[TensorDict, TensorDict]:
    L.check_state(f"fd.optim.{name}.update", state, tuple(str(i) for i in range(len(txs))))
    new = {}
    for i, tx in enumerate(txs):
        updates, new[str(i)] = tx.update(updates, state._data[str(i)], params)
    return updates, from_parts(new, state._batch_size)


class Chain(GradientTransformation):
    """What ``chain`` returns: a GradientTransformation of its own type, so that
    ``chain`` recognises (and flattens) a nested chain by ``isinstance``."""

    __slots__ = ()

    @property
    def txs(self) -> tuple[GradientTransformation, ...]:
        """The chained transformations, in order (never a chain, never identity)."""
        txs: tuple[GradientTransformation, ...] = self.update.kwargs["txs"]  # type: ignore[attr-defined]
        return txs

    def __repr__(self) -> str:
        return "chain(" + ", ".join(map(repr, self.txs)) + ")"


def chain(*transformations: GradientTransformation) -> GradientTransformation:
    """Apply transformations in order: the updates of one are the input of the next.

    Nested chains are flattened and identities dropped, so ``chain`` is
    associative and compares by value; ``chain(tx)`` is ``tx`` and ``chain()`` is
    ``identity()``. The state is a TensorDict with one entry per transformation,
    named by position (``state["1", "exp_avg"]``), empty for stateless ones.

    Raises:
        TypeError: an argument is not a GradientTransformation.

    Example:
        >>> opt = chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(1e-3))
    """
    flat: list[GradientTransformation] = []
    for i, tx in enumerate(transformations):
        if not isinstance(tx, GradientTransformation):
            raise TypeError(
                f"fd.optim.chain: argument {i} is a {type(tx).__name__}, not a "
                "GradientTransformation; pass optimizers such as fd.optim.adam(1e-3) or "
                "building blocks such as fd.optim.scale(-0.1) (call the factory)."
            )
        if isinstance(tx, Chain):
            flat.extend(tx.txs)
        elif getattr(tx.update, "kwargs", {}).get("name") != "identity":
            flat.append(tx)
    if not flat:
        return identity()
    if len(flat) == 1:
        return flat[0]
    return Chain(*transformation("chain", _chain_init, _chain_update, txs=tuple(flat)))


# ------------------------------------------------------------------ apply_updates
def apply_updates(params: TensorDict, updates: TensorDict) -> TensorDict:
    """Return ``params + updates`` leaf by leaf, in the dtype of ``params``.

    Nothing is modified: a new TensorDict is returned.

    Raises:
        TypeError: ``params`` or ``updates`` is not a TensorDict.
        ValueError: their keys or shapes differ (the message names the key).

    Example:
        >>> params = fd.optim.apply_updates(params, updates)
    """
    where = "fd.optim.apply_updates"
    p, spec = L.checked_leaves(where, "params", params)
    u, uspec = L.checked_leaves(where, "updates", updates)
    L.check_same(where, "params", p, spec, "updates", u, uspec, params, updates)
    u = [x if x.dtype == y.dtype else x.to(y.dtype) for x, y in zip(u, p)]
    return unflatten_like(spec, L.add(p, u))
