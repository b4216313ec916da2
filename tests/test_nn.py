"""functd.nn against torch.nn: outputs, gradients, init distributions, lowering, conversion."""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import functd.nn as fnn
import functd.random as fr
from functd import TensorDict
from functd._torch import TORCH_VERSION
from functd.nn._convert import flat_state
from tests._support.nn_cases import LAYER_CASES

D = torch.float64


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=D)


# ---------------------------------------------------------------- reference cases
@dataclasses.dataclass
class Case:
    module: Callable[[], nn.Module]
    args: Callable[[], tuple]
    kwargs: dict = dataclasses.field(default_factory=dict)
    torch_call: Callable[..., Any] | None = None  # (module, *args, **kwargs) when it differs


def _lstm_call(m, x, h=None, c=None):
    return m(x) if h is None else m(x, (h, c))


def _act(m: nn.Module) -> Case:
    return Case(lambda: m, lambda: (r(3, 5) * 3,))


def _mha_masks():
    q, k = r(2, 4, 8), r(2, 6, 8)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, -2:] = True
    attn = torch.zeros(4, 6, dtype=torch.bool)
    attn[0, 0] = True
    return (q, k, k), {"key_padding_mask": pad, "attn_mask": attn}


CASES: dict[str, Case] = {
    "linear": Case(lambda: nn.Linear(3, 4), lambda: (r(2, 5, 3),)),
    "linear_nobias": Case(lambda: nn.Linear(3, 4, bias=False), lambda: (r(3),)),
    "bilinear": Case(lambda: nn.Bilinear(3, 2, 4), lambda: (r(5, 3), r(5, 2))),
    "bilinear_nobias": Case(lambda: nn.Bilinear(3, 2, 4, bias=False), lambda: (r(5, 3), r(5, 2))),
    "identity": Case(nn.Identity, lambda: (r(2, 3),)),
    "flatten": Case(lambda: nn.Flatten(0, 1), lambda: (r(2, 3, 4),)),
    "conv1d": Case(lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1), lambda: (r(2, 4, 9),)),
    "conv1d_same_circular": Case(
        lambda: nn.Conv1d(2, 4, 4, padding="same", dilation=2, padding_mode="circular"),
        lambda: (r(2, 2, 9),),
    ),
    "conv1d_groups_nobias": Case(
        lambda: nn.Conv1d(4, 6, 3, groups=2, bias=False), lambda: (r(4, 9),)
    ),
    "conv2d_stride_groups": Case(
        lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), groups=2, dilation=(1, 2)),
        lambda: (r(2, 4, 9, 8),),
    ),
    "conv2d_reflect": Case(
        lambda: nn.Conv2d(3, 2, 3, padding=(1, 2), padding_mode="reflect"), lambda: (r(2, 3, 6, 6),)
    ),
    "conv2d_replicate_valid": Case(
        lambda: nn.Conv2d(3, 2, 3, padding="valid", padding_mode="replicate"),
        lambda: (r(3, 6, 6),),
    ),
    "conv2d_same": Case(
        lambda: nn.Conv2d(2, 2, 3, padding="same", dilation=2), lambda: (r(1, 2, 5, 5),)
    ),
    "conv3d": Case(
        lambda: nn.Conv3d(2, 3, 2, stride=(1, 2, 1), padding=1), lambda: (r(1, 2, 4, 4, 4),)
    ),
    "convT1d": Case(
        lambda: nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1), lambda: (r(2, 2, 5),)
    ),
    "convT2d": Case(
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, output_padding=1, groups=2, dilation=1),
        lambda: (r(2, 4, 4, 4),),
    ),
    "convT2d_dilation_nobias": Case(
        lambda: nn.ConvTranspose2d(2, 2, (2, 3), stride=(2, 1), dilation=2, bias=False),
        lambda: (r(2, 3, 3),),
    ),
    "convT2d_output_size": Case(
        lambda: nn.ConvTranspose2d(2, 3, 3, stride=2),
        lambda: (r(1, 2, 4, 4),),
        {"output_size": (10, 9)},
    ),
    "convT3d": Case(lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), lambda: (r(1, 2, 2, 2, 2),)),
    "embedding": Case(
        lambda: nn.Embedding(10, 3, padding_idx=2),
        lambda: (torch.tensor([[1, 2, 2], [9, 0, 1]]),),
    ),
    "embedding_freq": Case(
        lambda: nn.Embedding(10, 3, scale_grad_by_freq=True), lambda: (torch.tensor([1, 1, 4, 5]),)
    ),
    "layernorm": Case(lambda: nn.LayerNorm((3, 4)), lambda: (r(2, 3, 4),)),
    "layernorm_noaffine": Case(
        lambda: nn.LayerNorm(4, elementwise_affine=False), lambda: (r(2, 4),)
    ),
    "layernorm_nobias": Case(lambda: nn.LayerNorm(4, eps=1e-3, bias=False), lambda: (r(2, 4),)),
    "groupnorm": Case(lambda: nn.GroupNorm(2, 4), lambda: (r(3, 4, 5),)),
    "groupnorm_noaffine": Case(
        lambda: nn.GroupNorm(4, 4, eps=1e-3, affine=False), lambda: (r(3, 4),)
    ),
    "groupnorm_nobias": Case(lambda: nn.GroupNorm(1, 4, bias=False), lambda: (r(3, 4, 2),)),
    "rmsnorm": Case(lambda: nn.RMSNorm(4), lambda: (r(2, 4),)),
    "rmsnorm_eps_noaffine": Case(
        lambda: nn.RMSNorm((2, 4), eps=1e-2, elementwise_affine=False), lambda: (r(3, 2, 4),)
    ),
    "rnncell": Case(lambda: nn.RNNCell(3, 5), lambda: (r(2, 3), r(2, 5))),
    "rnncell_relu_noh": Case(lambda: nn.RNNCell(3, 5, nonlinearity="relu"), lambda: (r(2, 3),)),
    "rnncell_unbatched_nobias": Case(lambda: nn.RNNCell(3, 5, bias=False), lambda: (r(3), r(5))),
    "grucell": Case(lambda: nn.GRUCell(3, 5), lambda: (r(2, 3), r(2, 5))),
    "grucell_noh_nobias": Case(lambda: nn.GRUCell(3, 5, bias=False), lambda: (r(2, 3),)),
    "grucell_unbatched": Case(lambda: nn.GRUCell(3, 5), lambda: (r(3), r(5))),
    "lstmcell": Case(
        lambda: nn.LSTMCell(3, 5), lambda: (r(2, 3), r(2, 5), r(2, 5)), torch_call=_lstm_call
    ),
    "lstmcell_noh": Case(
        lambda: nn.LSTMCell(3, 5, bias=False), lambda: (r(2, 3),), torch_call=_lstm_call
    ),
    "lstmcell_unbatched": Case(
        lambda: nn.LSTMCell(3, 5), lambda: (r(3), r(5), r(5)), torch_call=_lstm_call
    ),
    "mha": Case(lambda: nn.MultiheadAttention(8, 2), lambda: (r(4, 2, 8), r(6, 2, 8), r(6, 2, 8))),
    "mha_self_batch_first": Case(
        lambda: nn.MultiheadAttention(8, 4, batch_first=True).eval(),
        lambda: (lambda x: (x, x, x))(r(2, 5, 8)),
    ),
    "mha_nobias_noavg": Case(
        lambda: nn.MultiheadAttention(8, 2, bias=False),
        lambda: (r(4, 2, 8), r(6, 2, 8), r(6, 2, 8)),
        {"average_attn_weights": False},
    ),
    "mha_kvdim_biaskv_zeroattn": Case(
        lambda: nn.MultiheadAttention(8, 2, kdim=3, vdim=5, add_bias_kv=True, add_zero_attn=True),
        lambda: (r(4, 2, 8), r(6, 2, 3), r(6, 2, 5)),
    ),
    "mha_masks": Case(
        lambda: nn.MultiheadAttention(8, 2, batch_first=True),
        lambda: _mha_masks()[0],
        _mha_masks()[1],
    ),
    "mha_no_weights_unbatched": Case(
        lambda: nn.MultiheadAttention(8, 2),
        lambda: (r(4, 8), r(6, 8), r(6, 8)),
        {"need_weights": False},
    ),
    "mha_eval_dropout": Case(
        lambda: nn.MultiheadAttention(8, 2, dropout=0.5).eval(),
        lambda: (r(4, 2, 8), r(6, 2, 8), r(6, 2, 8)),
    ),
    "dropout_eval": Case(lambda: nn.Dropout(0.3).eval(), lambda: (r(3, 4),)),
    "prelu": Case(lambda: nn.PReLU(), lambda: (r(3, 4),)),
    "prelu_channels": Case(lambda: nn.PReLU(4, init=0.1), lambda: (r(3, 4, 2),)),
    "sequential": Case(
        lambda: nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.2).eval(), nn.Linear(8, 2)),
        lambda: (r(5, 3),),
    ),
    "sequential_nested_named": Case(
        lambda: nn.Sequential(
            collections.OrderedDict(
                conv=nn.Conv1d(2, 4, 3),
                act=nn.ELU(),
                inner=nn.Sequential(nn.Flatten(), nn.LayerNorm(20), nn.Linear(20, 3)),
            )
        ),
        lambda: (r(2, 2, 7),),
    ),
    "relu": _act(nn.ReLU()),
    "relu_inplace": _act(nn.ReLU(inplace=True)),
    "relu6": _act(nn.ReLU6()),
    "leakyrelu": _act(nn.LeakyReLU(0.2)),
    "elu": _act(nn.ELU(0.7)),
    "celu": _act(nn.CELU(0.7)),
    "selu": _act(nn.SELU()),
    "gelu": _act(nn.GELU()),
    "gelu_tanh": _act(nn.GELU("tanh")),
    "silu": _act(nn.SiLU()),
    "mish": _act(nn.Mish()),
    "sigmoid": _act(nn.Sigmoid()),
    "tanh": _act(nn.Tanh()),
    "hardtanh": _act(nn.Hardtanh(-0.5, 2.0)),
    "hardsigmoid": _act(nn.Hardsigmoid()),
    "hardswish": _act(nn.Hardswish()),
    "softplus": _act(nn.Softplus(beta=2.0, threshold=3.0)),
    "softsign": _act(nn.Softsign()),
    "tanhshrink": _act(nn.Tanhshrink()),
    "logsigmoid": _act(nn.LogSigmoid()),
    "softmax": _act(nn.Softmax(dim=0)),
    "logsoftmax": _act(nn.LogSoftmax(dim=-1)),
}


def _tensors(out: Any) -> list[torch.Tensor | None]:
    """The outputs, flat (an LSTM's ``(output, (h_n, c_n))`` too)."""
    if not isinstance(out, tuple):
        return [out]
    return [t for o in out for t in _tensors(o)]


def _torch_call(case: Case, m: nn.Module, *args: Any) -> Any:
    args = tuple(a * 1 if a.is_floating_point() else a for a in args)  # for inplace=True
    if case.torch_call is not None:
        return case.torch_call(m, *args, **case.kwargs)
    return m(*args, **case.kwargs)


def _build(name: str):
    if name == "groupnorm_nobias" and TORCH_VERSION < (2, 12):
        pytest.skip("the reference, torch.nn.GroupNorm(bias=False), needs torch 2.12")
    case = CASES[name]
    m = case.module().to(D)
    args = case.args()
    layer = fnn.lower(m)
    assert layer is not None, f"{name}: {m} was not lowered"
    return case, m, args, layer, fnn.state_to_td(m)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_forward(name):
    case, m, args, layer, params = _build(name)
    expected = _tensors(_torch_call(case, m, *args))
    actual = _tensors(layer(params, *args, **case.kwargs))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if e is None:
            assert a is None
        else:
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_gradients(name):
    case, m, args, layer, params = _build(name)
    outs = [o for o in _tensors(layer(params, *args, **case.kwargs)) if o is not None]
    cotangents = [torch.randn_like(o) for o in outs]
    float_idx = [i for i, a in enumerate(args) if a.is_floating_point()]

    def with_inputs(float_args):
        full = list(args)
        for i, a in zip(float_idx, float_args):
            full[i] = a
        return full

    def loss(p, float_args):
        outs = _tensors(layer(p, *with_inputs(float_args), **case.kwargs))
        return sum((o * c).sum() for o, c in zip([o for o in outs if o is not None], cotangents))

    g_params, g_inputs = torch.func.grad(loss, argnums=(0, 1))(
        params, tuple(args[i] for i in float_idx)
    )
    # the same loss through torch autograd on the module
    leaves = [args[i].clone().requires_grad_() for i in float_idx]
    outs_t = [o for o in _tensors(_torch_call(case, m, *with_inputs(leaves))) if o is not None]
    loss_t = sum((o * c).sum() for o, c in zip(outs_t, cotangents))
    loss_t.backward()
    for g, leaf in zip(g_inputs, leaves):
        torch.testing.assert_close(g, leaf.grad, rtol=1e-9, atol=1e-11)
    flat = flat_state(g_params)
    named = dict(m.named_parameters())
    assert set(flat) == set(named)
    for k, p in named.items():
        expected = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(flat[k], expected, rtol=1e-9, atol=1e-11, msg=k)


@pytest.mark.parametrize("name", list(CASES))
def test_init_matches_state_dict_layout(name):
    _, m, _, layer, params = _build(name)
    fresh = layer.init(fr.key(1), dtype=D)
    assert fresh.batch_size == torch.Size([])
    assert fresh.keys(True, True) == params.keys(True, True)
    state = m.state_dict()
    assert list(flat_state(fresh)) == list(state), "init must follow the state_dict() order"
    for k, v in flat_state(fresh).items():
        assert v.shape == state[k].shape and v.dtype == D, k
    shapes = layer.param_shapes()
    assert list(shapes) == [tuple(k.split(".")) for k in state]
    assert shapes == {tuple(k.split(".")): tuple(v.shape) for k, v in state.items()}


def test_conv_transpose_output_size_error():
    layer = fnn.ConvTranspose2d(2, 3, 3, stride=2)
    with pytest.raises(ValueError, match="valid sizes range"):
        layer(layer.init(0), torch.zeros(1, 2, 4, 4), output_size=(20, 20))


def test_cells_reject_3d_inputs_like_torch():
    for layer, name in [(fnn.GRUCell(3, 5), "GRUCell"), (fnn.RNNCell(3, 5), "RNNCell")]:
        with pytest.raises(ValueError, match=f"{name}: Expected input to be 1D or 2D, got 3D"):
            layer(layer.init(0), torch.zeros(1, 2, 3))
    x, h, h3 = torch.zeros(2, 3), torch.zeros(2, 5), torch.zeros(1, 2, 5)
    bad_states = [
        ("GRUCell", (h3,), (h3,)),
        ("RNNCell", (h3,), (h3,)),
        ("LSTMCell", (h3, h), ((h3, h),)),
        ("LSTMCell", (h, h3), ((h, h3),)),
    ]
    for name, ours, theirs in bad_states:
        with pytest.raises(ValueError) as expected:  # torch's own message is the reference
            getattr(torch.nn, name)(3, 5)(x, *theirs)
        layer = getattr(fnn, name)(3, 5)
        with pytest.raises(ValueError, match=re.escape(str(expected.value))):
            layer(layer.init(0), x, *ours)
    lstm = fnn.LSTMCell(3, 5)
    with pytest.raises(ValueError, match="both h and c"):
        lstm(lstm.init(0), torch.zeros(2, 3), torch.zeros(2, 5))


def test_invalid_configs_raise_like_torch():
    with pytest.raises(ValueError, match="divisible by groups"):
        fnn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="strided"):
        fnn.Conv1d(1, 1, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding_mode"):
        fnn.Conv2d(1, 1, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        fnn.MultiheadAttention(6, 4)
    with pytest.raises(ValueError, match="divisible by num_groups"):
        fnn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="nonlinearity"):
        fnn.RNNCell(1, 1, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="kernel_size"):
        fnn.Conv2d(1, 1, (3, 3, 3))


# ---------------------------------------------------------------------- init
def _stats_check_uniform(t: torch.Tensor, bound: float) -> None:
    assert t.abs().max() <= bound
    assert t.abs().max() > 0.98 * bound
    assert abs(t.mean().item()) < 0.05 * bound
    assert t.var().item() == pytest.approx(bound**2 / 3, rel=0.05)


@pytest.mark.parametrize(
    "layer, name, bound",
    [
        (fnn.Linear(300, 400), "weight", 1 / math.sqrt(300)),
        (fnn.Linear(300, 4000), "bias", 1 / math.sqrt(300)),
        (fnn.Bilinear(20, 30, 40), "weight", 1 / math.sqrt(20)),
        (fnn.Conv2d(16, 64, 3, groups=2), "weight", 1 / math.sqrt(8 * 9)),
        (fnn.Conv1d(4, 8000, 5), "bias", 1 / math.sqrt(4 * 5)),
        (fnn.ConvTranspose2d(64, 16, 3, groups=2), "weight", 1 / math.sqrt(8 * 9)),
        (fnn.GRUCell(100, 64), "weight_ih", 1 / math.sqrt(64)),
        (fnn.LSTMCell(10, 128), "weight_hh", 1 / math.sqrt(128)),
        (fnn.RNNCell(10, 2000), "bias_hh", 1 / math.sqrt(2000)),
        (fnn.MultiheadAttention(128, 4), "in_proj_weight", math.sqrt(6 / (4 * 128))),
        (fnn.MultiheadAttention(128, 4), ("out_proj", "weight"), 1 / math.sqrt(128)),
        (fnn.MultiheadAttention(64, 4, kdim=32, vdim=32), "k_proj_weight", math.sqrt(6 / 96)),
    ],
)
def test_init_uniform_bounds(layer, name, bound):
    _stats_check_uniform(layer.init(fr.key(3))[name], bound)


def test_init_normal_and_constants():
    emb = fnn.Embedding(2000, 64, padding_idx=-3)
    w = emb.init(5)["weight"]
    assert torch.all(w[1997] == 0) and torch.count_nonzero(w.abs().sum(-1) == 0) == 1
    assert abs(w.mean().item()) < 0.01 and w.std().item() == pytest.approx(1.0, rel=0.02)
    mha = fnn.MultiheadAttention(512, 8, add_bias_kv=True).init(0)
    assert torch.all(mha["in_proj_bias"] == 0) and torch.all(mha["out_proj", "bias"] == 0)
    assert mha["bias_k"].std().item() == pytest.approx(math.sqrt(1 / 512), rel=0.15)
    ln = fnn.LayerNorm((3, 4)).init(0)
    assert torch.all(ln["weight"] == 1) and torch.all(ln["bias"] == 0)
    assert torch.all(fnn.GroupNorm(2, 4).init(0)["weight"] == 1)
    assert torch.all(fnn.RMSNorm(4).init(0)["weight"] == 1)
    assert torch.all(fnn.PReLU(3, 0.1).init(0)["weight"] == 0.1)


def test_init_agrees_with_torch_statistics():
    """Our draws and torch's own reset_parameters() have the same spread."""
    ours = fnn.Conv2d(8, 32, 3).init(0)["weight"]
    theirs = nn.Conv2d(8, 32, 3).weight.detach()
    assert ours.std().item() == pytest.approx(theirs.std().item(), rel=0.06)
    assert ours.abs().max().item() == pytest.approx(theirs.abs().max().item(), rel=0.02)


@pytest.mark.parametrize("name", list(LAYER_CASES))
def test_init_deterministic_and_key_sensitive(name):
    layer = LAYER_CASES[name][0]()
    a, b, c = layer.init(fr.key(0)), layer.init(fr.key(0)), layer.init(fr.key(1))
    fd_assert_equal(a, b)
    fd_assert_equal(layer.init(0), a)  # an int seed is functd.random.key(seed)
    random_leaves = [k for k, v in a.items(True, True) if v.numel() > 1 and v.unique().numel() > 1]
    for k in random_leaves:
        assert not torch.equal(a[k], c[k]), k


def fd_assert_equal(a: TensorDict, b: TensorDict) -> None:
    assert a.keys(True, True) == b.keys(True, True)
    for k, v in a.items(True, True):
        assert torch.equal(v, b[k]), k


@pytest.mark.parametrize("name", list(LAYER_CASES))
def test_init_under_vmap_over_keys(name):
    layer = LAYER_CASES[name][0]()
    keys = fr.split(fr.key(0), 8)
    ens = torch.func.vmap(layer.init)(keys)
    if not layer.has_params:
        assert ens.is_empty()
        return
    assert ens.batch_size == torch.Size([8])
    direct = layer.init(keys)  # a batch of keys works without vmap too
    assert direct.batch_size == torch.Size([8])
    fd_assert_equal(ens, direct)
    for i in (0, 5):
        fd_assert_equal(ens[i], layer.init(keys[i]))


def test_init_dtype_and_device():
    p = fnn.MLP(3, 2, num_cells=(4,)).init(0, dtype=torch.float64, device="cpu")
    assert {v.dtype for v in p.values(True, True)} == {torch.float64}
    assert p.device == torch.device("cpu")
    with pytest.raises(TypeError, match="PRNG key"):
        fnn.Linear(2, 2).init("seed")


def test_param_free_layers_have_empty_params():
    for layer in [fnn.ReLU(), fnn.Softmax(-1), fnn.Identity(), fnn.Flatten(), fnn.Dropout(0.1)]:
        p = layer.init(0)
        assert isinstance(p, TensorDict) and p.is_empty() and p.batch_size == torch.Size([])
        assert not layer.has_params


# ------------------------------------------------------------------- Dropout
def test_dropout_requires_key():
    drop = fnn.Dropout(0.3)
    assert drop.random
    with pytest.raises(ValueError, match=r"key=fd\.random\.key\(0\).*training=False"):
        drop(drop.init(0), torch.ones(3))


def test_dropout_masks():
    drop, x = fnn.Dropout(0.25), torch.ones(100_000)
    a = drop(TensorDict(), x, key=fr.key(0))
    assert torch.equal(a, drop(TensorDict(), x, key=fr.key(0)))
    assert not torch.equal(a, drop(TensorDict(), x, key=fr.key(1)))
    assert set(a.unique().tolist()) == {0.0, torch.tensor(1 / 0.75).item()}
    assert a.mean().item() == pytest.approx(1.0, abs=0.02)
    assert (a == 0).float().mean().item() == pytest.approx(0.25, abs=0.01)
    assert torch.equal(drop(TensorDict(), x, key=7), drop(TensorDict(), x, key=fr.key(7)))


def test_dropout_eval_mode_and_edge_probabilities():
    x = torch.randn(5)
    inf = fnn.Dropout(0.5, training=False)
    assert not inf.random and inf(TensorDict(), x) is x
    assert fnn.Dropout(0.0)(TensorDict(), x) is x
    assert torch.equal(fnn.Dropout(1.0)(TensorDict(), x, key=fr.key(0)), torch.zeros(5))
    with pytest.raises(ValueError, match="between 0 and 1"):
        fnn.Dropout(1.5)
    assert fnn.lower(nn.Dropout(0.2)) == fnn.Dropout(0.2, training=True)
    assert fnn.lower(nn.Dropout(0.2).eval()) == fnn.Dropout(0.2, training=False)


def test_dropout_under_vmap_and_grad():
    drop = fnn.Dropout(0.5)
    keys = fr.split(fr.key(0), 4)
    out = torch.func.vmap(lambda k, x: drop(TensorDict(), x, key=k))(keys, torch.ones(4, 10))
    for i in range(4):
        assert torch.equal(out[i], drop(TensorDict(), torch.ones(10), key=keys[i]))
    g = torch.func.grad(lambda x: drop(TensorDict(), x, key=fr.key(0)).sum())(torch.ones(10))
    assert torch.equal(g, drop(TensorDict(), torch.ones(10), key=fr.key(0)))


def test_chain_splits_key_among_random_layers():
    chain = fnn.Chain((fnn.Linear(3, 3), fnn.Dropout(0.5), fnn.ReLU(), fnn.Dropout(0.5)))
    assert (
        chain.random and not fnn.Chain((fnn.Linear(3, 3), fnn.Dropout(0.5, training=False))).random
    )
    p, x = chain.init(0), torch.randn(64, 3)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        chain(p, x)
    assert torch.equal(chain(p, x, key=fr.key(1)), chain(p, x, key=fr.key(1)))
    k1, k2 = fr.split(fr.key(1), 2)
    drop = fnn.Dropout(0.5)
    expected = drop(p, fnn.ReLU()(p, drop(p, fnn.Linear(3, 3)(p["0"], x), key=k1)), key=k2)
    assert torch.equal(chain(p, x, key=fr.key(1)), expected)


# -------------------------------------------------------------- Chain / MLP
def test_chain_layout_and_nesting():
    inner = fnn.Chain((fnn.Tanh(), fnn.Linear(4, 2)))
    chain = fnn.Chain([fnn.Linear(3, 4), fnn.ReLU(), inner, fnn.Identity()])
    assert chain.layers[2] is inner and isinstance(chain.layers, tuple)
    p = chain.init(0)
    assert p.keys(True, True) == (
        ("0", "weight"),
        ("0", "bias"),
        ("2", "1", "weight"),
        ("2", "1", "bias"),
    )
    assert chain.param_shapes() == {
        ("0", "weight"): (4, 3),
        ("0", "bias"): (4,),
        ("2", "1", "weight"): (2, 4),
        ("2", "1", "bias"): (2,),
    }
    x = torch.randn(5, 3)
    expected = fnn.Linear(4, 2)(p["2", "1"], torch.tanh(torch.relu(fnn.Linear(3, 4)(p["0"], x))))
    torch.testing.assert_close(chain(p, x), expected)
    named = fnn.Chain((fnn.Linear(3, 4), fnn.ReLU()), names=("lin", "act"))
    assert named.init(0).keys() == ("lin",)
    with pytest.raises(ValueError, match="one distinct name per layer"):
        fnn.Chain((fnn.ReLU(), fnn.ReLU()), names=("a", "a"))
    with pytest.raises(TypeError, match=r"not a functd\.nn layer"):
        fnn.Chain((nn.Linear(3, 4),))
    assert len(chain) == 4 and chain[1] == fnn.ReLU()


def test_mlp_matches_nn_sequential():
    mlp = fnn.MLP(3, 2, num_cells=(16, 8), activation=fnn.Tanh())
    seq = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 2))
    params = mlp.init(fr.key(0))
    assert params.keys(True, True) == fnn.state_to_td(seq).keys(True, True)
    fnn.load_td(params, seq)
    x = torch.randn(5, 3)
    torch.testing.assert_close(mlp(params, x), seq(x))
    assert fnn.lower(seq).init(fr.key(0)).keys(True, True) == params.keys(True, True)
    assert fnn.MLP(3, 2, num_cells=(), bias=False).init(0).keys(True, True) == (("0", "weight"),)
    assert fnn.MLP(3, 2, num_cells=[4, 4]) == fnn.MLP(3, 2, num_cells=(4, 4))
    with pytest.raises(TypeError, match="parameter-free"):
        fnn.MLP(3, 2, activation=fnn.PReLU())


# ------------------------------------------------------- values and hashing
def test_layers_are_frozen_hashable_values():
    assert fnn.Linear(3, 4) == fnn.Linear(3, 4) and fnn.Linear(3, 4) != fnn.Linear(3, 4, bias=False)
    assert hash(fnn.Linear(3, 4)) == hash(fnn.Linear(3, 4))
    table = {fnn.Linear(3, 4): "a", fnn.Conv2d(1, 2, 3): "b", fnn.MLP(3, 1): "c"}
    assert table[fnn.Linear(3, 4)] == "a" and table[fnn.MLP(3, 1)] == "c"
    assert fnn.Conv2d(1, 2, 3) == fnn.Conv2d(1, 2, (3, 3), stride=(1, 1), padding=0)
    assert fnn.MultiheadAttention(8, 2) == fnn.MultiheadAttention(8, 2, kdim=8, vdim=8)
    assert fnn.LayerNorm(4) == fnn.LayerNorm([4])
    assert fnn.Embedding(5, 2, padding_idx=-1) == fnn.Embedding(5, 2, padding_idx=4)
    assert fnn.ReLU() != fnn.Tanh()
    with pytest.raises(dataclasses.FrozenInstanceError):
        fnn.Linear(3, 4).in_features = 5
    assert dataclasses.replace(fnn.Conv1d(1, 2, 3), stride=2).stride == (2,)
    for name, (factory, _) in LAYER_CASES.items():
        assert factory() == factory() and hash(factory()) == hash(factory()), name


def test_layers_registry_is_complete():
    public = {
        v
        for k, v in vars(fnn).items()
        if isinstance(v, type) and issubclass(v, fnn.Layer) and not k.startswith("_")
    }
    assert set(fnn.LAYERS) == public - {fnn.Layer, fnn.FunctionalCall}
    assert {cls.__name__ for cls in fnn.LAYERS} == set(LAYER_CASES)
    for name, (factory, inputs) in LAYER_CASES.items():
        layer, args = factory(), inputs()
        assert type(layer).__name__ == name and all(a.shape[0] == 4 for a in args)
        key = fr.key(0) if layer.random else None
        out = _tensors(layer(layer.init(0), *args, key=key))
        if isinstance(layer, fnn.RNN | fnn.GRU | fnn.LSTM):  # states: (layers * dirs, N, H)
            out = [out[0], *(s.movedim(1, 0) for s in out[1:])]
        assert all(o.shape[0] == 4 for o in out if o is not None), name


# -------------------------------------------------------------- transforms
def test_layers_under_vmap_and_compile_smoke():
    gru = fnn.GRUCell(3, 5)
    ens = torch.func.vmap(gru.init)(fr.split(fr.key(0), 3))
    x, h = torch.randn(2, 3), torch.randn(2, 5)
    out = torch.func.vmap(gru, in_dims=(0, None, None))(ens, x, h)
    for i in range(3):
        torch.testing.assert_close(out[i], gru(ens[i], x, h))
    lin = fnn.Linear(3, 4)
    p = lin.init(0)
    per_sample = torch.func.vmap(lin, in_dims=(None, 0))(p, torch.randn(6, 3))
    assert per_sample.shape == (6, 4)


def _as_tuple(out: Any) -> tuple:
    return tuple(_tensors(out))


def _assert_outputs_close(a: Any, b: Any) -> None:
    for x, y in zip(_as_tuple(a), _as_tuple(b)):
        if y is None:
            assert x is None
        else:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(LAYER_CASES))
def test_vmap_over_params_and_inputs_matches_loop(name):
    """Ensembles (vmap over params) and per-sample vmap, without batching-rule fallbacks
    (torch warns on those, and warnings are errors here)."""
    factory, inputs = LAYER_CASES[name]
    layer, args = factory(), inputs()
    kw = {"key": fr.key(0)} if layer.random else {}
    if layer.has_params:
        ens = torch.func.vmap(layer.init)(fr.split(fr.key(0), 3))
        outs = torch.func.vmap(lambda p: layer(p, *args, **kw))(ens)
        for i in range(3):
            _assert_outputs_close(tuple(o[i] for o in _as_tuple(outs)), layer(ens[i], *args, **kw))
    p = layer.init(0)
    outs = torch.func.vmap(lambda *a: layer(p, *a, **kw))(*args)
    for i in range(4):
        expected = layer(p, *[a[i] for a in args], **kw)
        _assert_outputs_close(tuple(o[i] for o in _as_tuple(outs)), expected)


@pytest.mark.compile
@pytest.mark.parametrize(
    "name",
    ["Linear", "Conv2d", "ConvTranspose2d", "LSTMCell", "MultiheadAttention", "MLP", "Dropout"],
)
def test_compile_fullgraph_matches_eager(name):
    torch._dynamo.reset()
    factory, inputs = LAYER_CASES[name]
    layer, args = factory(), inputs()
    kw = {"key": fr.key(0)} if layer.random else {}
    p = layer.init(0)
    compiled = torch.compile(lambda p, *a: layer(p, *a, **kw), fullgraph=True, backend="eager")
    _assert_outputs_close(compiled(p, *args), layer(p, *args, **kw))
