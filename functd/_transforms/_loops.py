"""``fd.scan`` and ``fd.fori_loop``: loops over pytrees that compose with the transforms.

Eager (and under ``fd.vmap``/``fd.grad``/``torch.func`` without compiling) a loop is
a plain Python loop: ``xs`` is unbound once per leaf, ``f`` runs per step, and the
outputs are stacked with one ``torch.stack`` per leaf at the end. Under
``torch.compile`` and ``fd.jit`` it is torch's ``scan`` higher-order op: one graph
whose size (and compile time) does not grow with the length; ``_loops_hop`` builds
it, and falls back to the unrolled loop (with a ``LoopWarning``) where the op
cannot follow (see notes/transforms.md, "fd.scan").

Example:
    >>> carry, ys = fd.scan(lambda c, x: (c + x, c * x), torch.zeros(3), torch.ones(5, 3))
    >>> ys.shape
    torch.Size([5, 3])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch
from torch import Tensor

from .._td._tree import NAMESPACE
from ._loop_checks import (
    BOUNDS,
    NOT_CALLABLE,
    Y_CHANGED,
    LoopWarning,
    _check_init,
    _describe,
    _flat_xs,
    _kind,
    _split,
    check_carry,
    y_leaves,
)

__all__ = ["LoopWarning", "fori_loop", "scan"]


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
) -> tuple[Any, Any]:
    """Loop ``f(carry, x) -> (carry, y)`` over the leading dim of ``xs``, as
    ``jax.lax.scan``: returns the last carry and the ``y``s stacked along a new dim 0.

    ``init``, ``xs`` and each ``y`` are pytrees (TensorDicts, dicts, tuples, tensors).
    A TensorDict in ``xs`` is sliced along its first batch dim (``f`` sees batch size
    ``bs[1:]``); a TensorDict in ``y`` comes back with batch size ``[length, *bs]``.
    ``f`` may close over tensors (parameters). Eager it is a Python loop; under
    ``torch.compile`` or ``fd.jit`` it is torch's scan op: one graph whatever the length.

    Args:
        f: the step, ``f(carry, x) -> (carry, y)``. The carry it returns must have
            init's structure, shapes and dtypes; ``y`` may be None.
        init: the first carry (a pytree of tensors).
        xs: a pytree of tensors with a common leading dim (the steps), or None.
        length: the number of steps when ``xs`` is None (``f`` gets ``x=None``); if
            given with ``xs`` it must agree.
        reverse: run from the last step to the first; ``ys[i]`` is still the output
            of the step that saw ``xs[i]``.

    Returns:
        ``(carry, ys)``.

    Raises:
        ValueError: no ``xs`` and no ``length``, a length < 1, leaves of ``xs`` of
            different lengths, a TensorDict in ``xs`` without batch dims.
        TypeError: ``f`` changed the carry's structure, a shape or a dtype (the
            message names the path), or returned a ``y`` leaf that is not a tensor.

    Example:
        >>> def step(h, x):
        ...     h = torch.tanh(h + x)
        ...     return h, h.sum()
        >>> h, ys = fd.scan(step, torch.zeros(3), torch.randn(10, 3))
        >>> ys.shape
        torch.Size([10])
    """
    if not callable(f):
        raise TypeError(NOT_CALLABLE.format(kind=_kind(f)))
    init_leaves, init_spec = _check_init(init)
    xs_leaves, xs_spec, n = _flat_xs(xs, length)
    if torch.compiler.is_compiling():
        from ._loops_hop import scan_compiled

        out = scan_compiled(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse)
        if out is not None:
            return out
    return _scan_eager(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse)


def _scan_eager(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse):
    steps = range(n - 1, -1, -1) if reverse else range(n)
    slices = [v.unbind(0) for v in xs_leaves]
    unflatten = optree.tree_unflatten
    carry, ys = init, []
    for k, i in enumerate(steps):
        x = None if xs_spec is None else unflatten(xs_spec, [s[i] for s in slices])
        carry, y = _split(f(carry, x))
        if k == 0:
            check_carry(init_spec, init_leaves, carry)
        ys.append(y)
    if n > 1:
        check_carry(init_spec, init_leaves, carry)
    if reverse:
        ys.reverse()
    return carry, stack_ys(ys)


def stack_ys(ys: list) -> Any:
    """The ``y`` of every step stacked along a new dim 0 (one ``torch.stack`` per leaf)."""
    leaves0, spec = y_leaves(ys[0])
    if not leaves0:
        return ys[0] if len(ys) == 1 else optree.tree_unflatten(spec, [])
    columns: list[list[Tensor]] = [[v] for v in leaves0]
    for i, y in enumerate(ys[1:], 1):
        leaves, s = optree.tree_flatten(y, namespace=NAMESPACE)
        if s != spec:
            raise TypeError(Y_CHANGED.format(what="structure", i=i, was=spec, now=s))
        for col, v in zip(columns, leaves):
            if not isinstance(v, Tensor) or v.shape != col[0].shape or v.dtype != col[0].dtype:
                was = _describe(col[0])
                now = _describe(v) if isinstance(v, Tensor) else _kind(v)
                raise TypeError(Y_CHANGED.format(what="leaf", i=i, was=was, now=now))
            col.append(v)
    return optree.tree_unflatten(spec, [torch.stack(col) for col in columns])


def fori_loop(lower: int, upper: int, body: Callable[[Tensor, Any], Any], init: Any) -> Any:
    """``body(i, carry) -> carry`` for ``i`` in ``range(lower, upper)``, as
    ``jax.lax.fori_loop``; ``i`` is a 0-d int64 tensor (in every mode, so the same
    body runs eager and compiled: index with it, ``fd.random.fold_in(key, i)``).

    Built on ``fd.scan`` (over ``torch.arange(lower, upper)``): one graph under
    ``torch.compile``/``fd.jit``, a Python loop eager; ``lower >= upper`` returns
    ``init`` without calling ``body``.

    Args:
        lower: the first index (a Python int).
        upper: one past the last index (a Python int).
        body: the step, ``body(i, carry) -> carry`` (init's structure, shapes, dtypes).
        init: the first carry (a pytree of tensors).

    Returns:
        The last carry.

    Raises:
        TypeError: a bound that is not a Python int, or a carry that changed (as
            ``fd.scan``).

    Example:
        >>> fd.fori_loop(0, 4, lambda i, c: c + i, torch.zeros(()))
        tensor(6.)
    """
    for b in (lower, upper):
        if isinstance(b, bool) or not isinstance(b, int | torch.SymInt):
            raise TypeError(BOUNDS.format(got=f"{type(b).__name__} {b!r}"))
    if upper <= lower:
        _check_init(init)
        return init
    leaves = optree.tree_leaves(init, namespace=NAMESPACE)
    device = leaves[0].device if leaves and isinstance(leaves[0], Tensor) else None
    idx = torch.arange(lower, upper, dtype=torch.int64, device=device)
    carry, _ = scan(lambda c, i: (body(i, c), None), init, idx)
    return carry
