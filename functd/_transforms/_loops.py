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

from .._td import TensorDict
from .._td._tree import NAMESPACE
from ._paths import fmt_path

__all__ = ["LoopWarning", "fori_loop", "scan"]

NOT_CALLABLE = "fd.scan: f must be a callable f(carry, x) -> (carry, y); got {kind}."
NO_LENGTH = (
    "fd.scan(f, init, xs=None): without xs the number of steps is unknown. Pass "
    "length=n (f is then called with x=None), or xs with a leading dim of n."
)
BAD_LENGTH = "fd.scan: length must be a Python int >= 1; got {got}. {fix}"
XS_LEAF = (
    "fd.scan: xs{path} is a {kind}, not a tensor with a leading dim to loop over. "
    "Every leaf of xs is sliced along its dim 0; close over other values in f."
)
XS_TD = (
    "fd.scan: the TensorDict at xs{path} has batch size []: a TensorDict in xs is "
    "sliced along its first batch dim. Build it with batch_size=[n, ...] "
    "(TensorDict(..., batch_size=[n])) or pass its leaves."
)
XS_LENGTHS = (
    "fd.scan: the leaves of xs disagree on the number of steps: xs{a} has {n} along "
    "dim 0 and xs{b} has {m}. Every leaf of xs is sliced along dim 0."
)
LENGTH_XS = (
    "fd.scan: length={length} but xs{path} has {n} steps along dim 0; drop length or fix xs."
)
F_RESULT = (
    "fd.scan: f must return a pair (carry, y); it returned {kind}. Return (carry, None) "
    "when there is nothing to stack."
)
CARRY_STRUCTURE = (
    "fd.scan: f changed the structure of the carry: init is {was} and f returned "
    "{now}. f must return a carry with init's structure (the same keys, entries and "
    "containers), shapes and dtypes."
)
CARRY_LEAF = (
    "fd.scan: f changed the carry at {path}: init has {was} and f returned {now}. f "
    "must return a carry with init's structure, shapes and dtypes: cast (.to(dtype)), "
    "reshape, or start init with the shape and dtype of the step's result."
)
Y_LEAF = (
    "fd.scan: f returned a {kind} at y{path}; the outputs y are stacked along a new "
    "dim 0, so their leaves must be tensors (torch.as_tensor(v)) or None."
)
Y_CHANGED = (
    "fd.scan: f returned a y whose {what} changed at step {i}: {was} at step 0, {now} "
    "now. The outputs are stacked, so every step must return the same structure, "
    "shapes and dtypes."
)
BOUNDS = (
    "fd.fori_loop: lower and upper must be Python ints (the number of steps is fixed "
    "when the loop is built); got {got}. For a bound held in a tensor, loop over the "
    "largest count and mask the extra steps with torch.where."
)


class LoopWarning(UserWarning):
    """``fd.scan`` under ``torch.compile``/``fd.jit`` unrolled the loop (torch's scan
    op could not follow; the warning says why): the graph grows with the length."""


def _kind(v: Any) -> str:
    return type(v).__name__


def _describe(t: Tensor) -> str:
    dtype = str(t.dtype).replace("torch.", "")
    return f"{dtype}{list(t.shape)}"


# ---------------------------------------------------------------------------- checks
def _flat_xs(xs: Any, length: int | None) -> tuple[list[Tensor], Any, int]:
    """The leaves of xs, its structure and the number of steps (checked)."""
    if xs is None:
        if length is None:
            raise ValueError(NO_LENGTH)
        return [], None, _check_length(length, "")
    paths, leaves, spec = optree.tree_flatten_with_path(xs, namespace=NAMESPACE)
    _check_tds(xs, ())
    n = None
    for p, v in zip(paths, leaves):
        if not isinstance(v, Tensor) or v.ndim == 0:
            kind = "0-d tensor" if isinstance(v, Tensor) else _kind(v)
            raise TypeError(XS_LEAF.format(path=fmt_path(p, ""), kind=kind))
        if n is None:
            n, first = v.shape[0], p
        elif v.shape[0] != n:
            a, b = fmt_path(first, ""), fmt_path(p, "")
            raise ValueError(XS_LENGTHS.format(a=a, n=n, b=b, m=v.shape[0]))
    if n is None:  # xs without leaves: as xs=None
        if length is None:
            raise ValueError(NO_LENGTH)
        return [], None, _check_length(length, "")
    if length is not None and length != n:
        raise ValueError(LENGTH_XS.format(length=length, path=fmt_path(first, ""), n=n))
    _check_length(n, "xs has no steps (a leading dim of 0).")
    return leaves, spec, n


def _check_tds(v: Any, path: tuple) -> None:
    if isinstance(v, TensorDict):
        if not v.batch_size:
            raise ValueError(XS_TD.format(path=fmt_path(path, "")))
        return
    if isinstance(v, tuple | list):
        for i, w in enumerate(v):
            _check_tds(w, (*path, i))
    elif isinstance(v, dict):
        for k, w in v.items():
            _check_tds(w, (*path, k))


def _check_length(n: Any, fix: str) -> Any:
    if (type(n) is not int and not isinstance(n, torch.SymInt)) or (type(n) is int and n < 1):
        fix = fix or "A loop of 0 steps has no ys to stack (their shapes come from f)."
        raise ValueError(BAD_LENGTH.format(got=n, fix=fix))
    return n


def _split(out: Any) -> tuple[Any, Any]:
    if not isinstance(out, tuple) or len(out) != 2:
        kind = f"a tuple of {len(out)}" if isinstance(out, tuple) else f"a {_kind(out)}"
        raise TypeError(F_RESULT.format(kind=kind))
    return out


def check_carry(init_spec: Any, init_leaves: list, carry: Any) -> list[Tensor]:
    """The leaves of the carry ``f`` returned, checked against init's."""
    paths, leaves, spec = optree.tree_flatten_with_path(carry, namespace=NAMESPACE)
    if spec != init_spec:
        raise TypeError(CARRY_STRUCTURE.format(was=_short(init_spec), now=_short(spec)))
    for p, a, b in zip(paths, init_leaves, leaves):
        if not isinstance(b, Tensor):
            raise TypeError(
                CARRY_LEAF.format(path=fmt_path(p, "carry"), was=_describe(a), now=_kind(b))
            )
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            was, now = _describe(a), _describe(b)
            if a.device != b.device:
                was, now = f"{was} on {a.device}", f"{now} on {b.device}"
            raise TypeError(CARRY_LEAF.format(path=fmt_path(p, "carry"), was=was, now=now))
    return leaves


def _short(spec: Any) -> str:
    s = str(spec)
    return s if len(s) < 300 else s[:300] + "..."


def y_leaves(y: Any) -> tuple[list[Tensor], Any]:
    """The leaves of one step's ``y`` (tensors; None entries are empty nodes)."""
    paths, leaves, spec = optree.tree_flatten_with_path(y, namespace=NAMESPACE)
    for p, v in zip(paths, leaves):
        if not isinstance(v, Tensor):
            raise TypeError(Y_LEAF.format(path=fmt_path(p, ""), kind=_kind(v)))
    return leaves, spec


def _check_init(init: Any) -> tuple[list, Any]:
    paths, leaves, spec = optree.tree_flatten_with_path(init, namespace=NAMESPACE)
    for p, v in zip(paths, leaves):
        if not isinstance(v, Tensor):
            raise TypeError(
                f"fd.scan: init{fmt_path(p, '')} is a {_kind(v)}; the carry's leaves must be "
                "tensors (torch.as_tensor(v)); close over static values in f instead."
            )
    return leaves, spec


# ---------------------------------------------------------------------------- public
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
