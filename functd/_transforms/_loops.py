"""``fd.scan`` and ``fd.fori_loop``: loops over pytrees that compose with the transforms.

Eager (and under ``fd.vmap``/``fd.grad``/``torch.func`` without compiling) a loop is
a plain Python loop: ``xs`` is unbound once per leaf, ``f`` runs per step, and the
outputs are stacked with one ``torch.stack`` per leaf at the end. Under
``torch.compile`` and ``fd.jit`` it is torch's ``scan`` higher-order op: one graph
whose size (and compile time) does not grow with the length; ``_loops_hop`` builds
it, and falls back to the unrolled loop (with a ``LoopWarning``) where the op
cannot follow (see notes/transforms.md, "fd.scan"). Also here: Python scalars in
the carry (JAX's weak types, promoted by the step as JAX does), length 0 (the step
evaluated once on tensors without values), ``unroll=`` (blocks of steps in the
compiled loop's body) and ``fori_loop``'s tensor bounds (a while loop).

Example:
    >>> carry, ys = fd.scan(lambda c, x: (c + x, c * x), torch.zeros(3), torch.ones(5, 3))
    >>> ys.shape
    torch.Size([5, 3])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import optree
import torch
from torch import Tensor

from .._td._tree import NAMESPACE
from ._loop_checks import (
    NOT_CALLABLE,
    TRACED_BOUNDS,
    Y_CHANGED,
    LoopWarning,
    _check_init,
    _describe,
    _flat_xs,
    _kind,
    _split,
    as_carry,
    check_bound,
    check_carry,
    check_unroll,
    has_scalars,
    promoted,
    same_structure,
    tensorized,
    y_leaves,
)
from ._loop_index import index_mode

__all__ = ["LoopWarning", "fori_loop", "scan"]
_C = TypeVar("_C")  # the carry (as jax.lax's types; a Python scalar in it is a 0-d tensor)
_Y = TypeVar("_Y")  # a step's output (stacked: a tensor or TensorDict stays one)


def scan(
    f: Callable[[_C, Any], tuple[_C, _Y]],
    init: _C,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> tuple[_C, _Y]:
    """Loop ``f(carry, x) -> (carry, y)`` over the leading dim of ``xs``, as
    ``jax.lax.scan``: returns the last carry and the ``y``s stacked along a new dim 0.

    ``init``, ``xs`` and each ``y`` are pytrees (TensorDicts, dicts, tuples, tensors).
    A TensorDict in ``xs`` is sliced along its first batch dim (``f`` sees batch size
    ``bs[1:]``); a TensorDict in ``y`` comes back with batch size ``[length, *bs]``.
    ``f`` may close over tensors (parameters, ``xs`` itself) and index them with a
    tensor it is given (``w[i]``, ``td[i]``). Eager it is a Python loop; under
    ``torch.compile`` or ``fd.jit`` it is torch's scan op: one graph whatever the length.

    Args:
        f: the step, ``f(carry, x) -> (carry, y)``. The carry it returns must have
            init's structure, shapes, dtypes and TensorDict batch sizes (a Python
            scalar in it is a 0-d tensor of init's dtype, promoted as ``init + scalar``
            would be); ``y`` may be None.
        init: the first carry: a pytree of tensors, or of Python and numpy scalars.
            A Python scalar is a 0-d tensor of JAX's weak type: an int is int64, a
            float torch's default dtype (``torch.get_default_dtype()``), a bool bool;
            when the step returns it with another dtype (an int carry plus a float),
            the carry starts in ``torch.result_type`` of the two, as JAX promotes a
            weakly typed carry (the step then runs again from the start: eager, its
            first step runs twice). A numpy scalar keeps its dtype.
        xs: a pytree of tensors with a common leading dim (the steps), or None.
        length: the number of steps when ``xs`` is None (``f`` gets ``x=None``); if
            given with ``xs`` it must agree. Length 0 returns ``init`` and ``ys`` with
            a leading dim of 0, their shapes and dtypes found by running ``f`` once on
            tensors without values (fake tensors: nothing is computed), as JAX traces it.
        reverse: run from the last step to the first; ``ys[i]`` is still the output
            of the step that saw ``xs[i]``.
        unroll: as ``jax.lax.scan``: under ``fd.jit``/``torch.compile`` each
            iteration of the compiled loop runs ``unroll`` steps (the remainder of the
            length after the last whole block runs unrolled after the loop); True
            unrolls the whole loop into the graph. The result is the same; eager it
            changes nothing. A length that varies between calls of an ``fd.jit``
            function (a symbolic length) ignores it.

    Returns:
        ``(carry, ys)``.

    Raises:
        ValueError: no ``xs`` and no ``length``, a negative length, leaves of ``xs``
            of different lengths, a TensorDict in ``xs`` without batch dims, an
            ``unroll`` that is not a bool or an int >= 1.
        TypeError: ``f`` changed the carry's structure, a shape, a dtype or a
            TensorDict's batch size (the message names the path), or returned a ``y``
            leaf that is not a tensor.

    Example:
        >>> def step(h, x):
        ...     h = torch.tanh(h + x)
        ...     return h, h.sum()
        >>> h, ys = fd.scan(step, torch.zeros(3), torch.randn(10, 3))
        >>> ys.shape
        torch.Size([10])
        >>> fd.scan(lambda c, x: (c + 1, None), 0, length=3)  # a weakly typed carry
        (tensor(3), None)
    """
    if not callable(f):
        raise TypeError(NOT_CALLABLE.format(kind=_kind(f)))
    unroll = check_unroll(unroll, "scan")
    xs_leaves, xs_spec, n = _flat_xs(xs, length)
    return _scan_weak(f, init, xs_leaves, xs_spec, n, reverse, unroll)


def _scan_weak(f, init, xs_leaves, xs_spec, n, reverse, unroll):
    """The loop, restarted when its first step shows a weakly typed carry's dtype."""
    init, weak = as_carry(init, xs_leaves)
    scalars = False  # the step returns Python scalars in the carry: made tensors
    while True:  # each retry makes a weak carry strong or turns scalars on: bounded
        init_leaves, init_spec = _check_init(init)
        step = _first_call(f, weak, init_leaves, scalars)
        try:
            return _run(step, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse, unroll)
        except _Retry as e:
            dtypes, scalars = e.args
            leaves = list(init_leaves)
            for k, dtype in dtypes.items():
                leaves[k] = leaves[k].to(dtype)
                del weak[k]
            init = optree.tree_unflatten(init_spec, leaves)


class _Retry(Exception):
    """Raised by the step's first call: ``({weak leaf position: promoted dtype},
    whether the step returns Python scalars in its carry)``."""


def _first_call(
    f: Callable[..., Any], weak: dict[int, Any], init_leaves: list[Any], scalars: bool
) -> Callable[..., Any]:
    """``f`` as the loop calls it. Its first call (eager, the first step; compiled, the
    trace: every call sees the same types) raises ``_Retry`` when the step changes a
    weakly typed carry's dtype (JAX promotes the init) or returns a Python scalar in
    the carry (JAX's weak scalar: with ``scalars``, every call makes it a 0-d tensor,
    of the dtype a tensor of init's dtype and the scalar give)."""
    first = [True]
    # init's dtypes and devices, not its tensors: fd.vmap's check of the step's
    # closures (_loops_hop._mapped_closures) would take them for mapped closures
    kinds = [(t.dtype, t.device) for t in init_leaves]

    def step(c: Any, x: Any) -> Any:
        out = f(c, x)
        if scalars and isinstance(out, tuple) and len(out) == 2:
            out = (tensorized(out[0], kinds), out[1])
        if first[0]:
            first[0] = False
            if isinstance(out, tuple) and len(out) == 2:
                dtypes = promoted(weak, kinds, out[0]) if weak else {}
                found = not scalars and has_scalars(out[0], len(kinds))
                if dtypes or found:
                    raise _Retry(dtypes, scalars or found)
        return out

    return step


def _run(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse, unroll):
    if type(n) is int and n == 0:
        return _empty(f, init, init_leaves, init_spec, xs_leaves, xs_spec)
    if torch.compiler.is_compiling():
        from ._loops_hop import scan_compiled

        f = _indexing(f)
        if unroll is True or (type(n) is int and unroll > 1 and n <= unroll):
            pass  # fully unrolled: the Python loop, traced
        elif type(n) is int and unroll > 1:
            return _blocked(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, unroll, reverse)
        else:
            out = scan_compiled(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse)
            if out is not None:
                return out
    return _scan_eager(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse)


def _indexing(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` run where a traced 0-d integer tensor indexes (``xs[i]``, ``_loop_index``)."""

    def step(c: Any, x: Any) -> Any:
        with index_mode():
            return f(c, x)

    return step


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


def _empty(f, init, init_leaves, init_spec, xs_leaves, xs_spec):
    """A loop of 0 steps: ``init``, and ``ys`` of 0 rows shaped as ``f``'s ``y``."""
    from ._loops_hop import abstract_step

    new, y = _split(abstract_step(f, init, xs_leaves, xs_spec))
    check_carry(init_spec, init_leaves, new)
    leaves, spec = y_leaves(y)
    empty = [torch.empty((0, *v.shape), dtype=v.dtype, device=v.device) for v in leaves]
    return init, optree.tree_unflatten(spec, empty)


def _blocked(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, k, reverse):
    """``unroll=k`` while compiling: a loop over blocks of ``k`` steps (the op's step
    runs ``k`` of them), then the remaining ``n % k`` steps unrolled after it (the
    rows at the end, or at the start when ``reverse``)."""
    nb, rem = divmod(n, k)
    lo, hi = (rem, n) if reverse else (0, n - rem)  # the rows of the blocked loop
    order = range(k - 1, -1, -1) if reverse else range(k)

    def block(c: Any, xb: Any) -> tuple[Any, Any]:
        ys: list[Any] = [None] * k
        for j in order:
            x = None if xs_spec is None else optree.tree_unflatten(xs_spec, [v[j] for v in xb])
            c, ys[j] = _split(f(c, x))
        return c, stack_ys(ys)

    xb = None
    if xs_spec is not None:
        xb = [v[lo:hi].reshape(nb, k, *v.shape[1:]) for v in xs_leaves]
    carry, yb = scan(block, init, xb, length=nb, reverse=reverse)
    leaves, spec = optree.tree_flatten(yb, namespace=NAMESPACE)
    ys = optree.tree_unflatten(spec, [v.reshape(nb * k, *v.shape[2:]) for v in leaves])
    if not rem:
        return carry, ys
    rows = range(0, rem) if reverse else range(n - rem, n)
    rest = [v[rows.start : rows.stop] for v in xs_leaves]
    carry, ys_rest = _scan_eager(f, carry, init_leaves, init_spec, rest, xs_spec, rem, reverse)
    return carry, _concat(ys_rest, ys) if reverse else _concat(ys, ys_rest)


def _concat(a: Any, b: Any) -> Any:
    la, spec = optree.tree_flatten(a, namespace=NAMESPACE)
    lb = optree.tree_leaves(b, namespace=NAMESPACE)
    return optree.tree_unflatten(spec, [torch.cat([u, v]) for u, v in zip(la, lb)])


def stack_ys(ys: list[Any]) -> Any:
    """The ``y`` of every step stacked along a new dim 0 (one ``torch.stack`` per leaf)."""
    leaves0, spec = y_leaves(ys[0])
    if not leaves0:
        return ys[0] if len(ys) == 1 else optree.tree_unflatten(spec, [])
    columns: list[list[Tensor]] = [[v] for v in leaves0]
    for i, y in enumerate(ys[1:], 1):
        leaves, s = optree.tree_flatten(y, namespace=NAMESPACE)
        if not same_structure(s, spec):
            raise TypeError(Y_CHANGED.format(what="structure", i=i, was=spec, now=s))
        for col, v in zip(columns, leaves):
            if not isinstance(v, Tensor) or v.shape != col[0].shape or v.dtype != col[0].dtype:
                was = _describe(col[0])
                now = _describe(v) if isinstance(v, Tensor) else _kind(v)
                raise TypeError(Y_CHANGED.format(what="leaf", i=i, was=was, now=now))
            col.append(v)
    return optree.tree_unflatten(spec, [torch.stack(col) for col in columns])


def fori_loop(
    lower: int | Tensor,
    upper: int | Tensor,
    body: Callable[[Tensor, _C], _C],
    init: _C,
    *,
    unroll: int | bool | None = None,
) -> _C:
    """``body(i, carry) -> carry`` for ``i`` in ``range(lower, upper)``, as
    ``jax.lax.fori_loop``; ``i`` is a 0-d int64 tensor (in every mode, so the same
    body runs eager and compiled: index with it, ``xs[i]`` and ``td[i]`` included,
    ``fd.random.fold_in(key, i)``).

    With integer bounds it is ``fd.scan`` over ``torch.arange(lower, upper)``: one
    graph under ``torch.compile``/``fd.jit``, a Python loop eager; ``lower >= upper``
    returns ``init`` without calling ``body``. A bound that is a tensor whose value
    is not known (traced by ``fd.jit``, mapped by ``fd.vmap``) makes it a while loop
    (``fd.while_loop``, forward-only, as JAX); a plain tensor's value is read.

    Args:
        lower: the first index: a Python or numpy int, or a 0-d integer tensor.
        upper: one past the last index (as ``lower``).
        body: the step, ``body(i, carry) -> carry`` (init's structure, shapes, dtypes).
        init: the first carry (a pytree of tensors, or of Python and numpy scalars:
            weakly typed as in ``fd.scan``).
        unroll: steps per iteration of the compiled loop, as ``fd.scan``'s (None: 1).

    Returns:
        The last carry.

    Raises:
        TypeError: a bound that is not an integer, or a carry that changed (as
            ``fd.scan``).
        ValueError: an ``unroll`` that is not a bool or an int >= 1.

    Example:
        >>> fd.fori_loop(0, 4, lambda i, c: c + i, torch.zeros(()))
        tensor(6.)
        >>> xs = torch.arange(5.0)
        >>> fd.fori_loop(0, 5, lambda i, c: c + xs[i], 0.0)
        tensor(10.)
    """
    lower, upper = check_bound(lower, "lower"), check_bound(upper, "upper")
    k = check_unroll(1 if unroll is None else unroll, "fori_loop")
    if isinstance(lower, Tensor) or isinstance(upper, Tensor):
        from ._loops_hop import concrete

        lo, hi = concrete(lower), concrete(upper)
        if lo is None or hi is None:
            return _while(lower, upper, body, init)
        lower, upper = lo, hi
    if upper <= lower:
        init = as_carry(init, [])[0]
        _check_init(init)
        return init
    leaves: list[Any] = optree.tree_leaves(init, namespace=NAMESPACE)  # type: ignore[arg-type]
    device = next((v.device for v in leaves if isinstance(v, Tensor)), None)
    idx = torch.arange(lower, upper, dtype=torch.int64, device=device)
    carry, _ = scan(lambda c, i: (body(i, c), None), init, idx, unroll=k)
    return carry


def _while(lower: Any, upper: Any, body: Callable[..., Any], init: Any) -> Any:
    """A loop whose bound is not known while tracing: ``fori_while`` (``_while``)."""
    try:
        from ._while import fori_while  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        b, which = (upper, "upper") if isinstance(upper, Tensor) else (lower, "lower")
        raise TypeError(TRACED_BOUNDS.format(which=which, got=_describe(b))) from None
    return fori_while(lower, upper, body, init)
