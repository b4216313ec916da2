"""Embedding: a lookup table of learned vectors."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer, ParamSpec, normal

__all__ = ["Embedding"]


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
        idx = self.padding_idx
        if idx is not None:
            n = self.num_embeddings
            if not -n <= idx < n:
                raise ValueError("padding_idx must be within num_embeddings")
            object.__setattr__(self, "padding_idx", idx % n)

    def _specs(self) -> dict[str, Any]:
        return {"weight": ParamSpec((self.num_embeddings, self.embedding_dim), self._init_weight)}

    def _init_weight(self, key: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        w = normal()(key, shape, dtype)
        if self.padding_idx is None:
            return w
        row = torch.tensor([self.padding_idx], device=w.device)
        return w.index_fill(-2, row, 0.0)

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
