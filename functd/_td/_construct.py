"""The lean pass of TensorDict construction (``TensorDict.__init__`` inlines its
one-dim case): plain functions of torch only, so that ``_tensordict.py`` imports them.

Example:
    >>> _fast_leaves({"x": torch.zeros(4, 3)}, torch.Size([4]))  # a copy of the dict
    >>> _fast_leaves({"x": torch.zeros(3)}, torch.Size([4])) is None  # the slow path says why
    True
"""

from __future__ import annotations

import torch

__all__: list[str] = []

_SIZES: dict[int, torch.Size] = {}  # torch.Size([n]) for small n, made once (bounded)


def _size1(n: int) -> torch.Size:
    size = torch.Size([n])
    if n < 1024:
        _SIZES[n] = size
    return size


_LEAF_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def _fast_leaves(source: dict, bs: torch.Size) -> dict | None:
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
