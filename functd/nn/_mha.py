"""Multi-head attention as a pure function, with keyed attention dropout.

``multi_head_attention_forward`` is ``torch.nn.functional.multi_head_attention_forward``
(same arguments, same results to float rounding) plus a keyword-only PRNG
``key`` for the attention dropout; ``forward`` is the computation both it and
the ``MultiheadAttention`` layer run.

How it differs from torch's function inside (same numbers, less memory):

- The projections run on the inputs as given (``(N, L, E)`` or ``(L, N, E)``,
  contiguous); torch's layer first transposes batch-first inputs, and
  ``F.linear`` of a transposed input copies it, or, under ``vmap`` over a
  batch of weights, expands the *weights* to ``(M, L, E, 3E)``.
- The heads are views ``(N, H, L, hd)`` of the projection (no ``.contiguous()``),
  handed to ``F.scaled_dot_product_attention``, whose CPU kernel writes its
  result in ``(N, L, H, hd)`` order: the batch-first output needs no copy.
- Masks stay bool when both are bool and broadcast lazily (``(N, 1, L, S)``
  instead of torch's ``(N * H, L, S)`` float mask).

Example:
    >>> x = torch.randn(5, 2, 8)
    >>> w_in, w_out = torch.randn(24, 8), torch.randn(8, 8)
    >>> out, w = multi_head_attention_forward(
    ...     x, x, x, 8, 2, w_in, None, None, None, False, 0.0, w_out, None, training=False)
    >>> out.shape, w.shape
    (torch.Size([5, 2, 8]), torch.Size([2, 5, 5]))
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._torch.ops import native_multi_head_attention
from ._sdpa import KEY_REQUIRED, _active, attention_math, dropout, fused_ok

__all__ = ["Weights", "forward", "multi_head_attention_forward", "native_fast_path"]


class Weights(NamedTuple):
    """The tensors of one attention layer (None where absent)."""

    in_proj_weight: Tensor | None
    in_proj_bias: Tensor | None
    q_proj_weight: Tensor | None
    k_proj_weight: Tensor | None
    v_proj_weight: Tensor | None
    bias_k: Tensor | None
    bias_v: Tensor | None
    out_proj_weight: Tensor
    out_proj_bias: Tensor | None


class Masks(NamedTuple):
    """A call's masks in torch's MHA convention (bool: True = masked; float: added)."""

    attn: Tensor | None
    padding: Tensor | None


def forward(
    where: str,
    query: Tensor,
    key_: Tensor,
    value: Tensor,
    num_heads: int,
    w: Weights,
    masks: Masks,
    *,
    batch_first: bool = False,
    add_zero_attn: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    is_causal: bool = False,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    key: Tensor | int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """One attention call (``dropout_p`` already 0 outside training). ``where`` names
    the caller in error messages."""
    batched = _check_dims(where, query, key_, value, masks)
    if not batched:  # a batch of one, batch first
        query, key_, value = query.unsqueeze(0), key_.unsqueeze(0), value.unsqueeze(0)
        if masks.padding is not None:
            masks = Masks(masks.attn, masks.padding.unsqueeze(0))
        batch_first = True
    n, L = (query.size(0), query.size(1)) if batch_first else (query.size(1), query.size(0))
    E = query.size(-1)
    if is_causal:
        if masks.attn is None:
            raise ValueError(
                f"{where}: is_causal=True needs attn_mask (the causal mask itself, e.g. "
                "nn.Transformer.generate_square_subsequent_mask(L)); is_causal is only a hint."
            )
        if masks.padding is None and not need_weights:
            masks = Masks(None, None)  # SDPA builds the causal mask itself
        else:
            is_causal = False
    q, k, v = _project(query, key_, value, w, num_heads, batch_first)
    k, v, mask = _extend_keys(where, k, v, w, masks, L, add_zero_attn, static_k, static_v)
    if need_weights:
        out, weights = _with_weights(q, k, v, mask, dropout_p, key)
        if average_attn_weights:
            weights = weights.mean(dim=1)
    else:
        out, weights = _sdpa(q, k, v, mask, dropout_p, is_causal, key), None
    if batch_first:
        out = out.transpose(1, 2).reshape(n, L, E)  # a view after the CPU kernel
    else:
        out = out.permute(2, 0, 1, 3).reshape(L, n, E)  # contiguous: vmap-friendly linear
    out = F.linear(out, w.out_proj_weight, w.out_proj_bias)
    if not batched:
        out = out.squeeze(0)
        weights = None if weights is None else weights.squeeze(0)
    return out, weights


# ------------------------------------------------------------- torch's fast path
# torch's fused inference kernel, as nn.MultiheadAttention calls it (torch 1.12 to 2.13:
# ``_native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight,
# qkv_bias, proj_weight, proj_bias, mask, need_weights, average_attn_weights,
# mask_type)``); None if a torch lacks it: the general path then runs.
_native_mha = native_multi_head_attention
_DEVICES = ("cpu", "cuda")  # torch's also admits the privateuse1 backend; we leave it out


def native_fast_path(
    query: Tensor,
    key_: Tensor,
    value: Tensor,
    num_heads: int,
    w: Weights,
    masks: Masks,
    need_weights: bool,
    average_attn_weights: bool,
    is_causal: bool,
    *,
    batch_first: bool,
    add_zero_attn: bool,
    training: bool,
) -> tuple[Tensor, Tensor | None] | None:
    """``torch._native_multi_head_attention`` where ``nn.MultiheadAttention.forward``
    (torch 2.13, nn/modules/activation.py) takes it, with the same merged float mask;
    None elsewhere (the caller runs ``forward``). torch's conditions: self-attention
    (``query is key_ is value``) batched and batch-first, eval, an even number of
    heads, packed ``in_proj_weight`` with both biases, no ``bias_k``/``bias_v`` nor
    zero attention, bool masks (or none), no autocast, the fast path enabled
    (``torch.backends.mha``), no ``__torch_function__`` argument or mode (make_fx),
    cpu/cuda, no argument requiring grad under grad mode. Ours besides: no
    ``torch.func`` transform (the op has no batching rule nor derivative) and not
    compiling (fd.jit, torch.compile trace the general path); every weight and mask of
    the shape and dtype torch expects, and ``is_causal`` with its ``attn_mask`` (torch's
    fused kernel ignores the hint: it applies ``attn_mask``); elsewhere the general
    path runs and raises its clear error.

    Example:
        >>> x = torch.randn(2, 5, 8)
        >>> w = Weights(torch.randn(24, 8), torch.zeros(24), None, None, None, None, None,
        ...             torch.randn(8, 8), torch.zeros(8))
        >>> with torch.no_grad():
        ...     out, _ = native_fast_path(x, x, x, 2, w, Masks(None, None), False, True, False,
        ...                               batch_first=True, add_zero_attn=False, training=False)
        >>> out.shape
        torch.Size([2, 5, 8])
    """
    wi, bi, wo, bo = w.in_proj_weight, w.in_proj_bias, w.out_proj_weight, w.out_proj_bias
    attn, pad = masks
    if (
        training or not batch_first or num_heads % 2 or add_zero_attn or _native_mha is None
        or wi is None or bi is None or bo is None or w.bias_k is not None or w.bias_v is not None
        or query.dim() != 3 or query is not key_ or key_ is not value
        or (is_causal and attn is None) or (attn is not None and attn.dtype != torch.bool)
        or (pad is not None and pad.dtype != torch.bool)
        or not torch.backends.mha.get_fastpath_enabled() or torch.is_autocast_enabled()
        or _active() or torch.compiler.is_compiling()
    ):  # fmt: skip
        return None
    tensors = (query, wi, bi, wo, bo)
    if torch.overrides.has_torch_function(tensors) or (
        torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    ):
        return None
    n, L, E = query.shape
    shapes = ((3 * E, E), (3 * E,), (E, E), (E,))
    if any(t.dtype != query.dtype or t.shape != s for t, s in zip(tensors[1:], shapes)) or any(
        t.device.type not in _DEVICES for t in tensors
    ):
        return None
    if pad is not None and pad.shape != (n, L):
        return None
    if attn is not None and attn.shape != (L, L) and attn.shape != (n * num_heads, L, L):
        return None
    mask, mask_type = _native_mask(attn, pad, n, num_heads, L, query.dtype)
    return _native_mha(
        query, key_, value, E, num_heads, wi, bi, wo, bo, mask, need_weights,
        average_attn_weights, mask_type,
    )  # fmt: skip


def _native_mask(
    attn: Tensor | None, pad: Tensor | None, n: int, h: int, L: int, dtype: torch.dtype
) -> tuple[Tensor | None, int | None]:
    """torch's ``_canonical_mask`` (bool -> 0 / -inf) and ``merge_masks``: the padding
    mask ``(N, S)`` alone is type 1; with an attention mask, both expanded to
    ``(N, H, L, S)`` and added, type 2."""
    if attn is None:
        return (None, None) if pad is None else (_additive(pad, dtype), 1)
    merged = _additive(attn, dtype).view(-1, h if attn.dim() == 3 else 1, L, L).expand(n, h, L, L)
    if pad is not None:
        merged = merged + _additive(pad, dtype).view(n, 1, 1, L)
    return merged, 2


# ------------------------------------------------------------------ projection
def _heads(y: Tensor, parts: int, num_heads: int, batch_first: bool) -> tuple[Tensor, ...]:
    """``(N, L, parts*E)`` (or ``(L, N, ...)``) -> ``parts`` views ``(N, H, L, hd)``."""
    y = y.unflatten(-1, (parts, num_heads, -1))
    y = y.permute(2, 0, 3, 1, 4) if batch_first else y.permute(2, 1, 3, 0, 4)
    return y.unbind(0)


def _project(
    query: Tensor, key_: Tensor, value: Tensor, w: Weights, h: int, bf: bool
) -> tuple[Tensor, ...]:
    wi, b = w.in_proj_weight, w.in_proj_bias
    if wi is not None:
        if key_ is value:
            if query is key_:  # self-attention: one GEMM
                return _heads(F.linear(query, wi, b), 3, h, bf)
            E = query.size(-1)
            wq, wkv = wi.split([E, 2 * E])
            bq, bkv = (None, None) if b is None else b.split([E, 2 * E])
            return (
                *_heads(F.linear(query, wq, bq), 1, h, bf),
                *_heads(F.linear(key_, wkv, bkv), 2, h, bf),
            )
        wq, wk, wv = wi.chunk(3)
    else:
        wq, wk, wv = w.q_proj_weight, w.k_proj_weight, w.v_proj_weight  # type: ignore[assignment]
    bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
    return (
        *_heads(F.linear(query, wq, bq), 1, h, bf),
        *_heads(F.linear(key_, wk, bk), 1, h, bf),
        *_heads(F.linear(value, wv, bv), 1, h, bf),
    )


def _extend_keys(where, k, v, w, masks, L, add_zero_attn, static_k, static_v):
    """bias_k/bias_v, static_k/static_v and the zero attention applied to the keys
    and values ``(N, H, S, hd)``, and the masks checked, padded alike and merged."""
    n, h = k.shape[:2]
    attn = _attn_mask_4d(where, masks.attn, n, h, L, k.size(2))
    s_pad = k.size(2) if static_k is None or static_k.dim() != 3 else static_k.size(1)
    pad = _padding_mask_4d(where, masks.padding, n, s_pad)
    if w.bias_k is not None or w.bias_v is not None:
        k, v, attn, pad = _append_bias_kv(where, k, v, w, attn, pad, static_k, static_v)
    k = k if static_k is None else _static(where, "static_k", static_k, n, h, k)
    v = v if static_v is None else _static(where, "static_v", static_v, n, h, v)
    if add_zero_attn:
        zeros = k.new_zeros(n, h, 1, k.size(-1))
        k, v = torch.cat([k, zeros], 2), torch.cat([v, zeros], 2)
        attn, pad = _pad(attn), _pad(pad)
    return k, v, _merge(attn, pad, k.dtype)


def _append_bias_kv(where, k, v, w, attn, pad, static_k, static_v):
    if w.bias_k is None or w.bias_v is None:
        raise ValueError(f"{where}: bias_k and bias_v must be given together.")
    if static_k is not None or static_v is not None:
        raise ValueError(f"{where}: bias_k/bias_v cannot be added to static_k/static_v.")
    n, h, _, hd = k.shape
    bk = w.bias_k.reshape(1, h, 1, hd).expand(n, h, 1, hd)
    bv = w.bias_v.reshape(1, h, 1, v.size(-1)).expand(n, h, 1, v.size(-1))
    return torch.cat([k, bk], 2), torch.cat([v, bv], 2), _pad(attn), _pad(pad)


def _static(where: str, name: str, t: Tensor, n: int, h: int, like: Tensor) -> Tensor:
    if t.dim() != 3 or t.size(0) != n * h or t.size(2) != like.size(-1):
        raise ValueError(
            f"{where}: {name} must have shape (N * num_heads, S, head_dim) = "
            f"({n * h}, S, {like.size(-1)}); got {tuple(t.shape)}."
        )
    return t.view(n, h, t.size(1), t.size(2))


# ----------------------------------------------------------------------- masks
def _pad(mask: Tensor | None) -> Tensor | None:
    """One more key position that nothing masks (False / 0.0)."""
    return None if mask is None else F.pad(mask, (0, 1))


def _attn_mask_4d(where: str, m: Tensor | None, n: int, h: int, L: int, S: int):
    if m is None:
        return None
    if m.dim() == 2:
        if tuple(m.shape) != (L, S):
            raise ValueError(f"{where}: a 2D attn_mask must be (L, S) = {(L, S)}; got {_s(m)}.")
        return m.view(1, 1, L, S)
    if tuple(m.shape) != (n * h, L, S):
        raise ValueError(
            f"{where}: a 3D attn_mask must be (N * num_heads, L, S) = {(n * h, L, S)}; got {_s(m)}."
        )
    return m.view(n, h, L, S)


def _padding_mask_4d(where: str, m: Tensor | None, n: int, S: int) -> Tensor | None:
    if m is None:
        return None
    if tuple(m.shape) != (n, S):
        raise ValueError(f"{where}: key_padding_mask must be (N, S) = {(n, S)}; got {_s(m)}.")
    return m.view(n, 1, 1, S)


def _merge(attn: Tensor | None, pad: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """One mask ``(N|1, H|1, L|1, S)`` in torch's MHA convention: bool (True = masked)
    when both are bool, else additive float."""
    if attn is None or pad is None:
        return pad if attn is None else attn
    if attn.dtype == torch.bool and pad.dtype == torch.bool:
        return attn | pad
    return _additive(attn, dtype) + _additive(pad, dtype)


def _additive(m: Tensor, dtype: torch.dtype) -> Tensor:
    if m.dtype != torch.bool:
        return m
    return torch.zeros_like(m, dtype=dtype).masked_fill(m, float("-inf"))


def check_mask(where: str, name: str, m: Tensor | None) -> None:
    """Masks are bool or floating (as torch's ``_canonical_mask``)."""
    if m is not None and m.dtype != torch.bool and not m.is_floating_point():
        raise TypeError(
            f"{where}: {name} must be a bool or floating tensor; got {m.dtype} "
            f"(use {name}.bool() for a mask where True means 'do not attend')."
        )


# -------------------------------------------------------------------- attention
def _with_weights(q, k, v, mask, p, key) -> tuple[Tensor, Tensor]:
    """torch's need_weights branch: softmax(q / sqrt(hd) @ k.T + mask), its dropout,
    ``@ v``; the (dropped-out) probabilities are returned, as torch does."""
    scores = torch.matmul(q * math.sqrt(1.0 / float(q.size(-1))), k.transpose(-2, -1))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask, float("-inf"))
        else:
            scores = scores + mask
    scores = dropout(F.softmax(scores, dim=-1), p, key)  # (rebound: the scores are freed)
    return torch.matmul(scores, v), scores


def _sdpa(q, k, v, mask, p, is_causal, key) -> Tensor:
    keep = None if mask is None else (mask.logical_not() if mask.dtype == torch.bool else mask)
    if p == 0.0 and fused_ok():
        return F.scaled_dot_product_attention(q, k, v, keep, 0.0, is_causal)
    return attention_math(q, k, v, keep, p, is_causal, None, key)


# ------------------------------------------------------------------------ checks
def _s(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_dims(where: str, q: Tensor, k: Tensor, v: Tensor, masks: Masks) -> bool:
    if q.dim() not in (2, 3):
        raise ValueError(
            f"{where}: query must be (L, E) unbatched or 3D batched; got shape {_s(q)}."
        )
    if k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"{where}: key and value must have the query's {q.dim()} dims; got key "
            f"{_s(k)} and value {_s(v)}."
        )
    pad = masks.padding
    if pad is not None and pad.dim() != q.dim() - 1:
        raise ValueError(
            f"{where}: key_padding_mask must be {'(N, S)' if q.dim() == 3 else '(S,)'} "
            f"for a {q.dim()}D query; got {_s(pad)}."
        )
    if masks.attn is not None and masks.attn.dim() not in (2, 3):
        raise ValueError(f"{where}: attn_mask must be 2D or 3D; got {_s(masks.attn)}.")
    return q.dim() == 3


def _check_call(
    where: str,
    query: Tensor,
    embed_dim: int,
    num_heads: int,
    p: float,
    key: Tensor | int | None,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
) -> None:
    """torch's checks of the embed dim and heads, the dropout key, the masks' dtypes."""
    if query.size(-1) != embed_dim:
        raise ValueError(
            f"{where}: expected the query's last dim to be embed_dim={embed_dim}; "
            f"got {tuple(query.shape)}."
        )
    if embed_dim % num_heads:
        raise ValueError(f"{where}: embed_dim {embed_dim} not divisible by num_heads.")
    if p > 0.0 and key is None:
        raise ValueError(KEY_REQUIRED.format(fn=where, p=p))
    check_mask(where, "key_padding_mask", key_padding_mask)
    check_mask(where, "attn_mask", attn_mask)


def _packed_in_proj(
    where: str, in_proj_weight: Tensor | None, separate: tuple[Tensor | None, ...] | None
) -> Tensor | None:
    """The packed input projection weight to use: None when ``separate`` (the q, k, v
    weights of ``use_separate_proj_weight=True``) are given, all three of them."""
    if separate is not None:
        if any(w is None for w in separate):
            raise ValueError(
                f"{where}: use_separate_proj_weight=True needs q_proj_weight, k_proj_weight "
                "and v_proj_weight."
            )
        return None
    if in_proj_weight is None:
        raise ValueError(f"{where}: in_proj_weight is None and use_separate_proj_weight=False.")
    return in_proj_weight


# ------------------------------------------------------- the functional (keyed)
def multi_head_attention_forward(
    query: Tensor,
    key_: Tensor,
    value: Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    bias_k: Tensor | None,
    bias_v: Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    training: bool = True,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
    *,
    key: Tensor | int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``torch.nn.functional.multi_head_attention_forward`` with keyed attention dropout.

    The arguments are torch's, in torch's order (inputs ``(L, N, E)`` or unbatched
    ``(L, E)``; the attention key is the positional ``key_``), plus the keyword-only
    PRNG ``key``. The results equal torch's to float rounding (same formulas; the
    projections and masks are laid out differently, see the module docstring).
    When ``training and dropout_p > 0`` the attention probabilities are multiplied
    by ``bernoulli(key, 1 - dropout_p, (N, H, L, S)) / (1 - dropout_p)``: with
    ``need_weights=True`` before ``@ value``, and the returned weights are the
    dropped-out ones (averaged over heads when ``average_attn_weights``), as in
    torch; with ``need_weights=False`` inside the attention (the same mask for the
    same key). The masks themselves differ from torch's global-generator ones.

    Raises:
        ValueError: ``key`` missing when dropout applies; shapes that torch rejects
            (each message names the argument and the expected shape).
        TypeError: a mask that is neither bool nor floating.

    Example:
        >>> x = torch.randn(5, 2, 8)
        >>> w_in, w_out = torch.randn(24, 8), torch.randn(8, 8)
        >>> out, _ = multi_head_attention_forward(
        ...     x, x, x, 8, 2, w_in, None, None, None, False, 0.1, w_out, None,
        ...     key=functd.random.key(0))
    """
    where = "multi_head_attention_forward"
    p = dropout_p if training else 0.0
    _check_call(where, query, embed_dim_to_check, num_heads, p, key, key_padding_mask, attn_mask)
    separate = (q_proj_weight, k_proj_weight, v_proj_weight) if use_separate_proj_weight else None
    in_proj_weight = _packed_in_proj(where, in_proj_weight, separate)
    weights = Weights(
        in_proj_weight, in_proj_bias, q_proj_weight, k_proj_weight, v_proj_weight,
        bias_k, bias_v, out_proj_weight, out_proj_bias,
    )  # fmt: skip
    return forward(
        where, query, key_, value, num_heads, weights, Masks(attn_mask, key_padding_mask),
        add_zero_attn=add_zero_attn, dropout_p=p, need_weights=need_weights,
        average_attn_weights=average_attn_weights, is_causal=is_causal,
        static_k=static_k, static_v=static_v, key=key,
    )  # fmt: skip
