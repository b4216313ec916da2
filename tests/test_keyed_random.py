"""Randomness inside wrapped torch modules is driven by the call's key (KeyedRandom).

Every random function a training-mode module calls draws from ``fold_in(key, n)``:
the same key gives the same output, different keys (and vmap members) differ,
torch's global generator is neither read nor advanced, and a draw without a key
raises, naming the function.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import functd as fd
from functd.nn._dropout import keyed_dropout


class Net(nn.Module):
    """A module functd does not lower, calling ``fn(self, h)`` on its hidden layer."""

    def __init__(self, fn, width=6):
        super().__init__()
        self.lin = nn.Linear(3, width)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, self.lin(x))


def wrap(fn, width=6):
    torch.manual_seed(0)
    m = fd.Module(Net(fn, width), ["x"], ["y"])
    return m, fd.from_module(m)


X = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))

RANDOM_FNS = {
    "F.dropout": lambda s, h: F.dropout(h, 0.5, s.training),
    "nn.Dropout": lambda s, h: nn.functional.dropout(h, p=0.3, training=True),
    "dropout1d": lambda s, h: F.dropout1d(h.unsqueeze(-1), 0.5, True).squeeze(-1),
    "dropout2d": lambda s, h: F.dropout2d(h.reshape(5, 6, 1, 1), 0.5, True).reshape(5, 6),
    "dropout3d": lambda s, h: F.dropout3d(h.reshape(5, 6, 1, 1, 1), 0.5, True).reshape(5, 6),
    "alpha_dropout": lambda s, h: F.alpha_dropout(h, 0.5, True),
    "feature_alpha_dropout": lambda s, h: F.feature_alpha_dropout(
        h.reshape(5, 6, 1, 1), 0.5, True
    ).reshape(5, 6),
    "torch.dropout": lambda s, h: torch.dropout(h, 0.5, True),
    "torch.rand": lambda s, h: h * torch.rand(5, 6),
    "torch.rand(size)": lambda s, h: h * torch.rand((5, 6), dtype=h.dtype),
    "torch.randn": lambda s, h: h + torch.randn(5, 6),
    "rand_like": lambda s, h: h * torch.rand_like(h),
    "randn_like": lambda s, h: h + torch.randn_like(h),
    "randint": lambda s, h: h * torch.randint(0, 3, (5, 6)),
    "randint_like": lambda s, h: h * torch.randint_like(h, 3),
    "randperm": lambda s, h: h[torch.randperm(5)],
    "normal": lambda s, h: h + torch.normal(0.0, 1.0, (5, 6)),
    "normal(tensors)": lambda s, h: torch.normal(h, torch.ones_like(h)),
    "bernoulli": lambda s, h: h * torch.bernoulli(torch.full_like(h, 0.5)),
    "Tensor.bernoulli_": lambda s, h: h * torch.empty_like(h).bernoulli_(0.5),
    "Tensor.uniform_": lambda s, h: h * torch.empty_like(h).uniform_(-1, 1),
    "Tensor.normal_": lambda s, h: h + torch.empty_like(h).normal_(),
    "Tensor.exponential_": lambda s, h: h * torch.empty_like(h).exponential_(),
    "multinomial": lambda s, h: h[:, torch.multinomial(h[0].softmax(0), 4)],
    "multinomial(replacement)": lambda s, h: h[:, torch.multinomial(h[0].softmax(0), 9, True)],
    "rrelu": lambda s, h: F.rrelu(h, training=True),
    "gumbel_softmax": lambda s, h: F.gumbel_softmax(h, tau=0.5),
    "gumbel_softmax(hard)": lambda s, h: F.gumbel_softmax(h, hard=True),
}


@pytest.mark.parametrize("name", sorted(RANDOM_FNS))
def test_random_functions_draw_from_the_key(name):
    m, params = wrap(RANDOM_FNS[name])
    assert m.random
    rng = torch.get_rng_state()
    a = m(params, x=X, key=fd.random.key(0))
    b = m(params, x=X, key=fd.random.key(0))
    c = m(params, x=X, key=fd.random.key(1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(rng, torch.get_rng_state())  # not read, not advanced
    with pytest.raises(ValueError, match=r"FunctionalCall\(Net\): .* draws random numbers.*key="):
        m(params, x=X)


@pytest.mark.parametrize("name", ["F.dropout", "torch.rand", "bernoulli", "rrelu", "randint"])
def test_keyed_draws_under_vmap_equal_the_loop_and_take_gradients(name):
    m, params = wrap(RANDOM_FNS[name])
    keys = fd.random.split(fd.random.key(3), 4)
    many = fd.vmap(lambda k: m(params, x=X, key=k))(keys)
    for i in range(4):
        assert torch.equal(many[i], m(params, x=X, key=keys[i]))
    trainable, held = fd.partition(params, fd.trainable(m))
    g = fd.grad(lambda p: m(fd.combine(p, held), x=X, key=keys[0]).sum())(trainable)
    assert g["lin", "weight"].abs().sum() > 0


def test_dropout_arithmetic_is_torchs():
    """The keyed masks differ from torch's by design; the arithmetic around them is
    ATen's: x * mask / (1 - p); feature masks constant per channel; alpha dropout keeps
    a standard normal input's mean 0 and variance 1 (SELU's self-normalisation)."""
    x = torch.randn(4, 5, 6, 7, generator=torch.Generator().manual_seed(0))
    key = fd.random.key(0)
    y = keyed_dropout(x, 0.25, key)
    keep = fd.random.bernoulli(key, 0.75, x.shape)
    torch.testing.assert_close(y, torch.where(keep, x / 0.75, torch.zeros_like(x)))
    f = keyed_dropout(x, 0.5, key, feature=True)
    dropped = (f == 0).all(-1).all(-1)
    assert dropped.any() and (~dropped).any()
    torch.testing.assert_close(f[~dropped], 2 * x[~dropped])
    big = torch.randn(400_000, generator=torch.Generator().manual_seed(0))
    a = keyed_dropout(big, 0.2, key, alpha=True)
    assert abs(a.mean().item()) < 0.01 and abs(a.std().item() - 1) < 0.01
    # torch's own alpha_dropout has the same moments
    t = F.alpha_dropout(big, 0.2, True)
    assert abs(t.mean().item()) < 0.01 and abs(t.std().item() - 1) < 0.01
    assert torch.equal(keyed_dropout(x, 1.0, key), torch.zeros_like(x))


def test_dropout_in_eval_mode_and_p0_draws_nothing_and_needs_no_key():
    m, params = wrap(lambda s, h: F.dropout(h, 0.0, True) + F.dropout(h, 0.5, s.training))
    e = fd.nn.eval_mode(m)
    assert not e.random
    h = F.linear(X, params["lin", "weight"], params["lin", "bias"])
    torch.testing.assert_close(e(params, x=X), 2 * h)
    m0, p0 = wrap(lambda s, h: F.dropout(h, 0.0, True))
    torch.testing.assert_close(m0(p0, x=X), F.linear(X, p0["lin", "weight"], p0["lin", "bias"]))


def test_refused_random_functions_name_the_function():
    m, params = wrap(lambda s, h: h + torch.empty_like(h).cauchy_())
    with pytest.raises(NotImplementedError, match=r"Tensor.cauchy_ draws random numbers and "):
        m(params, x=X, key=fd.random.key(0))
    m, params = wrap(lambda s, h: h * torch.poisson(h.abs()))
    with pytest.raises(NotImplementedError, match=r"poisson draws random numbers"):
        m(params, x=X, key=fd.random.key(0))


def test_a_hidden_draw_is_caught_and_torchs_generator_restored():
    """nn.init.uniform_ dispatches as one torch function; the draw inside it is not seen
    by the mode. The eager call compares torch's generator around the call."""
    m, params = wrap(lambda s, h: h * nn.init.uniform_(torch.empty_like(h)))
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match=r"drew from torch's global generator.*restored"):
        m(params, x=X, key=fd.random.key(0))
    assert torch.equal(rng, torch.get_rng_state())


def test_generator_argument_is_refused():
    m, params = wrap(lambda s, h: h * torch.rand(5, 6, generator=torch.Generator()))
    with pytest.raises(ValueError, match=r"torch.rand was given a torch.Generator"):
        m(params, x=X, key=fd.random.key(0))


def test_draws_are_counted_in_order_within_a_call():
    """Two draws in one call get fold_in(key, 0) and fold_in(key, 1)."""
    m, params = wrap(lambda s, h: torch.stack([torch.rand(3), torch.rand(3)]).expand(5, 2, 3))
    out = m(params, x=X, key=fd.random.key(7))
    k = fd.random.key(7)
    torch.testing.assert_close(out[0, 0], fd.random.uniform(fd.random.fold_in(k, 0), (3,)))
    torch.testing.assert_close(out[0, 1], fd.random.uniform(fd.random.fold_in(k, 1), (3,)))


class _RNNNet(nn.Module):
    def __init__(self, cls, **kw):
        super().__init__()
        self.rnn = cls(3, 4, num_layers=3, dropout=0.5, batch_first=True, **kw)

    def forward(self, x):
        return self.rnn(x)[0]


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_rnn_inter_layer_dropout_is_keyed_and_layerwise_torch(cls, bidirectional):
    """The fused RNN op runs one layer at a time with keyed dropout in between; with the
    masks drawn the same way, one-layer torch modules give the same output."""
    torch.manual_seed(0)
    net = _RNNNet(cls, bidirectional=bidirectional)
    m = fd.Module(net, ["x"], ["y"])
    params, x = fd.from_module(m), torch.randn(2, 5, 3)
    key = fd.random.key(0)
    out = m(params, x=x, key=key)
    assert torch.equal(out, m(params, x=x, key=key))
    assert not torch.equal(out, m(params, x=x, key=fd.random.key(1)))
    # reference: torch's one-layer modules with the layer weights, masks drawn as functd's
    d = 2 if bidirectional else 1
    h = x
    for layer in range(3):
        one = cls(h.shape[-1], 4, batch_first=True, bidirectional=bidirectional)
        sd = {}
        for name in one.state_dict():
            sd[name] = net.rnn.state_dict()[name.replace("_l0", f"_l{layer}")]
        one.load_state_dict(sd)
        h = one(h)[0]
        assert h.shape[-1] == 4 * d
        if layer < 2:
            h = keyed_dropout(h, 0.5, fd.random.fold_in(key, layer))
    torch.testing.assert_close(out, h)


@pytest.mark.compile
def test_keyed_dropout_through_compile_equals_eager():
    m, params = wrap(RANDOM_FNS["F.dropout"])
    key = fd.random.key(0)
    f = torch.compile(lambda p, x, k: m(p, x=x, key=k), fullgraph=True, backend="eager")
    torch.testing.assert_close(f(params, X, key), m(params, x=X, key=key))


def test_module_is_not_random_in_eval_and_random_in_training():
    net = Net(lambda s, h: F.dropout(h, 0.5, s.training))
    assert fd.Module(net, ["x"], ["y"]).random
    assert not fd.Module(net.eval(), ["x"], ["y"]).random
    assert fd.nn.train_mode(fd.Module(net, ["x"], ["y"])).random
    assert not fd.Module(Net(lambda s, h: h), ["x"], ["y"]).random  # draws nothing


def test_transformer_encoder_attention_and_dropout_are_keyed():
    """nn.TransformerEncoder (not lowered) in training mode: its MultiheadAttention's
    dropout (F.multi_head_attention_forward) and its Dropouts draw from the key; with
    p = 0 it equals torch's module."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.3, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    m = fd.Module(enc, {"x": "src"}, ["y"])
    params, x = fd.from_module(m), torch.randn(3, 5, 8)
    td = fd.TensorDict({"x": x}, [3])
    rng = torch.get_rng_state()
    a = m(params, td, key=fd.random.key(0))["y"]
    assert torch.equal(a, m(params, td, key=fd.random.key(0))["y"])
    assert not torch.equal(a, m(params, td, key=fd.random.key(1))["y"])
    assert torch.equal(rng, torch.get_rng_state())
    with pytest.raises(ValueError, match=r"draws random numbers"):
        m(params, td)
    for sub in enc.modules():  # p = 0: nothing drawn, torch's numbers
        if hasattr(sub, "p"):
            sub.p = 0.0
        if isinstance(sub, nn.MultiheadAttention):
            sub.dropout = 0.0
    m0 = fd.Module(enc, {"x": "src"}, ["y"])
    torch.testing.assert_close(m0(params, td)["y"], enc(x))
