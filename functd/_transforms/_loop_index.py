"""Indexing with a traced loop index inside a compiled ``fd.scan``/``fd.fori_loop`` step.

``v[i]`` with a 0-d integer tensor ``i`` reads ``i``'s value (``__index__``): in
eager PyTorch that is a select, but while ``fd.jit`` traces (``i`` has no value)
it is data-dependent and refused. JAX's ``x[i]`` with a traced ``i`` is a dynamic
index; ``index_mode`` gives functd's loop steps the same: while the step is traced,
``v[..., i, ...]`` (one 0-d integer tensor among ints, slices, None and ``...``) and
``v.select(d, i)`` / ``torch.select(v, d, i)`` become a gather with a one-element
index tensor and a select of the dim it leaves, negative values wrapped as Python
does (``TensorDict`` indexing does the same, ``_td/_shape.py``). Out-of-range values
are not checked (as in ``jax.jit``, where they are clamped; here the compiled gather
reads them unchecked, so keep ``i`` in range).

``fd.scan`` enters the mode only while compiling (fd.jit's make_fx trace, or
dynamo, which traces the mode too) and only around the user's step: eager code
never sees it.

Example:
    >>> with index_mode():
    ...     row = xs[i]        # i: a traced 0-d int64 tensor
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["index_mode", "traced_index"]


def _is_index(v: Any) -> bool:
    return (
        isinstance(v, Tensor)
        and v.ndim == 0
        and not v.is_floating_point()
        and not v.is_complex()
        and v.dtype != torch.bool
    )


def traced_index(t: Tensor, idx: Any) -> Tensor | None:
    """``t[idx]`` as a gather when ``idx`` holds one 0-d integer tensor among ints,
    slices, None and one ``...`` (None: another kind of index, left to torch)."""
    items = idx if type(idx) is tuple else (idx,)
    p = None
    for k, it in enumerate(items):
        if isinstance(it, Tensor):
            if p is not None or not _is_index(it):
                return None
            p = k
        elif not (it is None or it is Ellipsis or type(it) in (int, slice)):
            return None
    if p is None or sum(1 for it in items if it is Ellipsis) > 1:
        return None
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    if used > t.ndim:
        return None  # torch's IndexError
    rest = t.ndim - used  # the dims ``...`` stands for
    d = at = 0  # the dim of t that items[p] indexes, and its dim in the result
    for it in items[:p]:
        if it is Ellipsis:
            d, at = d + rest, at + rest
        elif it is None:
            at += 1
        elif type(it) is slice:
            d, at = d + 1, at + 1
        else:
            d += 1
    i = items[p]
    i = torch.where(i < 0, i + t.shape[d], i).reshape(1)
    gather = (*items[:p], i, *items[p + 1 :])
    return t[gather].select(at, 0)


class _IndexMode(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[Any, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is Tensor.__getitem__ and len(args) == 2 and not kwargs:
            out = traced_index(args[0], args[1])
            if out is not None:
                return out
        elif func in (Tensor.select, torch.select) and len(args) == 3 and _is_index(args[2]):
            t, d = args[0], args[1]
            if isinstance(d, int) and -t.ndim <= d < t.ndim:
                d = d % t.ndim
                return traced_index(t, (*(slice(None),) * d, args[2]))
        return func(*args, **kwargs)


@contextlib.contextmanager
def index_mode() -> Iterator[None]:
    """Traced 0-d integer tensors index as JAX's traced indices do (module doc)."""
    with _IndexMode():
        yield
