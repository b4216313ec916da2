"""Operand checks during ``fd.jit``'s trace: what eager PyTorch refuses, fd.jit refuses
at the first call, naming the op, each operand and the argument paths it came from.

Fake tensors do not check that the operands of ``mm``, ``bmm``, ``addmm``, ``dot``,
``convolution``, ``lerp``... share a dtype (inductor would then compute a result or
fail inside its generated C++): ``decompositions()`` adds a check to inductor's
decomposition table for those ops. Any op whose shape, dtype or device check fails
in the trace is rewritten by ``refused_safely`` into a ``TransformError`` naming it.

Example:
    >>> table = decompositions()   # inductor's table with the dtype checks
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._torch.ops import OpOverload
from ._signature import Flat
from ._vmap import TransformError

__all__ = ["decompositions", "refused_safely"]

_TORCH_DIR = os.path.dirname(torch.__file__)


def _user_frame_of(frames: list[Any]) -> str:
    """``_user_frame`` of the innermost of ``frames`` (frame objects)."""
    if not frames:
        return ""
    fr = frames[-1]
    line = linecache.getline(fr.f_code.co_filename, fr.f_lineno).strip()
    return f" at {fr.f_code.co_filename}:{fr.f_lineno} (`{line}`)"


BAD_OPERANDS = (
    "{name}: {op} refuses its operands {operands}{at}: {why}. Eager PyTorch refuses "
    "these arguments too (fd.jit checks them at the first call of each signature, "
    "before any compiled code runs). {fix}"
)
_WHY = {
    "dtype": (
        "they have different dtypes and this op does not promote",
        "Convert one of them: before the call (`p.to(torch.float32)`) or inside the "
        "function (`x.to(p.dtype)`).",
    ),
    "device": (
        "they are on different devices",
        "Move the arguments to one device before the call (`td.to(device)`).",
    ),
    "shape": ("{msg}", "Check the shapes of these arguments."),
}


# ------------------------------------------------------------------ operand checks
class _MixedDtypes(RuntimeError):
    """Raised during a trace by an op that eager PyTorch runs only on operands of one
    dtype (fake tensors do not check it); ``_refused`` rewrites it."""


def _same_dtype_ops() -> dict[Any, Any]:
    """Op -> the operands eager PyTorch requires to share a dtype. ``?``: only on the
    CPU (a ``bias``-like operand: CUDA takes an fp32 one for some); ``~``: unless it
    has no dims (eager takes a 0-dim lerp weight of any float dtype)."""
    A = torch.ops.aten
    mat, batches = ("self", "mat2"), ("?self", "batch1", "batch2")
    return {
        A.mm.default: mat,
        A.bmm.default: mat,
        A.addmm.default: ("?self", "mat1", "mat2"),
        A.baddbmm.default: batches,
        A.addbmm.default: batches,
        A.mv.default: ("self", "vec"),
        A.addmv.default: ("?self", "mat", "vec"),
        A.dot.default: ("self", "tensor"),
        A.vdot.default: ("self", "tensor"),
        A.convolution.default: ("input", "weight", "bias"),
        A.linalg_cross.default: ("self", "other"),
        A.lerp.Scalar: ("self", "end"),
        A.lerp.Tensor: ("self", "end", "~weight"),
        A.index_put.default: ("self", "values"),
    }


def _bound(op: OpOverload, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> dict[str, Any]:
    """An op's call as {schema argument name: value}."""
    out = {}
    for i, a in enumerate(op._schema.arguments):
        out[a.name] = args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
    return out


def _checked(
    op: OpOverload, names: tuple[Any, ...], decomp: Callable[..., Any] | None
) -> Callable[..., Any]:
    """A decomposition-table entry for ``op``: raises ``_MixedDtypes`` when the operands
    ``names`` differ in dtype, else defers to ``decomp`` (None: no decomposition)."""

    def check(*args: Any, **kwargs: Any) -> Any:
        bound = _bound(op, args, kwargs)
        vals = []
        for n in names:
            v = bound.get(n.lstrip("?~"))
            if not isinstance(v, Tensor) or (n[0] == "?" and v.device.type != "cpu"):
                continue
            if not (n[0] == "~" and v.dim() == 0):
                vals.append(v)
        if len({v.dtype for v in vals}) > 1:
            raise _MixedDtypes(f"{op} takes operands of one dtype")
        return NotImplemented if decomp is None else decomp(*args, **kwargs)

    return check


def decompositions() -> dict[Any, Any]:
    """Inductor's decomposition table with the dtype checks of ``_same_dtype_ops``."""
    from .._torch.inductor import select_decomp_table

    table = dict(select_decomp_table())
    for op, names in _same_dtype_ops().items():
        table[op] = _checked(op, names, table.get(op))
    return table


def _frames(tb: Any) -> list[Any]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _is_torch(frame: Any) -> bool:
    return str(frame.f_code.co_filename).startswith(_TORCH_DIR)


# where torch checks an op's operands: torch._check, a C++ kernel called from
# OpOverload.__call__, fake/meta kernels, references, decompositions (not, e.g., the
# custom-op machinery saying an op has no fake kernel)
_CHECKERS = ("__init__.py", "_ops.py", "_subclasses", "_meta_registrations.py", "_refs", "_prims")
_OP_CHECKS = tuple(os.path.join(_TORCH_DIR, p) for p in (*_CHECKERS, "_decomp", "_inductor"))


def _refused(name: str, e: BaseException, flat: Flat) -> BaseException | None:
    """``e`` as a functd error naming the op and its operands (dtype, shape, device,
    and the argument paths they come from), when an op refused its operands during
    the trace: its fake kernel raised (shapes, devices, some dtypes) or
    ``_same_dtype_ops`` did. None for any other error."""
    if not isinstance(e, RuntimeError) or isinstance(e, TransformError):
        return None
    frames = _frames(e.__traceback__)
    calls = [
        i for i, fr in enumerate(frames) if fr.f_code.co_name == "proxy_call" and _is_torch(fr)
    ]
    if not calls:
        return None
    k = calls[-1]  # the innermost op being traced
    if not isinstance(e, _MixedDtypes) and (
        not all(_is_torch(fr) for fr in frames[k + 1 :])
        or not frames[-1].f_code.co_filename.startswith(_OP_CHECKS)
    ):
        return None  # not an op's check of its operands
    loc = frames[k].f_locals
    op, mode = loc.get("func"), loc.get("proxy_mode")
    if not isinstance(op, OpOverload):
        return None
    outer = next(
        (fr.f_locals.get("tracer") for fr in frames if fr.f_code.co_name == "dispatch_trace"),
        None,
    )
    tracer = getattr(mode, "tracer", None)
    bound = _bound(op, tuple(loc.get("args") or ()), dict(loc.get("kwargs") or {}))
    tensors = {n: v for n, v in bound.items() if isinstance(v, Tensor)}
    paths = flat.paths() if tracer is not None and tracer is outer else None
    msg = str(e).split("\n")[0].strip().rstrip(".")
    kind = "shape"
    if len({v.device for v in tensors.values()}) > 1:
        kind = "device"
    elif isinstance(e, _MixedDtypes) or (
        len({v.dtype for v in tensors.values()}) > 1 and ("dtype" in msg or "type" in msg)
    ):
        kind = "dtype"
    why, fix = _WHY[kind]
    if not isinstance(e, _MixedDtypes):
        why = why.format(msg=msg) + ("" if kind == "shape" else f" (torch: {msg})")
    operands = ", ".join(
        _operand(n, v, kind == "device", _sources(v, tracer, paths)) for n, v in tensors.items()
    )
    at = _user_frame_of([fr for fr in frames[:k] if not _is_torch(fr)])
    return TransformError(
        BAD_OPERANDS.format(name=name, op=op, operands=operands, at=at, why=why, fix=fix)
    )


def refused_safely(name: str, e: BaseException, flat: Flat) -> BaseException | None:
    """``_refused``, or None where reading torch's frames fails (torch's error then)."""
    try:
        return _refused(name, e, flat)
    except Exception:
        return None


def _operand(n: str, v: Tensor, device: bool, sources: list[str] | None) -> str:
    """``self: float32[4, 3] (from args[1]['x'])``; ``sources`` None: not known."""
    dtype = str(v.dtype).replace("torch.", "")
    where = f" on {v.device}" if device else ""
    if sources is None:
        return f"{n}: {dtype}{list(v.shape)}{where}"
    src = f"from {', '.join(sources)}" if sources else "computed in the function"
    return f"{n}: {dtype}{list(v.shape)}{where} ({src})"


def _sources(v: Tensor, tracer: Any, paths: list[str] | None, limit: int = 3) -> list[Any] | None:
    """The argument paths ``v`` was computed from without a dtype change (through
    views, copies, arithmetic with its own dtype): the graph's placeholders reached
    from its node through nodes of its dtype; at most ``limit``. None when not known
    (``paths`` None: an op inside a loop's body, traced apart)."""
    if paths is None:
        return None
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    slot = get_proxy_slot(v, tracer, None)
    node = getattr(getattr(slot, "proxy", None), "node", None)
    if node is None:
        return []
    order = {n: i for i, n in enumerate(tracer.graph.find_nodes(op="placeholder"))}
    found: list[str] = []
    seen, stack = {node}, [node]
    while stack and len(seen) < 1000:
        n = stack.pop()
        if n in order:
            if order[n] < len(paths):
                found.append(paths[order[n]])
            continue
        for m in n.all_input_nodes:
            val = m.meta.get("val")
            if m not in seen and isinstance(val, Tensor) and val.dtype == v.dtype:
                seen.add(m)
                stack.append(m)
    found = sorted(set(found), key=paths.index)
    return found[:limit] + (["..."] if len(found) > limit else [])
