"""fd.jit's compile log: a line when a slow compile starts and one when it ends.

functd logs through ``logging.getLogger("functd")`` (fd.jit through its child
``"functd.jit"``), which has a ``NullHandler`` and no level of its own: nothing is
shown unless the application configures logging, e.g.
``logging.basicConfig(); logging.getLogger("functd").setLevel(logging.INFO)``.

A compile (trace + inductor) that takes longer than ``SLOW_S`` seconds logs at INFO::

    fd.jit(step): compiling signature args[0]: TensorDict('w', 'b') (float32[3, 4], ...)...
    fd.jit(step): compiled signature args[0]: ... in 41.2 s (built, not from disk)

The start line is written once ``SLOW_S`` seconds have passed (by a timer thread while
inductor works, or at the end of the trace when the trace alone took that long), so a
compile answered quickly (a small graph, or inductor's cache on disk) logs nothing.

Example:
    >>> with CompileLog("fd.jit(f)", lambda: "args[0]: tensor (float32[3])") as log:
    ...     traced = trace(...)
    ...     log.checkpoint()
    ...     run, source = compile_graph(traced, "inductor")
    ...     log.from_disk = disk.hit
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

import torch

from ._signature import Flat, shown

__all__ = ["LOG", "SLOW_S", "CompileLog", "describe", "short"]

logging.getLogger("functd").addHandler(logging.NullHandler())
LOG = logging.getLogger("functd.jit")
#: a compile longer than this (seconds) logs its start and its end at INFO
SLOW_S = 2.0
_MAX_SIGNATURE = 160  # characters of the signature in a log line
_clock = time.perf_counter  # tests replace it to make a compile look slow


def describe(flat: Flat) -> str:
    """A call's signature in words: per argument its tree, batch size and leaves
    (``args[0]: TensorDict('x') batch [[2]] (float32[2, 3])``); ``lower()`` shows it."""
    names = [f"args[{i}]" for i in range(flat.nargs)] + [f"{k}=" for k in flat.sig[1]]
    parts = []
    for n, d in zip(names, flat.descs):
        struct, _, layout, leaves = d.key.value
        if d.kind == "td":
            keys = ", ".join(repr(p[0] if len(p) == 1 else p) for p in d.paths())
            head, layout = f"TensorDict({keys})", tuple(node[2] for node in struct)
        else:
            head = "tensor" if d.kind == "tensor" else str(d.spec)
        values = ", ".join(
            f"{p[1]}{list(p[0])}".replace("torch.", "")
            if isinstance(p[0], torch.Size)
            else shown(p)
            for p in leaves
        )
        batch = f" batch {[list(b) for b in layout]}" if layout else ""
        parts.append(f"{n}: {head}{batch} ({values})")
    return "; ".join(parts)


def short(signature: str) -> str:
    """``signature`` cut to ``_MAX_SIGNATURE`` characters (``...`` where cut)."""
    if len(signature) <= _MAX_SIGNATURE:
        return signature
    return signature[: _MAX_SIGNATURE - 3] + "..."


class CompileLog:
    """One compile's log lines (see the module doc). ``describe()`` gives the
    signature in words (called once, on entry, when INFO is on for the logger)."""

    def __init__(self, name: str, describe: Callable[[], str]) -> None:
        self.name, self.describe = name, describe
        self.signature = ""
        self.from_disk = False
        self._started = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._t0 = 0.0

    def __enter__(self) -> CompileLog:
        self._t0 = _clock()
        if LOG.isEnabledFor(logging.INFO):
            self.signature = short(self.describe())
            self._timer = threading.Timer(SLOW_S, self._start)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        LOG.info("%s: compiling signature %s...", self.name, self.signature)

    def checkpoint(self) -> None:
        """Write the start line now if the compile has taken ``SLOW_S`` already."""
        if self.signature and _clock() - self._t0 >= SLOW_S:
            self._start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        seconds = _clock() - self._t0
        if seconds < SLOW_S or not self.signature:
            return
        self._start()
        if kind is not None:
            LOG.info("%s: the compile failed after %.1f s (%s)", self.name, seconds, kind.__name__)
            return
        how = "loaded from inductor's cache on disk" if self.from_disk else "built, not from disk"
        LOG.info(
            "%s: compiled signature %s in %.1f s (%s)", self.name, self.signature, seconds, how
        )
