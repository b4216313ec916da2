"""What ``fd.scan``/``fd.fori_loop`` check, and the messages they raise: shared by the
eager loop (``_loops``) and the compiled one (``_loops_hop``)."""

from __future__ import annotations

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
