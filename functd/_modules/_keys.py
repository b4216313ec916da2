"""Keys of modules: ``in_keys``/``out_keys`` normalised as tensordict does.

Example:
    >>> as_keys(["x", ("c", ("d",))], "in_keys")
    ('x', ('c', 'd'))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._td import Key, key_path

__all__ = ["as_keys", "key_diff"]


def key_diff(expected: Any, got: Any) -> tuple[list, list]:
    """``(missing, extra)``: the keys of ``expected`` not in ``got``, and of ``got``
    not in ``expected`` (each in its container's order).

    Example:
        >>> key_diff({"a": 1, "b": 2}, ["b", "c"])
        (['a'], ['c'])
    """
    return [k for k in expected if k not in got], [k for k in got if k not in expected]


def _unravel(key: Any) -> Any:
    """Flatten nested tuples as tensordict's ``unravel_key`` does:
    ``("c", ("d",))`` is ``("c", "d")``; anything else is returned as is."""
    if type(key) is not tuple or all(type(k) is str for k in key):
        return key
    out: list = []
    for part in key:
        part = _unravel(part)
        if type(part) is tuple:
            out.extend(part)
        else:
            out.append(part)
    return tuple(out)


def as_keys(keys: Any, what: str) -> tuple[Key, ...]:
    """Normalise ``in_keys``/``out_keys``: a str, or a sequence of str/tuple keys.

    Nested tuples are flattened as tensordict does (``("c", ("d",))`` is
    ``("c", "d")``). A tuple of str is one nested key; a tuple holding tuples is
    a sequence of keys (``m.in_keys`` round-trips); pass a list to be explicit.
    """
    if isinstance(keys, str | tuple) and (
        isinstance(keys, str) or all(isinstance(k, str) for k in keys)
    ):
        keys = [keys]
    if not isinstance(keys, Sequence):
        raise TypeError(f"{what} must be a list of keys (str or tuple of str), got {keys!r}")
    out = []
    for k in keys:
        path = key_path(_unravel(k))
        out.append(path[0] if len(path) == 1 else path)
    return tuple(out)
