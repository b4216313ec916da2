"""When a collective fails: functd's error, and which rank did not answer.

A failing backend collective (gloo: ``Timed out waiting 20000ms for recv``,
``Connection closed by peer``) says nothing about *which* collective, step or
rank. Here:

- :class:`CollectiveError` is what functd's collectives raise when the backend
  fails (``raise CollectiveError(...) from e``: the backend's error stays the
  cause). ``fd.fit(data_parallel=True)`` raises it too, with the step, the
  epoch and the ranks that did not answer.
- :class:`Board` is a per-``fit`` notice board in the process group's
  rendezvous store (the TCPStore every rank already reaches). A rank whose
  collective fails writes ``down/<rank> = "<step>|<what>"`` and reads the
  others' notes; a rank that wrote nothing within a short grace period is the
  one that did not answer. The store's server runs on a thread of its own, so a
  rank stalled in Python still does not block it. Every store call is guarded:
  an unreachable store (rank 0's process is gone) makes the answer "unknown",
  never a second failure.

Example:
    >>> try:
    ...     fd.distributed.all_reduce(grads)
    ... except fd.distributed.CollectiveError as e:
    ...     print(e.collective, e.__cause__)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

__all__ = ["Board", "CollectiveError", "failed"]

GRACE_S = 2.0  # how long a failing rank waits for the others' notes


class CollectiveError(RuntimeError):
    """A collective of ``functd.distributed`` failed or timed out.

    The backend's own error (gloo, NCCL) is the ``__cause__``. Attributes:
    ``where`` (the functd call), ``collective`` (e.g. ``"all_reduce"``),
    ``rank`` (this rank), ``seconds`` (how long the collective ran before it
    failed), ``step`` (``fd.fit``'s global step, else ``None``) and ``missing``
    (the ranks that did not answer, when ``fit`` could tell; else ``None``).

    Example:
        >>> except fd.distributed.CollectiveError as e: print(e.missing)
    """

    def __init__(
        self,
        message: str,
        *,
        where: str,
        collective: str,
        rank: int | None = None,
        seconds: float | None = None,
        step: int | None = None,
        missing: list[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.where = where
        self.collective = collective
        self.rank = rank
        self.seconds = seconds
        self.step = step
        self.missing = missing


def _rank() -> int | None:
    try:
        return dist.get_rank()
    except (RuntimeError, ValueError):
        return None


def failed(where: str, collective: str, cause: BaseException, started: float) -> CollectiveError:
    """The error a functd collective raises when the backend's ``collective``,
    called at ``time.monotonic() == started``, fails."""
    rank = _rank()
    seconds = time.monotonic() - started
    return CollectiveError(
        f"{where}: the {collective} failed on rank {rank} after {seconds:.1f} s: "
        f"{type(cause).__name__}: {cause} "
        "A rank did not take part in time (it is stalled, slower than the process group's "
        "timeout, or dead) or called another collective. Under fd.fit(data_parallel=True) "
        "the error names the step and the rank; the backend's error is the cause.",
        where=where,
        collective=collective,
        rank=rank,
        seconds=seconds,
    )


class Board:
    """Notes of one ``fit`` call in the default group's store, under ``prefix``."""

    def __init__(self, prefix: str, world: int, rank: int) -> None:
        self.prefix, self.world, self.rank = prefix, world, rank
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            self.store: Any = _get_default_store()
        except (ImportError, RuntimeError, ValueError):  # no store: every answer is "unknown"
            self.store = None

    def _key(self, name: str, rank: int) -> str:
        return f"{self.prefix}/{name}/{rank}"

    def post(self, name: str, value: str) -> bool:
        """Write this rank's note ``name``; False when the store is unreachable."""
        if self.store is None:
            return False
        try:
            self.store.set(self._key(name, self.rank), value)
            return True
        except (RuntimeError, OSError):
            return False

    def read(self, name: str) -> dict[int, str] | None:
        """The other ranks' notes ``name`` written so far (None: store unreachable)."""
        if self.store is None:
            return None
        notes = {}
        try:
            for r in range(self.world):
                k = self._key(name, r)
                if r != self.rank and self.store.check([k]):  # check never blocks
                    notes[r] = self.store.get(k).decode()
        except (RuntimeError, OSError):
            return None
        return notes

    def wait(
        self, name: str, seconds: float, until: Callable[[dict[int, str]], bool] | None = None
    ) -> dict[int, str] | None:
        """The other ranks' notes ``name``, polled until every rank wrote one,
        ``until(notes)`` holds or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        while True:
            notes = self.read(name)
            if notes is None or len(notes) == self.world - 1 or time.monotonic() > deadline:
                return notes
            if until is not None and until(notes):
                return notes
            time.sleep(0.05)

    def add(self, name: str, amount: int) -> int | None:
        """Atomically add ``amount`` to the counter ``name`` (shared by the ranks)."""
        if self.store is None:
            return None
        try:
            return int(self.store.add(f"{self.prefix}/{name}", amount))
        except (RuntimeError, OSError):
            return None
