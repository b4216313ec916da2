"""A tied model's ``.safetensors`` (issue 39, item 5): what it holds, who ties it again.

GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``. HF's ``save_pretrained``
writes the tensor once (no ``lm_head.weight``), and so does ``fd.save`` of
``fd.from_module``: the same names. ``load_state_dict`` (strict) refuses either
file; ``fd.to_module``, ``from_pretrained`` and ``load_state_dict(strict=False)`` +
``tie_weights()`` restore the tie (the head *is* the embedding again) and the
original's logits. docs/guides/files.md shows the same readers (run by test_docs).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import functd as fd

T = pytest.importorskip("transformers")
load_file = pytest.importorskip("safetensors.torch").load_file


def _config():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return T.GPT2Config(
            vocab_size=100, n_positions=16, n_embd=16, n_layer=2, n_head=2,
            bos_token_id=None, eos_token_id=None,
        )  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(config, the original model, ids, its logits, functd's folder, HF's folder)."""
    T.logging.set_verbosity_error()
    T.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    config = _config()
    gpt2 = T.GPT2LMHeadModel(config).eval()
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight  # tied
    ours, theirs = tmp_path_factory.mktemp("functd"), tmp_path_factory.mktemp("hf")
    fd.save(
        fd.from_module(fd.Module(gpt2, {"ids": "input_ids"}, ["logits"])),
        str(ours / "model.safetensors"),
    )
    config.save_pretrained(ours)
    gpt2.save_pretrained(theirs)
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = gpt2(input_ids=ids).logits
    return config, gpt2, ids, want, ours, theirs


def _check(model, ids, want):
    assert model.lm_head.weight is model.transformer.wte.weight
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, want)


def test_functds_file_holds_the_names_hfs_own_file_holds(saved):
    *_, ours, theirs = saved
    a, b = load_file(str(ours / "model.safetensors")), load_file(str(theirs / "model.safetensors"))
    assert "lm_head.weight" not in a and "transformer.wte.weight" in a
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_strict_load_state_dict_refuses_a_tied_file_whoever_wrote_it(saved):
    config, *_, ours, theirs = saved
    for folder in (ours, theirs):
        model = T.GPT2LMHeadModel(config)
        with pytest.raises(
            RuntimeError, match=r'Missing key\(s\) in state_dict: "lm_head\.weight"'
        ):
            model.load_state_dict(load_file(str(folder / "model.safetensors")))


def test_to_module_restores_the_tie_and_the_logits(saved):
    config, _, ids, want, ours, _ = saved
    model = T.GPT2LMHeadModel(config).eval()  # other random weights
    fd.to_module(fd.load(str(ours / "model.safetensors")), model)
    _check(model, ids, want)


def test_from_pretrained_on_functds_folder_restores_the_tie_and_the_logits(saved):
    _, _, ids, want, ours, _ = saved
    _check(T.GPT2LMHeadModel.from_pretrained(ours).eval(), ids, want)


def test_load_state_dict_not_strict_then_tie_weights_restores_the_tie_and_the_logits(saved):
    config, _, ids, want, ours, _ = saved
    model = T.GPT2LMHeadModel(config).eval()
    missing, unexpected = model.load_state_dict(
        load_file(str(ours / "model.safetensors")), strict=False
    )
    assert missing == ["lm_head.weight"] and unexpected == []
    model.tie_weights()
    _check(model, ids, want)


def test_functd_reads_the_file_back_into_the_params(saved):
    _, gpt2, ids, want, ours, _ = saved
    lm = fd.Module(gpt2, {"ids": "input_ids"}, ["logits"])
    params = fd.from_module(lm).update(fd.load(str(ours / "model.safetensors")))
    assert torch.equal(lm(params, fd.TensorDict({"ids": ids}, [2]))["logits"], want)
