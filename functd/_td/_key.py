"""Keys of TensorDicts: a ``str`` or a tuple of ``str``, always stored as plain ``str``.

A ``str`` subclass (an ``enum.StrEnum`` member, a user's class) is normalised to the
plain ``str`` of its value where it enters (``str.__str__``): functd stores,
hashes, compares and prints only plain strings, so a subclass's own ``__eq__``,
``__hash__``, ``__repr__`` or ``__str__`` never reaches it.

Example:
    >>> class K(enum.StrEnum):
    ...     X = "x"
    >>> key_path(K.X), key_path(("obs", K.X))
    (('x',), ('obs', 'x'))
"""

from __future__ import annotations

from typing import Any

from .. import _errors as E

__all__ = ["plain_str"]


def plain_str(k: str) -> str:
    """A ``str`` subclass (``enum.StrEnum`` members...) as the plain ``str`` of its value.

    Keys are stored, hashed, compared and printed as plain strings, so a subclass's
    own ``__eq__``, ``__hash__``, ``__repr__`` or ``__str__`` never reaches functd.
    """
    return k if type(k) is str else str.__str__(k)


def key_path(key: Any) -> tuple[str, ...]:
    """Return the key as a non-empty tuple of plain str, or raise a clear error."""
    if type(key) is str:
        return (key,)
    if isinstance(key, str):
        return (str.__str__(key),)
    if isinstance(key, tuple):
        if not key:
            raise KeyError(E.EMPTY_KEY)
        if all(type(k) is str for k in key):
            return key
        if all(isinstance(k, str) for k in key):
            return tuple(str.__str__(k) for k in key)
    example = "'x'" if not isinstance(key, tuple) else "('obs', 'pos')"
    raise TypeError(E.BAD_KEY.format(key=key, type=type(key).__name__, example=example))
