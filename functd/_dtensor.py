"""DTensor params next to plain-tensor inputs: the one hook in a module call.

A module whose params hold ``torch.distributed.tensor.DTensor`` leaves (from
``fd.distributed.shard`` or ``fd.from_module(fully_shard(net))``) is called on
plain tensors the way DDP users call a model: each plain-tensor input becomes a
``Replicate()`` DTensor on the params' mesh (torch itself would raise "got mixed
torch.Tensor and DTensor").

Cost on the plain path: none per call. ``Module`` checks a params TensorDict
against its layer once (``params._checked``); a params TensorDict holding
DTensors is marked with a ``Placed`` record instead of the layer, so only those
calls come here, and find their mesh in the mark.

Example:
    >>> params = fd.distributed.shard(lin.init(0), mesh, {"*": [Replicate()]})
    >>> lin(params, x=torch.randn(5, 3))   # x is replicated on ``mesh``
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from . import _errors as E
from ._td import TensorDict, _set_checked

__all__ = ["Placed", "is_dtensor", "placed_inputs", "placed_mark"]

_Tensor = torch.Tensor


def _dtensor_type() -> type | None:
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def is_dtensor(v: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (without importing it)."""
    t = _dtensor_type()
    return t is not None and isinstance(v, t)


class Placed:
    """The ``_checked`` mark of params that passed a layer's check and hold DTensors."""

    __slots__ = ("fn", "mesh")

    def __init__(self, fn: Any, mesh: Any) -> None:
        self.fn, self.mesh = fn, mesh


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
        if isinstance(v, t):
            if first is None:
                first = (k, v.device_mesh)
            elif v.device_mesh != first[1]:
                raise mixed_mesh_error(where, first[0], first[1], k, v.device_mesh)
    return None if first is None else first[1]


def placed_mark(m: Any, items: Any) -> Any:
    """What ``_check_params`` stores in ``params._checked``: the layer itself for plain
    params, a ``Placed`` record (layer + mesh) for params holding DTensors."""
    mesh = one_mesh(m._label(), items)
    return m._fn if mesh is None else Placed(m._fn, mesh)


def _replicate(m: Any, args: Any, mesh: Any) -> Any:
    from torch.distributed.tensor import DTensor, Replicate

    out = []
    for i, a in enumerate(args):
        if type(a) is _Tensor or (isinstance(a, _Tensor) and not isinstance(a, DTensor)):
            a = DTensor.from_local(a, mesh, [Replicate()] * mesh.ndim, run_check=False)
        elif isinstance(a, DTensor) and a.device_mesh != mesh:
            key = m.in_keys[i] if i < len(m.in_keys) else i
            raise mixed_mesh_error(m._label(), "params", mesh, key, a.device_mesh)
        out.append(a)
    return out


def placed_inputs(m: Any, params: TensorDict, args: Any) -> Any:
    """Called by a module with params when ``params._checked is not m._fn``: check the
    params (once per params TensorDict), and when they hold DTensors return ``args``
    with every plain tensor replicated on their mesh; else ``args`` unchanged."""
    mark = params._checked
    if type(mark) is not Placed or mark.fn is not m._fn:
        from ._module import _check_params

        _check_params(m, params)
        mark = params._checked
        if mark is m._fn:
            return args
        if type(mark) is not Placed:  # under torch.compile nothing is stored: look again
            mark = placed_mark(m, params.items(True, True))
            if type(mark) is not Placed:
                return args
    return _replicate(m, args, mark.mesh)


def set_placed(params: TensorDict, m: Any, items: Any) -> None:
    _set_checked(params, placed_mark(m, items))
