"""RNN/GRU/LSTM against torch.nn.RNN/GRU/LSTM: outputs, grads, ensembles, keyed dropout.

Both paths of the layer are checked: torch's fused op (plain eager CPU tensors)
and the Python loop over time (under vmap/grad/compile; forced here with
the ``path`` fixture). Tolerances: float64 ``1e-12`` (measured: ≤ 3e-16);
float32 ``torch.testing.assert_close``'s defaults (rtol 1.3e-6, atol 1e-5;
measured ≤ 1.5e-7). Even the fused path, torch's own op, is not always
bit-equal in float32: ATen picks another matmul kernel when the weights do not
require grad (the detached params here), and torch's float32 LSTM runs
oneDNN's kernel, which the loop rounds differently from.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

import functd as fd
import functd.nn as fnn
from functd.nn import _rnn

D = torch.float64
TOL64 = {"rtol": 1e-12, "atol": 1e-12}

# (kind, constructor kwargs beyond (3, 4)); every option that changes the math
CONFIGS = [
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True}),
    ("RNN", {"bias": False, "batch_first": True}),
    ("GRU", {}),
    ("GRU", {"num_layers": 3, "batch_first": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "bias": False}),
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("LSTM", {"proj_size": 2}),
    ("LSTM", {"proj_size": 3, "num_layers": 2, "bidirectional": True, "bias": False}),
]
IDS = [f"{k}-{'-'.join(f'{a}={b}' for a, b in kw.items()) or 'default'}" for k, kw in CONFIGS]


@pytest.fixture(params=["fused", "loop"])
def path(request, monkeypatch):
    """Run the test on each path of the layer."""
    if request.param == "loop":
        monkeypatch.setattr(_rnn, "plain", lambda tensors: False)
    return request.param


def _inputs(m: nn.RNNBase, batched: bool, with_hx: bool, dtype=D):
    """An input and an initial state (None, a tensor, or LSTM's (h_0, c_0))."""
    n, t, dirs = 2, 5, 2 if m.bidirectional else 1
    if not batched:
        x = torch.randn(t, m.input_size, dtype=dtype)
    else:
        x = torch.randn(
            (n, t, m.input_size) if m.batch_first else (t, n, m.input_size), dtype=dtype
        )
    if not with_hx:
        return x, None
    lead = (m.num_layers * dirs, n) if batched else (m.num_layers * dirs,)
    h = torch.randn(*lead, m.proj_size or m.hidden_size, dtype=dtype)
    if m.mode != "LSTM":
        return x, h
    return x, (h, torch.randn(*lead, m.hidden_size, dtype=dtype))


def _close(a, b, **tol):
    assert type(a) is type(b)
    for x, y in zip(tree_leaves(a), tree_leaves(b), strict=True):
        torch.testing.assert_close(x, y, **tol)


@pytest.mark.parametrize("kind, kw", CONFIGS, ids=IDS)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [False, True])
def test_matches_torch_float64(kind, kw, batched, with_hx, path):
    m = getattr(nn, kind)(3, 4, **kw).double()
    layer = fnn.lower(m)
    assert type(layer).__name__ == kind
    x, hx = _inputs(m, batched, with_hx)
    _close(layer(fd.from_module(m), x, hx), m(x, hx), **TOL64)


@pytest.mark.parametrize(
    "kind, kw", [CONFIGS[1], CONFIGS[4], CONFIGS[7]], ids=[IDS[1], IDS[4], IDS[7]]
)
def test_matches_torch_float32(kind, kw, path):
    m = getattr(nn, kind)(3, 4, **kw)
    x, hx = _inputs(m, True, True, torch.float32)
    _close(fnn.lower(m)(fd.from_module(m), x, hx), m(x, hx))


@pytest.mark.parametrize(
    "kind, kw", [CONFIGS[1], CONFIGS[5], CONFIGS[9]], ids=[IDS[1], IDS[5], IDS[9]]
)
def test_grads_match_torch(kind, kw, path):
    """Grads of the params and of the input and initial state, against torch's autograd
    (through torch.autograd on the fused path, torch.func.grad on the loop)."""
    m = getattr(nn, kind)(3, 4, **kw).double()
    layer, params = fnn.lower(m), fd.from_module(m)
    x, hx = _inputs(m, True, True)
    w = [torch.randn(t.shape, dtype=D) for t in tree_leaves(m(x, hx))]
    names = [n for n, _ in m.named_parameters()]

    def loss(f, xs):  # xs: the input and the state tensors
        out = f(xs[0], xs[1] if kind != "LSTM" else (xs[1], xs[2]))
        return sum((o * wi).sum() for o, wi in zip(tree_leaves(out), w))

    def leaves():
        return [x.clone().requires_grad_(), *(t.clone().requires_grad_() for t in tree_leaves(hx))]

    xs = leaves()
    ref = torch.autograd.grad(loss(m, xs), [*m.parameters(), *xs])
    if path == "loop":
        g = torch.func.grad(lambda p, xs: loss(lambda *a: layer(p, *a), xs), argnums=(0, 1))(
            params, [x, *tree_leaves(hx)]
        )
        got = [g[0][n] for n in names] + list(g[1])
    else:
        p, xs = params.apply(lambda t: t.clone().requires_grad_()), leaves()
        got = torch.autograd.grad(loss(lambda *a: layer(p, *a), xs), [p[n] for n in names] + xs)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, **TOL64)


def test_lstm_ensemble_of_4_under_fd_vmap_equals_loop():
    layer = fnn.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True)
    ens = torch.func.vmap(layer.init)(fd.random.split(fd.random.key(0), 4))
    x = torch.randn(2, 6, 3)
    out = fd.vmap(layer, in_dims=(0, None))(ens, x)
    assert out[0].shape == (4, 2, 6, 10) and out[1][0].shape == (4, 4, 2, 5)
    for i in range(4):
        _close(
            tuple(t[i] for t in tree_leaves(out)),
            tuple(tree_leaves(layer(ens[i], x))),
            rtol=1e-5,
            atol=1e-6,
        )
    # and equal to torch's modules loaded with each member's weights
    for i in (0, 3):
        m = nn.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True)
        fd.to_module(ens[i], m)
        _close(
            tuple(t[i] for t in tree_leaves(out)), tuple(tree_leaves(m(x))), rtol=1e-5, atol=1e-6
        )


def test_ensemble_with_a_state_per_member():
    layer = fnn.GRU(3, 4, num_layers=2)
    ens = torch.func.vmap(layer.init)(fd.random.split(fd.random.key(1), 3))
    x, h = torch.randn(5, 2, 3), torch.randn(3, 2, 2, 4)
    out, hn = fd.vmap(layer, in_dims=(0, None, 0))(ens, x, h)
    for i in range(3):
        torch.testing.assert_close(out[i], layer(ens[i], x, h[i])[0])
        torch.testing.assert_close(hn[i], layer(ens[i], x, h[i])[1])


# ---------------------------------------------------------------------- dropout
def test_dropout_is_keyed_and_matches_the_stack_by_hand(path):
    """A 2-layer GRU with dropout: layer 0 (torch), the mask from
    functd.random.bernoulli(split(key, 1)[0]) scaled by 1/(1-p), layer 1 (torch)."""
    p = 0.4
    m = nn.GRU(3, 4, num_layers=2, dropout=p).double()
    layer = fnn.lower(m)
    assert layer.training and layer.random
    params, x, key = fd.from_module(m), torch.randn(6, 2, 3, dtype=D), fd.random.key(3)
    out, h = layer(params, x, key=key)
    g0, g1 = nn.GRU(3, 4).double(), nn.GRU(4, 4).double()
    with torch.no_grad():
        for i, g in enumerate((g0, g1)):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(g, f"{name}_l0").copy_(getattr(m, f"{name}_l{i}"))
    y0, h0 = g0(x)
    keep = fd.random.bernoulli(fd.random.split(key, 1)[0], 1 - p, y0.shape)
    y1, h1 = g1(y0 * (keep.to(D) / (1 - p)))
    torch.testing.assert_close(out, y1, **TOL64)
    torch.testing.assert_close(h, torch.cat([h0, h1]), **TOL64)


def test_dropout_same_key_same_output_and_eval_is_torch_eval():
    m = nn.LSTM(3, 4, num_layers=3, dropout=0.5)
    layer, params, x = fnn.lower(m), fd.from_module(m), torch.randn(5, 2, 3)
    k1, k2 = fd.random.key(0), fd.random.key(1)
    a, b, c = (layer(params, x, key=k)[0] for k in (k1, k1, k2))
    assert torch.equal(a, b) and not torch.allclose(a, c)
    # vmap members share the key's mask: an ensemble equals its loop
    ev = fnn.eval_mode(layer)
    assert ev == fnn.lower(m.eval()) and not ev.training and not ev.random
    _close(ev(params, x), m(x))
    assert fnn.train_mode(ev) == layer
    assert not fnn.LSTM(3, 4, dropout=0.5).random  # one layer: nothing between layers


def test_dropout_without_a_key_raises():
    layer = fnn.RNN(3, 4, num_layers=2, dropout=0.1)
    with pytest.raises(
        ValueError, match=r"RNN\(dropout=0.1\) in training mode .*needs a PRNG key.*eval_mode"
    ):
        layer(layer.init(0), torch.randn(5, 3))


def test_dropout_in_a_chain_gets_its_key():
    chain = fnn.lower(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.2)))
    lstm = fnn.LSTM(3, 4, num_layers=2, dropout=0.5)
    chain = fnn.Chain((*chain.layers, lstm))
    assert chain.random
    p, x = chain.init(0), torch.randn(5, 3)
    a = chain(p, x, key=fd.random.key(0))
    assert torch.equal(a[0], chain(p, x, key=fd.random.key(0))[0])


# -------------------------------------------------------------------- the rest
def test_lowering_reads_every_option_and_names_params_like_torch():
    m = nn.LSTM(
        3, 6, 2, bias=False, batch_first=True, dropout=0.25, bidirectional=True, proj_size=2
    )
    layer = fnn.lower(m.eval())
    assert layer == fnn.LSTM(3, 6, 2, False, True, 0.25, True, 2, training=False)
    assert list(layer.param_shapes()) == [(k,) for k in m.state_dict()]
    assert layer.param_shapes() == {(k,): tuple(v.shape) for k, v in m.state_dict().items()}
    rnn = nn.RNN(3, 4, nonlinearity="relu")
    assert fnn.lower(rnn) == fnn.RNN(3, 4, nonlinearity="relu", training=True)
    assert fnn.GRU(3, 4, dropout=0) == fnn.GRU(3, 4, dropout=0.0)


def test_init_is_torchs_uniform():
    p = fnn.LSTM(3, 16, 2, bidirectional=True, proj_size=4).init(0)
    bound = 1 / 16**0.5
    for k, v in p.items():
        assert v.abs().max() <= bound and v.abs().max() > 0.8 * bound, k
    assert not torch.equal(p["weight_ih_l0"][:4, :3], p["weight_ih_l0_reverse"][:4, :3])


def test_lstm_state_as_torch_tuple_or_two_arguments():
    layer = fnn.LSTM(3, 4)
    p, x = layer.init(0), torch.randn(5, 2, 3)
    h, c = torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    _close(layer(p, x, (h, c)), layer(p, x, h, c))
    with pytest.raises(ValueError, match="both h_0 and c_0"):
        layer(p, x, h)
    with pytest.raises(ValueError, match="not both"):
        layer(p, x, (h, c), c)


def test_bad_inputs_raise_torchs_checks():
    layer = fnn.GRU(3, 4, num_layers=2)
    p = layer.init(0)
    with pytest.raises(ValueError, match="GRU: Expected input to be 2D or 3D, got 4D"):
        layer(p, torch.randn(1, 2, 3, 3))
    with pytest.raises(
        ValueError, match=r"input\.size\(-1\) must be equal to input_size\. Expected 3, got 5"
    ):
        layer(p, torch.randn(4, 2, 5))
    with pytest.raises(
        ValueError, match="For batched 3-D input, hx should also be 3-D but got 2-D"
    ):
        layer(p, torch.randn(4, 2, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"Expected hidden size \(2, 2, 4\), got \[1, 2, 4\]"):
        layer(p, torch.randn(4, 2, 3), torch.randn(1, 2, 4))
    packed = nn.utils.rnn.pack_sequence([torch.randn(3, 3), torch.randn(2, 3)])
    with pytest.raises(
        TypeError, match=r"PackedSequence inputs are not supported.*pad_packed_sequence"
    ):
        layer(p, packed)
    with pytest.raises(ValueError, match="proj_size has to be smaller than hidden_size"):
        fnn.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="dropout should be a number in range"):
        fnn.RNN(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        fnn.RNN(3, 4, nonlinearity="gelu")


def test_gru_in_a_module_without_batch_dims():
    """``(output, h_n)`` to two keys (a td without batch dims: the state's batch dim is
    dim 1, as torch's)."""
    m = nn.GRU(3, 4, batch_first=True)
    mod = fd.Module(m, ["x"], ["y", "h"])
    td = fd.TensorDict({"x": torch.randn(2, 5, 3)}, [])
    out = mod(fd.from_module(mod), td)
    y, h = m(td["x"])
    torch.testing.assert_close(out["y"], y)
    torch.testing.assert_close(out["h"], h)


@pytest.mark.compile
def test_compile_fullgraph_without_allow_rnn():
    torch._dynamo.reset()
    layer = fnn.LSTM(3, 4, batch_first=True, bidirectional=True)
    p, x = layer.init(0), torch.randn(2, 3, 3)

    def loss(p, x):
        out, (h, c) = layer(p, x)
        return out.square().sum() + h.sum() + c.sum()

    compiled = torch.compile(torch.func.grad(loss), fullgraph=True, backend="aot_eager")
    got, ref = compiled(p, x), torch.func.grad(loss)(p, x)
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v)


def test_fused_op_only_on_plain_eager_tensors(monkeypatch):
    calls = []
    fused = fnn.GRU._fused
    monkeypatch.setattr(fnn.GRU, "_fused", staticmethod(lambda *a: calls.append(1) or fused(*a)))
    layer = fnn.GRU(3, 4, num_layers=2)
    p, x = layer.init(0), torch.randn(5, 2, 3)
    eager = layer(p, x)
    assert calls == [1]  # one call for the whole stack
    looped = torch.func.vmap(lambda x: layer(p, x), in_dims=1, out_dims=(1, 1))(x)
    torch.func.grad(lambda p: layer(p, x)[0].sum())(p)
    assert calls == [1]
    _close(looped, eager, rtol=1e-5, atol=1e-6)
    layer = fnn.GRU(3, 4, num_layers=2, dropout=0.5)
    layer(p, x, key=fd.random.key(0))
    assert calls == [1, 1, 1]  # dropout between layers: one call per layer


@pytest.mark.parametrize("batch_first", [True, False])
def test_dropout_masks_are_the_same_on_the_fused_and_the_loop_paths(batch_first):
    """Eager CPU calls take torch's fused op, vmap the Python loop: the same key gives
    the same output (masks drawn in one layout), batch_first or not."""
    layer = fnn.LSTM(3, 4, num_layers=3, dropout=0.5, batch_first=batch_first, training=True)
    params = layer.init(fd.random.key(0)).apply(lambda t: t.double())
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    key = fd.random.key(1)
    eager = layer(params, x, key=key)[0]
    looped = fd.vmap(lambda p: layer(p, x, key=key)[0])(fd.stack([params]))[0]
    torch.testing.assert_close(eager, looped, rtol=1e-12, atol=1e-12)
