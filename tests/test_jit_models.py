"""Every model and layer compiles under fd.jit, in eval and in keyed training.

The models of test_hf_models.py and test_torch_models.py (as built: HF attention is
torch's ``F.scaled_dot_product_attention``), nn.TransformerDecoder and the whole
conformance registry, each traced in ONE fd.jit program that returns its eval output
and its keyed-training output, against the eager calls (eval: the same; training:
the same key gives eager's draws). The exhaustive walks run the traced graph
(``backend="fx"``: the trace, the graph checks and the traced ops; it catches any
refusal and any trace-level wrong answer); inductor compiles a representative
subset (marked ``compile``). Ops that still draw from torch's global generator are
refused with the op, the module, the line and the way around.
"""

from __future__ import annotations

import pytest
import test_torch_models as tm
import torch
import torch.nn as nn
import torch.nn.functional as F

import functd as fd
from functd.testing import assert_close, assert_max_compiles
from tests._support.conformance import ENTRIES, params_for

try:
    import test_hf_models as hf
except pytest.skip.Exception:  # no transformers (the ``models`` extra)
    hf = None

FX = {"backend": "fx"}
TOL = {"rtol": 1e-5, "atol": 1e-5}


# ---------------------------------------------------------------- the models
def _decoder():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.3, batch_first=True)
    g = torch.Generator().manual_seed(0)
    inputs = {"tgt": torch.randn(3, 4, 8, generator=g), "memory": torch.randn(3, 5, 8, generator=g)}
    m = fd.Module(nn.TransformerDecoder(layer, 2), {f"td_{a}": a for a in inputs}, ["y"])
    td = fd.TensorDict({f"td_{a}": v for a, v in inputs.items()}, [])
    return m, fd.from_module(m), td


class Attention(nn.Module):
    """A torch module calling F.scaled_dot_product_attention as HF models do."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4).unbind(0)
        p = 0.5 if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


def _issue_models() -> dict:
    """The models the issue names beside those of test_hf_models.py (DistilBERT, RoBERTa,
    Qwen2), built the same way: small random configs, dropout on, default attention."""
    T, q = hf.T, hf._quiet
    return {
        "distilbert": (
            lambda: T.DistilBertModel(q(
                T.DistilBertConfig, n_layers=1, n_heads=2, dim=16, hidden_dim=32,
                vocab_size=100, max_position_embeddings=16, dropout=0.2, attention_dropout=0.2,
            )),
            "last_hidden_state",
        ),
        "roberta": (
            lambda: T.RobertaModel(q(
                T.RobertaConfig, num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                intermediate_size=32, vocab_size=100, max_position_embeddings=16,
                hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2,
            )),
            "last_hidden_state",
        ),
        "qwen2": (
            lambda: T.Qwen2ForCausalLM(q(
                T.Qwen2Config, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                hidden_size=16, intermediate_size=32, vocab_size=100, max_position_embeddings=16,
                attention_dropout=0.2,
            )),
            "logits",
        ),
    }  # fmt: skip


def _issue_model(name: str):
    build, out = _issue_models()[name]
    torch.manual_seed(0)
    model = build()
    assert model.config._attn_implementation == "sdpa"  # as built: torch's fused attention
    inputs = {"attention_mask": hf._mask(), "input_ids": hf._ids()}
    m = fd.Module(model, {f"td_{a}": a for a in inputs}, [out])
    return m, fd.from_module(m), fd.TensorDict({f"td_{a}": v for a, v in inputs.items()}, [2])


def _model(name: str):
    """(fd.Module in training mode, params, td, whether its training output draws)."""
    if name == "transformer_decoder":
        return (*_decoder(), True)
    kind, _, case = name.partition(":")
    if kind == "issue":
        return (*_issue_model(case), True)
    _, m, params, td, _ = (hf if kind == "hf" else tm).make(case)
    draws = not hf.CASES[case].stateful if kind == "hf" else tm.CASES[case].random
    return m, params, td, draws  # (HF's ResNet has no dropout)


MODELS = [f"torch:{n}" for n in sorted(tm.CASES)] + ["transformer_decoder"]
MODELS += [f"hf:{n}" for n in sorted(hf.CASES)] if hf is not None else []
MODELS += [f"issue:{n}" for n in sorted(_issue_models())] if hf is not None else []


def _run(m, params, td, key=None):
    """The module's output td; ``(td, new_state)`` for a stateful one (BatchNorm)."""
    if m.stateful:
        return m.apply_with_state(params, td, key=key)
    return m(params, td, key=key)


def _both(m):
    """``f(params, td, key) -> (eval output, keyed-training output)``: one program. The
    eval call gets the key only when eval mode still draws (a Probabilistic module
    sampling with InteractionType.RANDOM)."""
    evaluate = fd.nn.eval_mode(m)
    return lambda p, td, key: (
        _run(evaluate, p, td, key if evaluate.random else None),
        _run(m, p, td, key),
    )


def _check_jit_equals_eager(m, params, td, jitted, draws: bool = False) -> None:
    """jit == eager in eval and in training with the same key (two keys); with
    ``draws``, the two keys' training outputs differ (the test is not vacuous);
    torch's global generator untouched."""
    f, key = _both(m), fd.random.key(0)
    rng = torch.get_rng_state()
    with assert_max_compiles(1):
        got = jitted(params, td, key)
        other = jitted(params, td, fd.random.key(1))
    assert torch.equal(rng, torch.get_rng_state())
    assert_close(got, f(params, td, key), **TOL)
    assert_close(other, f(params, td, fd.random.key(1)), **TOL)
    if draws:
        train, train_other = (fd.tree.leaves(out[1]) for out in (got, other))
        assert any(not torch.equal(a, b) for a, b in zip(train, train_other))


@pytest.mark.parametrize("name", MODELS)
def test_every_model_traces_under_jit_in_eval_and_keyed_training(name):
    m, params, td, draws = _model(name)
    _check_jit_equals_eager(m, params, td, fd.jit(_both(m), **FX), draws)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_registry_entry_traces_under_jit_in_eval_and_keyed_training(name):
    m = ENTRIES[name].make()
    params, td = params_for(m), ENTRIES[name].example()
    _check_jit_equals_eager(m, params, td, fd.jit(_both(m), **FX))


# ---------------------------------------------------------------- inductor
# A representative subset (a compile costs seconds per model; several models in one
# program compile slower than apart): HF attention through sdpa (GPT-2; Llama's
# grouped-query heads), TransformerDecoder, a CNN and an LSTM in eval; a torch module's
# sdpa in eval and keyed training (its dropout from the key), one program. (Keyed
# training of whole models compiles too, but threefry's code costs inductor 15-130 s a
# model on 2 cores; the fx walk above covers their traces.)
EVAL_SUBSET = ["transformer_decoder", "torch:cnn", "torch:lstm"]
EVAL_SUBSET += ["hf:gpt2", "hf:llama"] if hf is not None else []


@pytest.mark.compile
@pytest.mark.parametrize("name", EVAL_SUBSET)
def test_inductor_compiles_models_in_eval(name):
    m, params, td = _model(name)[:3]
    evaluate = fd.nn.eval_mode(m)
    with assert_max_compiles(1):
        got = fd.jit(lambda p, td: _run(evaluate, p, td))(params, td)
    assert_close(got, _run(evaluate, params, td), **TOL)


@pytest.mark.compile
def test_inductor_compiles_sdpa_attention_in_eval_and_keyed_training():
    m = fd.Module(Attention(), ["x"], ["y"])
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
    _check_jit_equals_eager(
        m, fd.from_module(m), fd.TensorDict({"x": x}, []), fd.jit(_both(m)), True
    )


# ---------------------------------------------------------------- sdpa
def test_sdpa_without_dropout_is_not_a_draw():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    mask = torch.rand(5, 5, generator=g) > 0.3

    def f(q, k, v, mask):
        return (
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0),
            F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True),
        )

    jitted = fd.jit(f, **FX)
    assert "scaled_dot_product_flash_attention" in jitted.lower(q, k, v, mask).graph
    assert_close(jitted(q, k, v, mask), f(q, k, v, mask), rtol=0, atol=0)


def test_sdpa_dropout_in_a_torch_module_draws_from_the_key_under_jit():
    m = fd.Module(Attention(), ["x"], ["y"])
    params = fd.from_module(m)
    td = fd.TensorDict({"x": torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))}, [])
    _check_jit_equals_eager(m, params, td, fd.jit(_both(m), **FX), draws=True)


def test_eval_mode_called_inside_the_jitted_function():
    """fd.nn.eval_mode of a wrapped torch module inside fd.jit (it copies the module's
    meta copy; a copy that re-made its Parameters failed under the trace)."""
    m = fd.Module(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), ["x"], ["y"])
    params = fd.from_module(m)
    td = fd.TensorDict({"x": torch.randn(2, 3, generator=torch.Generator().manual_seed(0))}, [2])
    jitted = fd.jit(lambda p, td: fd.nn.eval_mode(m)(p, td)["y"], **FX)
    assert_close(jitted(params, td), fd.nn.eval_mode(m)(params, td)["y"], rtol=0, atol=0)


# ---------------------------------------------------------------- refused draws
class Noisy(nn.Module):
    """Draws in eval mode too, where functd hands a torch module no key."""

    def forward(self, x):
        return x + torch.randn_like(x)


class GammaNoise(nn.Module):
    def forward(self, x):
        return x * torch.distributions.Gamma(2.0, 1.0).rsample(x.shape)


class Net(nn.Module):
    def __init__(self, noise):
        super().__init__()
        self.lin, self.noise = nn.Linear(3, 3), noise

    def forward(self, x):
        return self.noise(self.lin(x))


def _wrapped(noise, training):
    m = fd.Module(Net(noise).train(training), ["x"], ["y"])
    td = fd.TensorDict({"x": torch.ones(2, 3)}, [2])
    return m, fd.from_module(m), td


def test_a_draw_in_an_eval_mode_torch_module_names_op_module_line_and_fix():
    m, params, td = _wrapped(Noisy(), training=False)
    with pytest.raises(
        fd.TransformError,
        match=r"fd.jit\(<lambda>\): the function draws from torch's global generator "
        r"\(aten.randn.default, from randn_like\(\.\.\.\)\) in Noisy \(submodule `noise`\) of "
        r"Module\(Net -> 'y'\) at .*test_jit_models.py:\d+ "
        r"\(`return x \+ torch.randn_like\(x\)`\).*Noisy draws in eval mode.*`self.training`",
    ):
        fd.jit(lambda p, td: m(p, td), **FX)(params, td)


def test_a_draw_functd_does_not_key_in_training_names_it_and_the_fix():
    m, params, td = _wrapped(GammaNoise(), training=True)
    with pytest.raises(
        fd.TransformError, match=r"\(aten._standard_gamma.default.*in GammaNoise.*no keyed version"
    ):
        fd.jit(lambda p, td, k: m(p, td, key=k), **FX)(params, td, fd.random.key(0))
    with pytest.raises(RuntimeError, match=r"drew from torch's global generator"):  # eager
        m(params, td, key=fd.random.key(0))


def test_sdpa_dropout_outside_a_module_is_refused_pointing_to_the_keyed_sdpa():
    q = torch.ones(1, 2, 3, 4)
    with pytest.raises(
        fd.TransformError,
        match=r"from scaled_dot_product_attention\(\.\.\.\)\) at .*test_jit_models.py:\d+.*"
        r"fd.nn.scaled_dot_product_attention\(q, k, v, dropout_p=p, key=key\)",
    ):
        fd.jit(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.1), **FX)(q)
    key = fd.random.key(0)
    keyed = fd.jit(
        lambda q, k: fd.nn.scaled_dot_product_attention(q, q, q, dropout_p=0.5, key=k), **FX
    )
    assert_close(keyed(q, key), fd.nn.scaled_dot_product_attention(q, q, q, dropout_p=0.5, key=key))


def test_a_draw_in_a_loop_step_is_refused_under_jit():
    def f(x):
        return fd.scan(lambda c, _: (c + torch.rand(3), c), x, None, length=3)

    with pytest.raises(fd.TransformError, match=r"\(aten.rand.default, from rand\(\.\.\.\)\) at "):
        fd.jit(f, **FX)(torch.zeros(3))
