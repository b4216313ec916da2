"""``fd.while_loop``: a loop whose number of steps is known only at run time, as
``jax.lax.while_loop``; and ``fori_while``, ``fd.fori_loop`` with tensor bounds.

The loop runs on the flat leaves of the carry, in one of three ways, chosen by
what is on top of torch's transform stack:

- **vmap** (``fd.vmap``, ``torch.func.vmap``): JAX's batching rule, one vmap level
  lower: every carry gets its batch dim first; when ``cond`` depends on the mapped
  values, the loop runs while any member's predicate holds and a step only changes
  the members still running (``torch.where(pred_b, new, old)``); a predicate that
  is the same for every member runs the plain loop. A carry that body returns as it
  was, unbatched in init, stays unbatched (JAX's readonly carry). Nested vmaps: one
  level at a time.
- **make_fx** (``fd.jit``'s trace): torch's ``while_loop`` higher-order op, one
  graph whatever the number of steps. Tensors ``cond``/``body`` close over become
  inputs of the op (``additional_inputs``), in nested loops too.
- otherwise a Python loop (``fd.jvp`` included: forward mode works eagerly).

Reverse mode is refused as JAX refuses it: the number of steps is only known at run
time, so there is nothing to store the steps in. Under ``fd.grad``/``fd.vjp`` the
call raises when a carry is differentiated; under plain autograd the backward
pass raises (the forward result stays usable).

Example:
    >>> fd.while_loop(lambda c: c < 10, lambda c: c * 2, torch.tensor(1))
    tensor(16)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import optree
import torch
from torch import Tensor

from .._td._tree import NAMESPACE
from .._torch import functorch
from .._torch.functorch import (
    restore_vmap,
    retrieve_all_functorch_interpreters,
    unwrap_batched,
    wrap_batched,
)
from .._torch.hop import while_loop as hop_while
from .._torch.hop import while_loop_op
from ._loop_checks import _weak_result, check_carry
from ._loops_hop import (
    _at,
    _canonical,
    _constant_of,
    _is_fake,
    _mapped_cells,
    _mapped_closures,
    _swapped,
    _vmap_on_top,
)
from ._paths import fmt_path
from ._vmap import TransformError

__all__ = ["fori_while", "while_loop"]

_F = functorch.C

NOT_CALLABLE = "fd.while_loop: {what} must be a callable {sig}; got {kind}."
INIT_LEAF = (
    "{where}: init{path} is a {kind}; the carry's leaves must be tensors or Python "
    "scalars (bool, int, float); close over other values in cond and body instead."
)
PRED = (
    "fd.while_loop: cond must return a bool scalar (a 0-d bool tensor or a Python "
    "bool); it returned {got}. Reduce it (.all(), .any()) or compare (c < n)."
)
NO_REVERSE = (
    "{where}: reverse-mode differentiation (fd.grad, fd.vjp, jacrev, .backward()) of a "
    "while loop is not supported: its number of steps is only known at run time, so "
    "there is nothing to store the steps in (JAX refuses it too). Use fd.scan or "
    "fd.fori_loop with Python int bounds (a fixed length; mask the extra steps with "
    "torch.where), or forward mode (fd.jvp, fd.jacfwd)."
)
JIT_FORWARD = (
    "{where}: forward-mode differentiation (fd.jvp, fd.jacfwd) inside fd.jit of a "
    "while loop is not supported (torch's while_loop op has no jvp rule). Call the "
    "fd.jvp outside fd.jit or run it eagerly."
)
MAPPED_CLOSURE = (
    "{where} under fd.vmap inside fd.jit: cond or body closes over {names}, a tensor "
    "that fd.vmap maps, through a functools.partial argument, which functd cannot rebind "
    "per step. Close over it in a plain function, or pass it in the carry (returned "
    "unchanged by body)."
)
VMAP_BELOW = (
    "{where}: the loop's predicate is mapped by an fd.vmap that is not the innermost "
    "transform ({top} is); put the fd.vmap inside, e.g. fd.vmap(fd.jvp(...)) -> "
    "fd.jvp(fd.vmap(...)). ({err})"
)


_C = TypeVar("_C")  # the carry (as jax.lax's types; a Python scalar in it is a 0-d tensor)


def while_loop(cond: Callable[[_C], Any], body: Callable[[_C], _C], init: _C) -> _C:
    """Run ``carry = body(carry)`` while ``cond(carry)``, as ``jax.lax.while_loop``;
    returns the final carry (``init`` when ``cond(init)`` is False).

    ``init`` is a pytree (TensorDicts, dicts, tuples) of tensors; a Python bool, int
    or float leaf becomes a 0-d tensor (bool, int64, torch's default float dtype). An
    int or float leaf is weakly typed, as in JAX: it takes the dtype ``body`` gives
    it, found by one call of ``body`` with the Python scalar in its place (``0 + x``
    with ``x`` a 0-d int8 tensor is int8, Python-scalar semantics; a body that needs a
    tensor there, ``c.add(x)``, is called with the 0-d tensor instead, where torch's
    promotion keeps int64). A bool leaf stays bool. (``fd.scan`` reads the dtype from
    its first step, on the 0-d tensor: there ``0 + x`` stays int64.) Under
    ``fd.vmap``, a carry whose init is unbatched and that ``body`` returns as it was
    (weights the loop reads) stays unbatched, as JAX's readonly carries
    (``out_dims=None`` works for it; a 0-d one, a counter or bound, is batched). Eager
    it is a Python loop; under ``fd.jit`` torch's while_loop op (one graph); under
    ``fd.vmap`` with a mapped predicate, every member runs until its own ``cond``
    fails (the loop runs while any member's does). Forward mode (``fd.jvp``) works
    eagerly; reverse mode (``fd.grad``, ``fd.vjp``) is refused, as in JAX.

    Args:
        cond: ``cond(carry) -> bool``: a 0-d bool tensor (or a Python bool).
        body: ``body(carry) -> carry``, with init's structure, shapes and dtypes.
        init: the first carry.

    Returns:
        The last carry.

    Raises:
        TypeError: ``cond``/``body`` not callable, a leaf of ``init`` that is not a
            tensor or scalar, a predicate that is not a bool scalar, a carry that
            changed (the message names the path).
        RuntimeError: reverse-mode differentiation of the loop.

    Example:
        >>> def cond(c):
        ...     i, x = c
        ...     return i < 3
        >>> fd.while_loop(cond, lambda c: (c[0] + 1, c[1] * 2), (torch.tensor(0), torch.ones(2)))
        (tensor(3), tensor([8., 8.]))
    """
    for what, fn, sig in (
        ("cond", cond, "cond(carry) -> bool"),
        ("body", body, "body(carry) -> carry"),
    ):
        if not callable(fn):
            raise TypeError(NOT_CALLABLE.format(what=what, sig=sig, kind=type(fn).__name__))
    return _while(cond, body, init, "fd.while_loop")


def fori_while(lower: Any, upper: Any, body: Callable[[Tensor, Any], Any], init: Any) -> Any:
    """``fd.fori_loop`` with a bound held in a tensor: ``body(i, carry)`` for ``i`` in
    ``range(lower, upper)`` through ``while_loop`` on ``(i, upper, carry)`` (as JAX
    lowers ``fori_loop`` with traced bounds); ``i`` is a 0-d int64 tensor.

    Forward only, as ``while_loop`` (reverse mode is refused). ``fd.fori_loop``
    calls it when a bound is a tensor.

    Example:
        >>> fori_while(0, torch.tensor(4), lambda i, c: c + i, torch.zeros(()))
        tensor(6.)
    """
    if not callable(body):
        raise TypeError(
            "fd.fori_loop: body must be a callable body(i, carry) -> carry; "
            f"got {type(body).__name__}."
        )
    device = _device(init)
    lo, hi = (_bound(b, name, device) for b, name in ((lower, "lower"), (upper, "upper")))

    def cond(c: tuple[Any, ...]) -> Tensor:
        return c[0] < c[1]

    def step(c: tuple[Any, ...]) -> tuple[Any, ...]:
        i, n, carry = c
        return i + 1, n, body(i, carry)

    return _while(cond, step, (lo, hi, init), "fd.fori_loop")[2]


def _bound(b: Any, name: str, device: Any) -> Tensor:
    if isinstance(b, Tensor):
        if b.ndim != 0 or b.dtype.is_floating_point or b.dtype.is_complex or b.dtype == torch.bool:
            raise TypeError(
                f"fd.fori_loop: {name} must be an int or a 0-d integer tensor; got "
                f"{str(b.dtype).replace('torch.', '')}{list(b.shape)}."
            )
        return b.to(torch.int64)
    if isinstance(b, bool) or not isinstance(b, int):
        raise TypeError(
            f"fd.fori_loop: {name} must be an int or a 0-d integer tensor; got "
            f"{type(b).__name__} {b!r}."
        )
    return torch.tensor(b, dtype=torch.int64, device=device)


def _device(tree: Any) -> Any:
    for v in optree.tree_leaves(tree, namespace=NAMESPACE):
        if isinstance(v, Tensor):
            return v.device
    return None


# ---------------------------------------------------------------------------- the loop
def _while(cond: Callable[..., Any], body: Callable[..., Any], init: Any, where: str) -> Any:
    paths, leaves, spec = optree.tree_flatten_with_path(init, namespace=NAMESPACE)
    device = _device(init)
    raw = leaves
    weak = [type(v) in (int, float) for v in raw]  # JAX's weak types (a bool is bool)
    leaves = [_as_tensor(v, p, device, where) for p, v in zip(paths, leaves)]
    grads = _grad_levels()
    if grads and any(v.requires_grad for v in leaves):
        raise RuntimeError(NO_REVERSE.format(where=where))
    checked: list[Tensor] = leaves  # what body's carry is checked against

    def cond_flat(cs: list[Tensor]) -> Tensor:
        return _pred(cond(optree.tree_unflatten(spec, cs)))

    def body_flat(cs: list[Tensor]) -> list[Tensor]:
        new = body(optree.tree_unflatten(spec, cs))
        try:
            return check_carry(spec, checked, new)
        except TypeError as e:
            raise TypeError(_renamed(str(e), where)) from None

    if any(weak):  # JAX's weak types: a scalar leaf takes the dtype body gives it
        leaves = _promote(body, spec, leaves, raw, weak)
        checked = leaves
    out = _run(cond_flat, body_flat, leaves, where, (cond, body))
    if grads and any(v.requires_grad for v in out):
        raise RuntimeError(NO_REVERSE.format(where=where))
    if not _F.peek_interpreter_stack() and torch.is_grad_enabled():
        for v in out:
            if v.requires_grad:
                v.register_hook(_refuse(where))
    return optree.tree_unflatten(spec, out)


def _run(
    cond_flat: Callable[..., Any],
    body_flat: Callable[..., Any],
    leaves: list[Tensor],
    where: str,
    user: tuple[Any, ...],
) -> list[Any]:
    """The loop on flat leaves, by what is on top of the transform stack (``user``: the
    caller's cond and body, whose closures are checked under vmap in fd.jit)."""
    vmap = _vmap_on_top()
    if vmap is not None:
        return _batched(vmap, cond_flat, body_flat, leaves, where, user)
    if torch.compiler.is_compiling():
        from torch.fx.experimental import proxy_tensor

        tracer = proxy_tensor._CURRENT_MAKE_FX_TRACER
        if tracer is not None and tracer.fx_tracer is not None:
            return _traced(tracer.fx_tracer, cond_flat, body_flat, leaves, where)
        if torch.compiler.is_dynamo_compiling():
            return list(
                hop_while(
                    lambda *c: cond_flat(list(c)),
                    lambda *c: tuple(v.clone() for v in body_flat(list(c))),
                    tuple(leaves),
                )
            )
    while _truth(cond_flat(leaves), where):
        leaves = body_flat(leaves)
    return leaves


def _truth(pred: Tensor, where: str) -> bool:
    try:
        return bool(pred)
    except RuntimeError as e:
        if "vmap" not in str(e):
            raise
        top = _F.peek_interpreter_stack()
        name = str(top.key()).rsplit(".", 1)[-1] if top is not None else "none"
        raise TransformError(VMAP_BELOW.format(where=where, top=name, err=e)) from None


def _pred(p: Any) -> Tensor:
    if isinstance(p, bool):
        return torch.tensor(p)
    if not isinstance(p, Tensor) or p.dtype != torch.bool or p.ndim != 0:
        if isinstance(p, Tensor):
            got = f"a {str(p.dtype).replace('torch.', '')}{list(p.shape)} tensor"
        else:
            got = f"a {type(p).__name__}"
        raise TypeError(PRED.format(got=got))
    return p


def _as_tensor(v: Any, path: Any, device: Any, where: str) -> Tensor:
    if isinstance(v, Tensor):
        return v
    if isinstance(v, bool | int | float):
        return torch.tensor(v, device=device)
    kind = type(v).__name__
    raise TypeError(INIT_LEAF.format(where=where, path=fmt_path(path, ""), kind=kind))


def _promote(
    body: Callable[..., Any], spec: Any, leaves: list[Tensor], raw: list[Any], weak: list[bool]
) -> list[Tensor]:
    """The carry with each weakly typed leaf (a Python int or float in init) cast to
    the dtype ``body`` gives it, as JAX traces ``body`` with weakly typed values. The
    probe (a call of ``body`` whose result is discarded) gets the Python scalars
    themselves in those places, so Python-scalar semantics decide: ``0 + x`` of a 0-d
    int8 ``x`` is int8. A body that fails on Python scalars (tensor methods on the
    carry) is probed with the 0-d tensors instead (then torch's promotion decides: an
    int64 ``0`` wins over a 0-d int8). A leaf the probe returns as a Python scalar takes
    ``result_type(init's dtype, it)``, as ``fd.scan``'s; only 0-d results move a leaf,
    anything else is left to the carry check; a body that fails on both is left to the
    loop (which reports it, or never runs it)."""
    values = [x if w else v for v, x, w in zip(leaves, raw, weak)]
    new = None
    for probe in (values, leaves):
        try:
            new = optree.tree_leaves(body(optree.tree_unflatten(spec, probe)), namespace=NAMESPACE)
            break
        except Exception:
            continue
    if new is None or len(new) != len(leaves):
        return leaves
    out = []
    for v, w, x, n in zip(leaves, weak, values, new):
        if w:
            if isinstance(n, Tensor) and n.ndim == 0:
                v = v.to(_weak_result(n.dtype, x))
            elif type(n) in (int, float):
                v = v.to(_weak_result(v.dtype, n))
        out.append(v)
    return out


def _renamed(msg: str, where: str) -> str:
    """``check_carry``'s message (written for fd.scan's ``f``) for this loop's body."""
    return msg.replace("fd.scan: f ", f"{where}: body ").replace(" f must ", " body must ")


def _refuse(where: str) -> Callable[[Tensor], None]:
    def hook(_: Tensor) -> None:
        raise RuntimeError(NO_REVERSE.format(where=where))

    return hook


def _grad_levels() -> list[Any]:
    return [i for i in retrieve_all_functorch_interpreters() if i.key() == _F.TransformType.Grad]


def _jvp_active() -> bool:
    return any(i.key() == _F.TransformType.Jvp for i in retrieve_all_functorch_interpreters())


# ---------------------------------------------------------------------------- vmap
class _Changed(Exception):
    """Raised by a step of ``_batched``'s loop: ``(token, positions)``, the carries
    kept unbatched that body did not return as they were (a restart without them)."""


def _batched(
    vmap: Any,
    cond_flat: Callable[..., Any],
    body_flat: Callable[..., Any],
    leaves: list[Any],
    where: str,
    user: tuple[Any, ...],
) -> list[Any]:
    """JAX's batching rule for the loop at the innermost vmap, run one level lower.

    A carry whose init is unbatched and that body returns as it was (the same tensor:
    weights the loop reads) stays unbatched, as JAX's readonly-carry optimization: no
    copy per member, and an unbatched output (``out_dims=None`` works for it). The loop
    assumes it of every unbatched carry of at least one dim and restarts without the
    ones body changed (eager, body's first step then runs twice; traced, body is traced
    twice). 0-d carries (counters, bounds) are batched anyway: they cost nothing, and
    keeping them would mean that restart for every counter."""
    level = vmap.level()
    closed: list[Any] = []  # traced: mapped tensors cond/body close over ride in the carry
    if torch.compiler.is_compiling():
        seen: dict[Any, Any] = {}
        found = [_mapped_cells(fn, level, 0, seen) for fn in user]
        if any(c is None for c in found):
            mapped = [m for fn in user for m in _mapped_closures(fn, level)]
            names = ", ".join(dict.fromkeys(repr(m) for m in mapped))
            raise TransformError(MAPPED_CLOSURE.format(where=where, names=names))
        closed = [c for cells in found for c in cells or ()]
    extra = [lv[k] for _, _, lv, _, idx in closed for k in idx]
    (c0, e0), (dims, e_dims) = unwrap_batched((list(leaves), extra), level)
    keep = {k for k, (t, d) in enumerate(zip(c0, dims)) if d is None and t.ndim > 0}
    while True:
        token = object()
        try:
            return _batched_loop(
                vmap, cond_flat, body_flat, (c0, e0, dims, e_dims), closed, keep, token, where, user
            )
        except _Changed as e:
            if e.args[0] is not token:
                raise
            keep -= e.args[1]


def _batched_loop(
    vmap: Any,
    cond_flat: Callable[..., Any],
    body_flat: Callable[..., Any],
    unwrapped: tuple[Any, ...],
    closed: list[Any],
    keep: set[int],
    token: object,
    where: str,
    user: tuple[Any, ...],
) -> list[Any]:
    """One try of ``_batched``: the carries in ``keep`` unbatched, the others at dim 0."""
    level, size, rnd = vmap.level(), vmap.batch_size(), vmap.randomness()
    c0, e0, dims, e_dims = unwrapped
    n = len(c0)
    cs0 = [
        t if k in keep else _at(t, d, 0, size)
        for k, (t, d) in enumerate(zip([*c0, *e0], [*dims, *e_dims]))
    ]
    in_dims = ([None if k in keep else 0 for k in range(len(cs0))],)
    same: list[bool] = []  # per carry of the last step: body returned it as it was

    def run_cond(c: list[Any]) -> Tensor:
        with _swapped(closed, c[n:]):
            return cond_flat(c[:n])

    def run_body(c: list[Any]) -> list[Any]:
        with _swapped(closed, c[n:]):
            new = [*body_flat(c[:n]), *c[n:]]
        same[:] = [a is b for a, b in zip(new, c)]
        return new

    def pred(cs: list[Any]) -> tuple[Tensor, Any]:
        return restore_vmap(run_cond, in_dims, size, rnd)(cs)

    def cond_lower(cs: list[Any]) -> Tensor:
        p, d = pred(cs)
        return p if d is None else p.any()

    def body_lower(cs: list[Any]) -> list[Any]:
        new, nd = restore_vmap(run_body, in_dims, size, rnd)(cs)
        changed = {k for k in keep if not same[k]}
        if changed:
            raise _Changed(token, changed)
        new = [c if s else _at(t, d, 0, size) for t, d, c, s in zip(new, nd, cs, same)]
        p, d = pred(cs)
        if d is None:
            return new
        p = p.movedim(d, 0)
        return [
            c if s else torch.where(p.view(size, *[1] * (t.ndim - 1)), t, c)
            for t, c, s in zip(new, cs, same)
        ]

    with vmap.lower():
        out = _run(cond_lower, body_lower, cs0, where, user)
    return list(wrap_batched((list(out)[:n],), (in_dims[0][:n],), level)[0])


# ---------------------------------------------------------------------------- make_fx
def _traced(
    fx_tracer: Any,
    cond_flat: Callable[..., Any],
    body_flat: Callable[..., Any],
    leaves: list[Any],
    where: str,
):
    """The loop as torch's while_loop op in the trace, its closures made inputs."""
    if _jvp_active():
        raise TransformError(JIT_FORWARD.format(where=where))
    if _grad_levels():
        raise RuntimeError(NO_REVERSE.format(where=where))
    token = not leaves  # torch's op cannot compile a loop without carries
    carried = [torch.zeros(())] if token else [_canonical(v) for v in leaves]

    def cond_op(*cs: Tensor) -> Tensor:
        return cond_flat([] if token else list(cs))

    def body_op(*cs: Tensor) -> tuple[Any, ...]:
        if token:
            body_flat([])
            return (cs[0].clone(),)
        return tuple(_canonical(v) for v in body_flat(list(cs)))

    graph = fx_tracer.graph
    before = set(_loop_nodes(graph))
    ins: Any = tuple(carried)  # (torch types it as a 1-tuple)
    out = while_loop_op(cond_op, body_op, ins, ())
    for node in _loop_nodes(graph):
        if node not in before:
            _lift(fx_tracer, node)
    return [] if token else list(out)


_LOOP_OPS = (torch.ops.higher_order.scan, torch.ops.higher_order.while_loop)


def _loop_nodes(graph: torch.fx.Graph) -> list[Any]:
    return [n for op in _LOOP_OPS for n in graph.find_nodes(op="call_function", target=op)]


def _subs(owner: Any, node: Any) -> list[Any]:
    """The subgraphs of a loop node: scan's step; while_loop's cond and body."""
    n = 2 if node.target is torch.ops.higher_order.while_loop else 1
    return [getattr(owner, node.args[k].target) for k in range(n)]


def _lift(fx_tracer: Any, node: Any) -> None:
    """Make the traced tensors that ``node``'s subgraphs read as constants inputs of
    the op (``additional_inputs``); constants of loops nested in them first move up. A
    real tensor (a global, a closure over a plain tensor) becomes a constant of the
    outer graph passed in the same way."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    root = fx_tracer.root
    subs = _subs(root, node)
    for sub in subs:
        _pull_up(sub)

    order = {n: i for i, n in enumerate(fx_tracer.graph.nodes)}

    def resolve(value: Tensor) -> tuple[Any, ...] | None:
        proxy = get_proxy_slot(value, fx_tracer, None)
        if proxy is not None:
            # (a value of the loop itself: torch's alias check re-traces a body whose
            # nested loop reads an outer tensor; that throwaway graph keeps it)
            before = order.get(proxy.proxy.node, len(order)) < order[node]
            return (proxy.proxy.node, value) if before else None
        if _is_fake(value):
            return None
        attr = _constant_of(root, fx_tracer.graph, node, value)
        return attr, attr.meta["val"]

    _move(node, subs, resolve)


def _pull_up(gm: torch.fx.GraphModule) -> None:
    """Constants read by loops nested in ``gm`` become constants of ``gm`` passed to
    them as inputs, so that the next ``_lift`` up can see them."""
    for node in _loop_nodes(gm.graph):
        subs = _subs(gm, node)
        for sub in subs:
            _pull_up(sub)

        def resolve(value: Tensor, node: Any = node) -> tuple[Any, ...]:
            attr = _constant_of(gm, gm.graph, node, value)
            return attr, attr.meta["val"]

        _move(node, subs, resolve)
    gm.recompile()


def _move(node: Any, subs: list[Any], resolve: Callable[[Tensor], tuple[Any, ...] | None]) -> None:
    """Replace the tensor constants of ``subs`` by new last inputs (one per tensor,
    the same in every subgraph), fed from the outer nodes ``resolve`` gives."""
    outer: dict[int, tuple[Any, ...]] = {}
    uses = []
    for sub in subs:
        for const in list(sub.graph.find_nodes(op="get_attr")):
            value = getattr(sub, str(const.target), None)
            if not isinstance(value, Tensor):
                continue
            key = id(value)
            if key not in outer:
                r = resolve(value)
                if r is None:
                    continue
                outer[key] = r
            uses.append((sub, const, key))
    if not outer:
        return
    keys = list(outer)
    for sub in subs:
        placeholders = list(sub.graph.find_nodes(op="placeholder"))
        new = {}
        last = placeholders[-1]
        names = {p.name for p in placeholders}
        for k in keys:
            with sub.graph.inserting_after(last):
                last = sub.graph.placeholder(_fresh_name(names))
            last.meta["val"] = outer[k][1]
            new[k] = last
        for s, const, k in uses:
            if s is not sub:
                continue
            const.replace_all_uses_with(new[k])
            sub.graph.erase_node(const)
            if not sub.graph.find_nodes(op="get_attr", target=const.target):
                delattr(sub, str(const.target))
        sub.recompile()
    args: Any = node.args
    node.args = (*args[:3], (*tuple(args[3]), *(outer[k][0] for k in keys)))


def _fresh_name(names: set[str]) -> str:
    j = 0
    while f"lifted_{j}" in names:
        j += 1
    names.add(f"lifted_{j}")
    return f"lifted_{j}"
