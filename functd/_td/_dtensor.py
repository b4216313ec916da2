"""DTensor leaves: recognise them (also under torch.func's wrappers), find their mesh.

The pieces every layer may need when params or inputs are
``torch.distributed.tensor.DTensor`` values: ``is_dtensor``, the one-mesh check
with its error, and ``replicated`` (a plain tensor as a ``Replicate()`` DTensor,
no communication). Nothing imports ``torch.distributed.tensor`` until a DTensor
exists. The hook that replicates a module's plain-tensor inputs next to DTensor
params lives with the params check (``functd/_modules/_params_check.py``).

Example:
    >>> is_dtensor(torch.zeros(2))
    False
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from .. import _errors as E
from .._torch.functorch import (
    get_unwrapped,
    is_batchedtensor,
    is_wrapped,
    temporarily_clear_interpreter_stack,
)

__all__ = ["SEEN", "is_dtensor", "mixed_mesh_error", "one_mesh", "replicated", "seen"]

_Tensor = torch.Tensor


#: True once functd has met a DTensor (params marked, ``shard``, an FSDP2 module): only
#: then does the fast params check look through torch.func's wrappers for DTensors.
SEEN = False
_wrapped = is_wrapped
_unwrap = get_unwrapped


def seen() -> None:
    global SEEN
    SEEN = True


def unwrapped(v: Any) -> Any:
    """The tensor under torch.func's grad/vmap wrappers (a DTensor under ``fd.grad``
    looks like a plain Tensor). Under torch.compile: ``v`` (the wrappers are traced)."""
    if torch.compiler.is_compiling():
        return v
    while isinstance(v, _Tensor) and _wrapped(v):
        v = _unwrap(v)
    return v


def _dtensor_type() -> type | None:
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def is_dtensor(v: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor``, also under torch.func's wrappers
    (without importing torch.distributed.tensor)."""
    t = _dtensor_type()
    return t is not None and isinstance(unwrapped(v), t)


def _fmt_mesh(mesh: Any) -> str:
    names = getattr(mesh, "mesh_dim_names", None)
    return f"DeviceMesh({mesh.device_type!r}, {mesh.mesh.tolist()}, names={names})"


def mixed_mesh_error(where: str, k1: Any, m1: Any, k2: Any, m2: Any) -> ValueError:
    return ValueError(
        f"{where}: mixes DTensors from different device meshes: {E.fmt_key(k1)} is on "
        f"{_fmt_mesh(m1)} but {E.fmt_key(k2)} is on {_fmt_mesh(m2)}. Place every parameter "
        "and input on one mesh, e.g. fd.distributed.shard(params, mesh, rules), or gather "
        "them back with fd.distributed.gather(params)."
    )


def one_mesh(where: str, items: Any) -> Any:
    """The mesh shared by the DTensor values of ``items`` (``(key, value)`` pairs), or
    None when there is none; a clear error when two meshes differ."""
    t = _dtensor_type()
    if t is None:
        return None
    first = None
    for k, v in items:
        if type(v) is _Tensor and not SEEN:  # plain (until a DTensor was met: wrapped)
            continue
        v = unwrapped(v)
        if isinstance(v, t):
            if first is None:
                first = (k, v.device_mesh)  # type: ignore[attr-defined]
            elif v.device_mesh != first[1]:  # type: ignore[attr-defined]
                raise mixed_mesh_error(where, first[0], first[1], k, v.device_mesh)  # type: ignore[attr-defined]
    return None if first is None else first[1]


def _constant_base(a: _Tensor) -> Any:
    """The plain tensor under ``a`` when no torch.func transform maps or differentiates
    it (a batch passed next to the params under ``fd.grad``); None otherwise."""
    while _wrapped(a):
        if a.requires_grad or is_batchedtensor(a):
            return None
        a = _unwrap(a)
    return a


def replicated(a: _Tensor, mesh: Any) -> Any:
    """``a`` (a plain tensor) as a ``Replicate()`` DTensor on ``mesh``, no communication;
    also inside torch.func transforms when ``a`` is a constant of them."""
    from torch.distributed.tensor import DTensor, Replicate

    return replicate_input(None, 0, a, mesh, DTensor, Replicate)


def replicate_input(m: Any, i: int, a: Any, mesh: Any, DTensor: Any, Replicate: Any) -> Any:
    placements = [Replicate()] * mesh.ndim
    base = _constant_base(a)
    if base is not None:  # a constant of every torch.func transform: build it outside them
        with temporarily_clear_interpreter_stack():
            return DTensor.from_local(base, mesh, placements, run_check=False)
    try:
        return DTensor.from_local(a, mesh, placements, run_check=False)
    except RuntimeError as e:  # DTensor.from_local has no torch.func rule
        if m is None:
            where, key = "fd.distributed.replicate", "x"
        else:
            where, key = m._label(), (m.in_keys[i] if i < len(m.in_keys) else i)  # type: ignore[assignment]
        raise TypeError(
            f"{where}: input {E.fmt_key(key)} is a plain tensor mapped or differentiated "
            "by a torch.func transform (fd.vmap / fd.grad with respect to it), which cannot "
            "be replicated onto the mesh of the DTensor params inside the transform. Make it "
            "a DTensor before the transform: fd.distributed.replicate(x, mesh)."
        ) from e
