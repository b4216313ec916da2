"""Ambient defaults that context managers set and calls read when they start.

``INTERACTION.value`` is the interaction type of ``fd.set_interaction_type`` (one
value per thread: a ``threading.local``). torch.compile (dynamo) reads a
``threading.local``'s attribute but installs no guard on it, so compiled code would
keep the value it was traced with; ``COMPILED.value``, a plain object's attribute that
dynamo does guard, mirrors the latest setting (in any thread) and is what code traced
by dynamo reads. It lives here, below every room, because two rooms read it:
the modules (each probabilistic call) and ``fd.jit`` (a traced function bakes in
the value it saw, so the compiled code is cached under it, with the autocast state).

Example:
    >>> snapshot()
    (None, False)
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ._torch.ops import any_autocast

__all__ = ["COMPILED", "INTERACTION", "snapshot"]


class _Interaction(threading.local):
    value = None  # a class default: reading it never raises (a missing attribute would)


INTERACTION = _Interaction()


class _Compiled:
    value = None  # what dynamo-traced code reads (and guards): the latest setting


COMPILED = _Compiled()

_any_autocast = any_autocast  # (a module global: read once per call)


def _autocast() -> tuple[Any, ...]:
    out = []
    for dev in ("cpu", "cuda", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(dev):
                out.append((dev, torch.get_autocast_dtype(dev)))
        except RuntimeError:  # a device type this build does not know
            continue
    return tuple(out)


def snapshot() -> tuple[Any, ...]:
    """The ambient state a traced function can bake in: (interaction type, autocast)."""
    return (
        getattr(INTERACTION, "value", None),
        _autocast() if _any_autocast() else False,
    )
