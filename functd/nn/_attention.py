"""MultiheadAttention: the pure layer over ``_mha.forward`` (SDPA, keyed dropout)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from .._td import TensorDict
from ._base import Layer, ParamSpec, constant, fan_in_bound, normal, uniform, xavier_uniform
from ._mha import Masks, Weights, check_mask, forward, native_fast_path

__all__ = ["MultiheadAttention"]

KEY_REQUIRED = (
    "MultiheadAttention(dropout={p}) in training mode needs a PRNG key for its attention "
    "dropout: pass one at call time, e.g. `m(params, td, key=fd.random.key(0))` (split a "
    "fresh key for each step), or switch it to eval mode (`fd.nn.eval_mode(m)`, or lower "
    "the torch module after `.eval()`)."
)


@dataclasses.dataclass(frozen=True)
class MultiheadAttention(Layer):
    """Multi-head attention; the pure counterpart of ``torch.nn.MultiheadAttention``.

    Args:
        embed_dim: model dim ``E`` (the query's last dim).
        num_heads: number of heads (must divide ``embed_dim``).
        bias: learn ``in_proj_bias`` and ``out_proj.bias`` (zeros at init).
        add_bias_kv: learn ``bias_k`` and ``bias_v`` appended to the keys/values.
        add_zero_attn: append a zero key/value.
        kdim: the key's last dim (default ``embed_dim``).
        vdim: the value's last dim (default ``embed_dim``).
        batch_first: inputs are ``(N, L, E)`` rather than ``(L, N, E)``.
        dropout: attention dropout probability (torch's ``dropout``).
        training: apply the attention dropout (torch's ``module.training``;
            ``functd.nn.train_mode``/``eval_mode`` switch it).

    Parameters, named as in ``state_dict()``: ``in_proj_weight`` ``(3E, E)``
    (or ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when ``kdim`` or
    ``vdim`` differ from ``E``; xavier-uniform), ``in_proj_bias``,
    ``out_proj.weight`` (as ``Linear(E, E)``), ``out_proj.bias``, ``bias_k``, ``bias_v``.

    Call: ``mha(params, query, key_, value, key_padding_mask=None,
    need_weights=True, attn_mask=None, average_attn_weights=True,
    is_causal=False, *, key=None)`` returns ``(attn_output, attn_weights)`` like
    torch (the attention key is the positional ``key_``; the keyword ``key=`` is
    the PRNG key). The layer is ``random`` when ``training and dropout > 0``:
    the call then needs ``key``, and the attention probabilities are multiplied
    by ``bernoulli(key, 1 - dropout, (N, H, L, S)) / (1 - dropout)`` (see
    ``functd.nn.multi_head_attention_forward``; the same key gives the same mask
    with ``need_weights`` True or False). Results equal torch's to float
    rounding; with ``need_weights=False`` the attention is
    ``F.scaled_dot_product_attention`` (its written-out math under ``vmap``/``jvp``).
    A batch-first output is contiguous (torch's is a transposed view).
    Where ``nn.MultiheadAttention`` takes its fused inference kernel
    (``torch._native_multi_head_attention``: eval, self-attention ``query is key_ is
    value``, batch first, an even number of heads, both biases, bool masks, nothing
    requiring grad under grad mode), the layer calls the same kernel with the
    weights from ``params`` and equals torch's result, NaN on fully masked rows
    included; never under ``torch.func`` transforms (``fd.vmap``, ``fd.grad``) or
    while tracing (``fd.jit``, ``torch.compile``).

    Example:
        >>> mha = MultiheadAttention(8, 2, batch_first=True)
        >>> x = torch.randn(3, 5, 8)
        >>> out, weights = mha(mha.init(0), x, x, x)
        >>> out.shape, weights.shape
        (torch.Size([3, 5, 8]), torch.Size([3, 5, 5]))
    """

    embed_dim: int
    num_heads: int
    bias: bool = True
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    kdim: int | None = None
    vdim: int | None = None
    batch_first: bool = False
    dropout: float = 0.0
    training: bool = False

    def __post_init__(self) -> None:
        if self.embed_dim <= 0 or self.num_heads <= 0:
            raise ValueError(
                f"embed_dim and num_heads must be greater than 0, got embed_dim="
                f"{self.embed_dim} and num_heads={self.num_heads} instead"
            )
        if self.embed_dim % self.num_heads != 0:
            raise ValueError("embed_dim must be divisible by num_heads")
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1]; got {self.dropout}.")
        if self.kdim is None:
            object.__setattr__(self, "kdim", self.embed_dim)
        if self.vdim is None:
            object.__setattr__(self, "vdim", self.embed_dim)
        object.__setattr__(
            self, "_same_dim", self.kdim == self.embed_dim and self.vdim == self.embed_dim
        )

    @property
    def random(self) -> bool:  # type: ignore[override]
        """True when ``training and dropout > 0``: then the call needs a ``key``."""
        return self.training and self.dropout > 0.0

    def _specs(self) -> dict[str, Any]:
        e, zeros = self.embed_dim, constant(0.0)
        if self._same_dim:  # type: ignore[attr-defined]
            specs = {"in_proj_weight": ParamSpec((3 * e, e), xavier_uniform(e, 3 * e))}
        else:
            specs = {
                "q_proj_weight": ParamSpec((e, e), xavier_uniform(e, e)),
                "k_proj_weight": ParamSpec((e, self.kdim), xavier_uniform(self.kdim, e)),
                "v_proj_weight": ParamSpec((e, self.vdim), xavier_uniform(self.vdim, e)),
            }
        if self.bias:
            specs["in_proj_bias"] = ParamSpec((3 * e,), zeros)
        if self.add_bias_kv:
            # xavier_normal_ of a (1, 1, E) tensor: fan_in = fan_out = E
            specs["bias_k"] = ParamSpec((1, 1, e), normal((1.0 / e) ** 0.5))
            specs["bias_v"] = ParamSpec((1, 1, e), normal((1.0 / e) ** 0.5))
        out = {"weight": ParamSpec((e, e), uniform(fan_in_bound(e)))}
        if self.bias:
            out["bias"] = ParamSpec((e,), zeros)
        specs["out_proj"] = out  # type: ignore[assignment]  # a child module: last in state_dict()
        return specs

    def __call__(
        self,
        params: TensorDict,
        query: Tensor,
        key_: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        key: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        d = params._data
        out_proj = d["out_proj"]._data
        p = self.dropout if self.training else 0.0
        if p > 0.0 and key is None:
            raise ValueError(KEY_REQUIRED.format(p=p))
        where = "MultiheadAttention"
        check_mask(where, "key_padding_mask", key_padding_mask)
        check_mask(where, "attn_mask", attn_mask)
        if query.size(-1) != self.embed_dim:
            raise ValueError(
                f"{where}: expected the query's last dim to be embed_dim={self.embed_dim}; "
                f"got {tuple(query.shape)}."
            )
        weights = Weights(
            d.get("in_proj_weight"), d.get("in_proj_bias"), d.get("q_proj_weight"),
            d.get("k_proj_weight"), d.get("v_proj_weight"), d.get("bias_k"), d.get("bias_v"),
            out_proj["weight"], out_proj.get("bias"),
        )  # fmt: skip
        masks = Masks(attn_mask, key_padding_mask)
        fast = native_fast_path(
            query, key_, value, self.num_heads, weights, masks, need_weights,
            average_attn_weights, is_causal, batch_first=self.batch_first,
            add_zero_attn=self.add_zero_attn, training=self.training,
        )  # fmt: skip
        if fast is not None:  # torch's fused inference kernel, where torch takes it
            return fast
        return forward(
            where, query, key_, value, self.num_heads, weights,
            masks, batch_first=self.batch_first,
            add_zero_attn=self.add_zero_attn, dropout_p=p, need_weights=need_weights,
            average_attn_weights=average_attn_weights, is_causal=is_causal, key=key,
        )  # fmt: skip
