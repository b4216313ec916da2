"""Whether tensors are plain eager ones: the test in front of every eager fast path.

Eager fast paths (torch's ``_foreach_*`` ops, in-place work on fresh buffers,
``torch.autograd.grad`` instead of ``torch.func.grad``) may only run on plain
tensors outside ``torch.compile``: not on the wrappers of ``torch.func``'s
``vmap``/``grad`` levels (no batching rule for the foreach ops; a grad level
must see the ops), and not while dynamo traces (it compiles the general path).
This file is the one owner of that test: the optimizers' list ops and RNNs
(``plain``), the PRNG's in-place paths (``plain_tensor``) and the fused PRNG
kernel (``_fused._serves``: a plain CPU key, or one under vmap levels only) all
ask it.

Example:
    >>> plain([torch.zeros(2)]), plain_tensor(torch.zeros(2))
    (True, True)
    >>> torch.func.vmap(lambda x: torch.tensor(plain([x])))(torch.zeros(2))
    tensor([False, False])
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from ._torch.functorch import is_wrapped

__all__ = ["is_wrapped", "plain", "plain_tensor"]

# ``is_wrapped(t)`` (functd._torch.functorch): whether ``t`` is a ``torch.func`` wrapper
# (None on a torch without the hook: then nothing is plain)


def plain(tensors: Iterable[Tensor]) -> bool:
    """True when not compiling and no tensor of ``tensors`` is a ``torch.func`` wrapper."""
    if torch.compiler.is_compiling() or is_wrapped is None:
        return False
    return not any(map(is_wrapped, tensors))


def plain_tensor(t: Tensor) -> bool:
    """``plain([t])`` for one tensor that must also be exactly a ``torch.Tensor`` (no
    subclass such as Parameter): the test of the in-place PRNG path, called per op,
    so written out (one call) rather than through ``plain``."""
    if torch.compiler.is_compiling() or is_wrapped is None:
        return False
    return type(t) is Tensor and not is_wrapped(t)
