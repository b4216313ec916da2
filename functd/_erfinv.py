"""XLA's float32 ``erf_inv`` (Giles' polynomials), the core of ``fd.random.normal``.

jax draws a normal as ``sqrt(2) * erf_inv(u)`` with XLA's polynomial; computing it
op for op in torch keeps ``fd.random.normal`` bit-equal to ``jax.random.normal``
(torch.erfinv is more accurate in the tails, so it would differ there). The fused
kernel (``_fused_ext.c``, ``MODE_ERFINV``) evaluates the same polynomial.

Example:
    >>> sqrt2_erfinv(torch.tensor([0.0, 0.5]), torch.float32)
    tensor([0.0000, 0.6745])
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ._eager import plain_tensor

__all__ = ["erfinv32", "sqrt2_erfinv"]

# Giles' single-precision erfinv coefficients for w < 5 and w >= 5, as in XLA.
_ERFINV_LT = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
              0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)  # fmt: skip
_ERFINV_GT = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
              0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)  # fmt: skip

_COEFS: dict[Any, Any] = {}


def _erfinv_coefs(ndim: int, device: torch.device) -> tuple[Tensor, ...]:
    """The (2, 1, ..., 1) float32 coefficient pairs of both polynomials (cached, read-only)."""
    out = _COEFS.get((ndim, device))
    if out is None:
        both = torch.tensor([_ERFINV_LT, _ERFINV_GT], dtype=torch.float32, device=device)
        out = tuple(both[:, i].reshape(2, *[1] * ndim) for i in range(both.shape[1]))
        _COEFS[(ndim, device)] = out
    return out


def erfinv32(x: Tensor) -> Tensor:
    """XLA's float32 ``erf_inv`` (Giles' polynomials, both evaluated everywhere).

    torch.erfinv is more accurate in the tails, where XLA's is up to ~90 ulp off.
    """
    ip = plain_tensor(x)  # x is a fresh buffer of ours
    w = torch.mul(x, x).neg_().log1p_().neg_() if ip else -torch.log1p(x * -x)
    lt, edge = w < 5.0, torch.isinf(w)  # edge: |x| == 1
    wg = torch.sqrt(w) - 3.0
    wl = w.sub_(2.5) if ip else w - 2.5
    if ip:  # both polynomials at once on a stacked buffer: half the tiny ops
        coefs = _erfinv_coefs(w.ndim, w.device)
        ws = torch.stack([wl, wg])
        p = torch.empty_like(ws).copy_(coefs[0])
        for c in coefs[1:]:
            p.mul_(ws).add_(c)
        return torch.where(lt, p[0], p[1]).masked_fill_(edge, math.inf).mul_(x)
    pl, pg = torch.full_like(w, _ERFINV_LT[0]), torch.full_like(w, _ERFINV_GT[0])
    for a, b in zip(_ERFINV_LT[1:], _ERFINV_GT[1:]):
        pl, pg = a + pl * wl, b + pg * wg
    return torch.where(lt, pl, pg).masked_fill(edge, math.inf) * x


def sqrt2_erfinv(u: Tensor, dtype: torch.dtype) -> Tensor:
    """``sqrt(2) * erf_inv(u)`` as jax computes it (16-bit floats via float32, like XLA)."""
    sqrt2 = torch.full((), math.sqrt(2.0), dtype=dtype, device=u.device)  # no host copy
    if dtype == torch.float64:
        return torch.erfinv(u) * sqrt2
    z = erfinv32(u.float()).to(dtype)
    return z.mul_(sqrt2) if plain_tensor(z) else z * sqrt2
