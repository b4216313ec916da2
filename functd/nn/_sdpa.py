"""Scaled dot-product attention with keyed attention dropout.

``scaled_dot_product_attention`` has the signature and the meaning of
``torch.nn.functional.scaled_dot_product_attention`` plus a keyword-only PRNG
``key``. Without dropout it is torch's fused kernel (or, under ``vmap``/``jvp``
levels, where the CPU kernel has no batching rule or forward derivative, the same
math written out);
with ``dropout_p > 0`` it is torch's documented reference computation with the
dropout mask drawn by ``functd.random.bernoulli(key, 1 - p, shape)``: the same
key gives the same mask, torch's global generator is never used.

Example:
    >>> q = torch.randn(2, 4, 5, 8)
    >>> out = scaled_dot_product_attention(q, q, q, dropout_p=0.1, key=functd.random.key(0))
    >>> out.shape
    torch.Size([2, 4, 5, 8])
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import random as fr
from .._torch.functorch import TransformType, are_transforms_active, get_interpreter_stack
from .._torch.ops import safe_softmax
from ._base import as_key

__all__ = ["scaled_dot_product_attention"]

KEY_REQUIRED = (
    "{fn}(dropout_p={p}) needs a PRNG key to draw the attention dropout mask: pass "
    "`key=fd.random.key(0)` (split a fresh key for each step), or `dropout_p=0.0`."
)

_safe_softmax = safe_softmax  # softmax; 0 on fully masked rows
_active = are_transforms_active  # a constant to dynamo
_stack = get_interpreter_stack
_GRAD = TransformType.Grad


def fused_ok() -> bool:
    """Whether torch's fused SDPA kernels may run: outside ``torch.func`` transforms,
    or (eager) under ``grad``/``vjp`` levels only. On CPU the flash kernel has no
    ``vmap`` batching rule (torch loops over the batch and warns) and no forward
    derivative (``jvp``); there the written-out math runs. A ``vjp`` that is vmapped
    later (``jacrev``, ``hessian``) meets torch's loop over the flash backward, as
    ``nn.MultiheadAttention`` does: correct, slower, with torch's warning."""
    if not _active():
        return True
    if torch.compiler.is_compiling() or _stack is None:
        return False
    return all(i.key() == _GRAD for i in _stack())


def scaled_dot_product_attention(
    query: Tensor,
    key_: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    key: Tensor | int | None = None,
) -> Tensor:
    """``softmax(query @ key_.T * scale + mask) @ value``, with keyed dropout.

    Same arguments and result as ``torch.nn.functional.scaled_dot_product_attention``:
    a bool ``attn_mask`` keeps the positions where it is True, a float one is
    added to the scores; ``is_causal`` keeps the lower triangle (top-left
    aligned); ``scale`` defaults to ``1 / sqrt(E)``; ``enable_gqa`` repeats each
    key/value head ``Hq // Hkv`` times (``repeat_interleave``). A row whose keys
    are all masked gives zeros, as torch's kernels do.

    With ``dropout_p > 0`` the attention probabilities are multiplied by
    ``bernoulli(key, 1 - dropout_p, (..., L, S)) / (1 - dropout_p)`` before
    ``@ value``; the masks differ from torch's (drawn from its global
    generator) by design. Works under ``torch.func.vmap`` (a batch of keys gives
    each member its own mask), ``grad`` and ``torch.compile(fullgraph=True)``.

    Args:
        query: ``(..., Hq, L, E)``.
        key_: the attention keys ``(..., Hkv, S, E)`` (positional, as torch's ``key``).
        value: ``(..., Hkv, S, Ev)``.
        attn_mask: bool or float, broadcastable to ``(..., Hq, L, S)``.
        dropout_p: attention dropout probability in ``[0, 1]``.
        is_causal: apply a causal mask (``attn_mask`` must then be None).
        scale: the score scale; default ``1 / sqrt(E)``.
        enable_gqa: grouped-query attention (``Hq`` a multiple of ``Hkv``).
        key: the PRNG key (a ``functd.random`` key or an int seed); required
            when ``dropout_p > 0``.

    Returns:
        ``(..., Hq, L, Ev)``.

    Raises:
        ValueError: ``dropout_p`` outside ``[0, 1]``; ``dropout_p > 0`` without
            ``key``; ``is_causal`` with an ``attn_mask``; ``enable_gqa`` with
            head counts that do not divide.

    Example:
        >>> q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
        >>> scaled_dot_product_attention(q, k, k).shape
        torch.Size([1, 2, 3, 4])
    """
    where = "scaled_dot_product_attention"
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{where}: dropout_p must be in [0, 1]; got {dropout_p}.")
    if dropout_p > 0.0 and key is None:
        raise ValueError(KEY_REQUIRED.format(fn=where, p=dropout_p))
    if is_causal and attn_mask is not None:
        raise ValueError(
            f"{where}: is_causal=True builds its own mask; pass attn_mask=None (or put the "
            "causal mask into attn_mask and is_causal=False)."
        )
    if dropout_p == 0.0 and fused_ok():
        return F.scaled_dot_product_attention(
            query, key_, value, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if enable_gqa:
        key_, value = _repeat_kv(where, query, key_, value)
    return attention_math(query, key_, value, attn_mask, dropout_p, is_causal, scale, key)


def _repeat_kv(where: str, query: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    hq, hk, hv = query.size(-3), k.size(-3), v.size(-3)
    if hq % hk or hq % hv:
        raise ValueError(
            f"{where}(enable_gqa=True): the query's {hq} heads must be a multiple of the "
            f"key's {hk} and the value's {hv} heads."
        )
    if hk != hq:
        k = k.repeat_interleave(hq // hk, -3)
    if hv != hq:
        v = v.repeat_interleave(hq // hv, -3)
    return k, v


def attention_math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    key: Tensor | int | None,
) -> Tensor:
    """torch's reference SDPA written out (no gqa): scaled scores, mask, safe
    softmax, keyed dropout, ``@ v``. ``key`` is only read when ``dropout_p > 0``."""
    s = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.matmul(q * s, k.transpose(-2, -1))
    if is_causal:
        L, S = scores.shape[-2:]
        causal = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(causal.logical_not(), float("-inf"))
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = torch.where(attn_mask, scores, float("-inf"))
        else:
            scores = scores + attn_mask
    scores = dropout(_safe_softmax(scores, -1), dropout_p, key)  # rebound: frees the scores
    return torch.matmul(scores, v)


def dropout(x: Tensor, p: float, key: Tensor | int | None) -> Tensor:
    """``x * bernoulli(key, 1 - p, x.shape) / (1 - p)`` (``x`` itself when ``p == 0``,
    ``x * 0`` when ``p == 1``, as ``torch.nn.functional.dropout``)."""
    if p == 0.0:
        return x
    if p == 1.0:
        return x * x.new_zeros(())
    keep = fr.bernoulli(as_key(key), 1.0 - p, x.shape)
    return x * (keep.to(x.dtype) / (1.0 - p))
