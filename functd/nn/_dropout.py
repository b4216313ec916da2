"""Dropout with an explicit PRNG key."""

from __future__ import annotations

import dataclasses

from torch import Tensor

from .. import random as fr
from .._td import TensorDict
from ._base import Layer, as_key

__all__ = ["Dropout", "keyed_dropout"]

_ALPHA = 1.7580993408473766  # SELU's alpha * lambda, as ATen's alpha_dropout

KEY_REQUIRED = (
    "Dropout(p={p}) needs a PRNG key in training mode: pass one at call time, e.g. "
    "`m(params, td, key=fd.random.key(0))` (split a fresh key for each step), or switch "
    "it to eval mode to make it the identity: `fd.nn.eval_mode(m)`, "
    "`Dropout({p}, training=False)`, or lower a module in eval() mode."
)


@dataclasses.dataclass(frozen=True)
class Dropout(Layer):
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)``.

    The mask is ``functd.random.bernoulli(key, 1 - p, x.shape)``: the same key
    gives the same mask; torch's global generator is never used.

    Args:
        p: the probability of zeroing an element, in ``[0, 1]``.
        training: training mode (the default, as a new ``nn.Dropout``); when False
            the layer is the identity (torch's ``eval()`` mode) and needs no key.
            Keyword-only; ``functd.nn.eval_mode``/``train_mode`` switch it.

    Raises:
        ValueError: ``p`` is outside ``[0, 1]``; or, at call time, ``key`` is
            missing while the layer is random.

    Example:
        >>> drop = Dropout(0.5)
        >>> y = drop(drop.init(0), torch.ones(4), key=functd.random.key(0))
        >>> Dropout(0.5, training=False)(drop.init(0), torch.ones(2)).tolist()
        [1.0, 1.0]
    """

    p: float = 0.5
    training: bool = dataclasses.field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"Dropout probability has to be between 0 and 1, but got {self.p}")

    @property
    def random(self) -> bool:  # type: ignore[override]
        """True in training mode with ``p > 0``: then the call needs a ``key``."""
        return self.training and self.p > 0.0

    def __call__(self, params: TensorDict, x: Tensor, *, key: Tensor | int | None = None) -> Tensor:
        p = self.p
        if not self.training or p == 0.0:
            return x
        if key is None:
            raise ValueError(KEY_REQUIRED.format(p=p))
        return keyed_dropout(x, p, key)


def keyed_dropout(
    x: Tensor, p: float, key: Tensor | int, *, feature: bool = False, alpha: bool = False
) -> Tensor:
    """Torch's dropout arithmetic (ATen's ``_dropout_impl``) with a keyed mask.

    ``keep = bernoulli(key, 1 - p)`` over ``x``'s shape (``feature``: over its first
    two dims, one draw per channel, as ``dropout2d``); the result is
    ``x * (keep / (1 - p))``, or with ``alpha`` (``alpha_dropout``, which keeps
    SELU's mean and variance) ``x * (keep * a) + (keep - 1) * alpha * a + alpha * a * p``.
    ``p == 1`` gives ``x * 0`` (keeping NaNs and the autograd graph), as torch.

    Example:
        >>> keyed_dropout(torch.ones(4), 0.5, fd.random.key(0))
        tensor([0., 0., 2., 2.])
    """
    if p == 1.0:
        return x * x.new_zeros(())
    shape = (*x.shape[:2], *(1,) * (x.dim() - 2)) if feature else x.shape
    key = as_key(key)
    if key.device != x.device:
        key = key.to(x.device)
    noise = fr.bernoulli(key, 1.0 - p, shape).to(x.dtype)
    if not alpha:
        return x * (noise / (1.0 - p))  # torch: x * (mask / (1 - p))
    a = 1.0 / ((_ALPHA * _ALPHA * p + 1) * (1 - p)) ** 0.5
    b = (noise - 1) * (_ALPHA * a) + _ALPHA * a * p
    return x * (noise * a) + b
