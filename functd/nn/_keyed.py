"""Keyed randomness for torch code run by ``FunctionalCall``: a torch-function mode.

A torch module that draws random numbers (``nn.Dropout``, ``F.dropout`` in a
forward, an RNN's inter-layer dropout, attention dropout, ``torch.rand``...)
reads torch's global generator. ``FunctionalCall`` runs such a module inside
``KeyedRandom(key)``: every random function the module calls is answered by a
draw from ``functd.random`` with ``fold_in(key, n)`` (``n`` counts the draws of
the call, in order), so the same key gives the same output, different keys
(and ``fd.vmap`` members) differ, and torch's global generator is neither read
nor advanced. It composes with ``torch.func`` transforms and ``torch.compile``:
the mode is entered inside the traced function and only calls pure functions.

A draw without a key raises ``KEY_NEEDED`` where it happens. A random function
functd has no keyed version of raises ``NOT_KEYED``. Random calls hidden inside
another torch function that the mode lets through are not seen by it; the
caller compares torch's generator state around an eager call to catch those
(``generator_state``).

Example:
    >>> with KeyedRandom(fd.random.key(0), "FunctionalCall(Net)"):
    ...     y = torch.nn.functional.dropout(torch.ones(4), 0.5)   # keyed mask
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .. import random as fr
from .._torch.ops import VF
from ._dropout import keyed_dropout
from ._rnn import run_stack

__all__ = ["KEY_NEEDED", "NOT_KEYED", "KeyedRandom", "generator_state"]

KEY_NEEDED = (
    "{owner}: {op} draws random numbers (the module is in training mode); functd hands "
    "randomness over as keys and never reads torch's global generator. Pass a key: "
    "m(params, td, key=fd.random.key(0)) (a fresh key each step: fd.random.fold_in(key, step)), "
    "or switch the model to eval mode (fd.nn.eval_mode(m), or model.eval() before wrapping it)."
)
NOT_KEYED = (
    "{owner}: {op} draws random numbers and functd has no keyed version of it, so it cannot run "
    "without torch's global generator. Replace it in the model (functd.random has uniform, "
    "normal, bernoulli, categorical, gumbel, randint, permutation), or run the model in eval mode."
)
GLOBAL_DRAW = (
    "{owner}: the module drew from torch's global generator through a function functd does not "
    "intercept (it runs inside another torch function), so the call was not pure. torch's "
    "generator was restored. Call the random function directly in forward (F.dropout, torch.rand, "
    "...: functd answers those with keyed draws), or run the model in eval mode."
)


class KeyedRandom(TorchFunctionMode):
    """Answer the random functions torch code calls with keyed draws.

    Args:
        key: a ``functd.random`` key, or None (then any draw raises ``KEY_NEEDED``).
        owner: the label errors start with (``FunctionalCall(BartModel)``).
    """

    def __init__(self, key: Tensor | None, owner: str) -> None:
        super().__init__()
        self.key = None if key is None else fr.as_key(key)
        self.owner = owner
        self.count = 0

    def next_key(self, op: str) -> Tensor:
        """The key of the next draw: ``fold_in(key, n)``."""
        if self.key is None:
            raise ValueError(KEY_NEEDED.format(owner=self.owner, op=op))
        k = fr.fold_in(self.key, self.count)
        self.count += 1
        return k

    def __torch_function__(self, func, types, args=(), kwargs=None):
        handler = _HANDLERS.get(func)
        if handler is None:
            return func(*args, **(kwargs or {}))
        return handler(self, *args, **(kwargs or {}))


def generator_state() -> tuple[Any, ...]:
    """Torch's default CPU generator state (and CUDA's when initialised): compared
    around an eager training call to catch draws the mode did not see."""
    cpu = torch.default_generator.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return cpu, torch.cuda.get_rng_state()
    return (cpu,)


def same_state(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def restore_state(state: tuple[Any, ...]) -> None:
    torch.default_generator.set_state(state[0])
    if len(state) > 1:
        torch.cuda.set_rng_state(state[1])


# ------------------------------------------------------------------ dropout family
def _dropout(mode, input, p=0.5, training=True, inplace=False):
    if not training or p == 0 or input.numel() == 0:
        return input
    return _apply(input, keyed_dropout(input, p, mode.next_key(f"F.dropout(p={p})")), inplace)


def _feature(mode, input, p, training, inplace, batched_dims, op, alpha=False):
    if not training or p == 0 or input.numel() == 0:
        return input
    x = input if input.dim() in batched_dims else input.unsqueeze(0)
    y = keyed_dropout(x, p, mode.next_key(f"{op}(p={p})"), feature=True, alpha=alpha)
    y = y if input.dim() in batched_dims else y.squeeze(0)
    return _apply(input, y, inplace)


def _apply(input: Tensor, out: Tensor, inplace: bool) -> Tensor:
    return input.copy_(out) if inplace else out


def _dropout1d(mode, input, p=0.5, training=True, inplace=False):
    return _feature(mode, input, p, training, inplace, (3,), "dropout1d")


def _dropout2d(mode, input, p=0.5, training=True, inplace=False):
    return _feature(mode, input, p, training, inplace, (3, 4), "dropout2d")


def _dropout3d(mode, input, p=0.5, training=True, inplace=False):
    return _feature(mode, input, p, training, inplace, (5,), "dropout3d")


def _alpha_dropout(mode, input, p=0.5, training=False, inplace=False):
    if not training or p == 0 or input.numel() == 0:
        return input
    y = keyed_dropout(input, p, mode.next_key(f"alpha_dropout(p={p})"), alpha=True)
    return _apply(input, y, inplace)


def _feature_alpha_dropout(mode, input, p=0.5, training=False, inplace=False):
    return _feature(
        mode, input, p, training, inplace, tuple(range(2, 9)), "feature_alpha_dropout", True
    )


def _aten_dropout(feature: bool, alpha: bool, inplace: bool, op: str) -> Callable[..., Any]:
    """``torch.dropout(input, p, train)`` and its feature/alpha/in-place siblings."""

    def handler(mode, input, p, train):
        if not train or p == 0 or input.numel() == 0:
            return input
        y = keyed_dropout(input, p, mode.next_key(f"{op}(p={p})"), feature=feature, alpha=alpha)
        return _apply(input, y, inplace)

    return handler


def _native_dropout(mode, input, p, train):
    if not train or p == 0 or input.numel() == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = fr.bernoulli(mode.next_key(f"native_dropout(p={p})"), 1.0 - p, input.shape)
    keep = keep.to(input.device)
    return input * (keep.to(input.dtype) / (1.0 - p)), keep


# ------------------------------------------------------------------ samplers
def _size(size: tuple[Any, ...]) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], list | tuple | torch.Size):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _place(t: Tensor, dtype: Any, device: Any, requires_grad: bool = False) -> Tensor:
    t = t.to(device=device) if device is not None else t
    return t.requires_grad_() if requires_grad else t


def _float(dtype: Any) -> torch.dtype:
    return dtype if dtype is not None else torch.get_default_dtype()


def _no_generator(op: str, generator: Any, mode: KeyedRandom) -> None:
    if generator is not None:
        raise ValueError(
            f"{mode.owner}: {op} was given a torch.Generator; under functd the draw comes from "
            "the call's key instead. Drop the generator argument."
        )


def _rand(mode, *size, generator=None, dtype=None, device=None, requires_grad=False, **_):
    _no_generator("torch.rand", generator, mode)
    u = fr.uniform(mode.next_key("torch.rand"), _size(size), dtype=_float(dtype))
    return _place(u, dtype, device, requires_grad)


def _randn(mode, *size, generator=None, dtype=None, device=None, requires_grad=False, **_):
    _no_generator("torch.randn", generator, mode)
    z = fr.normal(mode.next_key("torch.randn"), _size(size), dtype=_float(dtype))
    return _place(z, dtype, device, requires_grad)


def _like(sampler: Callable[..., Any], op: str) -> Callable[..., Any]:
    def handler(mode, input, *, dtype=None, device=None, requires_grad=False, **_):
        dt = dtype or input.dtype
        out = sampler(mode.next_key(op), tuple(input.shape), dtype=dt)
        return _place(out, dt, device or input.device, requires_grad)

    return handler


def _randint(mode, *args, generator=None, dtype=None, device=None, requires_grad=False, **kw):
    _no_generator("torch.randint", generator, mode)
    if "size" in kw:
        args = (*args, kw.pop("size"))
    if "high" in kw:
        args = (kw.pop("low", 0), kw.pop("high"), *args)
    low, high, size = (0, *args) if len(args) == 2 else args
    out = fr.randint(mode.next_key("torch.randint"), _size((size,)), low, high)
    return _place(out.to(dtype or torch.int64), None, device)


def _randint_like(mode, input, *args, dtype=None, device=None, **kw):
    low, high = (0, args[0]) if len(args) == 1 else args if args else (kw.get("low", 0), kw["high"])
    out = fr.randint(mode.next_key("torch.randint_like"), tuple(input.shape), low, high)
    return out.to(dtype=dtype or input.dtype, device=device or input.device)


def _randperm(mode, n, *, generator=None, dtype=torch.int64, device=None, **_):
    _no_generator("torch.randperm", generator, mode)
    out = fr.permutation(mode.next_key("torch.randperm"), int(n))
    return _place(out.to(dtype), None, device)


def _bernoulli(mode, input, p=None, *, generator=None, **_):
    _no_generator("torch.bernoulli", generator, mode)
    prob = input if p is None else p
    keep = fr.bernoulli(mode.next_key("bernoulli"), prob, tuple(input.shape))
    return keep.to(dtype=input.dtype, device=input.device)


def _bernoulli_(mode, self, p=0.5, *, generator=None):
    _no_generator("Tensor.bernoulli_", generator, mode)
    keep = fr.bernoulli(mode.next_key("Tensor.bernoulli_"), p, tuple(self.shape))
    return self.copy_(keep)


def _uniform_(mode, self, a=0.0, b=1.0, *, generator=None, **kw):
    _no_generator("Tensor.uniform_", generator, mode)
    a, b = kw.get("from", a), kw.get("to", b)
    u = fr.uniform(mode.next_key("Tensor.uniform_"), tuple(self.shape), self.dtype, a, b)
    return self.copy_(u)


def _normal_(mode, self, mean=0.0, std=1.0, *, generator=None):
    _no_generator("Tensor.normal_", generator, mode)
    z = fr.normal(mode.next_key("Tensor.normal_"), tuple(self.shape), self.dtype)
    return self.copy_(z * std + mean)


def _exponential_(mode, self, lambd=1.0, *, generator=None):
    _no_generator("Tensor.exponential_", generator, mode)
    e = fr.exponential(mode.next_key("Tensor.exponential_"), tuple(self.shape), self.dtype)
    return self.copy_(e / lambd)


def _normal(mode, mean, std=1.0, size=None, *, generator=None, dtype=None, device=None, **_):
    _no_generator("torch.normal", generator, mode)
    tensors = [t for t in (mean, std) if isinstance(t, Tensor)]
    if size is not None:
        shape = _size((size,))
    else:
        shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))
    dt = dtype or (tensors[0].dtype if tensors else _float(None))
    z = fr.normal(mode.next_key("torch.normal"), shape, dt)
    where = device or (tensors[0].device if tensors else None)
    return _place(z, None, where) * std + mean


def _multinomial(mode, input, num_samples, replacement=False, *, generator=None, **_):
    _no_generator("torch.multinomial", generator, mode)
    logits = input.log()
    key = mode.next_key("torch.multinomial")
    if replacement:
        shape = (num_samples, *input.shape[:-1])
        draw = fr.categorical(key, logits, axis=-1, shape=shape)
        return draw.movedim(0, -1)
    g = fr.gumbel(key, tuple(input.shape), input.dtype)
    return (logits + g).topk(num_samples, dim=-1).indices


def _rrelu(mode, input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False, **_):
    if not training:
        return F.leaky_relu(input, (lower + upper) / 2, inplace)
    a = fr.uniform(mode.next_key("rrelu"), tuple(input.shape), input.dtype, lower, upper)
    return _apply(input, torch.where(input >= 0, input, input * a), inplace)


def _gumbel_softmax(mode, logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
    g = fr.gumbel(mode.next_key("F.gumbel_softmax"), tuple(logits.shape), logits.dtype)
    y = ((logits + g) / tau).softmax(dim)
    if not hard:
        return y
    index = y.max(dim, keepdim=True)[1]
    y_hard = torch.zeros_like(logits).scatter_(dim, index, 1.0)
    return y_hard - y.detach() + y


def _refuse(op: str) -> Callable[..., Any]:
    def handler(mode, *args, **kwargs):
        raise NotImplementedError(NOT_KEYED.format(owner=mode.owner, op=op))

    return handler


# ------------------------------------------------------------------ RNN inter-layer dropout
def _rnn(name: str) -> Callable[..., Any]:
    """``_VF.lstm/gru/rnn_*`` with inter-layer dropout in training: run layer by layer
    (the same fused op, one layer each, no dropout) with keyed dropout in between.
    Padded inputs the fused op cannot take (under vmap, compiling) run functd's loop
    over time instead (``_rnn.run_stack``)."""
    fused = getattr(VF, name)
    lstm = name == "lstm"  # its state is a pair (h, c); the others' one tensor

    def handler(mode, *args):
        packed = isinstance(args[1], Tensor) if lstm else not isinstance(args[2], list | tuple)
        if packed:  # (data, batch_sizes, hx, params, bias, layers, dropout, train, bidir)
            data, sizes, hx, weights, bias, layers, p, train, bidir = args
            tail: tuple[Any, ...] = ()
        else:  # (input, hx, params, bias, layers, dropout, train, bidir, batch_first)
            data, hx, weights, bias, layers, p, train, bidir, *tail = args
        func = _packed(fused, mode.owner, name) if packed else functools.partial(run_stack, name)
        if not train or p == 0 or layers == 1:
            return func(*args)
        dirs = 2 if bidir else 1
        per = len(weights) // (layers * dirs)
        x, finals = data, []
        for i in range(layers):
            rows = slice(i * dirs, (i + 1) * dirs)
            h = [s[rows] for s in hx] if lstm else hx[rows]
            head = (x, sizes, h) if packed else (x, h)
            w = weights[i * dirs * per : (i + 1) * dirs * per]
            out = func(*head, w, bias, 1, 0.0, train, bidir, *tail)
            x = out[0]
            finals.append(out[1:])
            if i < layers - 1:
                x = keyed_dropout(x, p, mode.next_key(f"{name} inter-layer dropout(p={p})"))
        return (x, *(torch.cat(parts, 0) for parts in zip(*finals)))

    return handler


PACKED_BATCHED = (
    "{owner}: {module} on a PackedSequence cannot run under vmap: the fused op has no "
    "batching rule and functd's loop over time takes padded batches only. Pass the padded "
    "batch (torch.nn.utils.rnn.pad_packed_sequence) and mask the padded steps, or loop "
    "over the members."
)


def _packed(fused: Callable[..., Any], owner: str, name: str) -> Callable[..., Any]:
    """The fused op on a PackedSequence's data, with ``PACKED_BATCHED`` for vmap's
    missing batching rule (torch's message names no way around it)."""

    def call(*args: Any) -> Any:
        try:
            return fused(*args)
        except RuntimeError as e:
            if "Batching rule not implemented" not in str(e):
                raise
            module = "nn." + name.split("_")[0].upper()  # rnn_tanh: nn.RNN
            raise NotImplementedError(PACKED_BATCHED.format(owner=owner, module=module)) from e

    return call


# ------------------------------------------------------------------ attention
def _sdpa(mode, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
    if dropout_p == 0.0:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, **kw
        )
    from ._sdpa import scaled_dot_product_attention

    k = mode.next_key(f"F.scaled_dot_product_attention(dropout_p={dropout_p})")
    return scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, **kw, key=k
    )


def _mha_forward(mode, *args, **kwargs):
    bound = _MHA_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if not a["training"] or a["dropout_p"] == 0.0:
        return F.multi_head_attention_forward(*args, **kwargs)
    from ._mha import multi_head_attention_forward

    k = mode.next_key(f"F.multi_head_attention_forward(dropout_p={a['dropout_p']})")
    # every argument positionally, in torch's order (its attention `key` is ours `key_`)
    return multi_head_attention_forward(*a.values(), key=k)


_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)
_T = torch.Tensor
_HANDLERS: dict[Any, Callable[..., Any]] = {
    F.dropout: _dropout,
    F.dropout1d: _dropout1d,
    F.dropout2d: _dropout2d,
    F.dropout3d: _dropout3d,
    F.alpha_dropout: _alpha_dropout,
    F.feature_alpha_dropout: _feature_alpha_dropout,
    torch.dropout: _aten_dropout(False, False, False, "torch.dropout"),
    torch.dropout_: _aten_dropout(False, False, True, "torch.dropout_"),
    torch.feature_dropout: _aten_dropout(True, False, False, "torch.feature_dropout"),
    torch.feature_dropout_: _aten_dropout(True, False, True, "torch.feature_dropout_"),
    torch.alpha_dropout: _aten_dropout(False, True, False, "torch.alpha_dropout"),
    torch.alpha_dropout_: _aten_dropout(False, True, True, "torch.alpha_dropout_"),
    torch.feature_alpha_dropout: _aten_dropout(True, True, False, "torch.feature_alpha_dropout"),
    torch.feature_alpha_dropout_: _aten_dropout(True, True, True, "torch.feature_alpha_dropout_"),
    torch.native_dropout: _native_dropout,
    torch.rand: _rand,
    torch.randn: _randn,
    torch.rand_like: _like(fr.uniform, "torch.rand_like"),
    torch.randn_like: _like(fr.normal, "torch.randn_like"),
    torch.randint: _randint,
    torch.randint_like: _randint_like,
    torch.randperm: _randperm,
    torch.normal: _normal,
    torch.bernoulli: _bernoulli,
    _T.bernoulli: _bernoulli,
    _T.bernoulli_: _bernoulli_,
    _T.uniform_: _uniform_,
    _T.normal_: _normal_,
    _T.exponential_: _exponential_,
    torch.multinomial: _multinomial,
    _T.multinomial: _multinomial,
    F.rrelu: _rrelu,
    torch.rrelu: _rrelu,
    F.gumbel_softmax: _gumbel_softmax,
    VF.lstm: _rnn("lstm"),
    VF.gru: _rnn("gru"),
    VF.rnn_tanh: _rnn("rnn_tanh"),
    VF.rnn_relu: _rnn("rnn_relu"),
    F.scaled_dot_product_attention: _sdpa,
    F.multi_head_attention_forward: _mha_forward,
}
for _name in ("random_", "cauchy_", "log_normal_", "geometric_"):
    _HANDLERS[getattr(_T, _name)] = _refuse(f"Tensor.{_name}")
for _fn in (torch.poisson, F.fractional_max_pool2d, F.fractional_max_pool3d, torch.rrelu_):
    _HANDLERS[_fn] = _refuse(getattr(_fn, "__name__", repr(_fn)))
del _name, _fn
