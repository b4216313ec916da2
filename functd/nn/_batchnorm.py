"""BatchNorm1d/2d/3d: batch normalisation that returns its new running statistics.

The running statistics are entries of ``params`` (named like the torch
module's ``state_dict()``: ``running_mean``, ``running_var``,
``num_batches_tracked``), so ``fd.from_module``/``fd.to_module`` move them
with the weights. They are never written: in training mode the layer returns
``(y, new_state)``, where ``new_state`` is a TensorDict of the new
statistics; ``functd.nn.update_state(params, new_state)`` puts them in new
params. See ``notes/stateful.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict, from_parts
from ._base import Layer, ParamSpec, constant

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]

_ONES, _ZEROS = constant(1.0), constant(0.0)
_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _zero_count(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """``num_batches_tracked``: an int64 zero whatever the params dtype (as torch's)."""
    return torch.zeros((*key.shape[:-1], *shape), dtype=torch.long, device=key.device)


@dataclasses.dataclass(frozen=True)
class _BatchNorm(Layer):
    """Normalise ``(N, C, *)`` over every dim but ``C``; as ``torch.nn.BatchNorm*``.

    Args:
        num_features: ``C``.
        eps: added to the variance.
        momentum: weight of the batch statistics in the running average; None
            for a cumulative average (``1 / num_batches_tracked``), as torch.
        affine: learn per-channel ``weight`` (ones) and ``bias`` (zeros).
        track_running_stats: keep ``running_mean``/``running_var``/
            ``num_batches_tracked`` in params; without them the batch
            statistics are used in both modes, as torch.
        training: training mode (normalise with the batch statistics and
            return the new running statistics) or eval mode (normalise with
            the running statistics). ``functd.nn.eval_mode`` switches it.

    Returns (from a call):
        ``y`` in eval mode or without running statistics; ``(y, new_state)``
        in training mode with running statistics, where ``new_state`` is a
        TensorDict of ``running_mean``, ``running_var``, ``num_batches_tracked``.

    Raises:
        ValueError: the input has fewer than 2 dims, its dim 1 is not
            ``num_features``, or (training) a channel has a single value.
    """

    num_features: int
    eps: float = 1e-5
    momentum: float | None = 0.1
    affine: bool = True
    track_running_stats: bool = True
    training: bool = True

    def _specs(self) -> dict[str, Any]:
        c = (self.num_features,)
        specs: dict[str, Any] = {}
        if self.affine:
            specs["weight"] = ParamSpec(c, _ONES)
            specs["bias"] = ParamSpec(c, _ZEROS)
        if self.track_running_stats:
            specs["running_mean"] = ParamSpec(c, _ZEROS)
            specs["running_var"] = ParamSpec(c, _ONES)
            specs["num_batches_tracked"] = ParamSpec((), _zero_count)
        return specs

    @property
    def stateful(self) -> bool:
        """True when a call returns ``(y, new_state)`` (training with running stats)."""
        return self.training and self.track_running_stats

    def buffer_paths(self) -> tuple[tuple[str, ...], ...]:
        """The entries of params that are statistics, not trainable parameters."""
        return tuple((b,) for b in _BUFFERS) if self.track_running_stats else ()

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | None = None) -> Any:
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}): expected an input of shape "
                f"(N, {self.num_features}, *), got {list(x.shape)}. The channels are dim 1; "
                "under vmap the shape is the per-member one."
            )
        d = params._data
        w, b = d.get("weight"), d.get("bias")
        if not self.track_running_stats:
            return F.batch_norm(x, None, None, w, b, True, 0.0, self.eps)
        rm, rv = d["running_mean"], d["running_var"]
        if not self.training:
            return F.batch_norm(x, rm, rv, w, b, False, 0.0, self.eps)
        y = F.batch_norm(x, None, None, w, b, True, 0.0, self.eps)
        # two passes, as torch's CPU kernel (and ~3x faster than var_mean over dim 0)
        xd = x.detach()
        dims = [0, *range(2, x.dim())]
        mean = xd.mean(dims, keepdim=True)
        dev = xd - mean
        var = (dev * dev).sum(dims) / (xd.numel() // self.num_features - 1)
        mean = mean.reshape(self.num_features)
        count = d["num_batches_tracked"] + 1
        # torch: new = (1 - m) * old + m * batch; lerp computes it in one op
        m = self.momentum if self.momentum is not None else 1.0 / count.to(rm.dtype)
        new_rm = torch.lerp(rm, mean.to(rm.dtype), m)
        new_rv = torch.lerp(rv, var.to(rv.dtype), m)
        state = {"running_mean": new_rm, "running_var": new_rv, "num_batches_tracked": count}
        return y, from_parts(state, torch.Size([]))


@dataclasses.dataclass(frozen=True)
class BatchNorm1d(_BatchNorm):
    """Batch normalisation of ``(N, C)`` or ``(N, C, L)``; as ``torch.nn.BatchNorm1d``.

    In training mode a call returns ``(y, new_state)`` (the new running
    statistics); nothing is written. The BatchNorm classes compute the same
    function of any ``(N, C, *)`` input and differ only in the torch module
    they mirror.

    Example:
        >>> bn = BatchNorm1d(3)
        >>> params = bn.init(0)
        >>> y, new_state = bn(params, torch.randn(8, 3))
        >>> params = functd.nn.update_state(params, new_state)
        >>> y = BatchNorm1d(3, training=False)(params, torch.randn(8, 3))
    """


@dataclasses.dataclass(frozen=True)
class BatchNorm2d(_BatchNorm):
    """Batch normalisation of ``(N, C, H, W)``; as ``torch.nn.BatchNorm2d``.

    In training mode a call returns ``(y, new_state)``; see ``BatchNorm1d``.

    Example:
        >>> bn = BatchNorm2d(3, training=False)
        >>> bn(bn.init(0), torch.randn(2, 3, 4, 4)).shape
        torch.Size([2, 3, 4, 4])
    """


@dataclasses.dataclass(frozen=True)
class BatchNorm3d(_BatchNorm):
    """Batch normalisation of ``(N, C, D, H, W)``; as ``torch.nn.BatchNorm3d``.

    In training mode a call returns ``(y, new_state)``; see ``BatchNorm1d``.

    Example:
        >>> bn = BatchNorm3d(2, training=False)
        >>> bn(bn.init(0), torch.randn(2, 2, 3, 3, 3)).shape
        torch.Size([2, 2, 3, 3, 3])
    """
