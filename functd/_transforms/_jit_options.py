"""``fd.jit``'s options checked when the wrapper is built (``static_argnums``,
``donate_argnums``, ``dynamic``, ``cache_size``, ``backend``).

Example:
    >>> checked(f, 1, (), None, 8, "inductor")
    ((1,), ())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["BACKENDS", "checked"]

BACKENDS = ("inductor", "fx")


def checked(
    f: Any,
    static_argnums: int | Sequence[int],
    donate_argnums: int | Sequence[int],
    dynamic: bool | None,
    cache_size: int,
    backend: str,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``jit``'s arguments checked: ``(static, donate)``, the sorted argument numbers."""
    if not callable(f):
        raise TypeError(f"fd.jit(f) takes a function, got a {type(f).__name__}.")
    static, donate = (
        _argnums("static_argnums", static_argnums),
        _argnums("donate_argnums", donate_argnums),
    )
    if set(static) & set(donate):
        raise ValueError(
            f"fd.jit: argument(s) {sorted(set(static) & set(donate))} are both static and "
            "donated; a static argument is a constant, it holds no output."
        )
    if dynamic not in (None, True, False):
        raise ValueError(f"fd.jit: dynamic must be None, True or False, got {dynamic!r}.")
    if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
        raise ValueError(f"fd.jit: cache_size must be an int >= 1, got {cache_size!r}.")
    if backend not in BACKENDS:
        raise ValueError(f"fd.jit: backend must be one of {BACKENDS}, got {backend!r}.")
    return static, donate


def _argnums(what: str, v: int | Sequence[int]) -> tuple[int, ...]:
    nums = (v,) if isinstance(v, int) and not isinstance(v, bool) else tuple(v)  # type: ignore[arg-type]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in nums):
        raise TypeError(f"fd.jit: {what} must be non-negative ints, got {v!r}.")
    return tuple(sorted(set(nums)))
