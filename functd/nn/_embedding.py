"""Embedding and EmbeddingBag: lookup tables of learned vectors."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer, ParamSpec, normal

__all__ = ["Embedding", "EmbeddingBag"]

_MODES = ("sum", "mean", "max")


@dataclasses.dataclass(frozen=True)
class Embedding(Layer):
    """``weight[indices]``; the pure counterpart of ``torch.nn.Embedding``.

    Args:
        num_embeddings: size of the table.
        embedding_dim: size of each vector.
        padding_idx: a row that receives no gradient and is initialised to
            zeros (negative values count from the end, as in torch).
        scale_grad_by_freq: scale gradients by the inverse frequency of the
            indices in the mini-batch.

    torch's ``max_norm`` (which renormalises the weight *in place* on every
    call) and ``sparse`` gradients are not offered; ``lower`` leaves such
    modules to ``FunctionalCall``.

    Parameters: ``weight`` ``(num_embeddings, embedding_dim)``, ``N(0, 1)``.

    Example:
        >>> emb = Embedding(10, 3, padding_idx=0)
        >>> emb(emb.init(0), torch.tensor([[0, 5]])).shape
        torch.Size([1, 2, 3])
    """

    num_embeddings: int
    embedding_dim: int
    padding_idx: int | None = None
    scale_grad_by_freq: bool = False

    def __post_init__(self) -> None:
        _normalise_padding_idx(self)

    def _specs(self) -> dict[str, Any]:
        return _table_specs(self)

    def __call__(self, params: TensorDict, indices: Tensor, *, key: Tensor | None = None) -> Tensor:
        return F.embedding(
            indices,
            params._data["weight"],
            self.padding_idx,
            None,
            2.0,
            self.scale_grad_by_freq,
            False,
        )


def _normalise_padding_idx(layer: Any) -> None:
    idx = layer.padding_idx
    if idx is not None:
        n = layer.num_embeddings
        if not -n <= idx < n:
            raise ValueError("padding_idx must be within num_embeddings")
        object.__setattr__(layer, "padding_idx", idx % n)


def _table_specs(layer: Any) -> dict[str, Any]:
    """``weight`` ``N(0, 1)`` with the padding row zeroed, as torch's ``reset_parameters``."""

    def draw(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        w = normal()(key, shape, dtype)
        if layer.padding_idx is None:
            return w
        row = torch.tensor([layer.padding_idx], device=w.device)
        return w.index_fill(-2, row, 0.0)

    return {"weight": ParamSpec((layer.num_embeddings, layer.embedding_dim), draw)}


@dataclasses.dataclass(frozen=True)
class EmbeddingBag(Layer):
    """Sums, means or maxima of bags of embeddings; as ``torch.nn.EmbeddingBag``.

    Args:
        num_embeddings: size of the table.
        embedding_dim: size of each vector.
        scale_grad_by_freq: scale gradients by the inverse frequency of the
            indices in the mini-batch.
        mode: ``"sum"``, ``"mean"`` or ``"max"`` over each bag.
        include_last_offset: ``offsets`` has one more entry than there are
            bags (CSR layout); as torch on CPU, the last bag runs to the end
            of ``input`` whatever that entry says.
        padding_idx: a row excluded from every bag (and initialised to zeros).

    Call: ``bag(params, input, offsets=None, per_sample_weights=None)``, as
    torch's ``forward``. ``input`` of shape ``(..., L)`` (torch: ``(B, L)``)
    holds bags of ``L`` indices and gives ``(..., embedding_dim)``; a 1-D
    ``input`` needs ``offsets``, the start of each bag. ``per_sample_weights``
    (same shape as ``input``, ``mode="sum"`` only) scales each embedding. An
    empty bag gives zeros.

    torch's ``max_norm`` (renormalises the weight in place) and ``sparse`` are
    not offered; ``lower`` leaves such modules to ``FunctionalCall``.
    ``F.embedding_bag`` has no ``vmap`` batching rule, so the bags are
    reduced with ``index_add``/``scatter_reduce`` after ``F.embedding``: the
    same numbers up to float rounding, and it works in ensembles.

    Raises:
        ValueError: an unknown mode; at call time (as torch), offsets missing
            for a 1-D input or given for a batched one, per_sample_weights with
            a mode other than ``"sum"`` or of another shape than ``input``, or
            ``mode="max"`` with ``scale_grad_by_freq``.

    Example:
        >>> bag = EmbeddingBag(10, 3, mode="sum")
        >>> bag(bag.init(0), torch.tensor([1, 2, 4, 5]), torch.tensor([0, 2])).shape
        torch.Size([2, 3])
    """

    num_embeddings: int
    embedding_dim: int
    scale_grad_by_freq: bool = False
    mode: str = "mean"
    include_last_offset: bool = False
    padding_idx: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"EmbeddingBag: mode has to be one of {_MODES}; got {self.mode!r}")
        _normalise_padding_idx(self)

    def _specs(self) -> dict[str, Any]:
        return _table_specs(self)

    def __call__(
        self,
        params: TensorDict,
        input: Tensor,
        offsets: Tensor | None = None,
        per_sample_weights: Tensor | None = None,
        *,
        key: Tensor | None = None,
    ) -> Tensor:
        psw = per_sample_weights
        if self.mode == "max" and self.scale_grad_by_freq:  # as torch, at call time
            raise ValueError(
                "EmbeddingBag: max mode does not support scaling the gradient by the "
                "frequency; build it with scale_grad_by_freq=False or another mode."
            )
        if psw is not None:
            if self.mode != "sum":
                raise ValueError(
                    f"EmbeddingBag: per_sample_weights is only supported for mode='sum' "
                    f"(got mode={self.mode!r}); drop it or build the layer with mode='sum'."
                )
            if psw.shape != input.shape:
                raise ValueError(
                    f"EmbeddingBag: per_sample_weights has shape {list(psw.shape)} but input "
                    f"has shape {list(input.shape)}; give one weight per index."
                )
        ids, n_bags, lead = self._bags(input, offsets)
        emb = F.embedding(
            input.reshape(-1),
            params._data["weight"],
            self.padding_idx,
            None,
            2.0,
            self.scale_grad_by_freq,
            False,
        )
        if psw is not None:
            emb = emb * psw.reshape(-1, 1)
        if self.padding_idx is not None:  # padding entries go to an extra bag, dropped below
            ids = torch.where(input.reshape(-1) == self.padding_idx, n_bags, ids)
        out = self._reduce(emb, ids, n_bags)
        return out.reshape(*lead, self.embedding_dim)

    def _bags(self, input: Tensor, offsets: Tensor | None) -> tuple[Tensor, int, tuple[Any, ...]]:
        """The bag of each index (flat), the number of bags and the output's leading shape."""
        if input.dim() == 1:
            if offsets is None or offsets.dim() != 1:
                raise ValueError(
                    "EmbeddingBag: a 1-D input needs offsets, a 1-D tensor of the start of "
                    f"each bag; got {None if offsets is None else list(offsets.shape)}."
                )
            starts = offsets[:-1] if self.include_last_offset else offsets
            n = input.shape[0]
            marks = starts.new_zeros(n + 1).index_add(0, starts, torch.ones_like(starts))
            return marks.cumsum(0)[:n] - 1, starts.shape[0], (starts.shape[0],)
        if input.dim() == 0 or offsets is not None:
            raise ValueError(
                f"EmbeddingBag: input of shape {list(input.shape)} with offsets="
                f"{None if offsets is None else list(offsets.shape)}: a batched input "
                "(..., L) holds bags of L indices and takes no offsets; a 1-D input needs them."
            )
        *lead, length = input.shape
        n_bags = input.numel() // length if length else math.prod(lead)
        ids = torch.arange(n_bags, device=input.device).repeat_interleave(length)
        return ids, n_bags, tuple(lead)

    def _reduce(self, emb: Tensor, ids: Tensor, n_bags: int) -> Tensor:
        rows = emb.new_zeros(n_bags + 1, emb.shape[-1])
        if self.mode == "max":
            index = ids.unsqueeze(-1).expand_as(emb)
            return rows.scatter_reduce(0, index, emb, "amax", include_self=False)[:n_bags]
        sums = rows.index_add(0, ids, emb)[:n_bags]
        if self.mode == "sum":
            return sums
        count = emb.new_zeros(n_bags + 1).index_add(0, ids, emb.new_ones(ids.shape))[:n_bags]
        return sums / count.clamp(min=1).unsqueeze(-1)
