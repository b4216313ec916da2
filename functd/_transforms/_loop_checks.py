"""What ``fd.scan``/``fd.fori_loop`` check, and the messages they raise: shared by the
eager loop (``_loops``) and the compiled one (``_loops_hop``)."""

from __future__ import annotations

import operator
from typing import Any

import optree
import torch
from torch import Tensor

from .._td import TensorDict
from .._td._tree import NAMESPACE
from ._paths import fmt_path

NOT_CALLABLE = "fd.scan: f must be a callable f(carry, x) -> (carry, y); got {kind}."
NO_LENGTH = (
    "fd.scan(f, init, xs=None): without xs the number of steps is unknown. Pass "
    "length=n (f is then called with x=None), or xs with a leading dim of n."
)
BAD_LENGTH = "fd.scan: length must be a Python int >= 0; got {got}."
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
    "fd.fori_loop: {which} must be an integer (a Python or numpy int, or a 0-d integer "
    "tensor); got {got}."
)
TRACED_BOUNDS = (
    "fd.fori_loop: {which} is a tensor whose value is not known while tracing ({got}): "
    "such a loop is a while loop (fd.while_loop), which this build of functd lacks. "
    "Pass the bound as a Python int (a static argument of fd.jit), or loop over the "
    "largest count and mask the extra steps with torch.where."
)
UNROLL = (
    "fd.{fn}: unroll must be a bool or a Python int >= 1 (the number of steps in each "
    "iteration of the compiled loop); got {got}."
)
CARRY_BATCH = (
    "fd.scan: f changed the batch size of the TensorDict at {path}: init has batch "
    "size {was} and f returned {now}. A carry keeps init's batch sizes (the loop's "
    "state has one layout); return a TensorDict with batch_size={was}."
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
        return [], None, _check_length(length)
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
        return [], None, _check_length(length)
    if length is not None and length != n:
        raise ValueError(LENGTH_XS.format(length=length, path=fmt_path(first, ""), n=n))
    return leaves, spec, n


def _check_tds(v: Any, path: tuple[Any, ...]) -> None:
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


def _check_length(n: Any) -> Any:
    if isinstance(n, bool) or not isinstance(n, int | torch.SymInt):
        try:  # a numpy integer
            n = operator.index(n)
        except TypeError:
            raise ValueError(BAD_LENGTH.format(got=f"{_kind(n)} {n!r}")) from None
    if type(n) is int and n < 0:
        raise ValueError(BAD_LENGTH.format(got=n))
    return n


def _split(out: Any) -> tuple[Any, Any]:
    if not isinstance(out, tuple) or len(out) != 2:
        kind = f"a tuple of {len(out)}" if isinstance(out, tuple) else f"a {_kind(out)}"
        raise TypeError(F_RESULT.format(kind=kind))
    return out


def check_carry(init_spec: Any, init_leaves: list[Any], carry: Any) -> list[Tensor]:
    """The leaves of the carry ``f`` returned, checked against init's."""
    paths, leaves, spec = optree.tree_flatten_with_path(carry, namespace=NAMESPACE)
    if not same_structure(spec, init_spec):
        raise TypeError(CARRY_STRUCTURE.format(was=_short(init_spec), now=_short(spec)))
    bs_now = _batch_sizes(carry, (), {})  # (tree specs compare a TensorDict's keys only)
    if bs_now:
        bs_was = _batch_sizes(optree.tree_unflatten(init_spec, init_leaves), (), {})
        if bs_was != bs_now:
            raise TypeError(_batch_changed(bs_was, bs_now))
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


def same_structure(a: Any, b: Any) -> bool:
    """``a == b`` for two tree specs. Under dynamo, a walk over their nodes' types, entries
    (keys) and children, which it traces on every torch (dynamo 2.11/2.12 cannot compare
    its own specs: their flatten functions have no ``__eq__`` it can trace).

    >>> same_structure(optree.tree_structure({"a": 1}), optree.tree_structure({"a": 2}))
    True
    """
    if not torch.compiler.is_compiling():
        return bool(a == b)
    return _walk_same(a, b)


def _walk_same(a: Any, b: Any) -> bool:
    if a.type is not b.type or a.num_children != b.num_children or a.entries() != b.entries():
        return False
    return all(_walk_same(x, y) for x, y in zip(a.children(), b.children()))


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


def _check_init(init: Any) -> tuple[list[Any], Any]:
    paths, leaves, spec = optree.tree_flatten_with_path(init, namespace=NAMESPACE)
    for p, v in zip(paths, leaves):
        if not isinstance(v, Tensor):
            raise TypeError(
                f"fd.scan: init{fmt_path(p, '')} is a {_kind(v)}; the carry's leaves must be "
                "tensors (torch.as_tensor(v)); close over static values in f instead."
            )
    return leaves, spec


def _batch_sizes(v: Any, path: tuple[Any, ...], out: dict[Any, Any]) -> dict[Any, Any]:
    """``{path: batch size}`` of the TensorDicts in ``v`` (also nested in one another)."""
    if isinstance(v, TensorDict):
        out[path] = list(v.batch_size)
        for k, w in v.items():
            _batch_sizes(w, (*path, k), out)
    elif isinstance(v, tuple | list):
        for i, w in enumerate(v):
            _batch_sizes(w, (*path, i), out)
    elif isinstance(v, dict):
        for k, w in v.items():
            _batch_sizes(w, (*path, k), out)
    return out


def _batch_changed(was: dict[Any, Any], now: dict[Any, Any]) -> str:
    for path, bs in was.items():
        if now.get(path) != bs:
            return CARRY_BATCH.format(path=fmt_path(path, "carry"), was=bs, now=now.get(path))
    return CARRY_BATCH.format(path="carry", was=list(was.values()), now=list(now.values()))


# ------------------------------------------------------- scalars, bounds, unroll
def _scalar_dtype(v: Any) -> torch.dtype | None:
    """The dtype a scalar leaf becomes (None: not a scalar): Python ints int64, floats
    torch's default dtype, complex its complex counterpart, bools bool (as JAX's weak
    types); numpy scalars and 0-d arrays keep their dtype."""
    t = type(v)
    if t is bool:
        return torch.bool
    if t is int:
        return torch.int64
    if t is float:
        return torch.get_default_dtype()
    if t is complex:
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    if t.__module__ == "numpy" and getattr(v, "shape", None) == ():
        return torch.as_tensor(v).dtype
    return None


def as_carry(init: Any, like: list[Any]) -> tuple[Any, dict[int, Any]]:
    """``init`` with its Python and numpy scalar leaves made 0-d tensors (on the device
    of the first tensor of ``like``), and ``{leaf position: Python value}`` of the weakly
    typed ones (Python ints, floats, complex), whose dtype a step may promote."""
    leaves, spec = optree.tree_flatten(init, namespace=NAMESPACE)
    if all(isinstance(v, Tensor) for v in leaves):
        return init, {}
    device = next((t.device for t in (*leaves, *like) if isinstance(t, Tensor)), None)
    weak, new = {}, []
    for k, v in enumerate(leaves):
        dtype = None if isinstance(v, Tensor) else _scalar_dtype(v)
        if dtype is None:
            new.append(v)  # a tensor, or refused by _check_init
            continue
        value = v.item() if hasattr(v, "item") else v
        new.append(torch.full((), value, dtype=dtype, device=device))
        if type(v) in (int, float, complex):
            weak[k] = v
    return optree.tree_unflatten(spec, new), weak


def promoted(weak: dict[int, Any], kinds: list[Any], out: Any) -> dict[int, torch.dtype]:
    """The weakly typed carry leaves whose dtype the step changed, with the dtype JAX
    gives them (``result_type(weak value, step's result)``: an int carry to which the
    step adds a float becomes a float carry)."""
    leaves = optree.tree_leaves(out, namespace=NAMESPACE)
    if len(leaves) != len(kinds):
        return {}  # check_carry says what is wrong
    found = {}
    for k, v in weak.items():
        b, was = leaves[k], kinds[k][0]
        if isinstance(b, Tensor) and b.dtype != was:
            dtype = _weak_result(b.dtype, v)
            if dtype != was:
                found[k] = dtype
    return found


_SCALARS = (bool, int, float, complex)


def has_scalars(carry: Any, n: int) -> bool:
    """Whether the step's carry (of ``n`` leaves, as init) holds a Python scalar."""
    leaves = optree.tree_leaves(carry, namespace=NAMESPACE)
    return len(leaves) == n and any(type(v) in _SCALARS for v in leaves)


def tensorized(carry: Any, kinds: list[Any]) -> Any:
    """``carry`` with its Python scalar leaves made 0-d tensors on the device of init's
    leaf, of ``result_type(init's dtype, scalar)`` (``kinds``: init's (dtype, device)
    per leaf; a dtype change is then checked as any)."""
    leaves, spec = optree.tree_flatten(carry, namespace=NAMESPACE)
    if len(leaves) != len(kinds):
        return carry  # check_carry says what is wrong
    new = [
        torch.full((), v, dtype=_weak_result(dtype, v), device=device) if type(v) in _SCALARS else v
        for v, (dtype, device) in zip(leaves, kinds)
    ]
    return optree.tree_unflatten(spec, new)


def _category(dtype: torch.dtype) -> int:
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 0 if dtype == torch.bool else 1


def _weak_result(dtype: torch.dtype, v: Any) -> torch.dtype:
    """``torch.result_type`` of a tensor of ``dtype`` and the Python scalar ``v`` (its
    rule written out: dynamo cannot trace the call): ``dtype`` unless ``v`` is of a
    higher kind (bool < int < float < complex), else ``v``'s default dtype (a float
    tensor's complex counterpart for a complex ``v``)."""
    kind = {bool: 0, int: 1, float: 2}.get(type(v), 3)
    have = _category(dtype)
    if kind <= have:
        return dtype
    if kind == 3 and have == 2:
        return {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(
            dtype, torch.complex64
        )
    return _scalar_dtype(v) or dtype


def check_unroll(unroll: Any, fn: str) -> int | bool:
    if isinstance(unroll, bool):
        return True if unroll else 1
    try:
        k = operator.index(unroll)
    except TypeError:
        k = 0
    if k < 1:
        raise ValueError(UNROLL.format(fn=fn, got=f"{_kind(unroll)} {unroll!r}"))
    return k


def check_bound(b: Any, which: str) -> int | Tensor:
    """A bound of ``fori_loop``: a Python int (numpy ints too), or a 0-d integer tensor."""
    if isinstance(b, torch.SymInt):  # (torch.compile's dynamic ints)
        return b  # type: ignore[return-value]
    if isinstance(b, Tensor):
        if (
            b.ndim == 0
            and not b.is_floating_point()
            and not b.is_complex()
            and b.dtype != torch.bool
        ):
            return b
        got = f"a {_describe(b)} tensor"
    elif isinstance(b, bool) or type(b).__name__ == "bool_":
        got = f"{_kind(b)} {b!r}"
    else:
        try:
            return operator.index(b)
        except TypeError:
            got = f"{_kind(b)} {b!r}"
    raise TypeError(BOUNDS.format(which=which, got=got))
