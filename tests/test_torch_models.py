"""torch.nn's own models through functd, as a user porting them would wrap them.

TransformerEncoder (run through FunctionalCall), LSTM and GRU (lowered onto
functd's RNN layers), a Conv-BN-ReLU-MaxPool-Dropout CNN (lowered child by child),
Embedding and EmbeddingBag, MultiheadAttention and Dropout: keyword inputs against
the module's own keyword call, dropout keyed and pure in training mode, vmap
ensembles equal to the loop, and 3 Adam steps in lockstep with torch.optim.Adam in
float64 with frozen parameters and buffers untouched. And the errors a user porting a
model meets (params from init instead of from_module, a shared leaf in a batched
TensorDict, sparse gradients, integer buffers under grad, eval of a torch module), each
pointing to the right fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

import functd as fd
from functd.testing import assert_close


@dataclasses.dataclass
class Case:
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict]  # forward's argument name -> tensor
    outs: tuple[str, ...]  # out_keys, in the module's output order
    read: str  # the out_key compared and differentiated
    random: bool = True  # has dropout in training mode
    freeze: str | None = None  # a parameter frozen before wrapping


def _g(i=0):
    return torch.Generator().manual_seed(i)


def _cnn():
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.3), nn.Flatten(), nn.Linear(4 * 4 * 4, 5),
    )  # fmt: skip


CASES = {
    "transformer_encoder": Case(
        lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3, batch_first=True),
            2,
            enable_nested_tensor=False,
        ),
        lambda: {"src": torch.randn(3, 5, 8, generator=_g()), "mask": None},
        ("y",),
        "y",
        freeze="layers.0.linear1.bias",
    ),
    "lstm": Case(
        lambda: nn.LSTM(4, 6, num_layers=2, batch_first=True, dropout=0.3),
        lambda: {"input": torch.randn(3, 5, 4, generator=_g())},
        ("out", "h", "c"),
        "out",
    ),
    "gru": Case(
        lambda: nn.GRU(4, 6, num_layers=2, batch_first=True, dropout=0.3, bidirectional=True),
        lambda: {"input": torch.randn(3, 5, 4, generator=_g())},
        ("out", "h"),
        "out",
    ),
    "cnn": Case(_cnn, lambda: {"input": torch.randn(3, 3, 8, 8, generator=_g())}, ("y",), "y"),
    "embedding": Case(
        lambda: nn.Sequential(nn.Embedding(20, 4), nn.Flatten(), nn.Linear(16, 3)),
        lambda: {"input": torch.randint(0, 20, (3, 4), generator=_g())},
        ("y",),
        "y",
        random=False,
        freeze="0.weight",
    ),
    "embedding_bag": Case(
        lambda: nn.EmbeddingBag(20, 4, mode="mean"),
        lambda: {
            "offsets": torch.tensor([0, 2, 5]),
            "input": torch.randint(0, 20, (7,), generator=_g(1)),
        },
        ("y",),
        "y",
        random=False,
    ),
    "multihead_attention": Case(
        lambda: nn.MultiheadAttention(8, 2, dropout=0.3, batch_first=True),
        lambda: {
            "value": torch.randn(3, 5, 8, generator=_g(2)),
            "key": torch.randn(3, 5, 8, generator=_g(1)),
            "query": torch.randn(3, 5, 8, generator=_g()),
        },
        ("y", "w"),
        "y",
    ),
    "dropout": Case(
        lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)),
        lambda: {"input": torch.randn(3, 4, generator=_g())},
        ("y",),
        "y",
    ),
}


def make(name, dtype=torch.float32, eval_mode=False):
    case = CASES[name]
    torch.manual_seed(0)
    model = case.build().to(dtype)
    if case.freeze:
        model.get_parameter(case.freeze).requires_grad_(False)
    if eval_mode:
        model.eval()
    inputs = {k: v for k, v in case.inputs().items() if v is not None}
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    m = fd.Module(model, {f"td_{a}": a for a in inputs}, list(case.outs))  # shuffled names
    td = fd.TensorDict({f"td_{a}": v for a, v in inputs.items()}, [])
    return model, m, fd.from_module(m), td, inputs


def _out(case, raw):
    flat = []
    for v in raw if isinstance(raw, tuple) else (raw,):
        flat.extend(v if isinstance(v, tuple) else (v,))
    return flat[case.outs.index(case.read)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_keyword_inputs_equal_the_modules_keyword_call(name):
    model, m, params, td, inputs = make(name, eval_mode=True)
    case = CASES[name]
    out = m(params, td)[case.read]
    # ATen picks its matmul / fused-RNN kernel by whether the weights require grad and
    # by grad mode; functd's leaves do not require grad, so one of torch's two calls
    # runs the same kernels: equal to it bitwise, and close to the other
    with torch.no_grad():
        ref_no_grad = _out(case, model(**inputs))
    ref_grad = _out(case, model(**inputs))
    # (the bidirectional GRU: torch's fused op rounds differently for weights that do
    # not require grad in both modes; functd equals that op on detached weights)
    assert torch.equal(out, ref_no_grad) or torch.equal(out, ref_grad) or name == "gru"
    torch.testing.assert_close(out, ref_grad)


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if CASES[n].random])
def test_training_mode_draws_from_the_key_purely(name):
    _, m, params, td, _ = make(name)
    read = CASES[name].read
    assert m.random
    with pytest.raises(ValueError, match=r"(PRNG key|draws random numbers)"):
        call(m, params, td, None)
    rng = torch.get_rng_state()
    a = call(m, params, td, fd.random.key(0))[read]
    assert torch.equal(a, call(m, params, td, fd.random.key(0))[read])
    assert not torch.equal(a, call(m, params, td, fd.random.key(1))[read])
    assert torch.equal(rng, torch.get_rng_state())


def call(m, params, td, key):
    if m.stateful:  # the CNN's BatchNorm in training mode
        return m.apply_with_state(params, td, key=key)[0]
    return m(params, td, key=key)


# TransformerEncoder's eval fast path (torch._transformer_encoder_layer_fwd, taken when no
# parameter requires grad) has no vmap batching rule: torch loops over members, and says so
@pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")
@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_ensemble_equals_the_loop(name):
    _, m, params, td, _ = make(name, eval_mode=True)
    trainable, held = fd.partition(params, fd.trainable(m))
    ens = fd.stack([trainable, trainable.apply(lambda t: t * 0.8), trainable.apply(torch.neg)])
    read = CASES[name].read
    outs = fd.vmap(lambda p: m(fd.combine(p, held), td)[read])(ens)
    for i in range(3):
        torch.testing.assert_close(outs[i], m(fd.combine(ens[i], held), td)[read])


@pytest.mark.parametrize("name", sorted(CASES))
def test_three_adam_steps_in_lockstep_with_torch_optim(name):
    model, m, params, td, inputs = make(name, torch.float64, eval_mode=True)
    case = CASES[name]
    twin = case.build().to(torch.float64).eval()
    twin.load_state_dict(model.state_dict())
    if case.freeze:
        twin.get_parameter(case.freeze).requires_grad_(False)
    trainable, held = fd.partition(params, fd.trainable(m))
    trainable, held = trainable.clone(), held.clone()
    before = held.clone()
    opt = fd.optim.adam(1e-2)
    state = opt.init(trainable)

    def loss(p, batch, key):
        return (m(fd.combine(p, held), batch)[case.read] ** 2).mean()

    step = fd.train_step(loss, opt)
    torch_opt = torch.optim.Adam([p for p in twin.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        trainable, state, _ = step(trainable, state, td, None)
        torch_opt.zero_grad()
        (_out(case, twin(**inputs)) ** 2).mean().backward()
        torch_opt.step()
    after = fd.combine(trainable, held)
    for path, v in fd.from_module(twin).items(True, True):
        torch.testing.assert_close(after.get(path), v, atol=1e-10, rtol=0)
    assert_close(held, before)


# ---------------------------------------------------------------- errors a user porting a model meets
# each points to the right fix
class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3, 3))

    def forward(self, x):
        return x @ self.w


def test_missing_params_of_a_wrapped_torch_module_point_to_from_module_not_init():
    m = fd.Module(Custom(), ["x"], ["y"])
    td = fd.TensorDict({"x": torch.ones(2, 3)}, [2])
    with pytest.raises(TypeError, match=r"params = fd.from_module\(m\) \(the weights") as info:
        m(None, td)
    assert "init" not in str(info.value)  # FunctionalCall has no pure init
    with pytest.raises(KeyError, match=r"Use fd.from_module\(m\) \(the weights") as info:
        m(fd.TensorDict({"v": torch.ones(3, 3)}, []), td)
    assert "init" not in str(info.value)
    lin = fd.Module(nn.Linear(3, 3), ["x"], ["y"])  # lowered: both ways work
    with pytest.raises(TypeError, match=r"fd.from_module\(m\).* or m.init\(fd.random.key\(0\)\)"):
        lin(None, td)
    seq = lin >> m
    with pytest.raises(
        TypeError,
        match=r"seq\(params, td\) with params = fd.from_module\(seq\) \(the weights of the torch modules it wraps\)\.",
    ):
        seq(None, td)


def test_a_shared_leaf_in_a_batched_tensordict_says_to_expand_or_keep_it_out():
    with pytest.raises(
        ValueError,
        match=r"entry 'mask' has shape \[5, 5\].*batch size \[4\].*A leaf shared by every batch "
        r"element.*expand it.*keep it out",
    ):
        fd.TensorDict({"x": torch.randn(4, 5, 8), "mask": torch.ones(5, 5)}, [4])


def test_sparse_gradients_name_the_layer_option():
    emb = nn.Embedding(10, 4, sparse=True)  # not lowered: runs through FunctionalCall
    m = fd.Module(emb, ["i"], ["e"])
    params = fd.from_module(m)
    opt = fd.optim.adam(1e-3)
    step = fd.train_step(lambda p, b, k: m(p, b)["e"].sum(), opt)
    td = fd.TensorDict({"i": torch.tensor([1, 2, 3])}, [3])
    with pytest.raises(
        TypeError,
        match=r"fd.optim.adam.update: grads entry 'weight' is a torch.sparse_coo tensor.*"
        r"sparse=False",
    ):
        step(params, opt.init(params), td, None)


def test_integer_buffers_under_grad_say_to_hold_them_out():
    bn = fd.Module(nn.BatchNorm1d(3).eval(), ["x"], ["y"])
    params = fd.from_module(bn)
    td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])
    with pytest.raises(
        TypeError, match=r"'num_batches_tracked'\] has dtype torch.int64.*Hold it out.*fd.partition"
    ):
        fd.grad(lambda p: bn(p, td)["y"].sum())(params)
    trainable, held = fd.partition(params, fd.trainable(bn))
    g = fd.grad(lambda p: bn(fd.combine(p, held), td)["y"].sum())(trainable)
    assert set(g.keys()) == {"weight", "bias"}


def test_eval_mode_of_a_torch_module_says_to_wrap_it_or_use_eval():
    with pytest.raises(
        TypeError,
        match=r"Custom is a torch module. Wrap it first, fd.nn.eval_mode\(fd.Module\(model",
    ):
        fd.nn.eval_mode(Custom())
