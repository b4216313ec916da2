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

import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from . import random as fr
from ._td import TensorDict, _new
from ._td._shape import stack
from ._transforms._autodiff import loss_and_grad
from .optim._base import GradientTransformation, apply_updates
from .optim._errors import not_a_td

__all__ = ["fit", "train_step"]

_SCALAR = torch.Size([])
Step = Callable[[TensorDict, TensorDict, Any, Any], tuple[TensorDict, TensorDict, TensorDict]]


def _metrics(where: str, loss: Tensor, aux: Any) -> TensorDict:
    if type(aux) is dict and not aux:  # a loss_fn without aux (the common case)
        return _new({"loss": loss.detach()}, _SCALAR)
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


def train_step(loss_fn: Callable[..., Any], optimizer: GradientTransformation) -> Step:
    """Build the pure training step ``step(params, opt_state, batch, key)``.

    Args:
        loss_fn: ``loss_fn(params, batch, key)`` returning the scalar loss, or
            ``(loss, aux)`` with ``aux`` a tensor, dict of tensors or TensorDict.
            ``key`` is passed through as given (``None`` for a deterministic loss).
        optimizer: a GradientTransformation such as ``fd.optim.adam(1e-3)``.

    Returns:
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
    where = f"fd.train_step({getattr(loss_fn, '__name__', 'loss_fn')}, ...)"

    def step(params: TensorDict, opt_state: TensorDict, batch: Any, key: Any = None):
        if not isinstance(params, TensorDict):
            raise TypeError(not_a_td(where, "params", params))
        loss, aux, grads = loss_and_grad(where, loss_fn, params, batch, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return apply_updates(params, updates), opt_state, _metrics(where, loss, aux)

    step.__doc__ = f"One training step of {where}: (params, opt_state, batch, key) -> (params, opt_state, metrics)."
    step.optimizer = optimizer  # read by fit(data_parallel=True) to check the grads are reduced
    return step


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
    checkpoint: str | os.PathLike | None = None,
) -> tuple[TensorDict, TensorDict, TensorDict]:
    """Run ``step`` over ``batches`` for ``epochs`` epochs; return the history too.

    Args:
        step: ``step(params, opt_state, batch, key)``, e.g. from :func:`train_step`
            (compiled or vmapped is fine).
        params, opt_state: the starting values (not modified).
        batches: a re-iterable of batches (a list, a DataLoader), or a function
            ``epoch -> iterable`` (e.g. to reshuffle with ``fd.random``).
        key: a PRNG key; step ``i`` (counted over all epochs) gets
            ``fd.random.fold_in(key, i)``. ``None`` passes ``None``.
        epochs: number of passes over ``batches``.
        progress: show a progress bar (tqdm when installed) or, without tqdm,
            print one line per ``print_every`` epochs with the mean metrics.
        data_parallel: train on the ranks of the default torch.distributed
            process group (launched by ``torchrun``): the params and state are
            broadcast from rank 0, each rank steps on its rows of every batch
            (``fd.distributed.shard_batch``: the first dim split into equal
            parts), its key is ``fold_in(fold_in(key, i), rank)``, the step's
            optimizer reduces the grads (``fd.distributed.pmean()`` first in
            the chain: checked for ``fd.train_step`` steps), the metrics are
            averaged over the ranks at the end of each epoch and only rank 0
            prints. Off by default, also under torchrun (ranks may train
            different ensemble members, see notes/distributed.md).
        checkpoint: a path; after every epoch ``{"params", "opt_state",
            "epoch"}`` is written there with ``fd.save`` (by rank 0 only when
            data-parallel); ``fd.load(path, map_location=...)`` reads it anywhere.

    Returns:
        ``(params, opt_state, history)``: ``history`` is a TensorDict of batch
        size ``[steps]`` stacking every step's metrics (``history["loss"]``).

    Raises:
        ValueError: ``epochs < 1``; an iterator (exhausted after one pass) with
            ``epochs > 1``; no batches at all; data-parallel: a batch size the
            world size does not divide, an optimizer without ``pmean``/``psum``.
        RuntimeError: ``data_parallel=True`` without a process group.

    Example:
        >>> params, opt_state, hist = fd.fit(step, params, opt_state, batches, epochs=10)
        >>> hist["loss"][-1]
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"fd.fit(epochs={epochs!r}): epochs must be an int >= 1.")
    if not callable(batches) and iter(batches) is batches and epochs > 1:
        raise ValueError(
            "fd.fit: batches is an iterator, which is exhausted after one epoch; pass a list "
            "or another re-iterable (a DataLoader), or a function epoch -> iterable."
        )
    dp = None
    if data_parallel:
        from .distributed._fit import DataParallel

        dp = DataParallel("fd.fit(data_parallel=True)", step)
        params, opt_state = dp.start(params, opt_state)
        progress = progress and dp.main
    history: list[TensorDict] = []
    i = 0
    for epoch in range(epochs):
        source = batches(epoch) if callable(batches) else batches
        total = len(source) if hasattr(source, "__len__") else None
        bar = _progress_bar(total, f"epoch {epoch + 1}/{epochs}") if progress else None
        start, n0 = time.perf_counter(), len(history)
        for batch in source:
            k = None if key is None else fr.fold_in(key, i)
            if dp is not None:
                batch, k = dp.batch(batch), dp.key(k)
            params, opt_state, metrics = step(params, opt_state, batch, k)
            history.append(metrics)
            i += 1
            if bar is not None:
                bar.update(1)
                if i % 10 == 0:
                    bar.set_postfix(loss=f"{float(metrics['loss'].mean()):.4g}")
        if dp is not None:
            history[n0:] = dp.reduce(history[n0:])
        if checkpoint is not None:
            _checkpoint(checkpoint, params, opt_state, epoch, dp)
        if bar is not None:
            bar.close()
        elif progress and ((epoch + 1) % print_every == 0 or epoch + 1 == epochs):
            _print_epoch(epoch, epochs, history[n0:], time.perf_counter() - start)
    if not history:
        raise ValueError("fd.fit: batches gave no batch; nothing was trained.")
    return params, opt_state, stack(history)


def _checkpoint(path, params, opt_state, epoch: int, dp) -> None:
    if dp is None or dp.main:
        from ._td._io import save

        save({"params": params, "opt_state": opt_state, "epoch": torch.tensor(epoch + 1)}, path)
    if dp is not None:
        dp.barrier()  # the file exists for every rank when fit goes on


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
