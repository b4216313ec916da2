"""Lowering torch modules onto pure layers, and the ``FunctionalCall`` fallback.

``lower(module)`` reads a module's configuration (never its tensors) and
returns the pure layer that computes the same function of the same
``state_dict()``-named parameters. It matches on the exact type
(``type(m) is nn.Linear``): a subclass may override ``forward``, so it is
never lowered. Anything it cannot represent exactly gives None, and the
caller wraps the module in ``FunctionalCall`` (``lower(m, fallback=True)``
does that itself).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import Any

from torch import nn

from . import _activation as A
from ._attention import MultiheadAttention
from ._base import Layer
from ._batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from ._chain import Chain
from ._conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from ._dropout import Dropout
from ._embedding import Embedding
from ._fsdp import orig_type, user_hooks
from ._functional_call import FunctionalCall
from ._linear import Bilinear, Flatten, Identity, Linear
from ._norm import GroupNorm, LayerNorm, RMSNorm
from ._recurrent import GRUCell, LSTMCell, RNNCell

__all__ = ["FunctionalCall", "lower"]


# ------------------------------------------------------------------- lowering
def lower(module: nn.Module | Layer, *, fallback: bool = False) -> Layer | None:
    """The pure layer computing the same function as ``module``, or None.

    Lowered (exact types only; every option that changes the math is kept):
    ``Linear, Bilinear, Identity, Flatten, Conv1d/2d/3d, ConvTranspose1d/2d/3d,
    Embedding, LayerNorm, GroupNorm, RMSNorm, BatchNorm1d/2d/3d (``training``
    from the module's mode), RNNCell, GRUCell, LSTMCell, MultiheadAttention``, the parameter-free activations, ``PReLU``,
    ``Dropout`` (``inference = not module.training``) and ``Sequential`` of
    these (a ``Chain``). The layer's parameters are ``state_to_td(module)``.

    None (the caller falls back to ``FunctionalCall``) for any other module,
    a subclass, a module with forward/backward hooks or an instance-level
    ``forward``, and configs with no exact pure counterpart:
    ``Embedding(max_norm=...)`` or ``sparse=True``, ``Softmax(dim=None)``,
    ``MultiheadAttention`` with ``dropout > 0`` in training mode, a
    ``Sequential`` with a child that is not lowered or with shared children.

    Args:
        module: a torch module (a functd layer is returned unchanged).
        fallback: return ``FunctionalCall(module)`` instead of None, and wrap
            the children of a ``Sequential`` that are not lowered.

    Example:
        >>> lower(torch.nn.Linear(3, 4))
        Linear(in_features=3, out_features=4, bias=True)
        >>> lower(torch.nn.BatchNorm1d(3).eval())
        BatchNorm1d(num_features=3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True, training=False)
    """
    if isinstance(module, Layer):
        return module
    if not isinstance(module, nn.Module):
        raise TypeError(f"lower(module) takes an nn.Module; got a {type(module).__name__}")
    layer = _lower(module, fallback)
    if layer is None and fallback:
        return FunctionalCall(module)
    return layer


def _lower(m: nn.Module, fallback: bool) -> Layer | None:
    rule = _RULES.get(orig_type(m))  # an FSDP2 module is read as its original class
    if rule is None or _has_hooks(m):
        return None
    layer = rule(m, fallback)
    if layer is None:
        return None
    named = chain(m.named_parameters(), m.named_buffers())
    expected = {tuple(name.split(".")): tuple(t.shape) for name, t in named}
    if layer.param_shapes() != expected:  # extra or shared tensors
        return None
    return layer


_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def _has_hooks(m: nn.Module) -> bool:
    if "forward" in m.__dict__ or user_hooks(m):  # FSDP2's own hooks are not counted
        return True
    return any(getattr(nn.modules.module, h, None) for h in _GLOBAL_HOOKS)


def _sequential(m: nn.Sequential, fallback: bool) -> Chain | None:
    names = tuple(m._modules)
    layers = []
    for child in m._modules.values():
        layer = lower(child, fallback=fallback)
        if layer is None:
            return None
        layers.append(layer)
    positional = names == tuple(str(i) for i in range(len(names)))
    return Chain(tuple(layers), None if positional else names)


def _conv(cls: type) -> Callable[[Any, bool], Layer]:
    def rule(m: Any, fallback: bool) -> Layer:
        return cls(
            m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation,
            m.groups, m.bias is not None, m.padding_mode,
        )  # fmt: skip

    return rule


def _conv_transpose(cls: type) -> Callable[[Any, bool], Layer | None]:
    def rule(m: Any, fallback: bool) -> Layer | None:
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            return None
        return cls(
            m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding,
            m.output_padding, m.groups, m.bias is not None, m.dilation,
        )  # fmt: skip

    return rule


def _embedding(m: nn.Embedding, fallback: bool) -> Embedding | None:
    if m.max_norm is not None or m.sparse:
        return None
    return Embedding(m.num_embeddings, m.embedding_dim, m.padding_idx, m.scale_grad_by_freq)


def _mha(m: nn.MultiheadAttention, fallback: bool) -> MultiheadAttention | None:
    if m.training and m.dropout > 0:
        return None
    return MultiheadAttention(
        m.embed_dim,
        m.num_heads,
        bias=m.in_proj_bias is not None,
        add_bias_kv=m.bias_k is not None,
        add_zero_attn=m.add_zero_attn,
        kdim=m.kdim,
        vdim=m.vdim,
        batch_first=m.batch_first,
    )


def _softmax(cls: type) -> Callable[[Any, bool], Layer | None]:
    def rule(m: Any, fallback: bool) -> Layer | None:
        return None if m.dim is None else cls(m.dim)

    return rule


def _batchnorm(cls: type) -> Callable[[Any, bool], Layer | None]:
    def rule(m: Any, fallback: bool) -> Layer | None:
        if m.track_running_stats and (m.running_mean is None or m.running_var is None):
            return None  # stats deleted after construction: no exact pure counterpart
        return cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats, m.training)

    return rule


def _plain(cls: type) -> Callable[[Any, bool], Layer]:
    return lambda m, fallback: cls()


_RULES: dict[type, Callable[[Any, bool], Layer | None]] = {
    nn.Linear: lambda m, f: Linear(m.in_features, m.out_features, m.bias is not None),
    nn.Bilinear: lambda m, f: Bilinear(
        m.in1_features, m.in2_features, m.out_features, m.bias is not None
    ),
    nn.Identity: _plain(Identity),
    nn.Flatten: lambda m, f: Flatten(m.start_dim, m.end_dim),
    nn.Conv1d: _conv(Conv1d),
    nn.Conv2d: _conv(Conv2d),
    nn.Conv3d: _conv(Conv3d),
    nn.ConvTranspose1d: _conv_transpose(ConvTranspose1d),
    nn.ConvTranspose2d: _conv_transpose(ConvTranspose2d),
    nn.ConvTranspose3d: _conv_transpose(ConvTranspose3d),
    nn.Embedding: _embedding,
    nn.LayerNorm: lambda m, f: LayerNorm(
        m.normalized_shape,
        m.eps,
        m.elementwise_affine,
        m.bias is not None or not m.elementwise_affine,
    ),
    nn.GroupNorm: lambda m, f: GroupNorm(
        m.num_groups, m.num_channels, m.eps, m.affine, m.bias is not None or not m.affine
    ),
    nn.BatchNorm1d: _batchnorm(BatchNorm1d),
    nn.BatchNorm2d: _batchnorm(BatchNorm2d),
    nn.BatchNorm3d: _batchnorm(BatchNorm3d),
    nn.RMSNorm: lambda m, f: RMSNorm(m.normalized_shape, m.eps, m.elementwise_affine),
    nn.RNNCell: lambda m, f: RNNCell(m.input_size, m.hidden_size, m.bias, m.nonlinearity),
    nn.GRUCell: lambda m, f: GRUCell(m.input_size, m.hidden_size, m.bias),
    nn.LSTMCell: lambda m, f: LSTMCell(m.input_size, m.hidden_size, m.bias),
    nn.MultiheadAttention: _mha,
    nn.Dropout: lambda m, f: Dropout(m.p, inference=not m.training),
    nn.Sequential: _sequential,
    nn.ReLU: _plain(A.ReLU),
    nn.ReLU6: _plain(A.ReLU6),
    nn.LeakyReLU: lambda m, f: A.LeakyReLU(m.negative_slope),
    nn.ELU: lambda m, f: A.ELU(m.alpha),
    nn.CELU: lambda m, f: A.CELU(m.alpha),
    nn.SELU: _plain(A.SELU),
    nn.GELU: lambda m, f: A.GELU(m.approximate),
    nn.SiLU: _plain(A.SiLU),
    nn.Mish: _plain(A.Mish),
    nn.Sigmoid: _plain(A.Sigmoid),
    nn.Tanh: _plain(A.Tanh),
    nn.Hardtanh: lambda m, f: A.Hardtanh(m.min_val, m.max_val),
    nn.Hardsigmoid: _plain(A.Hardsigmoid),
    nn.Hardswish: _plain(A.Hardswish),
    nn.Softplus: lambda m, f: A.Softplus(m.beta, m.threshold),
    nn.Softsign: _plain(A.Softsign),
    nn.Tanhshrink: _plain(A.Tanhshrink),
    nn.LogSigmoid: _plain(A.LogSigmoid),
    nn.Softmax: _softmax(A.Softmax),
    nn.LogSoftmax: _softmax(A.LogSoftmax),
    nn.PReLU: lambda m, f: A.PReLU(m.num_parameters, m.init),
}
