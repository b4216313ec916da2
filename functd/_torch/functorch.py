"""torch.func's private machinery: its wrapper tensors and its interpreter stack.

functd reads the stack to tell which transforms (vmap, grad, jvp) wrap a call, unwraps
and rewraps batched tensors around its fused kernels and its loops, and tells a plain
tensor from a ``torch.func`` wrapper on the hot paths (one C call). torch has no public
API for any of it: ``torch.func`` exposes the transforms, not their state.

Versions: every name behaves as used on torch 2.11 to 2.14 (issue 37's runs); the names
read with a ``None`` fallback are probed by their callers (an older torch without them
takes a slower or pure path).

>>> import torch
>>> from functd._torch.functorch import is_wrapped
>>> is_wrapped(torch.zeros(1))
False
"""

from __future__ import annotations

from typing import Any

import torch
from torch._functorch.pyfunctorch import (
    coerce_cinterpreter,
    retrieve_all_functorch_interpreters,
    temporarily_clear_interpreter_stack,
)
from torch._functorch.vmap import restore_vmap, unwrap_batched, wrap_batched

__all__ = [
    "C",
    "TransformType",
    "are_transforms_active",
    "coerce_cinterpreter",
    "get_interpreter_stack",
    "get_unwrapped",
    "is_batchedtensor",
    "is_wrapped",
    "peek_interpreter_stack",
    "restore_vmap",
    "retrieve_all_functorch_interpreters",
    "temporarily_clear_interpreter_stack",
    "unwrap_batched",
    "wrap_batched",
]

#: ``torch._C._functorch``, the C module itself: the fused kernels and the loops read
#: its batching primitives (``maybe_get_level``, ``_add_batch_dim``, ``_unwrap_batched``,
#: ``push/pop_dynamic_layer_stack``) after probing them with ``hasattr``.
C: Any = torch._C._functorch

#: ``is_wrapped(t)``: whether ``t`` is a torch.func wrapper (a batched or grad tensor);
#: None on a torch without the hook (then nothing counts as plain).
is_wrapped: Any = getattr(C, "is_functorch_wrapped_tensor", None)

#: ``get_unwrapped(t)``: the tensor one torch.func level under the wrapper ``t``.
get_unwrapped: Any = C.get_unwrapped

#: ``is_batchedtensor(t)``: whether ``t`` is a vmap level's wrapper.
is_batchedtensor: Any = getattr(C, "is_batchedtensor", None)

#: ``peek_interpreter_stack()``: the innermost transform, None outside every transform.
peek_interpreter_stack: Any = getattr(C, "peek_interpreter_stack", None)

#: ``get_interpreter_stack()``: every active transform, outermost first.
get_interpreter_stack: Any = getattr(C, "get_interpreter_stack", None)

#: The kinds of transform (``TransformType.Grad``, ``.Jvp``, ``.Vmap``...): what an
#: interpreter's ``key()`` returns. None on a torch without it.
TransformType: Any = getattr(C, "TransformType", None)

#: ``are_transforms_active()``: whether any torch.func transform is active; dynamo treats
#: the call as a constant (so a compiled graph keeps the branch it traced).
are_transforms_active: Any = torch._C._are_functorch_transforms_active

# The Python side (torch._functorch.pyfunctorch / .vmap), imported above:
# - ``retrieve_all_functorch_interpreters()``: the stack as Python interpreters (the
#   loops ask whether a grad/jvp level wraps them);
# - ``coerce_cinterpreter(ci)``: the Python interpreter of a C one (fd.scan's vmap rule);
# - ``temporarily_clear_interpreter_stack()``: a context outside every transform (a
#   DTensor built from a constant of the transforms);
# - ``unwrap_batched``/``wrap_batched``/``restore_vmap``: vmap's own unwrap, rewrap and
#   level re-entry (fd.scan's and fd.while_loop's batching rules).
