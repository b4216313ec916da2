"""Torch modules in functd: lowering onto functd.nn layers, the FunctionalCall fallback,
and the state <-> TensorDict conversion of fd.from_module / fd.to_module (and its errors)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import functd as fd
import functd.nn as fnn
from functd.nn._convert import flat_state

D = torch.float64


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=D)


# ----------------------------------------------------------------- lowering
class _MyLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


class _Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(3))
        self.register_buffer("shift", torch.randn(3))
        self.register_buffer("tmp", torch.zeros(1), persistent=False)

    def forward(self, x, *, power=1):
        return (x * self.scale + self.shift) ** power


def test_lower_returns_none_when_not_exact():
    hooked = nn.Linear(3, 4)
    hooked.register_forward_hook(lambda m, i, o: o * 0)
    patched = nn.Linear(3, 4)
    patched.forward = lambda x: x
    extra = nn.Linear(3, 4)
    extra.register_buffer("extra", torch.zeros(2))
    shared = nn.Linear(3, 3)
    not_lowered = [
        _MyLinear(3, 4),
        hooked,
        patched,
        extra,
        nn.Softmin(-1),
        nn.Embedding(5, 2, max_norm=1.0),
        nn.Embedding(5, 2, sparse=True),
        nn.Softmax(),
        nn.Sequential(shared, nn.ReLU(), shared),
        _Affine(),
    ]
    for m in not_lowered:
        assert fnn.lower(m) is None, m
        wrapped = fnn.lower(m, fallback=True)
        assert isinstance(wrapped, fnn.FunctionalCall), m
    assert fnn.lower(fnn.Linear(2, 2)) == fnn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        fnn.lower("relu")


def test_lower_sequential_with_fallback_children():
    seq = nn.Sequential(nn.Linear(3, 4), nn.Softmin(-1), nn.ReLU()).eval()
    chain = fnn.lower(seq)  # per child, whatever `fallback` says
    assert isinstance(chain, fnn.Chain) and isinstance(chain.layers[1], fnn.FunctionalCall)
    assert isinstance(fnn.lower(seq, fallback=True).layers[1], fnn.FunctionalCall)
    assert chain.layers[0] == fnn.Linear(3, 4)
    x = torch.randn(5, 3)
    torch.testing.assert_close(chain(fnn.state_to_td(seq), x), seq(x))
    with pytest.raises(NotImplementedError, match="from_module"):
        chain.init(0)


# ------------------------------------------------------------ FunctionalCall
def test_functional_call_matches_module_and_grads():
    m = _Affine().double()
    fc = fnn.FunctionalCall(m)
    params = fnn.state_to_td(m)
    assert params.keys() == ("scale", "shift", "tmp")  # non-persistent buffers too
    x = r(4, 3)
    torch.testing.assert_close(fc(params, x, power=2), m(x, power=2))
    g = torch.func.grad(lambda p: fc(p, x, power=2).sum())(params)
    m(x, power=2).sum().backward()
    torch.testing.assert_close(g["scale"], m.scale.grad)
    assert fc.param_shapes() == {("scale",): (3,), ("shift",): (3,), ("tmp",): (1,)}
    assert fc.has_params
    with pytest.raises(NotImplementedError, match=r"only lowered layers have a pure `init`"):
        fc.init(0)


def test_functional_call_never_mutates_the_module():
    bn = nn.BatchNorm1d(3)  # training mode: forward writes running stats
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    fc = fnn.FunctionalCall(bn)
    assert fc.module is not bn and fc.module.weight.device.type == "meta"
    assert bn.weight.device.type == "cpu"
    params = fnn.state_to_td(bn)
    x = torch.randn(8, 3) * 5 + 2
    out, new_state = fc(params, x)  # training mode: the new statistics are returned
    torch.testing.assert_close(
        out, nn.functional.batch_norm(x, None, None, bn.weight, bn.bias, True)
    )
    expected = {k: v.clone() for k, v in before.items()}
    nn.functional.batch_norm(
        x, expected["running_mean"], expected["running_var"], None, None, True, 0.1
    )
    torch.testing.assert_close(new_state["running_mean"], expected["running_mean"])
    torch.testing.assert_close(new_state["running_var"], expected["running_var"])
    for k, v in bn.state_dict().items():
        assert torch.equal(v, before[k]), k
    for k, v in flat_state(params).items():
        assert torch.equal(v, before[k]), k
    emb = nn.Embedding(4, 3, max_norm=0.1)
    w0 = emb.weight.detach().clone()
    fnn.FunctionalCall(emb)(fnn.state_to_td(emb), torch.tensor([0, 1]))
    assert torch.equal(emb.weight, w0)


def test_functional_call_hashes_by_identity():
    m = nn.BatchNorm1d(2)
    a, b = fnn.FunctionalCall(m), fnn.FunctionalCall(m)
    assert a != b and a == a and len({a, b}) == 2
    assert "BatchNorm1d" in repr(a)


# --------------------------------------------------------------- conversion
def test_state_to_td_names_and_detach():
    mha = nn.MultiheadAttention(4, 2)
    td = fnn.state_to_td(mha)
    assert set(flat_state(td)) == set(mha.state_dict())
    assert td["out_proj", "weight"].data_ptr() == mha.out_proj.weight.data_ptr()
    assert not td["out_proj", "weight"].requires_grad and td["in_proj_weight"].grad_fn is None
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert fnn.state_to_td(seq).keys(True, True) == (
        ("0", "weight"),
        ("0", "bias"),
        ("2", "weight"),
        ("2", "bias"),
    )
    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    assert fnn.state_to_td(tied).keys(True, True) == (("0", "weight"), ("0", "bias"), ("1", "bias"))
    with pytest.raises(TypeError, match=r"nn\.Module"):
        fnn.state_to_td({"weight": torch.zeros(1)})


def test_load_td_round_trip_and_cast():
    src, dst = (
        nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3)),
        nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3)),
    )
    params = fnn.state_to_td(src).clone().double()
    assert fnn.load_td(params, dst) is dst
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b) and b.dtype == torch.float32, k
    bn = nn.BatchNorm1d(3)
    fnn.load_td(fnn.state_to_td(bn).apply(lambda t: t + 1), bn)
    assert bn.num_batches_tracked.item() == 1 and torch.all(bn.running_var == 2)


def test_load_td_errors():
    lin = nn.Linear(3, 4)
    w0 = lin.weight.detach().clone()
    good = fnn.state_to_td(lin).clone()
    with pytest.raises(KeyError, match=r"missing key\(s\) 'bias'"):
        fnn.load_td(good.exclude("bias"), lin)
    with pytest.raises(KeyError, match=r"unexpected key\(s\) \('extra', 'x'\)"):
        fnn.load_td(good.set(("extra", "x"), torch.zeros(1)), lin)
    bad = good.set("weight", torch.zeros(4, 5)).set("bias", torch.ones(4))
    with pytest.raises(ValueError, match=r"params\['weight'\] has shape \[4, 5\].*shape \[4, 3\]"):
        fnn.load_td(bad, lin)
    assert torch.equal(lin.weight, w0) and not torch.all(lin.bias == 1)  # nothing copied
    with pytest.raises(TypeError, match="TensorDict"):
        fnn.load_td({"weight": w0}, lin)


def test_from_module_of_pure_layer_module():
    m = fd.Module(fd.nn.Linear(3, 4), ["x"], ["h"])
    with pytest.raises(TypeError, match=r"holds no weights; create them with m\.init"):
        fd.from_module(m)


class _NoisyNet(nn.Module):
    """A custom module (not lowered) with dropout inside."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


def test_functional_call_draws_dropout_from_the_key_in_training_mode():
    net = _NoisyNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    m = fd.Module(net, ["x"], ["y"])
    assert m.random and net.training
    params, x = fd.from_module(m), torch.randn(4, 3)
    with pytest.raises(
        ValueError,
        match=r"FunctionalCall\(_NoisyNet\): F.dropout\(p=0.5\) draws random numbers.*key=fd",
    ):
        m(params, x=x)
    rng = torch.get_rng_state()
    a, b = m(params, x=x, key=fd.random.key(0)), m(params, x=x, key=fd.random.key(0))
    c = m(params, x=x, key=fd.random.key(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(rng, torch.get_rng_state())  # torch's generator: not read, not advanced
    h = torch.nn.functional.linear(x, params["lin", "weight"], params["lin", "bias"])
    kept = a != 0
    torch.testing.assert_close(a[kept], 2 * h[kept])  # torch's scaling, 1 / (1 - p)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    # in eval mode nothing is drawn: it runs without a key and matches the module
    e = fd.nn.eval_mode(m)
    assert not e.random
    net.eval()
    torch.testing.assert_close(e(params, x=x), net(x))
