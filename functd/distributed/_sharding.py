"""Sharded parameters: place a params tree on a DeviceMesh from rules keyed by path.

``shard(params, mesh, rules)`` turns every leaf into a ``DTensor``: the
placements are those of the first rule whose glob matches the leaf's dotted path
(the PartitionSpec idea of JAX). ``gather(params)`` turns every DTensor leaf back
into a plain tensor holding the full value (``full_tensor()``). DTensor params
work wherever plain ones do: module calls replicate plain-tensor inputs on the
params' mesh (see ``functd/_td/_dtensor.py``), ``fd.grad`` gives DTensor grads with
the params' placements, and the optimizers update them leaf by leaf.

Example:
    >>> mesh = init_device_mesh("cpu", (2,))
    >>> sharded = fd.distributed.shard(params, mesh, {"*.weight": [Shard(0)], "*": [Replicate()]})
    >>> out = model(sharded, td)              # plain td: replicated on the mesh
    >>> full = fd.distributed.gather(sharded)  # plain tensors again, equal to params
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._td import TensorDict, from_parts
from .._td._dtensor import is_dtensor, mixed_mesh_error, replicated, seen, unwrapped

__all__ = ["gather", "replicate", "shard"]


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _map(tree: Any, fn: Any, path: tuple[Any, ...] = ()) -> Any:
    """Apply ``fn(path, leaf)`` to every tensor leaf of a TensorDict/dict/list tree."""
    if isinstance(tree, TensorDict):
        data = {k: _map(v, fn, (*path, k)) for k, v in tree._data.items()}
        return from_parts(data, tree._batch_size)
    if isinstance(tree, Mapping):
        return {k: _map(v, fn, (*path, k)) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_map(v, fn, (*path, str(i))) for i, v in enumerate(tree))
    if isinstance(tree, torch.Tensor):
        return fn(path, tree)
    return tree


def _placements(rules: Mapping[str, Sequence[Any]], path: tuple[Any, ...]) -> Sequence[Any]:
    dotted = _dotted(path)
    for pattern, placements in rules.items():
        if fnmatch.fnmatchcase(dotted, pattern):
            return placements
    raise KeyError(
        f"fd.distributed.shard: no rule matches the parameter {dotted!r}; the rules are "
        f"{list(rules)}. Add a catch-all last rule, e.g. {{..., '*': [Replicate()]}}."
    )


def shard(
    params: Any,
    mesh: Any,
    rules: Mapping[str, Sequence[Any]],
    *,
    src_data_rank: int | None = 0,
) -> Any:
    """Place every tensor of ``params`` on ``mesh`` as a DTensor, by path rules.

    Args:
        params: a TensorDict (or nested dict/list) of full, unsharded tensors.
        mesh: a ``torch.distributed.device_mesh.DeviceMesh``.
        rules: ordered ``{glob: placements}``; a leaf's dotted path (``"0.weight"``,
            ``"encoder.layer.bias"``) takes the placements of the first glob that
            matches it (``fnmatch``: ``*`` matches across dots). ``placements`` has
            one entry per mesh dim: ``Shard(d)``, ``Replicate()``.
        src_data_rank: as ``torch.distributed.tensor.distribute_tensor``: the rank
            whose values are scattered or broadcast (default 0); None when every
            rank holds the same full values (no communication).

    Returns:
        A new tree of DTensors (the same batch sizes). ``params`` is not modified
        (a DTensor leaf already on ``mesh`` is redistributed to its rule).

    Raises:
        KeyError: no rule matches a leaf (names the path).
        ValueError: a leaf is a DTensor on another mesh.

    Example:
        >>> fd.distributed.shard(params, mesh, {"*.weight": [Shard(0)], "*": [Replicate()]})
    """
    from torch.distributed.tensor import distribute_tensor

    if not isinstance(rules, Mapping):
        raise TypeError(
            "fd.distributed.shard(params, mesh, rules): rules is a dict {glob: placements}, "
            f"e.g. {{'*.weight': [Shard(0)], '*': [Replicate()]}}; got a {type(rules).__name__}."
        )

    seen()

    def place(path: tuple[Any, ...], t: torch.Tensor) -> Any:
        placements = list(_placements(rules, path))
        if is_dtensor(t):
            if t.device_mesh != mesh:  # type: ignore[attr-defined]
                raise mixed_mesh_error(
                    "fd.distributed.shard",
                    _dotted(path),
                    t.device_mesh,  # type: ignore[attr-defined]
                    "mesh",
                    mesh,
                )
            return t.redistribute(mesh, placements)  # type: ignore[attr-defined]
        # a copy: broadcasting a Replicate leaf would write into the caller's tensor
        src = t.detach().clone()
        return distribute_tensor(src, mesh, placements, src_data_rank=src_data_rank)

    return _map(params, place)


def gather(params: Any) -> Any:
    """Every DTensor leaf of ``params`` as a plain tensor of its full value.

    A collective (every rank of the mesh must call it). Plain leaves are kept.

    Example:
        >>> full = fd.distributed.gather(sharded)   # == the params given to shard
    """
    return _map(params, lambda path, t: t.full_tensor() if is_dtensor(t) else t)


def replicate(x: Any, mesh: Any) -> Any:
    """Every plain tensor of ``x`` (a tensor or a tree) as a ``Replicate()`` DTensor on
    ``mesh``, without communication (each rank keeps its own value, as DDP's inputs).

    Module calls do this for their inputs; use it for the other operand of an op
    between a DTensor output and a plain tensor (a loss against targets).

    Example:
        >>> loss = ((out["y"] - fd.distributed.replicate(target, mesh)) ** 2).mean()
    """
    seen()

    def rep(path: tuple[Any, ...], t: torch.Tensor) -> Any:
        if is_dtensor(t):
            if unwrapped(t).device_mesh != mesh:
                raise mixed_mesh_error(
                    "fd.distributed.replicate",
                    _dotted(path) or "x",
                    t.device_mesh,  # type: ignore[attr-defined]
                    "mesh",
                    mesh,
                )
            return t
        return replicated(t, mesh)

    return _map(x, rep)
