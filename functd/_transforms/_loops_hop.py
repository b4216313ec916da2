"""``fd.scan`` while compiling: torch's ``scan`` higher-order op, one graph per loop.

Two tracers reach here, with ``torch.compiler.is_compiling()`` True:

- **dynamo** (``torch.compile``): torch's ``scan`` function, whose dynamo rule
  traces the step once and lifts the tensors it closes over into inputs of the op.
  The step's outputs must be lists of tensors, so ``f`` is first run once on the
  first slice, outside the op (its result is dead code the compiler drops) to learn
  the structure of ``y`` and to check the carry with functd's message.
- **make_fx** (``fd.jit``'s trace, torch.export's non-strict mode): ``scan_op``
  itself; make_fx traces the step into a subgraph. A tensor the step closes over
  that the outer trace tracks (a parameter, a value computed before the loop)
  becomes a constant of that subgraph, which would compile to a wrong answer:
  ``_lift`` turns each into an input of the op (``additional_inputs``), in every
  nested loop too. Carries the step never changes that come from the graph's inputs
  then leave the carry for ``additional_inputs`` (``_loops_hoist``). Dynamo is not
  used here: it refuses to start inside ``torch.func`` transforms
  (``fd.jit(fd.vmap(f))``).

Where the op cannot follow (scan inside ``fd.grad`` under ``fd.jit``: no
``torch.func.grad`` rule for the op in torch 2.13), the loop is unrolled with a
``LoopWarning``: the result is right, the graph grows with the length.

Example:
    >>> out = scan_compiled(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, False)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections.abc import Iterator
from typing import Any

import optree
import torch
from torch import Tensor

from .._td._tree import NAMESPACE
from .._torch import fake as ft
from .._torch import functorch
from .._torch.fake import FakeTensor, detect_fake_mode
from .._torch.functorch import (
    coerce_cinterpreter,
    restore_vmap,
    retrieve_all_functorch_interpreters,
    unwrap_batched,
    wrap_batched,
)
from .._torch.hop import scan as hop_scan
from .._torch.hop import scan_op
from ._loop_checks import LoopWarning, _split, check_carry, y_leaves
from ._loops_hoist import hoist_invariants

__all__ = ["abstract_step", "concrete", "loops_unrolled", "scan_compiled"]

UNROLLED = (
    "fd.scan: torch's scan op cannot follow this loop ({why}); the loop of {n} steps is "
    "unrolled into the graph (right, but its size and compile time grow with the length)."
    "{fix}"
)
_GRAD_FIX = (
    " To keep one graph, differentiate inside the step (fd.grad in f) or run the "
    "differentiated function eagerly."
)


def _warn(why: str, n: int, fix: str = "") -> None:
    warnings.warn(UNROLLED.format(why=why, n=n, fix=fix), LoopWarning, stacklevel=4)


INDUCTOR_FAILED = (
    "fd.jit: inductor could not compile torch's scan op in this function ({err}); it is "
    "traced again with its loops unrolled (right, but the graph and its compile time "
    "grow with the lengths). Please report the loop to functd."
)
_UNROLL: contextvars.ContextVar[bool] = contextvars.ContextVar("fd_unroll", default=False)


@contextlib.contextmanager
def loops_unrolled(error: BaseException) -> Iterator[None]:
    """A trace in which every ``fd.scan`` unrolls: fd.jit's way out when inductor fails
    on the op (one LoopWarning naming the error)."""
    err = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    warnings.warn(INDUCTOR_FAILED.format(err=err[:300]), LoopWarning, stacklevel=3)
    token = _UNROLL.set(True)
    try:
        yield
    finally:
        _UNROLL.reset(token)


def scan_compiled(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse):
    """``(carry, ys)`` through torch's scan op, or None: unroll (a LoopWarning said why)."""
    if not torch.compiler.is_dynamo_compiling() and _UNROLL.get():  # (dynamo: no get)
        return None
    if not init_leaves:
        return _tokened(f, init, init_spec, xs_leaves, xs_spec, n, reverse)
    if torch.compiler.is_dynamo_compiling():
        return _dynamo(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse)
    return _make_fx(f, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse)


def abstract_step(f: Any, init: Any, xs_leaves: list[Any], xs_spec: Any) -> Any:
    """``f(init, x)`` on a slice of zeros shaped as a step of ``xs``, for its shapes and
    dtypes only (a loop of 0 steps): on fake tensors eager (closed-over tensors are
    faked as met), on the trace's fake tensors without recording it under make_fx,
    traced (and dropped as dead code) under dynamo. A step that fake tensors cannot
    run (an op without a fake kernel, a value read in Python) runs on real zeros, its
    result thrown away."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    from ._loop_index import index_mode

    def call() -> Any:
        x = None
        if xs_spec is not None:
            x = optree.tree_unflatten(xs_spec, [v.new_zeros(v.shape[1:]) for v in xs_leaves])
        return f(init, x)

    if torch.compiler.is_dynamo_compiling():
        return call()
    if torch.compiler.is_compiling():
        with disable_proxy_modes_tracing(), index_mode():
            return call()
    try:
        with ft.FakeTensorMode(allow_non_fake_inputs=True), index_mode():
            return call()
    except (
        ft.UnsupportedFakeTensorException,
        ft.UnsupportedOperatorException,
        ft.DataDependentOutputException,
        ft.DynamicOutputShapeException,
        NotImplementedError,
    ):  # an op without a fake kernel, a value read in Python: on real zeros
        return call()


def concrete(b: int | Tensor) -> int | None:
    """The value of a loop bound, or None where it has none yet (traced while
    compiling, or mapped by ``fd.vmap``: a bound per member)."""
    if not isinstance(b, Tensor):
        return b
    if torch.compiler.is_compiling():
        return None
    t = b
    while _F.is_functorch_wrapped_tensor(t):
        if _F.is_batchedtensor(t):
            return None
        t = _F.get_unwrapped(t)
    return int(t.item())


def _tokened(f, init, init_spec, xs_leaves, xs_spec, n, reverse):
    """A loop without carry leaves (``init=None``, ``()``...) through the op with a 0-d
    token as its carry: torch 2.13's op with an empty carry fails to compile (inductor:
    "getitem is not an OpOverload"; dynamo refuses it)."""
    device = xs_leaves[0].device if xs_leaves else None
    token = torch.zeros((), device=device)

    def step(carry: tuple[Any, ...], x: Any) -> tuple[Any, ...]:
        new, y = _split(f(carry[0], x))
        check_carry(init_spec, [], new)  # the user's carry, with the user's message
        return (new, carry[1]), y

    wrapped = (init, token)
    leaves, spec = optree.tree_flatten(wrapped, namespace=NAMESPACE)
    out = scan_compiled(step, wrapped, leaves, spec, xs_leaves, xs_spec, n, reverse)
    return None if out is None else (out[0][0], out[1])


def _inputs(init_leaves, xs_leaves, n, reverse) -> list[Tensor]:
    if not xs_leaves:  # x=None: loop over the step numbers
        device = init_leaves[0].device if init_leaves else None
        return [torch.arange(n, device=device)]
    return [torch.flip(v, (0,)) for v in xs_leaves] if reverse else list(xs_leaves)


def _body(f, init_leaves, init_spec, xs_spec, box: list[Any] | None):
    """The step on flat leaves: ``(*carry, *x) -> [*carry, *y]`` (fresh tensors: the
    op refuses outputs that alias its inputs). A step with one output (one carry, no
    ``y``: every ``fori_loop`` of one tensor) gets a 0-d ``y`` more, dropped after
    the op: inductor 2.13 rewrites the op into a while loop whose single output it
    unwraps once too often ("getitem is not an OpOverload")."""
    n_init = len(init_leaves)

    def body(*leaves: Tensor) -> list[Tensor]:
        carry = optree.tree_unflatten(init_spec, list(leaves[:n_init]))
        x = None if xs_spec is None else optree.tree_unflatten(xs_spec, list(leaves[n_init:]))
        out = f(carry, x)

        new, y = _split(out)
        c = check_carry(init_spec, init_leaves, new)
        ys, spec = y_leaves(y)
        if len(c) + len(ys) < 2:  # one output: inductor 2.13 fails on it (above)
            ys = [*ys, torch.zeros((), device=c[0].device)]
        if box is None:  # dynamo
            return [v.clone() for v in c] + [v.clone() for v in ys]
        box.append(spec)
        return [_canonical(v) for v in (*c, *ys)]

    return body


_F = functorch.C
_CONTIGUOUS = torch.contiguous_format


def _canonical(t: Tensor) -> Tensor:
    """A copy with canonical strides: the op (and inductor's lowering of it) compares
    the strides of each carry in and out, size-1 dims included, and a plain clone keeps
    whatever layout a transpose left."""
    return t.clone(memory_format=_CONTIGUOUS)


def _finish(out: list[Any], init_spec, y_spec, n_init: int, reverse: bool):
    carry = optree.tree_unflatten(init_spec, list(out[:n_init]))
    ys = list(out[n_init : n_init + y_spec.num_leaves])  # (without _body's padding)
    if reverse:
        ys = [torch.flip(v, (0,)) for v in ys]
    return carry, optree.tree_unflatten(y_spec, ys)


def _dynamo(f, init, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse):
    # the first step, outside the op: y's structure and the carry check (dead code after)
    x0 = None
    if xs_spec is not None:
        x0 = optree.tree_unflatten(xs_spec, [v[-1 if reverse else 0] for v in xs_leaves])
    new, y = _split(f(init, x0))
    c0 = check_carry(init_spec, init_leaves, new)
    y0, y_spec = y_leaves(y)
    if any(v.requires_grad for v in (*c0, *y0)):
        return None  # differentiated: the op's backward fails to compile in torch 2.13
    body = _body(f, init_leaves, init_spec, xs_spec, None)
    n_init = len(init_leaves)

    def step(c: list[Any], x: list[Any]):
        out = body(*c, *x)
        return out[:n_init], out[n_init:]

    carry, ys = hop_scan(step, list(init_leaves), _inputs(init_leaves, xs_leaves, n, reverse))
    return _finish([*carry, *ys], init_spec, y_spec, n_init, reverse)


def _make_fx(f, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse):
    from torch.fx.experimental import proxy_tensor

    tracer = proxy_tensor._CURRENT_MAKE_FX_TRACER
    if tracer is None or tracer.fx_tracer is None:
        return None  # compiling flag without a make_fx trace: the Python loop is right
    if _under_grad():
        _warn("it is inside fd.grad / torch.func.grad, which has no rule for it", n, _GRAD_FIX)
        return None
    vmap = _vmap_on_top()
    if vmap is not None:
        return _batch_first(vmap, f, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse)
    box: list[Any] = []
    body = _body(f, init_leaves, init_spec, xs_spec, box)
    graph = tracer.fx_tracer.graph
    before = _scan_nodes(graph)
    # fresh carries: the op refuses inputs that alias each other (a tree may hold one
    # tensor twice), and a copy per loop (not per step) costs nothing that matters
    init_leaves = [_canonical(v) for v in init_leaves]
    out = scan_op(body, list(init_leaves), _inputs(init_leaves, xs_leaves, n, reverse), ())
    new = [m for m in _scan_nodes(graph) if m not in before]
    for node in new:
        _lift(tracer.fx_tracer, node)
    out = list(out)
    if len(new) == 1:  # (one op traced, as always: else the carries stay as they are)
        out = hoist_invariants(tracer.fx_tracer, new[0], out, init_leaves)
    return _finish(out, init_spec, box[-1], len(init_leaves), reverse)


def _vmap_on_top() -> Any:
    """The innermost functorch transform when it is a vmap, else None."""
    top = _F.peek_interpreter_stack()
    if top is None or top.key() != _F.TransformType.Vmap:
        return None
    return coerce_cinterpreter(top)


def _batch_first(vmap, f, init_leaves, init_spec, xs_leaves, xs_spec, n, reverse):
    """The loop under ``vmap`` with the batch dim of every carry first (and of every x
    and y second, after the step dim): functd's vmap rule for the op, in place of torch's,
    which moves it last. A carry is one tensor from step to step, whose layout the op
    fixes; with the batch dim last, every batched matmul of the step (a layer over the
    ensemble's members) needs a transposing copy of its weights, and every update of a
    weight, gradient or optimizer moment a transposing write back: at 64 PPO agents
    most of the learning loop's time beyond the matmuls (notes/transforms.md). The loop
    below runs one vmap level lower (nested vmaps: one level at a time), the step
    rewrapped with ``restore_vmap`` as torch's own rule does."""
    level, size = vmap.level(), vmap.batch_size()
    closed = _mapped_cells(f, level)  # mapped tensors f closes over: extra carries
    if closed is None:
        mapped = _mapped_closures(f, level)
        raise TypeError(MAPPED_CLOSURE.format(names=", ".join(repr(m) for m in mapped)))
    extra = [leaves[k] for _, _, leaves, _, idx in closed for k in idx]
    (c0, x0, e0), (c_dims, x_dims, e_dims) = unwrap_batched(
        (list(init_leaves), list(xs_leaves), extra), level
    )
    n_c = len(c0)
    c0 = [_at(t, d, 0, size) for t, d in zip([*c0, *e0], [*c_dims, *e_dims])]  # all batched
    x0 = [t if d is None else t.movedim(d, 1) for t, d in zip(x0, x_dims)]
    x_in = [None if d is None else 0 for d in x_dims]  # a step's slice: dim 0
    box: list[Any] = []

    def step(c: list[Any], x: list[Any] | None):
        def batched(cs: list[Any], xl: list[Any]):
            with _swapped(closed, cs[n_c:]):  # f reads this level's closed-over tensors
                out = f(
                    optree.tree_unflatten(init_spec, cs[:n_c]),
                    None if xs_spec is None else optree.tree_unflatten(xs_spec, xl),
                )
            new, y = _split(out)
            ys, spec = y_leaves(y)
            box.append(spec)
            return [*check_carry(init_spec, init_leaves, new), *cs[n_c:]], ys

        (cs, ys), (cd, yd) = restore_vmap(batched, ([0] * len(c), x_in), size, vmap.randomness())(
            c, x if x is not None else []
        )
        return [_at(t, d, 0, size) for t, d in zip(cs, cd)], [
            _at(t, d, 0, size) for t, d in zip(ys, yd)
        ]

    with vmap.lower():  # the loop over flat lists of leaves, one level lower
        c_spec = optree.tree_structure(c0, namespace=NAMESPACE)
        x_spec = None if xs_spec is None else optree.tree_structure(x0, namespace=NAMESPACE)
        out = scan_compiled(step, c0, c0, c_spec, x0, x_spec, n, reverse)
    if out is None:
        return None
    carry, ys = out
    carry = wrap_batched((list(carry)[:n_c],), (0,), level)[0]
    ys = wrap_batched((list(ys),), (1,), level)[0]
    return optree.tree_unflatten(init_spec, list(carry)), optree.tree_unflatten(box[-1], list(ys))


MAPPED_CLOSURE = (
    "fd.scan under fd.vmap inside fd.jit: the step closes over {names}, a tensor that "
    "fd.vmap maps, through a functools.partial argument, which functd cannot rebind per "
    "step. Close over it in a plain function (lambda h, x: step(w, h, x)), or pass it in "
    "the carry (e.g. carry=(h, w), returned unchanged)."
)


def _mapped(v: Any, level: int) -> bool:
    return isinstance(v, Tensor) and _F.is_batchedtensor(v) and _F.maybe_get_level(v) == level


def _mapped_cells(
    f: Any, level: int, depth: int = 0, seen: dict[Any, Any] | None = None
) -> list[Any] | None:
    """The closure cells of ``f`` (and of the functions it closes over) whose value holds
    tensors mapped at vmap ``level``: ``(cell, value, leaves, spec, mapped positions)``
    each, or None when such a tensor is a ``functools.partial`` argument (not a cell).
    ``_batch_first`` carries those tensors through the loop, returned unchanged (the
    loop hoists them back out when they are inputs of the jitted function), and rebinds
    the cells to the step's own view of them while ``f`` runs (``_swapped``)."""
    seen = {} if seen is None else seen
    if depth > 4:
        return []
    if isinstance(f, functools.partial):
        if _mapped_in([("argument", v) for v in (*f.args, *f.keywords.values())], level):
            return None
        return _mapped_cells(f.func, level, depth + 1, seen)
    cells = getattr(f, "__closure__", None)
    if getattr(f, "__code__", None) is None or not cells:
        return []
    found: list[Any] = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a name not bound yet)
            continue
        if id(cell) in seen:
            continue
        seen[id(cell)] = cell
        if callable(value) and not isinstance(value, Tensor):
            inner = _mapped_cells(value, level, depth + 1, seen)
            if inner is None:
                return None
            found += inner
            continue
        leaves, spec = optree.tree_flatten(value, namespace=NAMESPACE)
        idx = [k for k, v in enumerate(leaves) if _mapped(v, level)]
        if idx:
            found.append((cell, value, leaves, spec, idx))
    return found


@contextlib.contextmanager
def _swapped(closed: list[Any], values: list[Any]) -> Iterator[None]:
    """The cells of ``closed`` (``_mapped_cells``) hold ``values`` in place of their
    mapped tensors for the block, then their own values again."""
    it = iter(values)
    try:
        for cell, _, leaves, spec, idx in closed:
            new = list(leaves)
            for k in idx:
                new[k] = next(it)
            cell.cell_contents = optree.tree_unflatten(spec, new)
        yield
    finally:
        for cell, value, *_ in closed:
            cell.cell_contents = value


def _mapped_closures(f: Any, level: int, depth: int = 0) -> list[str]:
    """Names of the tensors mapped at vmap ``level`` that ``f`` closes over (through
    containers and TensorDicts, ``functools.partial`` and closures of closures)."""
    if depth > 4:
        return []
    if isinstance(f, functools.partial):
        values = [("argument", v) for v in (*f.args, *f.keywords.values())]
        return _mapped_in(values, level) + _mapped_closures(f.func, level, depth + 1)
    code, cells = getattr(f, "__code__", None), getattr(f, "__closure__", None)
    if code is None or not cells:
        return []
    found: list[str] = []
    for name, cell in zip(code.co_freevars, cells):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a name not bound yet)
            continue
        if callable(value) and not isinstance(value, Tensor):
            found += _mapped_closures(value, level, depth + 1)
        else:
            found += _mapped_in([(name, value)], level)
    return found


def _mapped_in(values: list[Any], level: int) -> list[str]:
    out = []
    for name, value in values:
        for leaf in optree.tree_leaves(value, namespace=NAMESPACE):
            if (
                isinstance(leaf, Tensor)
                and _F.is_batchedtensor(leaf)
                and _F.maybe_get_level(leaf) == level
            ):
                out.append(name)
                break
    return out


def _at(t: Tensor, d: int | None, dim: int, size: int) -> Tensor:
    """``t``'s batch dim (``d``; None: unbatched, broadcast) moved to ``dim``."""
    if d is None:
        return t.unsqueeze(dim).expand(*t.shape[:dim], size, *t.shape[dim:])
    return t.movedim(d, dim)


def _under_grad() -> bool:
    grad = (_F.TransformType.Grad, _F.TransformType.Jvp)
    return any(i.key() in grad for i in retrieve_all_functorch_interpreters())


def _scan_nodes(graph: torch.fx.Graph) -> list[Any]:
    return list(graph.find_nodes(op="call_function", target=torch.ops.higher_order.scan))


def _lift(fx_tracer: Any, node: Any) -> None:
    """Make the traced tensors that ``node``'s subgraph reads as constants inputs of
    the op (``additional_inputs``); constants of loops nested in it first move up
    into it. A real tensor the step closes over (not traced: a global, a closure over a
    plain tensor) becomes a constant of the outer graph passed in the same way: inductor's
    C++ wrapper cannot read a constant of a loop body."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    root = fx_tracer.root
    args: Any = node.args
    sub = getattr(root, args[0].target)
    _pull_up(sub)
    lifted = []
    for const in list(sub.graph.find_nodes(op="get_attr")):
        value = getattr(sub, const.target, None)
        if not isinstance(value, Tensor):
            continue
        proxy = get_proxy_slot(value, fx_tracer, None)
        if proxy is not None:
            lifted.append(proxy.proxy.node)
        elif _is_fake(value):
            continue
        else:
            attr = _constant_of(root, fx_tracer.graph, node, value)
            lifted.append(attr)
            value = attr.meta["val"]
        _to_placeholder(sub, const, value)
    if lifted:
        node.args = (args[0], args[1], args[2], (*tuple(args[3]), *lifted))


def _pull_up(gm: torch.fx.GraphModule) -> None:
    """Constants read by loops nested in ``gm`` become constants of ``gm`` passed to
    them as inputs, so that one more ``_lift`` level can see them."""
    for node in _scan_nodes(gm.graph):
        args: Any = node.args
        sub = getattr(gm, args[0].target)
        _pull_up(sub)
        moved = []
        for const in list(sub.graph.find_nodes(op="get_attr")):
            value = getattr(sub, const.target, None)
            if not isinstance(value, Tensor):
                continue
            attr = _constant_of(gm, gm.graph, node, value)
            moved.append(attr)
            _to_placeholder(sub, const, attr.meta["val"])
        if moved:
            node.args = (args[0], args[1], args[2], (*tuple(args[3]), *moved))
    gm.recompile()


def _constant_of(owner: Any, graph: torch.fx.Graph, node: Any, value: Tensor) -> Any:
    """A new constant of ``owner`` holding ``value``, read by a ``get_attr`` node placed
    before ``node`` (its ``meta["val"]`` the fake of ``value``)."""
    name = _fresh(owner, "_lifted_constant")
    if isinstance(owner, torch.fx.GraphModule):
        owner.register_buffer(name, value, persistent=False)  # a module's tensor
    else:
        setattr(owner, name, value)  # the tracer's root
    with graph.inserting_before(node):
        attr = graph.get_attr(name)
    attr.meta["val"] = _as_fake(value)
    return attr


def _is_fake(t: Tensor) -> bool:
    return isinstance(t, FakeTensor)


def _as_fake(t: Tensor) -> Tensor:
    """``t`` as a fake tensor of the trace's fake mode (a node's ``meta["val"]``)."""
    mode = detect_fake_mode()
    if mode is None or _is_fake(t):
        return t
    # a view's base is not fakified: its own values describe it (a trace-time copy)
    return mode.from_tensor(t.clone() if t._is_view() else t, static_shapes=True)


def _fresh(gm: Any, base: str) -> str:
    i = 0
    while hasattr(gm, f"{base}{i}"):
        i += 1
    return f"{base}{i}"


def _to_placeholder(gm: torch.fx.GraphModule, const: torch.fx.Node, value: Tensor) -> None:
    """Replace the constant node ``const`` of ``gm`` by a new last input."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    with gm.graph.inserting_after(placeholders[-1]):
        ph = gm.graph.placeholder(_fresh_ph(placeholders))
    ph.meta["val"] = value
    const.replace_all_uses_with(ph)
    gm.graph.erase_node(const)
    if not gm.graph.find_nodes(op="get_attr", target=const.target):
        delattr(gm, str(const.target))
    gm.recompile()


def _fresh_ph(placeholders: list[Any]) -> str:
    names = {p.name for p in placeholders}
    i = 0
    while f"lifted_{i}" in names:
        i += 1
    return f"lifted_{i}"
