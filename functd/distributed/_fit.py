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
- The gradients are reduced by the optimizer (``fd.distributed.pmean()``
  first in the chain); ``fit`` checks that a step built by ``fd.train_step``
  has it.
- The metrics of each epoch are averaged over the ranks in one all-reduce at
  the end of the epoch; only rank 0 prints and shows a progress bar, and every
  rank returns the same history.
- A checkpoint is written by rank 0 only, then all ranks wait for it.

Example:
    >>> local = fd.distributed.shard_batch(batch)   # this rank's rows
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._td._tree import tree as fdtree
from ..optim._base import _Chain
from ._collectives import _is_dtensor, all_reduce, broadcast
from ._group import resolve

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
    if kw.get("name") in ("pmean", "psum"):
        return True
    if isinstance(tx, _Chain):
        return any(_reduces(t) for t in tx.txs)
    return False


class DataParallel:
    """The per-rank state of one data-parallel ``fit``."""

    def __init__(self, where: str, step: Any) -> None:
        self.where = where
        self.group, self.world, self.rank = resolve(where, None)
        opt = getattr(step, "optimizer", None)
        if opt is not None and not _reduces(opt):
            raise ValueError(
                f"{where}: data_parallel=True, but the step's optimizer {opt!r} does not "
                "reduce the gradients over the ranks, so each rank would follow its own "
                "shard. Put fd.distributed.pmean() first in the chain: "
                "fd.train_step(loss_fn, fd.optim.chain(fd.distributed.pmean(), opt))."
            )

    @property
    def main(self) -> bool:
        return self.rank == 0

    def start(self, params: Any, opt_state: Any) -> tuple[Any, Any]:
        """Rank 0's params and state on every rank (DTensor leaves are already
        placed on their mesh and are kept)."""
        leaves, spec = fdtree.flatten((params, opt_state))
        plain = [i for i, x in enumerate(leaves) if not _is_dtensor(x)]
        sent = broadcast([leaves[i] for i in plain], src=0, group=self.group)
        for i, x in zip(plain, sent):
            leaves[i] = x
        return fdtree.unflatten(spec, leaves)

    def batch(self, batch: Any) -> Any:
        return shard_batch(batch, self.group, where=self.where)

    def key(self, key: Tensor | None) -> Tensor | None:
        if key is None or self.world == 1:
            return key
        from .. import random as fr

        return fr.fold_in(key, self.rank)

    def reduce(self, metrics: list) -> list:
        """The epoch's metrics averaged over the ranks (floating leaves; others are
        rank 0's), one all-reduce for the whole epoch."""
        if not metrics or self.world == 1:
            return metrics
        from .._td._shape import stack, unbind

        hist = stack(metrics)
        leaves, spec = fdtree.flatten(hist)
        idx = [i for i, x in enumerate(leaves) if x.is_floating_point() or x.is_complex()]
        others = [i for i in range(len(leaves)) if i not in idx]
        reduced = all_reduce([leaves[i] for i in idx], "mean", self.group)
        if others:
            kept = broadcast([leaves[i] for i in others], 0, self.group)
            for i, v in zip(others, kept):
                leaves[i] = v
        for i, v in zip(idx, reduced):
            leaves[i] = v
        return list(unbind(fdtree.unflatten(spec, leaves), 0))

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            if dist.get_backend(self.group) == "nccl":
                dist.barrier(self.group, device_ids=[torch.cuda.current_device()])
            else:
                dist.barrier(self.group)
