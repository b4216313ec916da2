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

import copy
import dataclasses
from collections.abc import Callable
from itertools import chain
from typing import Any

import torch
from torch import Tensor, nn

from .._td import TensorDict
from .._td._dtensor import is_dtensor
from . import _activation as A
from ._attention import MultiheadAttention
from ._base import Layer, set_derived
from ._batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from ._chain import Chain
from ._conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from ._convert import flat_state
from ._dropout import Dropout
from ._embedding import Embedding
from ._fsdp import fsdp_meta_copy, orig_type, user_hooks
from ._linear import Bilinear, Flatten, Identity, Linear
from ._norm import GroupNorm, LayerNorm, RMSNorm
from ._recurrent import GRUCell, LSTMCell, RNNCell

__all__ = ["FunctionalCall", "lower"]

NO_INIT = (
    "FunctionalCall({name}).init(key): only lowered layers have a pure `init`; {name} could "
    "not be lowered onto one (see functd.nn.lower). Take the module's current weights "
    "instead: `params = fd.from_module(module)` (functd.nn.state_to_td(module)), or "
    "re-initialise the torch module itself and read them again."
)


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionalCall(Layer):
    """Run any ``nn.Module`` as a pure layer through ``torch.func.functional_call``.

    Holds a private copy of the module on the ``meta`` device (no real
    tensors; made without copying the weights), so the user's module is
    never used nor mutated. The call runs the copy's ``forward`` with
    ``params`` (dotted ``state_dict`` names, strict) and the inputs. Buffers
    are cloned first, so a forward that writes into them writes into a
    temporary: the caller's TensorDict (and the module it came from) are
    unchanged. When the module holds a BatchNorm in training mode
    (``stateful``), the call returns ``(out, new_state)``: those clones, the
    new running statistics (see ``functd.nn.update_state``). The weight of an
    ``Embedding(max_norm=...)`` is renormalised in a temporary too.

    Compares and hashes by identity. The module's mode (``training``) is the
    one it had when wrapped. A module that would draw from torch's global
    generator (dropout or RReLU in training mode) is refused: functd cannot
    hand it a key.

    Args:
        module: any ``torch.nn.Module``.

    Raises:
        ValueError: the module holds a random submodule in training mode.
        NotImplementedError: from ``init``; see ``functd.nn.state_to_td``.

    Example:
        >>> bn = torch.nn.BatchNorm1d(3).eval()
        >>> layer, params = FunctionalCall(bn), state_to_td(bn)
        >>> layer(params, torch.randn(4, 3)).shape
        torch.Size([4, 3])
    """

    module: nn.Module

    def __post_init__(self) -> None:
        if not isinstance(self.module, nn.Module):
            raise TypeError(
                f"FunctionalCall(module) takes an nn.Module; got {type(self.module).__name__}"
            )
        meta = _meta_copy(self.module)
        object.__setattr__(self, "module", meta)
        clone = {name for name, _ in meta.named_buffers()}
        for prefix, sub in meta.named_modules():
            if getattr(sub, "max_norm", None) is not None:  # F.embedding renorms in place
                clone.update(f"{prefix}.{n}" if prefix else n for n, _ in sub.named_parameters())
        stats = tuple(
            f"{prefix}.{n}" if prefix else n
            for prefix, sub in meta.named_modules()
            if isinstance(sub, nn.modules.batchnorm._NormBase)
            and sub.training
            and sub.track_running_stats
            for n, _ in sub.named_buffers(recurse=False)
        )
        _refuse_global_rng(meta, type(self.module).__name__)
        set_derived(self, _clone=frozenset(clone), _stats=stats)

    @property
    def stateful(self) -> bool:  # type: ignore[override]
        """True when the module holds a BatchNorm in training mode: a call then
        returns ``(out, new_state)`` with its new running statistics."""
        return bool(self._stats)

    def _specs(self) -> dict[str, Any]:
        raise NotImplementedError(NO_INIT.format(name=type(self.module).__name__))

    def init(self, key: Any, dtype: torch.dtype = torch.float32, device: Any = None) -> TensorDict:
        raise NotImplementedError(NO_INIT.format(name=type(self.module).__name__))

    def param_shapes(self) -> dict[tuple[str, ...], tuple[int, ...]]:
        named = chain(self.module.named_parameters(), self.module.named_buffers())
        return {tuple(name.split(".")): tuple(t.shape) for name, t in named}

    def buffer_paths(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(name.split(".")) for name, _ in self.module.named_buffers())

    def __call__(
        self, params: TensorDict, *inputs: Any, key: Tensor | None = None, **kwargs: Any
    ) -> Any:
        flat = flat_state(params)
        for name in self._clone.intersection(flat):
            flat[name] = flat[name].clone()
        out = torch.func.functional_call(self.module, flat, inputs, kwargs or None, strict=True)
        if not self._stats:
            return out
        state: dict[str, Any] = {}  # the clones the forward wrote into: the new statistics
        for name in self._stats:
            *parents, leaf = name.split(".")
            node = state
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = flat[name]
        return out, TensorDict(state, [])

    def __repr__(self) -> str:
        return f"FunctionalCall({type(self.module).__name__} at {id(self):#x})"


_RANDOM_TORCH = (nn.modules.dropout._DropoutNd, nn.RReLU)


def _refuse_global_rng(module: nn.Module, name: str) -> None:
    """Raise when a submodule in training mode would draw from torch's global RNG."""
    for path, sub in module.named_modules():
        p = getattr(sub, "p", 1.0) if isinstance(sub, nn.modules.dropout._DropoutNd) else 1.0
        if isinstance(sub, _RANDOM_TORCH) and sub.training and p > 0:
            where = f" at {path!r}" if path else ""
            raise ValueError(
                f"FunctionalCall({name}): holds {type(sub).__name__} in training mode{where}, "
                "which would draw from torch's global generator; functd passes randomness "
                "as keys and cannot give it one. Call module.eval() (or fd.nn.eval_mode) "
                "for inference, or build the model from functd layers (fd.nn.Dropout "
                "takes a key)."
            )


def _meta_copy(module: nn.Module) -> nn.Module:
    """``deepcopy(module).to("meta")`` without copying the real parameters and buffers."""
    memo: dict[int, Any] = {}
    for t in chain(module.parameters(), module.buffers()):
        if type(t) is nn.Parameter:
            memo[id(t)] = nn.Parameter(torch.empty_like(t, device="meta"), t.requires_grad)
        elif type(t) is Tensor:
            memo[id(t)] = torch.empty_like(t, device="meta")
        elif is_dtensor(t):  # FSDP2 / DTensor shards: a meta tensor of the global shape
            meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
            memo[id(t)] = nn.Parameter(meta, t.requires_grad) if t.requires_grad else meta
    fsdp_meta_copy(module, memo)  # FSDP2 modules forbid deepcopy: their original class
    return copy.deepcopy(module, memo).to("meta")


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
