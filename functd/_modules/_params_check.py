"""The params check of a Module: the layout a layer expects, cached on the layer.

``_layout(layer)`` is ``({path: shape}, flat or None)``, computed once per layer
value and kept on the layer itself (or, for a layer without ``__dict__``, in a
bounded weak-keyed table): nothing here keeps a layer, or the torch module it
came from, alive. ``_check_params`` compares a params TensorDict with it.

Example:
    >>> _layout(fd.nn.Linear(3, 4))[0]
    {('weight',): (4, 3), ('bias',): (4,)}
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .. import _errors as E
from .._td import TensorDict
from .._td import _dtensor as _dt
from .._td._dtensor import mixed_mesh_error, one_mesh, replicate_input, seen, unwrapped
from .._td._marks import mark, mark_of
from ._call import params_hint
from ._keys import key_diff

__all__ = ["_check_params", "_layout"]

#: Layouts of layers that keep no ``__dict__`` (the others keep theirs on themselves,
#: under ``_LAYOUT_ATTR``): weak keys, so a dropped layer leaves, and bounded.
_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LAYOUTS_MAX = 256
_LAYOUT_ATTR = "_functd_layout"
_Tensor = torch.Tensor


def _layout(fn) -> tuple[dict, tuple | None]:
    """A layer's expected params, computed once per layer value: ``{path: shape}``,
    and ``((name, shape), ...)`` when every path is top-level (the fast check) or None.

    Kept on the layer itself (in its ``__dict__``, beside its frozen fields), so
    it lives exactly as long as the layer; a layer without ``__dict__`` uses a
    bounded weak-keyed table, or nothing when it cannot be weakly referenced."""
    own = getattr(fn, "__dict__", None)
    if own is not None:
        cached = own.get(_LAYOUT_ATTR)
        if cached is None:
            cached = own[_LAYOUT_ATTR] = _compute_layout(fn)
        return cached
    try:
        cached = _LAYOUTS.get(fn)
    except TypeError:  # not weakly referenceable (or unhashable): no cache
        return _compute_layout(fn)
    if cached is None:
        cached = _compute_layout(fn)
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        _LAYOUTS[fn] = cached
    return cached


def _compute_layout(fn) -> tuple[dict, tuple | None]:
    """The layout ``_layout`` caches (computed without drawing: meta tensors)."""
    shapes = getattr(fn, "param_shapes", None)
    if shapes is not None:
        lay = dict(shapes())
    else:
        with torch.device("meta"):
            p = fn.init(0)
        lay = {k if isinstance(k, tuple) else (k,): tuple(v.shape) for k, v in p.items(True, True)}
    flat = None
    if all(len(k) == 1 for k in lay):
        flat = tuple((k[0], tuple(shape)) for k, shape in lay.items())
    return (lay, flat)


def _check_params(m: Any, params: TensorDict) -> None:
    # Under torch.compile the check is traced (it costs nothing at run time: the
    # shapes are guarded anyway) but neither the layout cache nor the params'
    # params-check cache (``_td/_marks.py``) is written: a side effect on an input or on a global
    # would make the next call fail a guard and recompile (notes/gotchas.md).
    compiling = torch.compiler.is_compiling()
    if not compiling:  # fast path: a flat layout whose entries all match
        flat = _layout(m._fn)[1]
        if flat is not None and len(params._data) == len(flat):
            data = params._data
            for k, shape in flat:
                v = data.get(k)
                if type(v) is not _Tensor or v.shape != shape:  # DTensors: the slow path
                    break
            else:  # after a DTensor was met, look under torch.func's wrappers too
                mark(params, placed_mark(m, data.items()) if _dt.SEEN else m._fn)
                return
    expected = dict(m._fn.param_shapes()) if compiling else _layout(m._fn)[0]
    got = {k if isinstance(k, tuple) else (k,): v for k, v in params.items(True, True)}
    missing, extra = key_diff(expected, got)
    if missing or extra:
        raise KeyError(
            f"{m._label()}: params do not match the layout of {m._fn!r}: missing "
            f"{E.fmt_keys(missing)}; unexpected {E.fmt_keys(extra)}. Were these params made "
            f"for another module? Use {params_hint(m)}."
        )
    for k, shape in expected.items():
        if tuple(got[k].shape) != tuple(shape):
            raise ValueError(
                f"{m._label()}: params entry {E.fmt_key(k)} has shape {list(got[k].shape)}, "
                f"expected {list(shape)}. (An ensemble's stacked params are called with fd.vmap.)"
            )
    if not compiling:  # the layer, or a Placed mark when params hold DTensors
        mark(params, placed_mark(m, got.items()))


class Placed:
    """The params-check token of params that passed a layer's check and hold DTensors."""

    __slots__ = ("fn", "mesh")
    fn: Any
    mesh: Any

    def __init__(self, fn: Any, mesh: Any) -> None:
        self.fn, self.mesh = fn, mesh


def placed_mark(m: Any, items: Any) -> Any:
    """What ``_check_params`` records in the params-check cache (``_td/_marks.py``): the layer itself for plain
    params, a ``Placed`` record (layer + mesh) for params holding DTensors."""
    mesh = one_mesh(m._label(), items)
    if mesh is None:
        return m._fn
    seen()
    return Placed(m._fn, mesh)


def _replicate(m: Any, args: Any, mesh: Any) -> Any:
    from torch.distributed.tensor import DTensor, Replicate

    out = []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) and not isinstance(unwrapped(a), DTensor):
            a = replicate_input(m, i, a, mesh, DTensor, Replicate)
        elif isinstance(unwrapped(a), DTensor) and unwrapped(a).device_mesh != mesh:
            key = m.in_keys[i] if i < len(m.in_keys) else i
            raise mixed_mesh_error(m._label(), "params", mesh, key, unwrapped(a).device_mesh)
        out.append(a)
    return out


def placed_inputs(m: Any, params: TensorDict, args: Any) -> Any:
    """Called by a module with params when ``params`` is not marked checked against ``m._fn``: check the
    params (once per params TensorDict), and when they hold DTensors return ``args``
    with every plain tensor replicated on their mesh; else ``args`` unchanged."""
    token = mark_of(params)
    if type(token) is not Placed or token.fn is not m._fn:
        _check_params(m, params)
        token = mark_of(params)
        if token is m._fn:
            return args
        if type(token) is not Placed:  # under torch.compile nothing is stored: look again
            token = placed_mark(m, params.items(True, True))
            if type(token) is not Placed:
                return args
    return _replicate(m, args, token.mesh)
