"""Attention: fd.nn.MultiheadAttention, multi_head_attention_forward and
scaled_dot_product_attention against torch's (values and gradients, float64, every
option), and their keyed attention dropout (reproducible, pure, vmap, grad, compile)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import functd as fd
import functd.nn as fnn
import functd.random as fr
from functd.nn._convert import flat_state

D = torch.float64
H, E = 2, 8  # heads, embed dim


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=D)


# ------------------------------------------------------------- layer vs torch
MODULES = {
    "plain": {},
    "nobias": {"bias": False},
    "biaskv_zeroattn": {"add_bias_kv": True, "add_zero_attn": True},
    "kvdim": {"kdim": 3, "vdim": 5},
    "kvdim_biaskv": {"kdim": 3, "vdim": 5, "add_bias_kv": True},
}
MASKS = [
    "none",
    "attn_bool2d",
    "attn_bool3d",
    "attn_float",
    "pad_bool",
    "pad_float",
    "both_bool",
    "both_float",
    "causal",
]
WEIGHTS = ["avg", "per_head", "none"]  # need_weights=True (average or not), need_weights=False


def _masks(kind: str, n: int, L: int, S: int, batched: bool) -> dict:
    """Masks that leave key 0 visible to every query (no fully masked row)."""
    bool2d = torch.rand(L, S) < 0.4
    bool2d[:, 0] = False
    bool3d = torch.rand(n * H, L, S) < 0.4
    bool3d[..., 0] = False
    pad = torch.zeros(n, S, dtype=torch.bool)
    pad[-1, S // 2 :] = True
    if not batched:
        pad = pad[0]
    fl = lambda m: torch.zeros(m.shape, dtype=D).masked_fill(m, -1e9) + 0.1 * r(*m.shape)  # noqa: E731
    return {
        "none": {},
        "attn_bool2d": {"attn_mask": bool2d},
        "attn_bool3d": {"attn_mask": bool3d},
        "attn_float": {"attn_mask": r(L, S)},
        "pad_bool": {"key_padding_mask": pad},
        "pad_float": {"key_padding_mask": fl(pad)},
        "both_bool": {"attn_mask": bool2d, "key_padding_mask": pad},
        "both_float": {"attn_mask": fl(bool3d), "key_padding_mask": fl(pad)},
        "causal": {"attn_mask": torch.ones(L, S, dtype=torch.bool).triu(1), "is_causal": True},
    }[kind]


def _case(mod: str, mask: str, weights: str, unbatched: bool = False):
    """(module, args, kwargs): inputs shared as torch's fast paths expect them."""
    cfg = MODULES[mod]
    i = list(MODULES).index(mod) + MASKS.index(mask) + WEIGHTS.index(weights)
    batch_first = i % 2 == 0
    m = nn.MultiheadAttention(E, H, batch_first=batch_first, **cfg).to(D)
    n, L = 3, 4
    S = L if mask == "causal" else 5
    kdim, vdim = cfg.get("kdim", E), cfg.get("vdim", E)

    def x(length, dim):
        if unbatched:
            return r(length, dim)
        return r(n, length, dim) if batch_first else r(length, n, dim)

    q = x(L, E)
    sharing = "qkv" if "kdim" in cfg else ["self", "kv", "qkv"][i % 3]
    if sharing == "self" and S == L:
        args = (q, q, q)
    elif sharing in ("self", "kv"):
        k = x(S, E)
        args = (q, k, k)
    else:
        args = (q, x(S, kdim), x(S, vdim))
    kwargs = _masks(mask, 1 if unbatched else n, L, S, not unbatched)
    kwargs["need_weights"] = weights != "none"
    kwargs["average_attn_weights"] = weights == "avg"
    return m, args, kwargs


CASES = list(itertools.product(MODULES, MASKS, WEIGHTS))


def _both(m, args, kwargs, layer=None, params=None):
    layer = layer or fnn.lower(m)
    params = fnn.state_to_td(m) if params is None else params
    return layer(params, *args, **kwargs), m(*args, **kwargs)


def _assert_pair(actual, expected, **tol):
    assert len(actual) == len(expected) == 2
    for a, e in zip(actual, expected):
        if e is None:
            assert a is None
        else:
            torch.testing.assert_close(a, e, **(tol or {"rtol": 1e-10, "atol": 1e-12}))


@pytest.mark.parametrize(("mod", "mask", "weights"), CASES)
def test_layer_matches_torch_forward(mod, mask, weights):
    m, args, kwargs = _case(mod, mask, weights)
    _assert_pair(*_both(m.eval(), args, kwargs))


@pytest.mark.parametrize("mod", list(MODULES))
@pytest.mark.parametrize("mask", ["none", "pad_bool", "attn_bool3d", "both_float"])
@pytest.mark.parametrize("weights", ["avg", "none"])
def test_layer_matches_torch_unbatched(mod, mask, weights):
    m, args, kwargs = _case(mod, mask, weights, unbatched=True)
    (out, w), expected = _both(m.eval(), args, kwargs)
    assert out.shape == args[0].shape
    _assert_pair((out, w), expected)


def _grads(m, args, kwargs):
    """Gradients of one random projection of the outputs: functd (torch.func.grad of
    the lowered layer) and torch (autograd through the module)."""
    layer, params = fnn.lower(m), fnn.state_to_td(m)
    outs = [o for o in layer(params, *args, **kwargs) if o is not None]
    cots = [torch.randn_like(o) for o in outs]
    idx = [i for i, a in enumerate(args) if i == 0 or a is not args[i - 1]]  # distinct inputs

    def full(xs):
        out = list(args)
        for j in range(len(args)):  # shared inputs stay shared (same object)
            out[j] = xs[idx.index(j)] if j in idx else out[j - 1]
        return out

    def loss(p, xs):
        os = [o for o in layer(p, *full(xs), **kwargs) if o is not None]
        return sum((o * c).sum() for o, c in zip(os, cots))

    g_p, g_x = torch.func.grad(loss, argnums=(0, 1))(params, tuple(args[i] for i in idx))
    leaves = [args[i].clone().requires_grad_() for i in idx]
    os = [o for o in m(*full(leaves), **kwargs) if o is not None]
    sum((o * c).sum() for o, c in zip(os, cots)).backward()
    return g_p, g_x, leaves


@pytest.mark.parametrize(
    ("mod", "mask", "weights"),
    [c for c in CASES if c[1] in ("none", "both_bool", "attn_float", "causal")],
)
def test_layer_matches_torch_gradients(mod, mask, weights):
    m, args, kwargs = _case(mod, mask, weights)
    g_p, g_x, leaves = _grads(m, args, kwargs)
    for g, leaf in zip(g_x, leaves):
        torch.testing.assert_close(g, leaf.grad, rtol=1e-9, atol=1e-11)
    flat = flat_state(g_p)
    for name, p in m.named_parameters():
        torch.testing.assert_close(flat[name], p.grad, rtol=1e-9, atol=1e-11, msg=name)


def test_layer_through_fd_module_matches_torch():
    m = nn.MultiheadAttention(E, H, batch_first=True).to(D).eval()
    mod = fd.Module(m, in_keys=["x", "x", "x"], out_keys=["y", "w"])
    x = r(3, 4, E)
    out = mod(fd.from_module(mod), fd.TensorDict({"x": x}, [3]))
    y, w = m(x, x, x)
    torch.testing.assert_close(out["y"], y, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out["w"], w, rtol=1e-10, atol=1e-12)


# --------------------------------------------- multi_head_attention_forward
def _f_args(separate: bool, bias_kv: bool, zero_attn: bool):
    kv = 3 if separate else None
    m = nn.MultiheadAttention(E, H, kdim=kv, vdim=kv, add_bias_kv=bias_kv).to(D)
    pos = [
        E, H, m.in_proj_weight, m.in_proj_bias, m.bias_k, m.bias_v, zero_attn, 0.2,
        m.out_proj.weight, m.out_proj.bias,
    ]  # fmt: skip
    kw = {"use_separate_proj_weight": separate}
    if separate:
        kw.update(q_proj_weight=m.q_proj_weight, k_proj_weight=m.k_proj_weight)
        kw["v_proj_weight"] = m.v_proj_weight
    return pos, kw


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("bias_kv", [False, True])
@pytest.mark.parametrize("zero_attn", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_functional_matches_torch_without_dropout(separate, bias_kv, zero_attn, need_weights):
    pos, kw = _f_args(separate, bias_kv, zero_attn)
    q, k = r(4, 3, E), r(5, 3, 3 if separate else E)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, -2:] = True
    kw.update(key_padding_mask=pad, need_weights=need_weights)
    for training in (False, True):  # dropout_p=0.2 only applies in training
        if training:
            pos = [*pos[:7], 0.0, *pos[8:]]
        actual = fnn.multi_head_attention_forward(q, k, k, *pos, training=training, **kw)
        expected = F.multi_head_attention_forward(q, k, k, *pos, training=training, **kw)
        _assert_pair(actual, expected)


def test_functional_static_kv_matches_torch():
    pos, kw = _f_args(False, False, True)
    q = r(4, 3, E)
    sk, sv = r(3 * H, 6, E // H), r(3 * H, 6, E // H)
    kw.update(static_k=sk, static_v=sv, key_padding_mask=torch.zeros(3, 6, dtype=torch.bool))
    actual = fnn.multi_head_attention_forward(q, q, q, *pos, training=False, **kw)
    expected = F.multi_head_attention_forward(q, q, q, *pos, training=False, **kw)
    _assert_pair(actual, expected)


def test_functional_errors():
    pos, _ = _f_args(False, False, False)
    q = r(4, 3, E)
    with pytest.raises(ValueError, match=r"multi_head_attention_forward\(dropout_p=0.2\).*key="):
        fnn.multi_head_attention_forward(q, q, q, *pos)
    with pytest.raises(ValueError, match="embed_dim=8"):
        fnn.multi_head_attention_forward(r(4, 3, 6), q, q, *pos, training=False)
    with pytest.raises(TypeError, match=r"attn_mask must be a bool or floating.*\.bool\(\)"):
        fnn.multi_head_attention_forward(
            q, q, q, *pos, training=False, attn_mask=torch.zeros(4, 4, dtype=torch.long)
        )
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(N, S\) = \(3, 4\)"):
        fnn.multi_head_attention_forward(
            q, q, q, *pos, training=False, key_padding_mask=torch.zeros(3, 5, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match=r"2D attn_mask must be \(L, S\)"):
        fnn.multi_head_attention_forward(
            q, q, q, *pos, training=False, attn_mask=torch.zeros(4, 5, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="is_causal=True needs attn_mask"):
        fnn.multi_head_attention_forward(q, q, q, *pos, training=False, is_causal=True)
    with pytest.raises(ValueError, match="static_k must have shape"):
        fnn.multi_head_attention_forward(q, q, q, *pos, training=False, static_k=r(3, 4, 4))


# ------------------------------------------------------------- keyed dropout
def _train_layer(p=0.3, **cfg):
    m = nn.MultiheadAttention(E, H, dropout=p, batch_first=True, **cfg).to(D)
    layer = fnn.lower(m)
    assert layer.random == (p > 0) and layer.training and layer.dropout == p
    return m, layer, fnn.state_to_td(m)


def test_lowered_training_mha_is_random_and_keyed():
    _, layer, params = _train_layer()
    x = r(3, 4, E)
    k0, k1 = fr.key(0), fr.key(1)
    a = layer(params, x, x, x, key=k0)
    torch.testing.assert_close(layer(params, x, x, x, key=k0), a, rtol=0, atol=0)
    b = layer(params, x, x, x, key=k1)
    assert (a[0] - b[0]).abs().max() > 1e-3 and (a[1] - b[1]).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"MultiheadAttention\(dropout=0.3\) in training mode"):
        layer(params, x, x, x)
    ev = fnn.eval_mode(layer)
    assert not ev.random and ev.training is False and fnn.train_mode(ev) == layer
    _assert_pair(ev(params, x, x, x), layer.__class__(E, H, batch_first=True)(params, x, x, x))


def test_dropout_zero_in_training_equals_eval():
    m, layer, params = _train_layer(p=0.0)
    assert not layer.random
    x = r(3, 4, E)
    _assert_pair(layer(params, x, x, x), m.eval()(x, x, x))


def test_dropout_weights_are_the_dropped_probabilities():
    """torch's need_weights branch: probs -> dropout -> @ v, and returns the dropped
    probabilities; so out == out_proj(dropped @ v) and dropped in {0, probs / (1 - p)}."""
    p = 0.4
    m, layer, params = _train_layer(p)
    x = r(3, 4, E)
    key = fr.key(7)
    out, dropped = layer(params, x, x, x, key=key, average_attn_weights=False)
    _, probs = fnn.eval_mode(layer)(params, x, x, x, average_attn_weights=False)
    zero = dropped == 0
    assert 0 < zero.sum() < zero.numel()
    torch.testing.assert_close(dropped[~zero], probs[~zero] / (1 - p), rtol=1e-12, atol=0)
    v = F.linear(x, m.in_proj_weight[2 * E :], m.in_proj_bias[2 * E :])
    heads = v.view(3, 4, H, E // H).transpose(1, 2)
    attended = (dropped @ heads).transpose(1, 2).reshape(3, 4, E)
    torch.testing.assert_close(out, m.out_proj(attended), rtol=1e-10, atol=1e-12)
    avg_out, avg_w = layer(params, x, x, x, key=key)
    torch.testing.assert_close(avg_out, out, rtol=0, atol=0)
    torch.testing.assert_close(avg_w, dropped.mean(1), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mask", ["none", "both_bool", "attn_float"])
def test_dropout_same_mask_with_or_without_weights(mask):
    _, layer, params = _train_layer(0.25, add_zero_attn=True)
    x = r(3, 4, E)
    kw = _masks(mask, 3, 4, 4, True)
    a, _ = layer(params, x, x, x, key=fr.key(3), need_weights=True, **kw)
    b, none = layer(params, x, x, x, key=fr.key(3), need_weights=False, **kw)
    assert none is None
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_dropout_vmap_over_keys_and_members_equals_loop():
    _, layer, params = _train_layer(0.3)
    x = r(3, 4, E)
    keys = fr.split(fr.key(0), 4)
    for nw in (True, False):
        outs = fd.vmap(lambda k, nw=nw: layer(params, x, x, x, need_weights=nw, key=k)[0])(keys)
        for i in range(4):
            torch.testing.assert_close(
                outs[i], layer(params, x, x, x, need_weights=nw, key=keys[i])[0]
            )
    ens = fd.stack([params, params.apply(lambda t: t * 0.5), params, params])
    outs = fd.vmap(lambda p, k: layer(p, x, x, x, need_weights=False, key=k)[0])(ens, keys)
    for i in range(4):
        expected = layer(ens[i], x, x, x, need_weights=False, key=keys[i])[0]
        torch.testing.assert_close(outs[i], expected)
    assert (outs[0] - outs[2]).abs().max() > 1e-3  # same params, different keys


def test_dropout_grad_through_layer_matches_autograd():
    _, layer, params = _train_layer(0.3)
    x = r(3, 4, E)

    def loss(p):
        return layer(p, x, x, x, key=fr.key(5), need_weights=False)[0].pow(2).sum()

    g = fd.grad(loss)(params)
    leaves = params.apply(lambda t: t.clone().requires_grad_())
    loss(leaves).backward()
    for path, t in flat_state(leaves).items():
        torch.testing.assert_close(flat_state(g)[path], t.grad, msg=path)


def test_fd_module_trains_mha_with_dropout_purely():
    m = nn.MultiheadAttention(E, H, dropout=0.2, batch_first=True).to(D)
    mod = fd.Module(m, in_keys=["x", "x", "x"], out_keys=["y", "w"])
    assert mod.random
    params = fd.from_module(mod)
    td = fd.TensorDict({"x": r(3, 4, E)}, [3])
    state = torch.get_rng_state()
    a = mod(params, td, key=fr.key(1))
    assert torch.equal(torch.get_rng_state(), state)  # torch's generator untouched
    torch.testing.assert_close(mod(params, td, key=fr.key(1))["y"], a["y"], rtol=0, atol=0)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        mod(params, td)
    ev = fd.nn.eval_mode(mod)
    torch.testing.assert_close(ev(params, td)["y"], m.eval()(td["x"], td["x"], td["x"])[0])


def test_functional_dropout_is_the_layers_for_the_same_key():
    """multi_head_attention_forward ((L, N, E)) and the batch-first layer draw the
    same (N, H, L, S) mask from the same key."""
    m, layer, params = _train_layer(0.3)
    x = r(3, 4, E)
    pos = [E, H, m.in_proj_weight, m.in_proj_bias, None, None, False, 0.3]
    pos += [m.out_proj.weight, m.out_proj.bias]
    xt = x.transpose(0, 1)
    for nw in (True, False):
        a, wa = fnn.multi_head_attention_forward(xt, xt, xt, *pos, need_weights=nw, key=fr.key(4))
        b, wb = layer(params, x, x, x, need_weights=nw, key=fr.key(4))
        torch.testing.assert_close(a.transpose(0, 1), b, rtol=1e-10, atol=1e-12)
        if nw:
            torch.testing.assert_close(wa, wb)


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
def test_jacrev_hessian_jvp_through_sdpa_path():
    """jvp takes the written-out math (the CPU flash kernel has no forward derivative);
    jacrev/hessian vmap the flash backward, which torch loops over with a warning."""
    layer = fnn.MultiheadAttention(4, 2, batch_first=True)
    p, x = layer.init(0).double(), r(2, 3, 4)

    def f(x):
        return layer(p, x, x, x, need_weights=False)[0]

    jr, jf = torch.func.jacrev(f)(x), torch.func.jacfwd(f)(x)
    torch.testing.assert_close(jr, jf)
    _, t = torch.func.jvp(f, (x,), (torch.ones_like(x),))
    torch.testing.assert_close(t, jr.flatten(3).sum(-1))
    h = torch.func.hessian(lambda x: f(x).pow(2).sum())(x)
    hm = h.reshape(24, 24)
    torch.testing.assert_close(hm, hm.T)  # symmetric


def test_ensemble_vmap_matches_members_without_warnings():
    """fd.vmap over 4 members' params; need_weights=False takes the written-out
    SDPA under vmap (torch's CPU flash kernel has no batching rule and would warn,
    which this suite turns into an error)."""
    nets = [nn.MultiheadAttention(E, H, batch_first=True).to(D).eval() for _ in range(4)]
    layer = fnn.lower(nets[0])
    ens = fd.stack([fnn.state_to_td(n) for n in nets])
    x = r(3, 4, E)
    for nw in (False, True):
        outs = fd.vmap(lambda p, nw=nw: layer(p, x, x, x, need_weights=nw)[0])(ens)
        for i, net in enumerate(nets):
            torch.testing.assert_close(outs[i], net(x, x, x, need_weights=nw)[0])


# ------------------------------------------------- torch's fused inference path
class _Ops(TorchDispatchMode):
    """Counts the calls of torch's fused MHA kernel below it (torch's fast-path gate
    ignores dispatch modes other than make_fx's, as functd's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.native = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.native += func.overloadpacket is torch.ops.aten._native_multi_head_attention
        return func(*args, **(kwargs or {}))


def _counted(fn):
    with _Ops() as ops:
        out = fn()
    return out, ops.native


N_, L_, E_ = 3, 5, 8
PAD = torch.tensor([[False] * 5, [False, False, False, True, True], [True] * 5])  # row 2: all
ATTN = torch.ones(L_, L_, dtype=torch.bool).triu(1)
FAST = {  # name -> (module kwargs, call kwargs, cross-attention, torch takes its fast path)
    "self": ({}, {}, False, True),
    "pad_bool": ({}, {"key_padding_mask": PAD}, False, True),
    "attn_bool_2d_and_pad": ({}, {"attn_mask": ATTN, "key_padding_mask": PAD}, False, True),
    "attn_bool_3d": ({}, {"attn_mask": torch.rand(N_ * 2, L_, L_) < 0.3}, False, True),
    "causal_hint": ({}, {"attn_mask": ATTN, "is_causal": True}, False, True),
    "pad_float": ({}, {"key_padding_mask": torch.zeros(N_, L_)}, False, False),
    "cross": ({}, {}, True, False),
    "odd_heads": ({"num_heads": 1}, {}, False, False),
    "seq_first": ({"batch_first": False}, {}, False, False),
    "no_bias": ({"bias": False}, {}, False, False),
    "bias_kv": ({"add_bias_kv": True}, {}, False, False),
    "zero_attn": ({"add_zero_attn": True}, {}, False, False),
}
NEED = [(True, True), (True, False), (False, True)]  # need_weights, average_attn_weights


@pytest.mark.parametrize("case", list(FAST))
@pytest.mark.parametrize(("need", "avg"), NEED)
def test_eval_no_grad_takes_torchs_fast_path_exactly_where_torch_does(case, need, avg):
    """Eval under no_grad: functd calls _native_multi_head_attention when and only
    when nn.MultiheadAttention does, with its results (<= 1e-6, NaN on a fully padded
    row as torch), and its general path agrees (<= 1e-5)."""
    cfg, kw, cross, taken = FAST[case]
    torch.manual_seed(0)
    m = nn.MultiheadAttention(E_, **{"num_heads": 2, "batch_first": True, **cfg}).eval()
    layer, params = fnn.lower(m), fnn.state_to_td(m)
    x = torch.randn(N_, L_, E_) if m.batch_first else torch.randn(L_, N_, E_)
    args = (x, torch.randn_like(x), x) if cross else (x, x, x)
    kw = {**kw, "need_weights": need, "average_attn_weights": avg}
    with torch.no_grad():
        expected, t_calls = _counted(lambda: m(*args, **kw))
        got, f_calls = _counted(lambda: layer(params, *args, **kw))
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            general, g_calls = _counted(lambda: layer(params, *args, **kw))
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    assert (t_calls, f_calls, g_calls) == (int(taken), int(taken), 0)
    tol = {"rtol": 1e-6, "atol": 1e-6} if taken else {"rtol": 1e-5, "atol": 1e-5}
    for a, e, g in zip(got, expected, general):
        assert (a is None) == (e is None) == (g is None)
        if e is not None:
            torch.testing.assert_close(a, e, equal_nan=True, **tol)
            ok = ~e.isnan()  # torch's fused kernel is NaN on a fully padded row
            torch.testing.assert_close(a[ok], g[ok], rtol=1e-5, atol=1e-5)


def test_fast_path_not_taken_in_training_with_grad_under_transforms_or_tracing():
    """Training mode, params requiring grad, fd.vmap, fd.grad and a make_fx trace
    (fd.jit's) run the general path; each equals torch."""
    torch.manual_seed(0)
    m = nn.MultiheadAttention(E_, 2, batch_first=True)
    layer, params = fnn.lower(m), fnn.state_to_td(m)
    x, xs = torch.randn(N_, L_, E_), torch.randn(4, N_, L_, E_)
    with torch.no_grad():  # training mode (dropout 0): neither takes the fast path
        (out, w), calls = _counted(lambda: layer(params, x, x, x))
        assert calls == 0 and _counted(lambda: m(x, x, x))[1] == 0
        torch.testing.assert_close((out, w), m(x, x, x), rtol=1e-5, atol=1e-6)
    m.eval()
    layer = fnn.lower(m)
    grad_params = params.apply(lambda t: t.clone().requires_grad_())
    (out, _), calls = _counted(lambda: layer(grad_params, x, x, x))
    assert calls == 0 and _counted(lambda: m(x, x, x))[1] == 0
    torch.testing.assert_close(out, m(x, x, x)[0], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        outs, calls = _counted(lambda: fd.vmap(lambda x: layer(params, x, x, x)[0])(xs))
        assert calls == 0
        torch.testing.assert_close(outs, torch.stack([m(x, x, x)[0] for x in xs]))
    g, calls = _counted(lambda: fd.grad(lambda p: layer(p, x, x, x)[0].sum())(params))
    expected = torch.autograd.grad(m(x, x, x)[0].sum(), m.in_proj_weight)[0]
    assert calls == 0
    torch.testing.assert_close(g["in_proj_weight"], expected, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        gm = make_fx(lambda x: layer(params, x, x, x)[0])(x)
        assert "_native_multi_head_attention" not in gm.code
        torch.testing.assert_close(gm(x), m(x, x, x)[0], rtol=1e-5, atol=1e-6)


def test_fast_path_eligible_calls_keep_the_general_paths_errors():
    """Where torch's fused kernel would run, bad masks and a maskless is_causal (which
    the kernel ignores) still get the general path's errors, not a silent answer."""
    m = nn.MultiheadAttention(E_, 2, batch_first=True).eval()
    layer, params, x = fnn.lower(m), fnn.state_to_td(m), torch.randn(N_, L_, E_)
    bad = [
        ({"is_causal": True}, ValueError, "MultiheadAttention: is_causal=True needs attn_mask"),
        ({"key_padding_mask": PAD[:, :4]}, ValueError, r"key_padding_mask must be \(N, S\)"),
        ({"attn_mask": ATTN[:, :4]}, ValueError, r"2D attn_mask must be \(L, S\) = \(5, 5\)"),
        ({"attn_mask": ATTN[None, None]}, ValueError, "attn_mask must be 2D or 3D"),
        ({"key_padding_mask": PAD.long()}, TypeError, r"key_padding_mask must be a bool or"),
    ]
    with torch.no_grad():
        for kw, err, match in bad:
            with pytest.raises(err, match=match):
                layer(params, x, x, x, **kw)


# ------------------------------------------------------------------ SDPA
@st.composite
def _sdpa_cases(draw):
    b, hkv = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    gqa = draw(st.booleans())
    hq = hkv * (draw(st.integers(1, 2)) if gqa else 1)
    L, S, e, ev = (draw(st.integers(1, 5)) for _ in range(4))
    mask = draw(st.sampled_from(["none", "bool", "float", "bool_bcast", "causal"]))
    scale = draw(st.sampled_from([None, 0.3]))
    seed = draw(st.integers(0, 2**16))
    return b, hq, hkv, L, S, e, ev, mask, scale, gqa, seed


def _sdpa_inputs(b, hq, hkv, L, S, e, ev, mask, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, L, e, dtype=D, generator=g)
    k = torch.randn(b, hkv, S, e, dtype=D, generator=g)
    v = torch.randn(b, hkv, S, ev, dtype=D, generator=g)
    kw = {}
    if mask == "bool":
        kw["attn_mask"] = torch.rand(b, hq, L, S, generator=g) > 0.3
    elif mask == "bool_bcast":
        kw["attn_mask"] = torch.rand(L, S, generator=g) > 0.3
    elif mask == "float":
        kw["attn_mask"] = torch.randn(1, hq, L, S, dtype=D, generator=g)
    elif mask == "causal":
        kw["is_causal"] = True
    return q, k, v, kw


@given(_sdpa_cases())
def test_sdpa_matches_torch_eager_and_under_vmap(case):
    b, hq, hkv, L, S, e, ev, mask, scale, gqa, seed = case
    q, k, v, kw = _sdpa_inputs(b, hq, hkv, L, S, e, ev, mask, seed)
    kw.update(scale=scale, enable_gqa=gqa)
    expected = F.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(fnn.scaled_dot_product_attention(q, k, v, **kw), expected)
    # under vmap (the written-out math; rows with every key masked give 0 like torch)
    vm = torch.func.vmap(lambda q: fnn.scaled_dot_product_attention(q, k, v, **kw))
    torch.testing.assert_close(
        vm(q.unsqueeze(0).expand(2, *q.shape)), expected.expand(2, *q.shape[:-1], ev)
    )


def test_sdpa_dropout_matches_torch_math_with_the_same_mask():
    """torch's own math kernel, handed functd's mask, gives the same numbers."""
    q, k, v, kw = _sdpa_inputs(2, 4, 2, 5, 6, 3, 7, "bool", 0)
    p, key = 0.3, fr.key(11)
    out = fnn.scaled_dot_product_attention(q, k, v, dropout_p=p, key=key, enable_gqa=True, **kw)
    keep = fr.bernoulli(key, 1 - p, (2, 4, 5, 6))
    additive = torch.zeros(kw["attn_mask"].shape, dtype=D).masked_fill(~kw["attn_mask"], -math.inf)
    ref, _ = torch.ops.aten._scaled_dot_product_attention_math(  # (the raw op adds bool masks)
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), additive, p, dropout_mask=keep
    )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


def test_sdpa_dropout_statistics_and_reproducibility():
    p = 0.2
    q, k = torch.randn(4, 4, 64, 8), torch.randn(4, 4, 64, 8)
    ones = torch.ones(4, 4, 64, 1)
    out = fnn.scaled_dot_product_attention(q, k, ones, dropout_p=p, key=fr.key(0))
    # each output = sum of the row's dropped probabilities: mean 1, variance ~ p/(1-p) * sum(w^2)
    assert abs(out.mean().item() - 1.0) < 0.02
    assert out.std().item() > 0.05
    same = fnn.scaled_dot_product_attention(q, k, ones, dropout_p=p, key=fr.key(0))
    assert torch.equal(out, same)
    other = fnn.scaled_dot_product_attention(q, k, ones, dropout_p=p, key=fr.key(1))
    assert not torch.equal(out, other)
    eye = torch.eye(64).expand(4, 4, 64, 64)  # output = the dropped probabilities
    dropped = fnn.scaled_dot_product_attention(q, k, eye, dropout_p=p, key=fr.key(2))
    assert abs((dropped == 0).float().mean().item() - p) < 0.01
    zero = fnn.scaled_dot_product_attention(q, k, ones, dropout_p=1.0, key=fr.key(0))
    assert torch.equal(zero, torch.zeros_like(zero))


def test_sdpa_dropout_vmap_over_keys_equals_loop_and_grad():
    q, k, v, _ = _sdpa_inputs(2, 2, 2, 3, 4, 5, 6, "none", 1)
    keys = fr.split(fr.key(0), 3)
    f = lambda q, key: fnn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, key=key)  # noqa: E731
    outs = torch.func.vmap(f, in_dims=(None, 0))(q, keys)
    for i in range(3):
        torch.testing.assert_close(outs[i], f(q, keys[i]))
    g = torch.func.grad(lambda q: f(q, keys[0]).sum())(q)
    leaf = q.clone().requires_grad_()
    f(leaf, keys[0]).sum().backward()
    torch.testing.assert_close(g, leaf.grad)


def test_sdpa_errors():
    q = r(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention\(dropout_p=0.1\).*key="):
        fnn.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
        fnn.scaled_dot_product_attention(q, q, q, dropout_p=1.5, key=fr.key(0))
    with pytest.raises(ValueError, match="is_causal=True builds its own mask"):
        fnn.scaled_dot_product_attention(q, q, q, torch.ones(3, 3, dtype=torch.bool), 0.0, True)
    with pytest.raises(ValueError, match="must be a multiple of the key's 3"):
        kv = r(1, 3, 3, 4)
        fnn.scaled_dot_product_attention(q, kv, kv, dropout_p=0.1, enable_gqa=True, key=0)


def test_layer_config_errors():
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\]"):
        fnn.MultiheadAttention(8, 2, dropout=2.0)
    layer = fnn.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match="query's last dim to be embed_dim=8"):
        layer(layer.init(0), r(3, 2, 6), r(3, 2, 8), r(3, 2, 8))
    with pytest.raises(ValueError, match="key and value must have the query's 3 dims"):
        layer(layer.init(0), r(3, 2, 8), r(3, 8), r(3, 8))


# ------------------------------------------------------------------ compile
@pytest.mark.compile
def test_compile_fullgraph_keyed_dropout_matches_eager():
    torch._dynamo.reset()
    _, layer, params = _train_layer(0.3)
    x = r(3, 4, E)
    key = fr.key(0)

    def f(p, x, key):
        a, _ = layer(p, x, x, x, key=key)
        b, _ = layer(p, x, x, x, key=key, need_weights=False)
        c = fnn.scaled_dot_product_attention(x.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1))
        return a, b, c

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(params, x, key), f(params, x, key)):
        torch.testing.assert_close(got, want)
    assert math.isfinite(compiled(params, x, fr.key(1))[0].sum().item())


@pytest.mark.compile
def test_compile_fullgraph_vmap_over_members_and_keys_matches_eager():
    torch._dynamo.reset()
    layer = fnn.MultiheadAttention(E, H, batch_first=True, dropout=0.3, training=True)
    ens = torch.func.vmap(layer.init)(fr.split(fr.key(0), 3))
    keys, x = fr.split(fr.key(1), 3), torch.randn(2, 4, E)
    ensemble = torch.func.vmap(lambda p, k: layer(p, x, x, x, key=k, need_weights=False)[0])
    compiled = torch.compile(ensemble, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ens, keys), ensemble(ens, keys))
