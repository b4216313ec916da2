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
from . import _pool as P
from ._attention import MultiheadAttention
from ._base import Layer
from ._batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from ._chain import Chain
from ._conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from ._dropout import Dropout
from ._embedding import Embedding, EmbeddingBag
from ._fsdp import orig_type, user_hooks
from ._functional_call import FunctionalCall
from ._linear import Bilinear, Flatten, Identity, Linear, Unflatten
from ._norm import GroupNorm, LayerNorm, RMSNorm
from ._recurrent import GRUCell, LSTMCell, RNNCell
from ._rnn import GRU, LSTM, RNN
from ._spatial import Pad, PixelShuffle, PixelUnshuffle, Upsample

__all__ = ["FunctionalCall", "lower"]


# ------------------------------------------------------------------- lowering
def lower(module: nn.Module | Layer, *, fallback: bool = False) -> Layer | None:
    """The pure layer computing the same function as ``module``, or None.

    Lowered (exact types only; every option that changes the math is kept):
    ``Linear, Bilinear, Identity, Flatten, Unflatten`` (int ``dim``),
    ``Conv1d/2d/3d, ConvTranspose1d/2d/3d, Embedding, EmbeddingBag,
    LayerNorm, GroupNorm, RMSNorm, BatchNorm1d/2d/3d`` (``training`` from the
    module's mode), ``RNNCell, GRUCell, LSTMCell``, ``RNN, GRU, LSTM``
    (``training`` from the module's mode: keyed inter-layer dropout; the
    states in torch's layout, ``dataclasses.replace(layer,
    batch_first_state=True)`` for the batch dim in front),
    ``MultiheadAttention``, ``MaxPool/AvgPool/LPPool/AdaptiveMaxPool/
    AdaptiveAvgPool 1d/2d/3d``, the padding modules ``ZeroPad, ConstantPad,
    ReflectionPad, ReplicationPad, CircularPad 1d/2d/3d`` (one ``Pad``),
    ``Upsample, UpsamplingNearest2d, UpsamplingBilinear2d`` (one
    ``Upsample``), ``PixelShuffle, PixelUnshuffle``, the parameter-free
    activations, ``PReLU``, ``Dropout`` (``training`` from the module's mode)
    and ``Sequential`` (a ``Chain``, child by child: a child that is not
    lowered runs as ``FunctionalCall(child)`` inside it). The layer's
    parameters are ``state_to_td(module)``.

    None (the caller falls back to ``FunctionalCall``) for any other module,
    a subclass, a module with forward/backward hooks or an instance-level
    ``forward``, and configs with no exact pure counterpart:
    ``Embedding``/``EmbeddingBag`` with ``max_norm`` or ``sparse=True``,
    ``Softmax(dim=None)``, ``Unflatten`` with a named dim, a ``Sequential``
    with shared children (a child that cannot be lowered runs as a
    ``FunctionalCall`` inside the Chain).

    Args:
        module: a torch module (a functd layer is returned unchanged).
        fallback: return ``FunctionalCall(module)`` instead of None.

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


def _sequential(m: nn.Sequential, fallback: bool) -> Chain:
    """A Chain of the children, each lowered or else wrapped in ``FunctionalCall``
    (whatever ``fallback`` says: one custom child leaves the rest lowered)."""
    names = tuple(m._modules)
    layers = [lower(child, fallback=True) for child in m._modules.values()]
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


def _mha(m: nn.MultiheadAttention, fallback: bool) -> MultiheadAttention:
    return MultiheadAttention(
        m.embed_dim,
        m.num_heads,
        bias=m.in_proj_bias is not None,
        add_bias_kv=m.bias_k is not None,
        add_zero_attn=m.add_zero_attn,
        kdim=m.kdim,
        vdim=m.vdim,
        batch_first=m.batch_first,
        dropout=float(m.dropout),
        training=m.training,
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


def _embedding_bag(m: nn.EmbeddingBag, fallback: bool) -> EmbeddingBag | None:
    if m.max_norm is not None or m.sparse:
        return None
    return EmbeddingBag(
        m.num_embeddings,
        m.embedding_dim,
        m.scale_grad_by_freq,
        m.mode,
        m.include_last_offset,
        m.padding_idx,
    )


def _rnn(m: nn.RNNBase, fallback: bool) -> Layer | None:
    if m.proj_size and m.mode != "LSTM":  # torch refuses it too; nothing to mirror
        return None
    common = {
        "num_layers": m.num_layers,
        "bias": m.bias,
        "batch_first": m.batch_first,
        "dropout": m.dropout,
        "bidirectional": m.bidirectional,
        "training": m.training,
    }
    if m.mode == "LSTM":
        return LSTM(m.input_size, m.hidden_size, proj_size=m.proj_size, **common)
    if m.mode == "GRU":
        return GRU(m.input_size, m.hidden_size, **common)
    return RNN(m.input_size, m.hidden_size, nonlinearity=m.nonlinearity, **common)


def _pad(mode: str) -> Callable[[Any, bool], Layer]:
    return lambda m, f: Pad(m.padding, mode, getattr(m, "value", 0.0))


def _upsample(m: nn.Upsample, fallback: bool) -> Upsample:
    return Upsample(m.size, m.scale_factor, m.mode, m.align_corners, m.recompute_scale_factor)


def _max_pool(cls: type) -> Callable[[Any, bool], Layer]:
    return lambda m, f: cls(
        m.kernel_size, m.stride, m.padding, m.dilation, m.return_indices, m.ceil_mode
    )


def _avg_pool(cls: type) -> Callable[[Any, bool], Layer]:
    return lambda m, f: cls(
        m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad, m.divisor_override
    )


def _plain(cls: type) -> Callable[[Any, bool], Layer]:
    return lambda m, fallback: cls()


_PADS = (
    ("Zero", "constant"),
    ("Constant", "constant"),
    ("Reflection", "reflect"),
    ("Replication", "replicate"),
    ("Circular", "circular"),
)

_RULES: dict[type, Callable[[Any, bool], Layer | None]] = {
    nn.Linear: lambda m, f: Linear(m.in_features, m.out_features, m.bias is not None),
    nn.Bilinear: lambda m, f: Bilinear(
        m.in1_features, m.in2_features, m.out_features, m.bias is not None
    ),
    nn.Identity: _plain(Identity),
    nn.Flatten: lambda m, f: Flatten(m.start_dim, m.end_dim),
    nn.Unflatten: lambda m, f: (
        Unflatten(m.dim, m.unflattened_size) if isinstance(m.dim, int) else None
    ),
    nn.Conv1d: _conv(Conv1d),
    nn.Conv2d: _conv(Conv2d),
    nn.Conv3d: _conv(Conv3d),
    nn.ConvTranspose1d: _conv_transpose(ConvTranspose1d),
    nn.ConvTranspose2d: _conv_transpose(ConvTranspose2d),
    nn.ConvTranspose3d: _conv_transpose(ConvTranspose3d),
    nn.Embedding: _embedding,
    nn.EmbeddingBag: _embedding_bag,
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
    nn.RNN: _rnn,
    nn.GRU: _rnn,
    nn.LSTM: _rnn,
    nn.MaxPool1d: _max_pool(P.MaxPool1d),
    nn.MaxPool2d: _max_pool(P.MaxPool2d),
    nn.MaxPool3d: _max_pool(P.MaxPool3d),
    nn.AvgPool1d: lambda m, f: P.AvgPool1d(
        m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad
    ),
    nn.AvgPool2d: _avg_pool(P.AvgPool2d),
    nn.AvgPool3d: _avg_pool(P.AvgPool3d),
    nn.LPPool1d: lambda m, f: P.LPPool1d(m.norm_type, m.kernel_size, m.stride, m.ceil_mode),
    nn.LPPool2d: lambda m, f: P.LPPool2d(m.norm_type, m.kernel_size, m.stride, m.ceil_mode),
    nn.LPPool3d: lambda m, f: P.LPPool3d(m.norm_type, m.kernel_size, m.stride, m.ceil_mode),
    nn.AdaptiveMaxPool1d: lambda m, f: P.AdaptiveMaxPool1d(m.output_size, m.return_indices),
    nn.AdaptiveMaxPool2d: lambda m, f: P.AdaptiveMaxPool2d(m.output_size, m.return_indices),
    nn.AdaptiveMaxPool3d: lambda m, f: P.AdaptiveMaxPool3d(m.output_size, m.return_indices),
    nn.AdaptiveAvgPool1d: lambda m, f: P.AdaptiveAvgPool1d(m.output_size),
    nn.AdaptiveAvgPool2d: lambda m, f: P.AdaptiveAvgPool2d(m.output_size),
    nn.AdaptiveAvgPool3d: lambda m, f: P.AdaptiveAvgPool3d(m.output_size),
    **{getattr(nn, f"{kind}Pad{n}d"): _pad(mode) for kind, mode in _PADS for n in (1, 2, 3)},
    nn.Upsample: _upsample,
    nn.UpsamplingNearest2d: _upsample,
    nn.UpsamplingBilinear2d: _upsample,
    nn.PixelShuffle: lambda m, f: PixelShuffle(m.upscale_factor),
    nn.PixelUnshuffle: lambda m, f: PixelUnshuffle(m.downscale_factor),
    nn.MultiheadAttention: _mha,
    nn.Dropout: lambda m, f: Dropout(m.p, training=m.training),
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
