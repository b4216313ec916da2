"""``partition`` and ``combine``: split a TensorDict by a filter, and put it back.

equinox's ``partition``/``combine`` for TensorDicts: ``partition(td, keep)`` gives
``(kept, rest)``, two TensorDicts of ``td``'s batch size holding the leaves for
which ``keep(path, leaf)`` is true and the others (nested TensorDicts left
without leaves are dropped); ``combine(kept, rest)`` is the inverse. Used to
differentiate and optimise the trainable part of a model's params while the
rest (buffers, frozen parameters) rides along unchanged.

Example:
    >>> trainable, held = fd.partition(params, fd.trainable(model))
    >>> params == fd.combine(trainable, held)   # same leaves (compare with assert_close)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ._tensordict import TensorDict, from_parts

__all__ = ["combine", "partition"]

Filter = Callable[[tuple[str, ...], Tensor], bool]


def partition(td: TensorDict, keep: Filter) -> tuple[TensorDict, TensorDict]:
    """``(kept, rest)``: the leaves of ``td`` for which ``keep(path, leaf)`` is true, and
    the others, each a TensorDict of ``td``'s batch size and key order.

    Args:
        td: the TensorDict to split (a model's params, an ensemble's stacked params).
        keep: ``(path, leaf) -> bool``, ``path`` a tuple of str; e.g. ``fd.trainable(model)``.

    Raises:
        TypeError: ``td`` is not a TensorDict, or ``keep`` is not callable.

    Example:
        >>> floats, ints = fd.partition(td, lambda path, x: x.is_floating_point())
    """
    if not isinstance(td, TensorDict):
        raise TypeError(
            f"fd.partition(td, keep): td must be a TensorDict; got {type(td).__name__}."
        )
    if not callable(keep):
        raise TypeError(
            f"fd.partition(td, keep): keep must be a function (path, leaf) -> bool, such as "
            f"fd.trainable(model); got {type(keep).__name__}."
        )
    return _split(td, keep, ())


def _split(td: TensorDict, keep: Filter, prefix: tuple[Any, ...]) -> tuple[TensorDict, TensorDict]:
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    for k, v in td._data.items():
        path = (*prefix, k)
        if type(v) is TensorDict:
            va, vb = _split(v, keep, path)
            if va._data or not vb._data:  # an empty nested TensorDict stays in ``kept``
                a[k] = va
            if vb._data:
                b[k] = vb
        elif keep(path, v):  # type: ignore[arg-type]
            a[k] = v
        else:
            b[k] = v
    return from_parts(a, td._batch_size), from_parts(b, td._batch_size)


def combine(*parts: TensorDict) -> TensorDict:
    """One TensorDict holding the leaves of every part; the inverse of ``partition``.

    Raises:
        TypeError: a part is not a TensorDict, or none is given.
        ValueError: the parts' batch sizes differ.
        KeyError: a leaf is in more than one part.

    Example:
        >>> params = fd.combine(trainable, held)
    """
    if not parts or not all(isinstance(p, TensorDict) for p in parts):
        got = ", ".join(type(p).__name__ for p in parts) or "nothing"
        raise TypeError(f"fd.combine(*parts) takes TensorDicts; got {got}.")
    bs = parts[0]._batch_size
    for i, p in enumerate(parts[1:], 1):
        if p._batch_size != bs:
            raise ValueError(
                f"fd.combine: part {i} has batch size {list(p._batch_size)} but part 0 has "
                f"{list(bs)}; combine the parts that fd.partition returned."
            )
    data = dict(parts[0]._data)
    for p in parts[1:]:
        _merge(data, p, ())
    return from_parts(data, bs)


def _merge(into: dict[Any, Any], td: TensorDict, prefix: tuple[Any, ...]) -> None:
    for k, v in td._data.items():
        have = into.get(k)
        if have is None:
            into[k] = v
        elif type(have) is TensorDict and type(v) is TensorDict:
            sub = dict(have._data)
            _merge(sub, v, (*prefix, k))
            into[k] = from_parts(sub, have._batch_size)
        else:
            path = (*prefix, k)
            raise KeyError(
                f"fd.combine: {path[0] if len(path) == 1 else path!r} is in more than one part; "
                "give the parts fd.partition returned (each leaf in exactly one)."
            )
