"""The lean pass of TensorDict construction (its one-dim case is also in C,
``_alloc_ext.c``) and the batch-size checks: plain functions of torch only, so that
``_tensordict.py`` imports them.

Example:
    >>> _fast_leaves({"x": torch.zeros(4, 3)}, torch.Size([4]))  # a copy of the dict
    >>> _fast_leaves({"x": torch.zeros(3)}, torch.Size([4])) is None  # the slow path says why
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import _errors as E

__all__: list[str] = []

_SIZES: dict[int, torch.Size] = {}  # torch.Size([n]) for small n, made once (bounded)


def _size1(n: int) -> torch.Size:
    size = torch.Size([n])
    if n < 1024:
        _SIZES[n] = size
    return size


_LEAF_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def _fast_leaves(source: dict[Any, Any], bs: torch.Size) -> dict[Any, Any] | None:
    """The common construction in one pass with the least work per leaf: a str key,
    a plain tensor (or Parameter) whose leading dims are ``bs`` (one dim compared
    for the usual one-dim batch, none for ``[]``). Returns the new entries, or None
    when any leaf fails (nested mappings, TensorDicts, errors): the caller then
    takes the per-leaf path, which converts or raises the precise error."""
    n = len(bs)
    leaf = _LEAF_TYPES
    if n == 1:
        b0 = bs[0]
        try:
            for k, v in source.items():
                if type(k) is not str or type(v) not in leaf or v.shape[0] != b0:
                    return None
        except IndexError:  # a 0-dim leaf
            return None
    elif n == 0:
        for k, v in source.items():
            if type(k) is not str or type(v) not in leaf:
                return None
    else:
        for k, v in source.items():
            if type(k) is not str or type(v) not in leaf or v.shape[:n] != bs:
                return None
    return source.copy()


_EMPTY_SIZE = torch.Size([])
_MAX_NUMEL = (1 << 63) - 1  # the most elements a torch.Size counts


def _check_batch_size(batch_size: Any) -> torch.Size:
    if batch_size is None:
        return _EMPTY_SIZE
    if type(batch_size) is list and len(batch_size) == 1:  # the common ``[n]``
        d = batch_size[0]
        if type(d) is int and 0 <= d <= _MAX_NUMEL:
            return torch.Size(batch_size)
    if isinstance(batch_size, torch.Size):
        return batch_size
    if isinstance(batch_size, int | torch.SymInt) and not isinstance(batch_size, bool):
        batch_size = [batch_size]
    if not isinstance(batch_size, Sequence) or isinstance(batch_size, str):
        raise TypeError(E.BAD_BATCH.format(batch_size=batch_size))
    numel = 1
    for d in batch_size:
        if isinstance(d, bool) or not isinstance(d, int | torch.SymInt) or d < 0:
            raise (ValueError if isinstance(d, int) else TypeError)(
                E.BAD_BATCH.format(batch_size=batch_size)
            )
        if type(d) is int:
            numel *= d
    if numel > _MAX_NUMEL:  # torch.Size would wrap its numel() around (to 0 or negative)
        raise ValueError(
            f"batch_size {list(batch_size)} has {numel} elements, more than torch can index "
            "(2**63 - 1); give a smaller batch size."
        )
    return torch.Size(batch_size)


def _common_prefix(shapes: list[torch.Size]) -> list[int]:
    if not shapes:
        return []
    out = []
    for dims in zip(*shapes):
        if any(d != dims[0] for d in dims):
            break
        out.append(dims[0])
    return out
