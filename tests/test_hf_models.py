"""Real models nobody here wrote: small random configs of HF transformers models.

Each model is wrapped as a user porting it would (``fd.Module(model, {td_key:
argument}, [output])``, the mapping in shuffled order) and checked against its own
call and against torch.optim: eval outputs, gradients, a vmapped ensemble,
keyword inputs, dropout driven by the key (pure), buffers and frozen parameters
untouched through 3 Adam steps in lockstep with torch.optim.Adam, and
torch.compile(fullgraph=True). Skipped without transformers (the ``models`` extra).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import pytest
import torch

import functd as fd
from functd._torch import TORCH_VERSION
from functd.testing import assert_close

T = pytest.importorskip("transformers")


@dataclasses.dataclass
class Case:
    build: Callable[[], torch.nn.Module]  # a fresh model (training mode, dropout on)
    inputs: Callable[[], dict]  # argument name -> tensor, batch 2
    out: str  # the ModelOutput field read
    freeze: tuple[str, ...] = ()  # submodules frozen (requires_grad=False) before wrapping
    stateful: bool = False  # BatchNorm in training mode (ResNet)


def _ids(n=100, lo=3):
    return torch.randint(lo, n, (2, 7), generator=torch.Generator().manual_seed(0))


def _quiet(cfg_cls, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cfg_cls(**kw)


def _gpt2():
    cfg = _quiet(
        T.GPT2Config, n_layer=2, n_head=2, n_embd=16, vocab_size=100, n_positions=16,
        bos_token_id=None, eos_token_id=None, resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2,
    )  # fmt: skip
    return T.GPT2LMHeadModel(cfg)


def _bert():
    cfg = T.BertConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=16, intermediate_size=32,
        vocab_size=100, max_position_embeddings=16, hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.2,
    )  # fmt: skip
    return T.BertModel(cfg)


def _bart():
    cfg = T.BartConfig(
        encoder_layers=1, decoder_layers=1, d_model=16, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=100,
        max_position_embeddings=16, dropout=0.2, attention_dropout=0.2, activation_dropout=0.2,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_bos_token_id=None, forced_eos_token_id=None,
    )  # fmt: skip
    model = T.BartForConditionalGeneration(cfg)
    with torch.no_grad():  # a float buffer that must not train
        model.final_logits_bias.normal_()
    return model


def _llama():
    cfg = T.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=16,
        intermediate_size=32, vocab_size=100, max_position_embeddings=16, attention_dropout=0.2,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return T.LlamaForCausalLM(cfg)


def _vit():
    cfg = T.ViTConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32,
        image_size=8, patch_size=4, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2,
    )  # fmt: skip
    return T.ViTModel(cfg)


def _resnet():
    cfg = T.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_channels=3
    )
    return T.ResNetModel(cfg)


def _t5():
    cfg = T.T5Config(
        vocab_size=100, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
        num_heads=2, dropout_rate=0.2, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return T.T5ForConditionalGeneration(cfg)


def _pixels(size):
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


def _mask():
    m = torch.ones(2, 7, dtype=torch.long)
    m[0, 5:] = 0
    return m


CASES = {
    "gpt2": Case(_gpt2, lambda: {"input_ids": _ids(), "attention_mask": _mask()}, "logits"),
    "bert": Case(
        _bert,
        lambda: {"token_type_ids": _ids(2, 0), "input_ids": _ids(), "attention_mask": _mask()},
        "last_hidden_state",
        freeze=("embeddings",),
    ),
    "bart": Case(_bart, lambda: {"labels": _ids(), "input_ids": _ids()}, "logits"),
    "llama": Case(_llama, lambda: {"attention_mask": _mask(), "input_ids": _ids()}, "logits"),
    "t5": Case(_t5, lambda: {"labels": _ids(), "input_ids": _ids()}, "logits"),
    "vit": Case(_vit, lambda: {"pixel_values": _pixels(8)}, "last_hidden_state"),
    "resnet": Case(
        _resnet, lambda: {"pixel_values": _pixels(16)}, "last_hidden_state", stateful=True
    ),
}


def make(name, dtype=torch.float32, eval_mode=False):
    """(torch model, fd.Module with shuffled keyword in_keys, params, td)."""
    case = CASES[name]
    torch.manual_seed(0)
    model = case.build().to(dtype)
    for sub in case.freeze:
        model.get_submodule(sub).requires_grad_(False)
    if eval_mode:
        model.eval()
    inputs = case.inputs()
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    names = list(reversed(inputs))  # the mapping in another order than forward's
    m = fd.Module(model, {f"td_{a}": a for a in names}, [case.out])
    td = fd.TensorDict({f"td_{a}": v for a, v in inputs.items()}, [2])
    return model, m, fd.from_module(m), td, inputs


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return (out.double() ** 2).mean()


@pytest.mark.parametrize("name", sorted(CASES))
def test_eval_outputs_equal_the_models_own_call(name):
    model, m, params, td, inputs = make(name, eval_mode=True)
    assert m._label().startswith(f"Module({type(model).__name__} -> ")
    out = m(params, td)[CASES[name].out]
    with torch.no_grad():  # params without grad: the same matmul kernels as functd's leaves
        ref = getattr(model(**inputs), CASES[name].out)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(out, getattr(model(**inputs), CASES[name].out))
    assert_close(params, fd.from_module(model))  # nothing written


@pytest.mark.parametrize("name", sorted(CASES))
def test_grads_equal_torch_autograd(name):
    model, m, params, td, inputs = make(name, torch.float64, eval_mode=True)
    trainable, held = fd.partition(params, fd.trainable(m))
    out_key = CASES[name].out
    grads = fd.grad(lambda p: loss_of(m(fd.combine(p, held), td)[out_key]))(trainable)
    loss_of(getattr(model(**inputs), out_key)).backward()
    n = 0
    for path, g in grads.items(True, True):
        ref = model.get_parameter(".".join(path if isinstance(path, tuple) else (path,))).grad
        torch.testing.assert_close(g, ref if ref is not None else torch.zeros_like(g))
        n += 1
    assert n == sum(p.requires_grad for p in model.parameters())


# torch runs SDPA's CPU flash kernel under vmap member by member, and says so
VMAP_SDPA = "ignore:There is a performance drop because we have not yet implemented the batching"


@pytest.mark.filterwarnings(VMAP_SDPA)
@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_ensemble_equals_the_loop(name):
    _, m, params, td, _ = make(name, eval_mode=True)
    trainable, held = fd.partition(params, fd.trainable(m))
    ens = fd.stack([trainable, trainable.apply(lambda t: t * 0.9)])
    out_key = CASES[name].out
    outs = fd.vmap(lambda p: m(fd.combine(p, held), td)[out_key])(ens)
    for i in range(2):
        torch.testing.assert_close(outs[i], m(fd.combine(ens[i], held), td)[out_key])


@pytest.mark.filterwarnings(VMAP_SDPA)
@pytest.mark.parametrize("name", [n for n in sorted(CASES) if not CASES[n].stateful])
def test_training_mode_dropout_is_keyed_and_pure(name):
    _, m, params, td, _ = make(name)
    assert m.random
    out_key = CASES[name].out
    with pytest.raises(ValueError, match=r"draws random numbers .*training mode.*key="):
        m(params, td)
    rng = torch.get_rng_state()
    a = m(params, td, key=fd.random.key(0))[out_key]
    assert torch.equal(a, m(params, td, key=fd.random.key(0))[out_key])
    assert not torch.equal(a, m(params, td, key=fd.random.key(1))[out_key])
    assert torch.equal(rng, torch.get_rng_state())
    keys = fd.random.split(fd.random.key(2), 2)
    many = fd.vmap(lambda k: m(params, td, key=k)[out_key])(keys)
    torch.testing.assert_close(many[1], m(params, td, key=keys[1])[out_key])


@pytest.mark.parametrize("name", sorted(CASES))
def test_three_adam_steps_in_lockstep_with_torch_optim(name):
    """The README's path, float64: frozen parameters and buffers never move, the rest
    equals torch.optim.Adam over model.parameters() to 1e-10."""
    model, m, params, td, inputs = make(name, torch.float64, eval_mode=True)
    twin = CASES[name].build().to(torch.float64).eval()
    twin.load_state_dict(model.state_dict())
    for sub in CASES[name].freeze:
        twin.get_submodule(sub).requires_grad_(False)
    trainable, held = fd.partition(params, fd.trainable(m))
    trainable, held = trainable.clone(), held.clone()
    frozen_before = held.clone()
    out_key = CASES[name].out
    opt = fd.optim.adam(1e-2)
    state = opt.init(trainable)
    step = fd.train_step(lambda p, b, k: loss_of(m(fd.combine(p, held), b)[out_key]), opt)
    torch_opt = torch.optim.Adam([p for p in twin.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        trainable, state, _ = step(trainable, state, td, None)
        torch_opt.zero_grad()
        loss_of(getattr(twin(**inputs), out_key)).backward()
        torch_opt.step()
    after = fd.combine(trainable, held)
    for path, v in fd.from_module(twin).items(True, True):
        torch.testing.assert_close(after.get(path), v, atol=1e-10, rtol=0)
    assert_close(held, frozen_before)  # bitwise
    if name in ("bart", "bert", "llama", "resnet"):  # buffers or frozen parameters
        assert len(held.keys(True, True)) > 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_fullgraph_equals_eager(name):
    if name == "t5" and TORCH_VERSION < (2, 13):
        pytest.skip(
            "dynamo before torch 2.13 cannot trace copy.deepcopy, which transformers' T5 "
            "decoder calls on its config to build its cache"
        )
    _, m, params, td, _ = make(name, eval_mode=True)
    out_key = CASES[name].out
    f = torch.compile(lambda p, td: m(p, td)[out_key], fullgraph=True, backend="eager")
    torch.testing.assert_close(f(params, td), m(params, td)[out_key])


@pytest.mark.compile
def test_compile_training_gradient_with_keyed_dropout():
    _, m, params, td, _ = make("gpt2")
    trainable, held = fd.partition(params, fd.trainable(m))

    def loss(p, key):
        return loss_of(m(fd.combine(p, held), td, key=key)["logits"])

    f = torch.compile(fd.grad(loss), fullgraph=True, backend="aot_eager")
    key = fd.random.key(0)
    g, e = f(trainable, key), fd.grad(loss)(trainable, key)
    for path, v in e.items(True, True):
        torch.testing.assert_close(g.get(path), v, rtol=1e-4, atol=1e-5)


def test_resnet_batchnorm_statistics_follow_torch_in_training_mode():
    model, m, params, td, inputs = make("resnet")
    assert m.stateful
    out, new_state = m.apply_with_state(params, td)
    ref = model(**inputs).last_hidden_state  # updates the torch model's running stats
    torch.testing.assert_close(out["last_hidden_state"], ref)
    updated = fd.nn.update_state(params, new_state)
    assert_close(updated, fd.from_module(model), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head", [T.ResNetModel, T.ResNetForImageClassification])
def test_resnet_draws_nothing_so_it_is_not_random(head):
    torch.manual_seed(0)
    model = head(_resnet().config)  # training mode: BatchNorm, no dropout
    m = fd.Module(model, {"px": "pixel_values"}, [_first_out(head)])
    assert m.stateful and not m.random
    td = fd.TensorDict({"px": _pixels(16)}, [2])
    out, _ = m.apply_with_state(fd.from_module(m), td)  # no key needed
    ref = getattr(model(pixel_values=_pixels(16)), _first_out(head))
    torch.testing.assert_close(out[_first_out(head)], ref)


def _first_out(head):
    return "logits" if head is T.ResNetForImageClassification else "last_hidden_state"


@pytest.mark.parametrize(("rate", "random"), [(0.0, False), (0.3, True)])
def test_convnext_is_random_only_with_a_drop_path_rate(rate, random):
    cfg = T.ConvNextConfig(
        num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_channels=3, drop_path_rate=rate
    )
    m = fd.Module(T.ConvNextModel(cfg), {"px": "pixel_values"}, ["last_hidden_state"])
    assert m.random is random
    td = fd.TensorDict({"px": _pixels(16)}, [2])
    if not random:  # the same output with no key as with one
        params = fd.from_module(m)
        torch.testing.assert_close(m(params, td), m(params, td, key=fd.random.key(0)))


def test_a_scalar_loss_output_says_how_to_read_it():
    model, _, params, td, inputs = make("bart", eval_mode=True)
    m = fd.Module(model, {f"td_{a}": a for a in inputs}, ["loss"])
    with pytest.raises(
        ValueError,
        match=r"output 'loss' has shape \[\], which does not start with the batch size \[2\].* "
        r"reduced over the batch .*keyword form.*`loss = m\(params, x=x, ...\)`.*"
        r"fd.TensorDict\(td, batch_size=\[\]\).*leave 'loss' out of out_keys",
    ):
        m(params, td)
    ref = model(**inputs).loss
    torch.testing.assert_close(m(params, **{f"td_{a}": v for a, v in inputs.items()}), ref)
    torch.testing.assert_close(m(params, fd.TensorDict(td, batch_size=[]))["loss"], ref)
