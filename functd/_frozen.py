"""Frozen values: equal and hashed by what they hold, never assigned to.

``Frozen`` is the one base of functd's frozen value classes: the module kinds
(``ModuleKind``), ``functd.optim.Partial``, ``fd.trainable``'s filter and
``fd.train_step``'s ``TrainStep``. A subclass lists its fields in ``__slots__``,
sets them in ``__init__`` with ``object.__setattr__`` and says what it is equal
by (``_identity()``). Setting or deleting an attribute raises ``FrozenError`` (a
``TypeError`` and an ``AttributeError``, as a frozen dataclass's) that says what
to do instead.

Example:
    >>> class Point(Frozen):
    ...     __slots__ = ("x", "y")
    ...     def __init__(self, x, y):
    ...         object.__setattr__(self, "x", x)
    ...         object.__setattr__(self, "y", y)
    ...     def _identity(self): return (self.x, self.y)
    >>> Point(1, 2) == Point(1, 2), len({Point(1, 2), Point(1, 2)})
    (True, 1)
    >>> Point(1, 2).x = 3
    Traceback (most recent call last):
    functd._errors.FrozenError: Point is immutable: cannot set 'x'; build a new one instead.
"""

from __future__ import annotations

from typing import Any

from ._errors import FrozenError

__all__ = ["Frozen"]


class Frozen:
    """Value semantics for frozen classes: equal and hashed by ``(type, _identity())``;
    assigning or deleting an attribute raises ``FrozenError`` (``_frozen_message``: the
    class's ``_FROZEN_HINT`` by default)."""

    __slots__ = ()
    _FROZEN_HINT = "build a new one instead."

    def _identity(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._identity()))

    def _frozen_message(self, name: str) -> str:
        return f"{type(self).__name__} is immutable: cannot set {name!r}; {self._FROZEN_HINT}"

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenError(self._frozen_message(name))

    def __delattr__(self, name: str) -> None:
        raise FrozenError(self._frozen_message(name))
