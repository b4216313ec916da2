"""The per-step math of the optimizers, on flat lists of leaves, and the one
transformation that runs any of them.

Each kernel is two functions: ``buffers(**hp)`` (the per-parameter statistics
it keeps, with their initial value) and ``step(g, bufs, t, fe, **hp)``, which returns
``(direction, new statistics, factor, fresh)``: the direction is
``factor * direction`` (``factor`` None means 1; folding it into the learning
rate saves a pass over the leaves), and ``fresh`` says the direction list was
allocated by the kernel alone (so the caller may scale it in place). ``t`` is
the new step count as a float tensor under ``torch.compile``, ``vmap`` and on
accelerators (bias corrections never recompile nor sync), a Python float on the
eager CPU path (fewer tiny tensor ops; CPU reads cost no sync). The same kernel serves
the building block (``scale_by_adam``: the direction only) and the optimizer
(``adam``: weight decay and the learning rate around it), so the two agree by
construction.

The formulas follow ``torch.optim`` (the kernel docstrings say where optax
differs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._td import TensorDict
from .._td._tree import unflatten_like
from . import _errors as E
from . import _listops as L
from ._base import GradientTransformation, transformation
from ._checks import is_zero


# ------------------------------------------------------------------ kernels
def _sgd_buffers(*, momentum, dampening, nesterov) -> dict[str, Any]:
    return {} if is_zero(momentum) else {"momentum_buffer": 0.0}


def _sgd_step(g, bufs, t, fe, *, momentum, dampening, nesterov):
    """torch.optim.SGD: ``buf = momentum * buf + (1 - dampening) * g``, except at the
    first step where ``buf = g`` (no dampening); nesterov uses ``g + momentum * buf``.
    (optax's ``trace`` has no dampening and no first-step rule.)"""
    if not bufs:
        return g, {}, None, False
    buf = bufs["momentum_buffer"]
    if is_zero(dampening):  # buf starts at 0, so the first step gives g exactly
        new = L.axpy(momentum, buf, g, fe)
    else:
        c = 1 - dampening * ((t > 1).to(t.dtype) if isinstance(t, Tensor) else float(t > 1))
        new = L.add(L.scale(momentum, buf, fe), L.scale(c, g, fe), fe)
    if nesterov:
        return L.axpy(momentum, new, g, fe), {"momentum_buffer": new}, None, True
    return new, {"momentum_buffer": new}, None, False


def _adam_buffers(*, b1, b2, eps, amsgrad) -> dict[str, Any]:
    out = {"exp_avg": 0.0, "exp_avg_sq": 0.0}
    if amsgrad:
        out["max_exp_avg_sq"] = 0.0
    return out


def _adam_step(g, bufs, t, fe, *, b1, b2, eps, amsgrad):
    """torch.optim.Adam: ``m / (1 - b1^t) / (sqrt(v) / sqrt(1 - b2^t) + eps)``
    (``eps`` outside the square root, after the bias correction, as optax's
    ``eps``); amsgrad keeps the running max of the uncorrected ``v``. Computed as
    ``m / (sqrt(v) + eps * sqrt(1 - b2^t))`` times ``sqrt(1 - b2^t) / (1 - b1^t)``
    (the same number, fewer passes over the leaves)."""
    m = L.ema(b1, bufs["exp_avg"], g, fe)
    v = L.ema_sq(b2, bufs["exp_avg_sq"], g, fe)
    new = {"exp_avg": m, "exp_avg_sq": v}
    if amsgrad:
        v = new["max_exp_avg_sq"] = L.maximum(bufs["max_exp_avg_sq"], v, fe)
    bc1 = 1 - b1**t
    bc2_sqrt = (1 - b2**t) ** 0.5
    denom = L.add_fresh(L.sqrt(v, fe), eps * bc2_sqrt, fe, fresh=True)
    return L.div(m, denom, fe), new, bc2_sqrt / bc1, True


def _rmsprop_buffers(*, alpha, eps, momentum, centered) -> dict[str, Any]:
    out = {"square_avg": 0.0}
    if centered:
        out["grad_avg"] = 0.0
    if not is_zero(momentum):
        out["momentum_buffer"] = 0.0
    return out


def _rmsprop_step(g, bufs, t, fe, *, alpha, eps, momentum, centered):
    """torch.optim.RMSprop: ``g / (sqrt(v) + eps)`` (eps outside the root; optax's
    ``scale_by_rms`` puts it inside), ``v`` the running mean of ``g**2`` (minus the
    squared running mean of ``g`` when centered); with momentum,
    ``buf = momentum * buf + g / (sqrt(v) + eps)``."""
    v = L.ema_sq(alpha, bufs["square_avg"], g, fe)
    new = {"square_avg": v}
    if centered:
        ga = new["grad_avg"] = L.ema(alpha, bufs["grad_avg"], g, fe)
        v = L.sub(v, L.mul(ga, ga, fe), fe)
    d = L.div(g, L.add_fresh(L.sqrt(v, fe), eps, fe, fresh=True), fe)
    if "momentum_buffer" in bufs:
        buf = L.add(L.scale(momentum, bufs["momentum_buffer"], fe), d, fe)
        new["momentum_buffer"] = buf
        return buf, new, None, False
    return d, new, None, True


def _adagrad_buffers(*, lr_decay, initial_accumulator_value, eps) -> dict[str, Any]:
    return {"sum": initial_accumulator_value}


def _adagrad_step(g, bufs, t, fe, *, lr_decay, initial_accumulator_value, eps):
    """torch.optim.Adagrad: ``sum += g**2``; ``g / (sqrt(sum) + eps)``, divided by
    ``1 + (t - 1) * lr_decay``."""
    s = L.add(bufs["sum"], L.mul(g, g, fe), fe)
    d = L.div(g, L.add_fresh(L.sqrt(s, fe), eps, fe, fresh=True), fe)
    factor = None if is_zero(lr_decay) else 1 / (1 + (t - 1) * lr_decay)
    return d, {"sum": s}, factor, True


def _lion_buffers(*, b1, b2) -> dict[str, Any]:
    return {"exp_avg": 0.0}


def _lion_step(g, bufs, t, fe, *, b1, b2):
    """Lion (Chen et al. 2023, Algorithm 2): ``sign(b1 * m + (1 - b1) * g)``, then
    ``m = b2 * m + (1 - b2) * g``."""
    m = bufs["exp_avg"]
    d = L.sign(L.ema(b1, m, g, fe), fe)
    return d, {"exp_avg": L.ema(b2, m, g, fe)}, None, True


KERNELS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "sgd": (_sgd_buffers, _sgd_step),
    "adam": (_adam_buffers, _adam_step),
    "rmsprop": (_rmsprop_buffers, _rmsprop_step),
    "adagrad": (_adagrad_buffers, _adagrad_step),
    "lion": (_lion_buffers, _lion_step),
}


# ------------------------------------------------------------------ transformation
def _init(params: TensorDict, *, name: str, kernel: str, lr, weight_decay, decoupled, **hp):
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    spec = params
    entries: dict[str, Any] = {"count": L.new_count(leaves)}
    for b, fill in KERNELS[kernel][0](**hp).items():
        entries[b] = unflatten_like(spec, [_full_like(x, fill) for x in leaves])
    return L.state_td(entries)


def _full_like(x: Tensor, fill: Any) -> Tensor:
    if isinstance(fill, Tensor):
        return torch.zeros_like(x) + fill.to(x.dtype)
    return torch.zeros_like(x) if fill == 0 else torch.full_like(x, fill)


def _update(updates, state, params=None, *, name, kernel, lr, weight_decay, decoupled, **hp):
    where = f"fd.optim.{name}.update"
    buffers_fn, step_fn = KERNELS[kernel]
    names = tuple(buffers_fn(**hp))
    L.check_state(where, state, ("count", *names))
    g, spec = L.checked_leaves(where, "grads", updates)
    bufs = {}
    for b in names:
        sub = state._data[b]
        leaves, bspec = L.checked_leaves(where, f"opt_state[{b!r}]", sub)
        L.check_same(where, "grads", g, spec, f"opt_state[{b!r}]", leaves, bspec, updates, sub)
        bufs[b] = leaves
    decay = not is_zero(weight_decay)
    if decay:
        if params is None:
            raise ValueError(E.needs_params(where, f"weight_decay={weight_decay!r}"))
        p, pspec = L.checked_leaves(where, "params", params)
        L.check_same(where, "grads", g, spec, "params", p, pspec, updates, params)
    stored = bufs
    dtypes = _step_dtypes(g, stored, p if decay else None)
    if dtypes is not None:  # mixed precision: compute in the promoted dtype of each leaf
        g = _cast(g, dtypes)
        bufs = {b: _cast(bufs[b], dtypes) for b in names}
        if decay:
            p = _cast(p, dtypes)
    fe = L.foreach(g)
    count = state._data["count"]
    new_count = count + 1
    dtype = L.scalar_dtype(g)
    if decay and not decoupled:
        g = L.axpy(weight_decay, p, g, fe)
    # the step count as a float: a Python number on the eager CPU path (as
    # torch.optim's default, non-capturable step), else a tensor (no sync, no
    # recompilation, capturable in a CUDA graph)
    t = float(new_count) if fe and new_count.device.type == "cpu" else new_count.to(dtype)
    d, new, factor, fresh = step_fn(g, bufs, t, fe, **hp)
    neg_lr = None
    if lr is not None:
        lr_t = lr(count.to(dtype)) if callable(lr) else lr
        neg_lr = -lr_t
    if decay and decoupled:
        d = L.scale_fresh(d, factor, fe, fresh)
        fresh = fresh or factor is not None
        d = L.axpy(weight_decay, p, d, fe) if not (fe and fresh) else _axpy_(weight_decay, p, d)
        d = L.scale_fresh(d, neg_lr, fe, True)
    else:
        d = L.scale_fresh(d, _times(factor, neg_lr), fe, fresh)
    if dtypes is not None:  # the statistics keep their dtype (that of the params)
        new = {b: _cast(new[b], [x.dtype for x in stored[b]]) for b in names}
    entries = {"count": new_count, **{b: unflatten_like(spec, new[b]) for b in names}}
    return unflatten_like(spec, d), L.state_td(entries)


def _step_dtypes(g: list[Tensor], bufs: dict[Any, Any], p: list[Tensor] | None) -> list[Any] | None:
    """Per leaf, the dtype a step computes in when the grads, the statistics and the
    params read (``p``) do not all agree: their promoted dtype (so float16 grads
    and float32 params step in float32, as optax's type promotion does); None
    when every leaf agrees already (the common case: nothing is cast)."""
    lists = [*bufs.values(), *([p] if p is not None else [])]
    dtypes = [x.dtype for x in g]
    if all([y.dtype for y in ys] == dtypes for ys in lists):  # one pass a list
        return None
    out = []
    for i, x in enumerate(g):
        dt = x.dtype
        for ys in lists:
            dt = torch.promote_types(dt, ys[i].dtype)
        out.append(dt)
    return out


def _cast(xs: list[Tensor], dtypes: list[Any]) -> list[Tensor]:
    return [x if x.dtype == d else x.to(d) for x, d in zip(xs, dtypes)]


def _times(a, b):
    if a is None:
        return b
    return a if b is None else a * b


def _axpy_(a, xs, ys):
    """``ys += a * xs`` on a fresh foreach list (``a`` a number or 0-dim tensor)."""
    if isinstance(a, Tensor):
        torch._foreach_add_(ys, torch._foreach_mul(xs, a))
    else:
        torch._foreach_add_(ys, xs, alpha=a)
    return ys


def kernel_transformation(
    name: str,
    kernel: str,
    *,
    lr: Any = None,
    weight_decay: Any = 0.0,
    decoupled: bool = False,
    **hp: Any,
) -> GradientTransformation:
    """The transformation running ``KERNELS[kernel]``, with optional weight decay
    (added to the gradient, or to the direction when ``decoupled``) and learning
    rate (``-lr * direction``; ``lr`` may be a schedule of the step count)."""
    return transformation(
        name,
        _init,
        _update,
        kernel=kernel,
        lr=lr,
        weight_decay=weight_decay,
        decoupled=decoupled,
        **hp,
    )
