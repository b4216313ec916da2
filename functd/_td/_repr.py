"""The tensordict-style repr: ``TensorDict(batch_size=[5], fields={x: f32[3]})``.

Fields are sorted by key and show dtype and feature shape (the shape after the
batch dims). A leaf on another device than its TensorDict's shows ``@device``;
the header shows ``device=`` when all leaves share a non-CPU device.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["short_dtype", "td_repr"]


@functools.cache
def short_dtype(dtype: torch.dtype) -> str:
    """``torch.float32 -> 'f32'``, ``torch.int64 -> 'i64'``, ``torch.bool -> 'bool'``."""
    name = str(dtype).replace("torch.", "")
    for long, short in (("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c")):
        name = name.replace(long, short)
    return name


def _dims(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def td_repr(td: Any, parent_device: torch.device | None = None) -> str:
    """Return the one-line repr of ``td`` (nested TensorDicts are of ``type(td)``)."""
    n = len(td._batch_size)
    cls = type(td)
    device = td.device
    fields = []
    for k in sorted(td._data):
        v = td._data[k]
        if isinstance(v, cls):
            fields.append(f"{k}: {td_repr(v, device)}")
        else:
            at = "" if device is not None else f"@{v.device}" if v.device.type != "cpu" else ""
            fields.append(f"{k}: {short_dtype(v.dtype)}{_dims(v.shape[n:])}{at}")
    show = device is not None and device.type != "cpu" and device != parent_device
    dev = f", device={device}" if show else ""
    return f"TensorDict(batch_size={_dims(td._batch_size)}{dev}, fields={{{', '.join(fields)}}})"
