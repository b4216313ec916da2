"""What ``fd.fit(..., data_parallel=True)`` does on each rank, and ``shard_batch``.

- At the start the params and the optimizer state are broadcast from rank 0
  (as DDP does when it wraps a module), so every rank starts from the same
  values even when the ranks initialised them differently.
- Each rank trains on its shard of every batch: rows ``[r * B / W, (r + 1) * B / W)``
  along the first dim of every tensor leaf (:func:`shard_batch`), so the union
  over the ranks is the batch of the single-process run. ``B`` must be
  divisible by ``W``: there is no remainder rule (an uneven split would weight
  the ranks' gradients unequally), the error says so.
- Step ``i`` gets the key ``fold_in(fold_in(key, i), rank)``: independent
  randomness on each shard, the same on every run.
- The gradients are reduced by the optimizer (``fd.distributed.mean_updates()``
  first in the chain); ``fit`` checks that a step built by ``fd.train_step``
  has it.
- The metrics of each epoch are averaged over the ranks in one all-reduce at
  the end of the epoch; only rank 0 prints and shows a progress bar, and every
  rank returns the same history.
- A checkpoint is written by rank 0 only, then all ranks wait for it.
- The ranks agree before they act, so a fault is an error on every rank rather
  than a hang: at the start (checkpoint folder, resume point, the layouts of
  params and optimizer state, named by key path) and before each epoch (the
  number of batches and the layout of the first one; without ``len()``, one
  store round trip a step and an agreement at the end of the epoch).
- ``timeout=``, when given, is set on the process group for the run (else the
  group's own applies); a collective that fails or times out raises
  :class:`~functd.distributed.CollectiveError` naming the collective, the step
  and the rank at fault (from the notes the failing ranks leave in the store,
  see ``_faults``): a rank that raised, else the ranks that did not answer.

Example:
    >>> local = fd.distributed.shard_batch(batch)   # this rank's rows
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .._td._tree import tree as fdtree
from ..optim._base import Chain
from ._collectives import _is_dtensor, all_reduce, broadcast
from ._fast import rider
from ._faults import GRACE_S, Board, CollectiveError, failed
from ._group import (
    _fingerprint,
    describe,
    gather_ints,
    gather_objects,
    get_timeout,
    mismatch_detail,
    resolve,
    set_timeout,
)

__all__ = ["DataParallel", "shard_batch"]


def shard_batch(batch: Any, group: Any = None, *, where: str = "fd.distributed.shard_batch") -> Any:
    """This rank's rows of ``batch``: ``[r * B / W, (r + 1) * B / W)`` along dim 0.

    ``batch`` is a TensorDict or any pytree; every tensor leaf is sliced (views,
    nothing copied or written), other leaves (and DTensors, which carry their
    own sharding) are kept. The union over the ranks,
    in rank order, is ``batch``.

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: the tensor leaves disagree on their first dim, or it is not
            divisible by the world size.

    Example:
        >>> local = fd.distributed.shard_batch(fd.TensorDict({"x": x}, [8]))  # 4 rows on 2 ranks
    """
    _, world, rank = resolve(where, group)
    leaves = fdtree.leaves(batch)
    sizes = {x.shape[0] for x in leaves if _cuttable(x)}
    if len(sizes) > 1:
        raise ValueError(
            f"{where}: the tensors of the batch have different first dims {sorted(sizes)}; "
            "data parallelism splits every tensor along dim 0 (the batch dim), so they must "
            "agree."
        )
    if not sizes:
        if any(_is_dtensor(x) for x in leaves):  # a batch of DTensors: already placed
            return batch
        raise ValueError(f"{where}: the batch holds no tensor with a batch dim to split.")
    (n,) = sizes
    if n % world:
        raise ValueError(
            f"{where}: the batch has {n} rows, which the world size {world} does not divide; "
            f"each rank takes n / world rows. Use a batch size that is a multiple of {world} "
            "(e.g. drop the last, smaller batch: DataLoader(..., drop_last=True))."
        )
    lo, hi = rank * n // world, (rank + 1) * n // world

    def cut(x):
        return x[lo:hi] if _cuttable(x) else x

    return fdtree.map(cut, batch)


def _cuttable(x: Any) -> bool:
    return isinstance(x, Tensor) and x.ndim > 0 and not _is_dtensor(x)


def _reduces(tx: Any) -> bool:
    kw = getattr(tx.update, "kwargs", {})
    if kw.get("name") in ("mean_updates", "sum_updates"):
        return True
    if isinstance(tx, Chain):
        return any(_reduces(t) for t in tx.txs)
    return False


_END = object()  # the end of a rank's batches
_calls = 0  # data-parallel fit calls in this process: each gets its own notes in the store


def _seconds(where: str, timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(
            f"{where}: timeout must be a positive number of seconds (or a timedelta, or None "
            f"to keep the process group's own), got {timeout!r}."
        )
    return float(timeout)


def sized(source: Any) -> int | None:
    """``len(source)``, or None when it has none (a generator; a DataLoader over
    an IterableDataset raises TypeError)."""
    try:
        return len(source)
    except TypeError:
        return None


def _layout_print(tree: Any) -> int:
    leaves, spec = fdtree.flatten(tree)
    return _fingerprint(spec, leaves)


class DataParallel:
    """The per-rank state of one data-parallel ``fit``; a context manager that
    sets the process group's timeout for the run and restores it after."""

    def __init__(self, where: str, step: Any, timeout: Any = None) -> None:
        global _calls
        self.where = where
        self.group, self.world, self.rank = resolve(where, None)
        opt = getattr(step, "optimizer", None)
        if opt is not None and not _reduces(opt):
            raise ValueError(
                f"{where}: data_parallel=True, but the step's optimizer {opt!r} does not "
                "reduce the gradients over the ranks, so each rank would follow its own "
                "shard. Put fd.distributed.mean_updates() first in the chain: "
                "fd.train_step(loss_fn, fd.optim.chain(fd.distributed.mean_updates(), opt))."
            )
        self.timeout = _seconds(where, timeout)
        self.limit = self.timeout  # the timeout in force (seconds; None: unknown)
        self._old_timeout = None
        _calls += 1
        self.board = Board(f"functd/fit/{_calls}", self.world, self.rank)
        self.i = self.epoch = 0  # where the run is, for the messages

    @property
    def main(self) -> bool:
        return self.rank == 0

    def __enter__(self) -> DataParallel:
        if self.world > 1:
            self._old_timeout = get_timeout(self.group)  # type: ignore[assignment]
            if self.timeout is not None:
                set_timeout(self.group, datetime.timedelta(seconds=self.timeout))
            elif self._old_timeout is not None:
                self.limit = self._old_timeout.total_seconds()
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if exc is not None and not isinstance(exc, CollectiveError) and self.world > 1:
            # the others' diagnosis reads it when they wait for this rank in vain
            self.board.post("down", f"{self.i}|0|raised {kind.__name__}: {str(exc)[:300]}")
        if self._old_timeout is not None and self.timeout is not None:
            set_timeout(self.group, self._old_timeout)

    # ------------------------------------------------------------------ start
    def start(
        self, params: Any, opt_state: Any, problem: str | None, resumed: tuple[Any, ...] | None
    ):
        """One agreement (checkpoint folder, resume point, layout of the params and
        state), then rank 0's params and state on every rank (DTensor leaves are
        already placed on their mesh and are kept)."""
        parts = {"params": params, "opt_state": opt_state}
        prints = [_layout_print({k: v}) for k, v in parts.items()]
        at = (-1, -1) if resumed is None else resumed
        mine = [int(problem is not None), *at, *prints]
        rows = self._gather("the start-up agreement of the ranks", mine)
        if any(r[0] for r in rows):
            problems = self._guarded(
                "the start-up agreement",
                gather_objects,
                self.where,
                self.group,
                self.world,
                problem,
            )
            raise ValueError(f"{self.where} could not start: {_by_rank(problems)}")
        if any(r[1:3] != rows[0][1:3] for r in rows):
            raise ValueError(
                f"{self.where}: the ranks resume from different points: "
                + ", ".join(f"rank {r}: {_resume_point(row)}" for r, row in enumerate(rows))
                + ". Every rank reads the checkpoint: its folder must be shared (the same "
                "files on every rank)."
            )
        for j, (name, part) in enumerate(parts.items(), 3):
            if any(r[j] != rows[0][j] for r in rows):
                self._different_start({name: part}, [r[j] for r in rows])
        leaves, spec = fdtree.flatten(parts)  # type: ignore[arg-type, var-annotated]
        plain = [i for i, x in enumerate(leaves) if not _is_dtensor(x)]
        paths = [".".join(map(str, p)) for p in fdtree.paths(parts)]  # type: ignore[arg-type]
        sent = {paths[i]: leaves[i] for i in plain}  # keyed by path: errors name the key
        got = self._guarded(
            "the broadcast of the params from rank 0", broadcast, sent, 0, self.group
        )
        for i in plain:
            leaves[i] = got[paths[i]]
        out = fdtree.unflatten(spec, leaves)
        return out["params"], out["opt_state"]

    def _different_start(self, tree: dict[Any, Any], prints: list[int]) -> None:
        leaves = fdtree.leaves(tree)  # type: ignore[arg-type, var-annotated]
        detail = mismatch_detail(self.where, self.group, self.world, describe(tree, leaves), prints)
        raise ValueError(
            f"{self.where}: the ranks passed different params or optimizer states: "
            f"{detail}. Every rank must start from the same layout (keys, shapes and "
            "dtypes; fit then copies rank 0's values to every rank): build the model and "
            "the optimizer state the same way on every rank."
        )

    # ------------------------------------------------------------------ epochs
    def batches(self, source: Any, epoch: int) -> Iterator[Any]:
        """This rank's batches of ``epoch``, after the ranks agreed on their number
        and the layout of the first one; uneven numbers raise on every rank."""
        self.epoch = epoch
        n = sized(source)
        it = iter(source)
        first = next(it, _END)
        known = n if n is not None else (0 if first is _END else -1)
        fp = 0 if first is _END else _layout_print(first)
        rows = self._gather(f"the agreement on the batches before epoch {epoch}", [known, fp])
        counts = [r[0] for r in rows]
        if len({c for c in counts if c != -1}) > 1 or (0 in counts and -1 in counts):
            self._uneven(epoch, [str(c) if c >= 0 else "at least 1" for c in counts])
        if len({r[1] for r in rows if r[0]}) > 1:
            self._different_batches(epoch, first, [r[1] for r in rows])
        if -1 in counts:
            yield from self._watched(it, first, n, epoch)
        else:
            yield from self._counted(it, first, n, epoch)  # type: ignore[arg-type]

    def _counted(self, it: Iterator[Any], first: Any, n: int, epoch: int) -> Iterator[Any]:
        count, cur = 0, first
        while cur is not _END and count < n:
            yield cur
            count += 1
            cur = next(it, _END) if count < n else _END
        if count < n or next(it, _END) is not _END:
            raise ValueError(
                f"{self.where}: on rank {self.rank}, the batches of epoch {epoch} have len() "
                f"{n} but gave {'only ' + str(count) if count < n else 'more'}; fit agrees on "
                "the number of steps with len(), so it must be exact (or give no len())."
            )

    def _watched(self, it: Iterator[Any], first: Any, n: int | None, epoch: int) -> Iterator[Any]:
        """Some rank's batches have no len(). Each rank reads one batch ahead, so
        before each step it knows whether it has a next batch: that flag rides
        in the step's gradient all-reduce (``_fast.rider``), and after the step
        every rank knows whether every rank has a next batch. When a step did
        not carry it (no one-buffer mean_updates/sum_updates in it), the ranks ask the store
        instead, where each rank posts its total as soon as it knows it."""
        total = f"total/{epoch}"
        if n is not None:
            self._post_total(total, n)
        count, cur, seen, limit, known = 0, first, 0, None, False
        try:
            while cur is not _END:
                if count and not known:  # the last step carried no flag: ask the store
                    posted = self.board.add(total, 0) or 0
                    if posted != seen:
                        seen, notes = posted, self.board.read(total)
                        limit = min(int(v) for v in notes.values()) if notes else limit
                    if limit is not None and count >= limit:
                        break
                nxt = next(it, _END)
                if nxt is _END and n is None:
                    self._post_total(total, count + 1)  # before the last step's collective
                rider.arm(float(nxt is not _END))
                yield cur
                count, cur = count + 1, nxt
                having = rider.take()  # ranks with a next batch (None: not carried)
                known = having is not None
                if known and having < self.world:  # type: ignore[operator]
                    break  # a rank has no batch for the next step: stop together
        finally:
            rider.take()
        what = f"the agreement on the batch counts at the end of epoch {epoch}"
        rows = self._gather(what, [count, int(cur is _END)])
        if any(r != rows[0] for r in rows) or not rows[0][1]:
            self._uneven(epoch, [f"{c}" if done else f"more than {c}" for c, done in rows])

    def _post_total(self, name: str, total: int) -> None:
        self.board.post(name, str(total))
        self.board.add(name, 1)

    def _uneven(self, epoch: int, counts: list[str]) -> None:
        raise ValueError(
            f"{self.where}: the ranks have different numbers of batches in epoch {epoch}: "
            + ", ".join(f"rank {r} has {c}" for r, c in enumerate(counts))
            + ". Each step all-reduces the gradients, so every rank must take the same "
            "number of steps: give every rank the same number of batches (the same list on "
            "every rank, or a DistributedSampler with drop_last=True)."
        )

    def _different_batches(self, epoch: int, first: Any, prints: list[int]) -> None:
        leaves = [] if first is _END else fdtree.leaves(first)
        desc = [] if first is _END else describe(first, leaves)
        detail = mismatch_detail(self.where, self.group, self.world, desc, prints)
        raise ValueError(
            f"{self.where}: the ranks' batches differ at the first step of epoch {epoch}: "
            f"{detail}. Every rank must get the same batch (each takes its 1/{self.world} of "
            "the rows): the same batch size, keys and dtypes on every rank."
        )

    def batch(self, batch: Any) -> Any:
        return shard_batch(batch, self.group, where=self.where)

    def key(self, key: Tensor | None) -> Tensor | None:
        if key is None or self.world == 1:
            return key
        from .. import random as fr

        return fr.fold_in(key, self.rank)

    def reduce(self, hist: Any) -> Any:
        """The epoch's stacked metrics averaged over the ranks (floating leaves;
        others are rank 0's), one all-reduce for the whole epoch."""
        if self.world == 1:
            return hist
        leaves, spec = fdtree.flatten(hist)
        idx = [i for i, x in enumerate(leaves) if x.is_floating_point() or x.is_complex()]
        others = [i for i in range(len(leaves)) if i not in idx]
        what = f"the all_reduce of the metrics of epoch {self.epoch}"
        reduced = self._guarded(what, all_reduce, [leaves[i] for i in idx], "mean", self.group)
        if others:
            kept = self._guarded(what, broadcast, [leaves[i] for i in others], 0, self.group)
            for i, v in zip(others, kept):
                leaves[i] = v
        for i, v in zip(idx, reduced):
            leaves[i] = v
        return fdtree.unflatten(spec, leaves)

    def barrier(self) -> None:
        if self.world > 1:
            self._guarded(f"the barrier after the checkpoint of epoch {self.epoch}", self._barrier)

    def _barrier(self) -> None:
        kw: dict[str, Any] = {}
        if dist.get_backend(self.group) == "nccl":
            kw["device_ids"] = [torch.cuda.current_device()]
        started = time.monotonic()
        try:
            dist.barrier(self.group, **kw)
        except RuntimeError as e:
            raise failed(self.where, "barrier", e, started) from e

    # ------------------------------------------------------------------ failures
    def _gather(self, what: str, values: list[int]) -> list[list[int]]:
        return self._guarded(what, gather_ints, self.where, self.group, self.world, values)

    def _guarded(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except CollectiveError as e:
            raise self.failure(what, e) from (e.__cause__ or e)

    def failure(self, what: str, e: CollectiveError) -> CollectiveError:
        """The error of a failed collective, naming the step and the rank at fault, from
        the notes the failing ranks leave in the store: a rank that raised; else the
        ranks without a note, and those that failed fast *after* this rank timed out
        (they came late). Each note carries its failure's place in a store counter,
        so a rank's failure caused by another's (a closed connection) is not blamed.
        A rank that timed out waits up to GRACE_S for the notes; one that failed fast
        (a peer's connection closed) waits until the ranks still in the collective
        have timed out too (at most the timeout + GRACE_S after it entered)."""
        seconds = e.seconds or 0.0
        mine = self.board.add("order", 1)  # this failure's place (None: unknown)
        self.board.post(
            "down", f"{self.i}|{seconds:.2f}{'' if mine is None else f'#{mine}'}|{what}"
        )
        patience = GRACE_S
        if self.limit is not None and not self._timed_out(seconds):
            patience = max(GRACE_S, self.limit - seconds + GRACE_S)
        notes = self.board.wait("down", patience, until=_a_rank_raised)
        kinds = {r: self._kind(n) for r, n in (notes or {}).items()}
        order = {r: _order(n) for r, n in (notes or {}).items()}
        quiet = [r for r in range(self.world) if r != self.rank and r not in kinds]

        def before_me(r: int) -> bool | None:  # None: unknown (a note of an older version)
            return None if mine is None or order[r] is None else order[r] < mine  # type: ignore[operator]

        late, missing = False, None
        if notes is not None and any(k[0] == "raised" for k in kinds.values()):
            # a rank raised an error: it failed first, and every other failure follows
            # from it (ranks that gave up waiting, failed fast or still wait are victims)
            missing = []
        elif notes is not None and self._timed_out(seconds):
            # ranks that failed fast after this rank had given up came late; those that
            # failed fast before (a peer's connection closed) are victims
            came_late = [r for r, k in kinds.items() if k[0] == "late" and not before_me(r)]
            missing = sorted(quiet + came_late)
        elif notes is not None:
            # this rank came late if a rank had given up waiting before it failed
            late = any(k[0] == "gave up" and before_me(r) is not False for r, k in kinds.items())
            missing = [] if late else quiet
        head = f"{self.where}: on rank {self.rank}, {what} at step {self.i} (epoch {self.epoch}) "
        if self._timed_out(seconds):
            head += f"did not complete within the timeout of {self.limit:g} s"
        else:
            head += f"failed after {seconds:.1f} s"
        return CollectiveError(
            f"{head}: {_who(kinds if notes is not None else None, missing, late)}. Every rank "
            "stops with an error. If a step can take longer, raise fd.fit(..., timeout=...). "
            "The backend's error is the cause.",
            where=self.where,
            collective=e.collective,
            rank=self.rank,
            step=self.i,
            missing=missing,
        )

    def _timed_out(self, seconds: float) -> bool:
        return self.limit is not None and seconds >= 0.9 * self.limit

    def _kind(self, note: str) -> tuple[str, str, str]:
        """``(kind, step, what)`` of a rank's note: it "raised" an error, "gave up"
        waiting (timed out) or failed fast because it came "late"."""
        step, _, rest = note.partition("|")
        seconds, _, what = rest.partition("|")
        if what.startswith("raised "):
            return "raised", step, what
        try:
            gave_up = self._timed_out(float(seconds.partition("#")[0]))
        except ValueError:  # not a note of this version
            gave_up = False
        return ("gave up" if gave_up else "late"), step, what


def _a_rank_raised(notes: dict[int, str]) -> bool:
    return any(n.partition("|")[2].partition("|")[2].startswith("raised ") for n in notes.values())


def _order(note: str) -> int | None:
    """The failure's place in the store's counter (``seconds#order`` field), if any."""
    field = note.partition("|")[2].partition("|")[0]
    _, sep, order = field.partition("#")
    return int(order) if sep and order.isdigit() else None


def _who(kinds: dict[Any, Any] | None, missing: list[Any] | None, late: bool) -> str:
    if kinds is None:
        return (
            "which rank did not answer is unknown (the process group's store is "
            "unreachable: rank 0 may have exited)"
        )
    said = [
        f"rank {r} stopped at step {step}: it {what}"
        for r, (kind, step, what) in sorted(kinds.items())
        if kind == "raised"
    ]
    if late:
        gave_up = [
            f"rank {r} gave up waiting in {what} at step {step}"
            for r, (kind, step, what) in sorted(kinds.items())
            if kind == "gave up"
        ]
        return "; ".join([*gave_up, *said]) + (
            ": this rank came too late (was it stalled before this collective?)"
        )
    if missing:
        plural = "s" if len(missing) > 1 else ""
        said.insert(
            0,
            f"rank{plural} {', '.join(map(str, missing))} did not answer in time (stalled, "
            "e.g. in its data loading or a long step, or dead)",
        )
    return "; ".join(said) or "every rank reported the failure (a network fault?)"


def _by_rank(problems: list[Any]) -> str:
    groups: dict[str, list[int]] = {}
    for r, p in enumerate(problems):
        if p is not None:
            groups.setdefault(p, []).append(r)
    return "; ".join(
        f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {p}" for p, rs in groups.items()
    )


def _resume_point(row: list[int]) -> str:
    return "a fresh start" if row[1] < 0 else f"epoch {row[1]} (step {row[2]})"
