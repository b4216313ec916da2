"""Shared by the translations of JAX's control-flow tests (test_lax_while.py,
test_lax_scan.py): references written as plain Python loops, and small helpers."""

from __future__ import annotations

import pytest
import torch

import functd as fd

D = torch.float64
# scan inside fd.grad/fd.jvp under fd.jit is unrolled with a LoopWarning (the values
# are still checked)
UNROLLED = pytest.mark.filterwarnings("ignore::functd.LoopWarning")


def _jit(f):
    return fd.jit(f, backend="fx")


def _t(v, dtype=None):
    return torch.tensor(v, dtype=dtype)


def _index(arr, i):
    """``lax.dynamic_index_in_dim(arr, i, 0, keepdims=False)``."""
    return arr.index_select(0, i.reshape(1))[0]


def _rng(seed=0):
    return torch.Generator().manual_seed(seed)


def _scan_reference(f, init, xs):
    carry, ys = init, []
    for x in xs.unbind(0):
        carry, y = f(carry, x)
        ys.append(y)
    return carry, None if ys[0] is None else torch.stack(ys)


def _while_reference(cond, body, carry):
    while cond(carry):
        carry = body(carry)
    return carry
