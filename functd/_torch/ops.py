"""torch's private C++ entry points and probes: the fused RNN ops, DDP's bucket
flattening, the samplers' gradients, the dispatch-state probes, ``OpOverload``.

Each is what the public torch API runs underneath (``nn.LSTM.forward`` calls
``torch._VF.lstm``; DDP flattens its buckets with ``flatten_dense_tensors``), called
directly to skip the Python around it. Versions: all behave as used on torch 2.11 to
2.14 (issue 37's runs); the names read with a ``None`` fallback are probed by callers.

>>> import torch
>>> from functd._torch.ops import flatten_dense_tensors
>>> flatten_dense_tensors([torch.ones(2), torch.zeros(1)]).tolist()
[1.0, 1.0, 0.0]
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

__all__ = [
    "OpOverload",
    "VF",
    "aoti",
    "any_autocast",
    "flatten_dense_tensors",
    "function_mode_enabled",
    "is_all_true",
    "len_dispatch_stack",
    "native_multi_head_attention",
    "safe_softmax",
    "standard_gamma_grad",
    "tracing_state",
    "unflatten_dense_tensors",
]

#: ``torch._VF``: the fused RNN ops ``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu`` that
#: ``torch.nn.LSTM/GRU/RNN.forward`` call (functd.nn's RNNs call them the same way).
VF: Any = torch._VF

#: ``torch._native_multi_head_attention``: the fused kernel ``nn.MultiheadAttention``
#: runs on its fast path (eval, self-attention); None on a torch without it.
native_multi_head_attention: Any = getattr(torch, "_native_multi_head_attention", None)

#: ``aten::_safe_softmax``: softmax giving 0 on fully masked rows (what SDPA's math
#: backend runs).
safe_softmax: Any = torch.ops.aten._safe_softmax.default

#: ``torch._standard_gamma_grad(a, x)``: d x / d a of a gamma draw (the reparameterized
#: gradient ``torch.distributions.Gamma.rsample`` uses).
standard_gamma_grad: Any = torch._standard_gamma_grad

#: ``torch._is_all_true(t)``: ``t.all()`` as a tensor op (argument validation of the
#: distributions, as torch.distributions' constraints).
is_all_true: Any = torch._is_all_true

#: DDP's bucket copy: many tensors into one flat buffer (one C++ call) and back (views).
flatten_dense_tensors: Any = torch._C._nn.flatten_dense_tensors
unflatten_dense_tensors: Any = torch._C._nn.unflatten_dense_tensors

#: Probes of the dispatch state (the fused kernels run only when all are off):
#: ``len_dispatch_stack()`` (a TorchDispatchMode, FakeTensor), ``function_mode_enabled()``
#: (a TorchFunctionMode, ``with torch.device``), ``tracing_state()`` (``torch.jit.trace``),
#: ``any_autocast()`` (an autocast region).
len_dispatch_stack: Any = getattr(torch._C, "_len_torch_dispatch_stack", None)
function_mode_enabled: Any = torch._C._is_torch_function_mode_enabled
tracing_state: Any = torch._C._get_tracing_state
any_autocast: Any = torch._C._is_any_autocast_enabled

#: ``torch._C._aoti``: AOTInductor's C++ runners (fd.jit's CUDA-graph-free C++ path);
#: None on a build without it.
aoti: Any = getattr(torch._C, "_aoti", None)

# ``OpOverload`` (torch._ops): the type of an aten op overload (``aten.add.Tensor``);
# fd.jit's passes tell a graph node's target by it.
