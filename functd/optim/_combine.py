"""``named_chain``: ``chain`` with each transformation's state under a name.

optax's ``named_chain``: the state is keyed by the names given, so
``state["adam", "exp_avg"]`` reads the moments whatever comes before them in the
chain. functd's state is a TensorDict, so the named state is one too (an entry
per name, in the order given); ``chain`` names its entries by position instead.

Example:
    >>> opt = fd.optim.named_chain(("clip", fd.optim.clip_by_global_norm(1.0)),
    ...                            ("adam", fd.optim.adam(1e-3)))
    >>> state = opt.init(params)
    >>> state["adam", "count"]
    tensor(0)
"""

from __future__ import annotations

from typing import Any

from .._td import TensorDict
from . import _listops as L
from ._base import GradientTransformation, transformation

__all__ = ["named_chain"]


def _named_init(params: TensorDict, *, name: str, txs: tuple[Any, ...]) -> TensorDict:
    L.check_params(f"fd.optim.{name}.init", params)
    return L.state_td({key: tx.init(params) for key, tx in txs})


def _named_update(updates, state, params=None, *, name: str, txs: tuple[Any, ...]):
    L.check_state(f"fd.optim.{name}.update", state, tuple(key for key, _ in txs))
    new = {}
    for key, tx in txs:
        updates, new[key] = tx.update(updates, state._data[key], params)
    return updates, L.state_td(new)


class NamedChain(GradientTransformation):
    """What ``named_chain`` returns (a GradientTransformation; its own type for the
    ``repr``, which shows the pairs as they were given)."""

    __slots__ = ()

    @property
    def txs(self) -> tuple[tuple[str, GradientTransformation], ...]:
        """The ``(name, transformation)`` pairs, in order."""
        return self.update.kwargs["txs"]  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return "named_chain(" + ", ".join(f"({k!r}, {tx!r})" for k, tx in self.txs) + ")"


def _checked_pair(i: int, pair: Any) -> tuple[str, GradientTransformation]:
    where = "fd.optim.named_chain"
    if isinstance(pair, GradientTransformation) or not (isinstance(pair, tuple) and len(pair) == 2):
        raise TypeError(
            f"{where}: argument {i} is a {type(pair).__name__}, not a (name, transformation) "
            "pair; write named_chain(('clip', fd.optim.clip(1.0)), ('adam', fd.optim.adam(1e-3)))."
        )
    key, tx = pair
    if not (isinstance(key, str) and key):
        raise TypeError(
            f"{where}: the name of argument {i} is {key!r}; names must be non-empty str "
            "(they are the keys of the state TensorDict)."
        )
    if not isinstance(tx, GradientTransformation):
        raise TypeError(
            f"{where}: the transformation named {key!r} is a {type(tx).__name__}, not a "
            "GradientTransformation; call the factory (fd.optim.adam(1e-3), not fd.optim.adam)."
        )
    return key, tx


def named_chain(*transformations: tuple[str, GradientTransformation]) -> GradientTransformation:
    """Apply ``(name, transformation)`` pairs in order, each state under its name.

    As ``optax.named_chain``: the updates of one transformation are the input of
    the next, and the state is a TensorDict with one entry per name (in the order
    given), so ``state[name]`` is that transformation's state. Unlike ``chain``,
    nothing is flattened or dropped: a nested chain or an identity keeps its own
    entry.

    Raises:
        TypeError: an argument is not a ``(str, GradientTransformation)`` pair.
        ValueError: a name is given twice.

    Example:
        >>> opt = fd.optim.named_chain(("decay", fd.optim.add_decayed_weights(1e-4)),
        ...                            ("adam", fd.optim.adam(1e-3)))
        >>> opt.init(params)["adam", "exp_avg"]   # shaped like params
    """
    pairs = tuple(_checked_pair(i, pair) for i, pair in enumerate(transformations))
    names = [key for key, _ in pairs]
    twice = sorted({key for key in names if names.count(key) > 1})
    if twice:
        raise ValueError(
            f"fd.optim.named_chain: the names must be unique (they key the state), but "
            f"{', '.join(map(repr, twice))} is given more than once; got {names}."
        )
    return NamedChain(*transformation("named_chain", _named_init, _named_update, txs=pairs))
