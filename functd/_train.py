"""Training helpers: ``train_step`` (one pure step) and ``fit`` (the epoch loop).

``train_step(loss_fn, optimizer)`` returns the pure function
``step(params, opt_state, batch, key) -> (params, opt_state, metrics)``: the
gradient of ``loss_fn``, the optimizer update and ``apply_updates``, nothing
modified. Compile it, vmap it over an ensemble, or hand it to ``fit``.

Example:
    >>> def loss_fn(params, batch, key):
    ...     return ((model(params, x=batch["x"]) - batch["y"]) ** 2).mean()
    >>> step = fd.train_step(loss_fn, fd.optim.adam(1e-3))
    >>> params, opt_state, metrics = step(params, opt.init(params), batch, None)
    >>> params, opt_state, history = fd.fit(step, params, opt_state, batches, key, epochs=5)
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from . import random as fr
from ._checkpoint import Checkpoints, run_fingerprint
from ._frozen import Frozen
from ._td import TensorDict, from_parts
from ._td._shape import cat, stack
from ._transforms._autodiff import loss_and_grad
from .distributed._dcp import ShardedStore, holds_dtensors
from .distributed._faults import CollectiveError
from .distributed._fit import DataParallel, sized
from .optim._base import GradientTransformation, apply_updates
from .optim._errors import not_a_td

__all__ = ["TrainStep", "fit", "train_step"]

_SCALAR = torch.Size([])
Step = Callable[[TensorDict, TensorDict, Any, Any], tuple[TensorDict, TensorDict, TensorDict]]


def _metrics(where: str, loss: Tensor, aux: Any) -> TensorDict:
    if type(aux) is dict and not aux:  # a loss_fn without aux (the common case)
        return from_parts({"loss": loss.detach()}, _SCALAR)
    entries: dict[str, Any] = {"loss": loss.detach()}
    if isinstance(aux, TensorDict | Mapping):
        items = aux.items() if isinstance(aux, Mapping) else aux._data.items()
        for k, v in items:
            entries[k] = v.detach() if isinstance(v, Tensor) else v
    elif isinstance(aux, Tensor):
        entries["aux"] = aux.detach()
    else:
        raise TypeError(
            f"{where}: the aux of loss_fn must be a tensor, a dict of tensors or a TensorDict "
            f"(it becomes the metrics); got a {type(aux).__name__}."
        )
    return TensorDict(entries, [])


class TrainStep(Frozen):
    """One pure training step, ``(params, opt_state, batch, key) -> (params, opt_state,
    metrics)``: a frozen value made by :func:`train_step`.

    Its fields are read-only: ``loss_fn`` and ``optimizer`` (``fd.fit(data_parallel=True)``
    reads the latter to check that the gradients are reduced over the ranks). Two steps
    built from the same loss and optimizer are equal and hash alike.

    Example:
        >>> opt = fd.optim.adam(1e-3)
        >>> step = fd.train_step(loss_fn, opt)
        >>> step.optimizer is opt
        True
        >>> params, opt_state, metrics = step(params, opt_state, batch, None)
    """

    __slots__ = ("__name__", "__qualname__", "_where", "loss_fn", "optimizer")
    loss_fn: Callable[..., Any]
    optimizer: GradientTransformation
    _where: str

    def __init__(self, loss_fn: Callable[..., Any], optimizer: GradientTransformation) -> None:
        name = getattr(loss_fn, "__name__", "loss_fn")
        where = f"fd.train_step({name}, ...)"
        for field, value in (
            ("loss_fn", loss_fn),
            ("optimizer", optimizer),
            ("_where", where),
            ("__name__", f"train_step_{name}"),
            ("__qualname__", f"train_step_{name}"),
        ):
            object.__setattr__(self, field, value)

    def _frozen_message(self, name: str) -> str:
        return (
            f"{self._where} is a frozen value: build another step with "
            f"fd.train_step(loss_fn, optimizer) instead of setting {name!r}."
        )

    def _identity(self) -> tuple[Any, ...]:
        return (self.loss_fn, self.optimizer)

    def __repr__(self) -> str:
        return f"TrainStep({self.loss_fn!r}, {self.optimizer!r})"

    def __call__(
        self, params: TensorDict, opt_state: TensorDict, batch: Any, key: Any = None
    ) -> tuple[TensorDict, TensorDict, TensorDict]:
        if not isinstance(params, TensorDict):
            raise TypeError(not_a_td(self._where, "params", params))
        loss, aux, grads = loss_and_grad(self._where, self.loss_fn, params, batch, key)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return apply_updates(params, updates), opt_state, _metrics(self._where, loss, aux)


def train_step(loss_fn: Callable[..., Any], optimizer: GradientTransformation) -> TrainStep:
    """Build the pure training step ``step(params, opt_state, batch, key)``.

    Args:
        loss_fn: ``loss_fn(params, batch, key)`` returning the scalar loss, or
            ``(loss, aux)`` with ``aux`` a tensor, dict of tensors or TensorDict.
            ``key`` is passed through as given (``None`` for a deterministic loss).
        optimizer: a GradientTransformation such as ``fd.optim.adam(1e-3)``.

    Returns:
        A frozen :class:`TrainStep`, called as
        ``step(params, opt_state, batch, key) -> (params, opt_state, metrics)``,
        ``metrics`` a TensorDict holding ``loss`` (before the update) and the
        entries of ``aux`` (detached). Pure: nothing given is modified.

    Raises:
        TypeError: ``optimizer`` is not a GradientTransformation; at call time,
            ``loss_fn`` returns something else than a scalar loss (and aux).

    Example:
        >>> step = torch.compile(fd.train_step(loss_fn, fd.optim.adam(1e-3)), fullgraph=True)
        >>> params, opt_state, metrics = step(params, opt_state, batch, key)
    """
    if not isinstance(optimizer, GradientTransformation):
        raise TypeError(
            f"fd.train_step(loss_fn, optimizer): optimizer must be a GradientTransformation "
            f"such as fd.optim.adam(1e-3), got a {type(optimizer).__name__}."
        )
    if not callable(loss_fn):
        raise TypeError(f"fd.train_step: loss_fn must be callable, got {type(loss_fn).__name__}.")
    return TrainStep(loss_fn, optimizer)


# ------------------------------------------------------------------ fit
def _progress_bar(total: int | None, desc: str):
    if importlib.util.find_spec("tqdm") is None:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=True)


def fit(
    step: Step,
    params: TensorDict,
    opt_state: TensorDict,
    batches: Iterable[Any] | Callable[[int], Iterable[Any]],
    key: Tensor | None = None,
    *,
    epochs: int = 1,
    progress: bool = True,
    print_every: int = 1,
    data_parallel: bool = False,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    keep: int = 2,
    timeout: float | datetime.timedelta | None = None,
) -> tuple[TensorDict, TensorDict, TensorDict]:
    """Run ``step`` over ``batches`` for ``epochs`` epochs; return the history too.

    Args:
        step: ``step(params, opt_state, batch, key)``, e.g. :func:`train_step`'s (compiled
            or vmapped is fine).
        params: the starting params (not modified).
        opt_state: the starting optimizer state (not modified).
        batches: a re-iterable of batches (a list, a DataLoader), or a function
            ``epoch -> iterable`` (e.g. to reshuffle with ``fd.random``).
        key: a PRNG key or None (passed as is); step ``i`` (over all epochs) gets ``fold_in(key, i)``.
        epochs: number of passes over ``batches``.
        progress: show a progress bar (tqdm when installed) or, without tqdm,
            print one line per ``print_every`` epochs with the mean metrics.
        data_parallel: train on the ranks of the default process group (``torchrun``):
            they agree first (checkpoint folder, resume point, param and state layouts;
            a mismatch names the key path on every rank), start from rank 0's params and
            state, step on their rows of every batch (``fd.distributed.shard_batch``)
            with key ``fold_in(fold_in(key, i), rank)``, let the optimizer reduce the
            grads (``fd.distributed.mean_updates()`` first in the chain, checked for
            ``fd.train_step`` steps), agree on the number of batches and the first one's
            layout before each epoch and average the metrics after it; rank 0 prints.
            Off by default, also under torchrun (see notes/distributed.md).
        checkpoint: a path (its folder must exist and be writable: checked first); after
            every epoch the run's state (params, opt_state, epochs done, step counter,
            history, the run's fingerprint) is written there with ``fd.save`` (rank 0
            only when data-parallel), older ones rotating to ``path.1``, ...;
            ``fd.load(path)["params"]`` reads it. DTensors in the trees
            (``fd.distributed.shard``): each checkpoint is a folder every rank writes
            with ``fd.distributed.save``, resumable with another sharding or number of
            ranks (``fd.distributed.load(path)["params"]`` reads it).
        resume: continue from the newest checkpoint that loads (``path``, else
            ``path.1``...), bitwise the uninterrupted run; none yet: a fresh start. A
            checkpoint of another run (layouts, ``epochs`` or ``key``) is refused.
        keep: how many checkpoints to keep (``path``, ``path.1`` ... ``path.{keep-1}``);
            a crash during a write leaves the previous ones intact.
        timeout: data-parallel only: seconds (or a timedelta) any collective may wait,
            set on the process group for the run (restored after); a timeout raises
            ``fd.distributed.CollectiveError`` naming the collective, the step and the
            ranks at fault. ``None`` (default): the group's own (``init_process_group``'s).

    Returns:
        ``(params, opt_state, history)``, ``history`` every step's metrics (``[steps]``).

    Raises:
        ValueError: ``epochs < 1``; an iterator (one pass only) with ``epochs > 1``; no
            batches; a missing or read-only checkpoint folder; ``resume`` onto another
            run; data-parallel: a batch size the world size does not divide, an
            optimizer without ``mean_updates``/``sum_updates``, ranks with different
            numbers of batches, batch layouts or param layouts (on every rank).
        RuntimeError: ``data_parallel=True`` without a process group;
            ``fd.distributed.CollectiveError`` when a collective fails or times out.

    Example:
        >>> params, opt_state, hist = fd.fit(step, params, opt_state, batches, key, epochs=10,
        ...                                  checkpoint="ckpt.pt", resume=True)
        >>> hist["loss"][-1]
    """
    where = "fd.fit(data_parallel=True)" if data_parallel else "fd.fit"
    _check_args(epochs, batches, checkpoint, resume)
    dp = DataParallel(where, step, timeout) if data_parallel else None
    ckpts, run = _checkpoints(where, params, opt_state, epochs, key, checkpoint, keep)
    problem, state = _restore(ckpts, run, resume, params, data_parallel)
    loop = _Loop(step, key, epochs, batches, dp, ckpts, run, state)
    return loop.train(params, opt_state, problem, state, progress, print_every)


def _checkpoints(where: str, params, opt_state, epochs: int, key, checkpoint, keep: int):
    """``(checkpoints, run)``: the rotating checkpoints of a fit call (written through
    torch.distributed.checkpoint when the trees hold DTensors) and the run's
    fingerprint; ``(None, None)`` without ``checkpoint``."""
    if checkpoint is None:
        return None, None
    sharded = {"params": params, "opt_state": opt_state}
    store = ShardedStore(sharded) if checkpoint and holds_dtensors(sharded) else None  # DCP
    return Checkpoints(where, checkpoint, keep, store), run_fingerprint(
        params, opt_state, epochs, key
    )


def _check_args(epochs: Any, batches: Any, checkpoint: Any, resume: Any) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"fd.fit(epochs={epochs!r}): epochs must be an int >= 1.")
    if not callable(batches) and iter(batches) is batches and epochs > 1:
        raise ValueError(
            "fd.fit: batches is an iterator, which is exhausted after one epoch; pass a list "
            "or another re-iterable (a DataLoader), or a function epoch -> iterable."
        )
    if not isinstance(resume, bool):
        raise TypeError(f"fd.fit(resume={resume!r}): resume must be True or False.")
    if resume and checkpoint is None:
        raise ValueError(
            "fd.fit(resume=True): resume needs the checkpoint path to resume from: "
            "fd.fit(..., checkpoint='ckpt.pt', resume=True)."
        )


def _restore(ckpts, run, resume: bool, params: Any, data_parallel: bool):
    """``(problem, state)``: why this rank cannot checkpoint (None: it can) and the
    checkpoint to resume from (None: a fresh start). In one process a problem
    raises at once; data-parallel ranks report theirs in the start-up agreement,
    so that every rank raises."""
    if ckpts is None:
        return None, None
    try:
        problem = ckpts.problem()
        if problem is not None:
            raise ValueError(f"fd.fit(checkpoint={ckpts.path!r}): {problem}.")
        if not resume:
            return None, None
        device = params.device if isinstance(params, TensorDict) else None
        return None, ckpts.latest(run, map_location=device)
    except ValueError as e:
        if not data_parallel:
            raise
        return str(e), None


class _Loop:
    """The epochs of one ``fit`` call, from where a checkpoint left off."""

    def __init__(self, step, key, epochs, batches, dp, ckpts, run, state) -> None:
        self.step, self.key, self.epochs, self.batches = step, key, epochs, batches
        self.dp, self.ckpts, self.run_id = dp, ckpts, run
        self.first = 0 if state is None else int(state["epoch"])
        self.i = 0 if state is None else int(state["step"])
        self.chunks = [] if state is None or state["history"] is None else [state["history"]]
        self.progress, self.print_every = True, 1

    def history(self) -> TensorDict:
        if len(self.chunks) > 1:
            self.chunks = [cat(self.chunks)]
        return self.chunks[0]

    def train(self, params, opt_state, problem, state, progress: bool, print_every: int):
        """``fit``'s result: start from ``state`` (a checkpoint, or None) and run the
        remaining epochs; data-parallel ranks first agree (``problem``: this rank's
        reason not to checkpoint)."""
        if state is not None:
            params, opt_state = state["params"], state["opt_state"]
        dp = self.dp
        with dp if dp is not None else contextlib.nullcontext():
            if dp is not None:
                at = None if state is None else (int(state["epoch"]), int(state["step"]))
                params, opt_state = dp.start(params, opt_state, problem, at)
            self.progress = progress and (dp is None or dp.main)
            self.print_every = print_every
            params, opt_state = self.run(params, opt_state)
        if not self.chunks:
            raise ValueError("fd.fit: batches gave no batch; nothing was trained.")
        return params, opt_state, self.history()

    def run(self, params, opt_state):
        if self.first and self.progress:
            print(
                f"fd.fit: resumed from {self.ckpts.loaded} after epoch {self.first}/{self.epochs} "
                f"(step {self.i})",
                file=sys.stdout,
                flush=True,
            )
        for epoch in range(self.first, self.epochs):
            params, opt_state = self.epoch(epoch, params, opt_state)
        return params, opt_state

    def epoch(self, epoch: int, params, opt_state):
        dp = self.dp
        source = self.batches(epoch) if callable(self.batches) else self.batches
        total = sized(source)
        if dp is not None:
            source = dp.batches(source, epoch)
        bar = _progress_bar(total, f"epoch {epoch + 1}/{self.epochs}") if self.progress else None
        start, metrics = time.perf_counter(), []
        for batch in source:
            k = None if self.key is None else fr.fold_in(self.key, self.i)
            if dp is not None:
                dp.i = self.i
                batch, k = dp.batch(batch), dp.key(k)
            params, opt_state, m = _one_step(self.step, dp, params, opt_state, batch, k)
            metrics.append(m)
            self.i += 1
            if bar is not None:
                bar.update(1)
                if self.i % 10 == 0:
                    bar.set_postfix(loss=f"{float(m['loss'].mean()):.4g}")
        if metrics:
            hist = stack(metrics)
            self.chunks.append(hist if dp is None else dp.reduce(hist))
        if self.ckpts is not None:
            self.save(epoch, params, opt_state)
        if bar is not None:
            bar.close()
        elif self.progress and ((epoch + 1) % self.print_every == 0 or epoch + 1 == self.epochs):
            _print_epoch(epoch, self.epochs, metrics, time.perf_counter() - start)
        return params, opt_state

    def save(self, epoch: int, params, opt_state) -> None:
        dp = self.dp
        if dp is None or dp.main or self.ckpts.store.collective:  # DCP: every rank writes
            state = {
                "params": params,
                "opt_state": opt_state,
                "epoch": torch.tensor(epoch + 1),
                "step": torch.tensor(self.i),
                "history": self.history() if self.chunks else None,
                "run": self.run_id,
            }
            self.ckpts.write(state)
        if dp is not None:
            dp.barrier()  # the file exists for every rank when fit goes on


def _one_step(step, dp, params, opt_state, batch, k):
    if dp is None:
        return step(params, opt_state, batch, k)
    try:
        return step(params, opt_state, batch, k)
    except CollectiveError as e:
        what = f"the {e.collective} of {e.where} (inside the step)"
        raise dp.failure(what, e) from (e.__cause__ or e)


def _print_epoch(epoch: int, epochs: int, metrics: list[TensorDict], seconds: float) -> None:
    if not metrics:
        return
    hist = stack(metrics)
    means = ", ".join(
        f"{k} {float(v.float().mean()):.4g}"
        for k, v in hist.items(include_nested=True, leaves_only=True)
    )
    width = len(str(epochs))
    print(
        f"epoch {epoch + 1:>{width}}/{epochs}: {means} ({len(metrics)} step{'s' * (len(metrics) != 1)}, {seconds:.2f}s)",
        file=sys.stdout,
        flush=True,
    )
