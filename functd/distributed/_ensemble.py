"""Ensembles across ranks: the member dim of a vmapped ensemble split over ranks.

An ensemble of ``M`` members trained with ``fd.vmap`` on one process is split
over ``W`` ranks by members: rank ``r`` holds members
``member_slice(M, r, W) = slice(r*M//W, (r+1)*M//W)``, made from the same keys
(``fd.random.split(key, M)[member_slice(M)]``), so each member's init, keys and
training are those of the single-process run, with no communication but the
metrics. ``gather_members`` reassembles the full ensemble (rank order) for
evaluation.

Example:
    >>> sl = fd.distributed.member_slice(M)                  # this rank's members
    >>> keys = fd.random.split(fd.random.key(0), M)[sl]
    >>> params = fd.vmap(block.init)(keys)                    # M // W members here
    >>> ...train with fd.vmap as on one process...
    >>> full = fd.distributed.gather_members(params)          # all M members, everywhere
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as torch_pytree

__all__ = ["gather_members", "member_slice", "shard_members"]


def _rank_world(rank: int | None, world: int | None, group: Any, where: str) -> tuple[int, int]:
    if rank is not None and world is not None:
        return rank, world
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{where}: no process group is initialised and rank/world were not given. Launch "
            "with `torchrun --nproc-per-node N script.py` and call "
            "torch.distributed.init_process_group(), or pass rank= and world= explicitly."
        )
    r = dist.get_rank(group) if rank is None else rank
    w = dist.get_world_size(group) if world is None else world
    return r, w


def member_slice(
    members: int, rank: int | None = None, world: int | None = None, *, group: Any = None
) -> slice:
    """The members of an ensemble of ``members`` that ``rank`` of ``world`` holds.

    Contiguous blocks in rank order: ``slice(rank*m, (rank+1)*m)`` with
    ``m = members // world``. ``rank``/``world`` default to the process group's.

    Raises:
        ValueError: ``members`` is not divisible by ``world`` (every rank holds the
            same number of members, so the vmapped steps have one shape), or rank
            is out of range.

    Example:
        >>> fd.distributed.member_slice(8, rank=1, world=2)
        slice(4, 8, None)
    """
    r, w = _rank_world(rank, world, group, "fd.distributed.member_slice")
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"fd.distributed.member_slice: rank {r} is not in [0, {w}).")
    if members % w:
        raise ValueError(
            f"fd.distributed.member_slice: {members} members do not split evenly over {w} "
            f"ranks; choose a number of members divisible by {w} (e.g. {members + w - members % w})."
        )
    m = members // w
    return slice(r * m, (r + 1) * m)


def shard_members(tree: Any, group: Any = None) -> Any:
    """This rank's members of a full ensemble ``tree`` (leading dim = members).

    Example:
        >>> local = fd.distributed.shard_members(fd.vmap(block.init)(keys))
    """
    leaves = torch_pytree.tree_leaves(tree)
    first = next((v for v in leaves if isinstance(v, torch.Tensor)), None)
    if first is None or first.ndim == 0:
        raise ValueError(
            "fd.distributed.shard_members: the tree has no tensor with a leading member dim."
        )
    sl = member_slice(first.shape[0], group=group)
    return torch_pytree.tree_map(lambda v: v[sl] if isinstance(v, torch.Tensor) else v, tree)


def gather_members(tree: Any, group: Any = None) -> Any:
    """The full ensemble: every rank's members concatenated along dim 0, in rank order.

    A collective (every rank calls it with the same tree structure and shapes);
    the result is the same on every rank and equals the single-process ensemble.
    ``tree`` is not modified.

    Example:
        >>> full = fd.distributed.gather_members(local_params)   # [M, ...] everywhere
    """
    _rank_world(None, None, group, "fd.distributed.gather_members")
    from ._collectives import all_gather

    every = all_gather(tree, group)  # one bucketed collective: [world, M/world, ...]
    return torch_pytree.tree_map(
        lambda v: v.flatten(0, 1) if isinstance(v, torch.Tensor) else v, every
    )
