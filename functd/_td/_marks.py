"""The params-check cache: the one slot of a TensorDict that may change after it is built.

A module call checks its params against its layer's layout (paths and shapes).
A TensorDict's values never change, so the answer holds for the life of the
TensorDict: the call records a *token* in the TensorDict's ``_check_cache`` slot
and the next call with the same params compares the token (one ``is`` test)
instead of checking again. The token is owned by the module room
(``functd/_modules/_params_check.py``: the layer checked against, or a
``Placed`` record when the params hold DTensors); this file owns the slot and is
the only writer after construction:

- ``mark(td, token)``: record a check (``token=None`` forgets it);
- ``carry(src, dst)``: ``dst`` was built with ``src``'s keys and shapes (pytree
  unflatten): the check holds for it too;
- ``keep_marks(seen, like)``: copy the marks that calls left on ``seen`` (and its
  nested TensorDicts) onto ``like``, of the same layout (``fd.grad``);
- ``mark_of(td)`` and ``is_checked(params, token)``: read it.

This is the one exception to "nothing a call is given is modified": the cache
is invisible to values (equality, pytree leaves, repr, files) and only saves
the repeated check. Under ``torch.compile`` nothing is written (a side effect on
an input would fail a guard and recompile).

Example:
    >>> mark(params, layer)
    >>> is_checked(params, layer)
    True
"""

from __future__ import annotations

from typing import Any

from ._tensordict import TensorDict

__all__ = ["carry", "is_checked", "keep_marks", "mark", "mark_of"]


#: ``mark(td, token)``: record that ``td`` passed the check ``token`` names (None: forget
#: it, as every new TensorDict starts). The slot's setter itself: a hot path (plans, jit).
mark = vars(TensorDict)["_check_cache"].__set__


def mark_of(td: TensorDict) -> Any:
    """The token of the last check ``td`` passed, or None."""
    return td._check_cache


def is_checked(params: Any, token: Any) -> bool:
    """True when ``params`` is a TensorDict that passed the check ``token`` names."""
    return type(params) is TensorDict and params._check_cache is token


def carry(src: TensorDict, dst: TensorDict) -> None:
    """``dst`` holds ``src``'s keys and shapes: ``src``'s check holds for it too."""
    mark(dst, src._check_cache)


def keep_marks(seen: TensorDict, like: TensorDict) -> None:
    """Copy the marks that module calls left on ``seen`` (and its nested TensorDicts)
    onto ``like``, a TensorDict of the same layout it was built from
    (``unflatten_like``), so that later TensorDicts built from ``like`` skip the
    check too."""
    token = seen._check_cache
    if token is not None and like._check_cache is not token:
        mark(like, token)
    data = like._data
    for k, v in seen._data.items():
        if type(v) is TensorDict:
            keep_marks(v, data[k])  # type: ignore[arg-type]
