"""fd.save/fd.load of .safetensors files: bitwise round trips for every dtype the
format holds, torch's load_state_dict and HF's save_pretrained/from_pretrained on
both sides (references nobody here wrote), the tree and batch sizes kept, damaged
files refused."""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from hypothesis import given

import functd as fd

st = pytest.importorskip("safetensors.torch")

DTYPES = sorted(set(st._TYPES.values()), key=str)  # every dtype the format holds


def _random_bits(dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """Random bytes viewed as ``dtype``: NaN payloads, infinities, subnormals included."""
    size = torch.empty((), dtype=dtype).element_size()
    n = int(torch.tensor(shape).prod()) if shape else 1
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8)
    if dtype is torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_u8(a), _u8(b))


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bitwise(tmp_path, dtype):
    x = _random_bits(dtype, (4, 3))
    tree = fd.TensorDict({"x": x, "nested": {"y": x[:, 0]}, "s": x[:, :1]}, [4])
    path = str(tmp_path / "w.safetensors")
    fd.save(tree, path)
    back = fd.load(path)
    for k in (("x",), ("nested", "y"), ("s",)):
        assert _same_bits(back[k], tree[k]), k
    # the same bytes through the format's own reader
    raw = st.load_file(path)
    assert _same_bits(raw["x"], x) and _same_bits(raw["nested.y"], x[:, 0])


def test_dtypes_cover_what_functd_uses():
    wanted = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64}
    wanted |= {torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64}
    assert wanted <= set(DTYPES)


def test_a_dtype_the_format_lacks_is_refused(tmp_path):
    td = fd.TensorDict({"z": torch.zeros(2, dtype=torch.complex128)})
    with pytest.raises(TypeError, match=r"'z' has dtype torch.complex128.*fd.save\(tree, 'x.pt'\)"):
        fd.save(td, str(tmp_path / "w.safetensors"))
    assert not os.listdir(tmp_path)  # nothing written, no temporary left


def test_the_tree_and_batch_sizes_come_back(tmp_path):
    inner = fd.TensorDict({"a.b": torch.randn(2, 3, 4), "c": torch.arange(6).reshape(2, 3)}, [2, 3])
    td = fd.TensorDict({"inner": inner, "w": torch.randn(2, 5)}, [2])
    tree = {"td": td, "list": [torch.ones(1), None], "tuple": (torch.zeros(2),), "n": 3, "s": "x"}
    path = str(tmp_path / "tree.safetensors")
    fd.save(tree, path)
    back = fd.load(path)
    assert back["td"].batch_size == torch.Size([2])
    assert back["td"]["inner"].batch_size == torch.Size([2, 3])
    assert back["td"].keys() == td.keys() and back["td"]["inner"].keys() == ("a.b", "c")
    fd.testing.assert_close(back["td"], td)
    assert isinstance(back["list"], list) and back["list"][1] is None
    assert isinstance(back["tuple"], tuple) and back["n"] == 3 and back["s"] == "x"
    names = set(st.load_file(path))  # flat dotted names, as state_dict has them
    assert names == {"td.inner.a.b", "td.inner.c", "td.w", "list.0", "tuple.0"}


@given(fd.testing.tensordicts(dtypes=(torch.float32, torch.int64, torch.bool), max_extra_dims=1))
def test_random_tensordicts_round_trip(td):
    import tempfile

    names = [".".join(k if isinstance(k, tuple) else (k,)) for k in td.keys(True, True)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "td.safetensors")
        if len(set(names)) < len(names):  # a key with a dot meets a nested path: refused
            with pytest.raises(ValueError, match=r"both get the flat name .*rename the key"):
                fd.save({"td": td}, path)
            return
        fd.save({"td": td}, path)
        back = fd.load(path)["td"]
    fd.testing.assert_close(back, td)
    assert back.batch_size == td.batch_size
    for k in td.keys(include_nested=True):
        v = td[k]
        if isinstance(v, fd.TensorDict):
            assert back[k].batch_size == v.batch_size


def test_torch_load_state_dict_reads_functd_params(tmp_path):
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Conv1d(1, 2, 3), nn.BatchNorm1d(2))
    model = fd.Module(net, ["x"], ["y"])
    params = fd.from_module(model)
    params = params.apply(lambda t: t + 1 if t.is_floating_point() else t + 3)  # not net's values
    path = str(tmp_path / "params.safetensors")
    fd.save(params, path)
    other = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Conv1d(1, 2, 3), nn.BatchNorm1d(2))
    other.load_state_dict(st.load_file(path), strict=True)
    for name, t in other.state_dict().items():
        assert _same_bits(t, params[tuple(name.split("."))]), name


def test_a_torch_state_dict_file_loads_as_from_module(tmp_path):
    net = nn.Sequential(nn.Linear(3, 8), nn.GELU(), nn.Linear(8, 2), nn.LayerNorm(2))
    path = str(tmp_path / "torch.safetensors")
    st.save_file(net.state_dict(), path)
    loaded = fd.load(path)
    expected = fd.from_module(fd.Module(net, ["x"], ["y"]))
    assert loaded.batch_size == torch.Size([])
    assert set(loaded.keys(True, True)) == set(expected.keys(True, True))
    for k in expected.keys(True, True):
        assert _same_bits(loaded[k], expected[k]), k


def test_views_shared_and_strided_leaves_are_written_compact(tmp_path):
    big = torch.randn(1000, 100)
    w = torch.randn(4, 4)
    td = fd.TensorDict({"view": big[:2], "t": w.T, "w": w, "tied": w})
    path = str(tmp_path / "v.safetensors")
    fd.save(td, path)
    assert os.path.getsize(path) < 2 * 100 * 4 + 3 * 16 * 4 + 4096
    back = fd.load(path)
    fd.testing.assert_close(back, td)
    assert back["w"].data_ptr() != back["tied"].data_ptr()  # loaded as separate tensors


def test_nothing_given_is_modified(tmp_path):
    w = torch.randn(3, 3).T  # not contiguous
    td = fd.TensorDict({"w": w, "v": torch.randn(3, requires_grad=True)})
    before = {k: td[k].detach().clone() for k in td.keys()}  # noqa: SIM118 (iter: batch)
    fd.save(td, str(tmp_path / "x.safetensors"))
    assert td["w"] is w and not w.is_contiguous() and td["v"].requires_grad
    for k, v in before.items():
        assert torch.equal(td[k], v)


def test_map_location_and_sniffing(tmp_path):
    path = str(tmp_path / "w.safetensors")
    td = fd.TensorDict({"x": torch.randn(3)})
    fd.save(td, path)
    other = str(tmp_path / "weights.bin")  # another name: recognised by its header
    os.replace(path, other)
    fd.testing.assert_close(fd.load(other, map_location="cpu"), td)
    with pytest.raises(TypeError, match="map_location is a device"):
        fd.load(other, map_location={"cuda:0": "cpu"})


def test_a_flipped_byte_is_an_error(tmp_path):
    path = str(tmp_path / "w.safetensors")
    fd.save(fd.TensorDict({"x": torch.arange(64.0)}), path)
    data = bytearray(Path(path).read_bytes())
    data[-5] ^= 0x01  # inside the tensor data
    Path(path).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"'x' is damaged \(its CRC-32 does not match"):
        fd.load(path)
    st.load_file(path)  # the format itself cannot tell


def test_truncated_and_empty_files_are_errors(tmp_path):
    path = str(tmp_path / "w.safetensors")
    fd.save(fd.TensorDict({"x": torch.arange(64.0)}), path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-10])
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        fd.load(path)
    Path(path).write_bytes(b"")
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        fd.load(path)


def test_bad_trees_are_refused_with_the_path(tmp_path):
    path = str(tmp_path / "w.safetensors")
    with pytest.raises(TypeError, match=r"give a TensorDict, a dict, a list or a tuple"):
        fd.save(torch.zeros(2), path)
    with pytest.raises(TypeError, match=r"the key path \('a',\), a object cannot be written"):
        fd.save({"a": object()}, path)
    with pytest.raises(TypeError, match=r"the dict key 1 is a int"):
        fd.save({1: torch.zeros(1)}, path)
    clash = fd.TensorDict({"a.b": torch.zeros(1), "a": {"b": torch.ones(1)}})
    with pytest.raises(ValueError, match=r"both get the flat name 'a.b'"):
        fd.save(clash, path)
    assert not os.path.exists(path)


def test_damaged_tree_metadata_is_an_error(tmp_path):
    path = str(tmp_path / "w.safetensors")
    meta = {"format": "pt", "functd": json.dumps({"version": 99})}
    st.save_file({"x": torch.zeros(1)}, path, metadata=meta)
    with pytest.raises(ValueError, match="functd metadata is not one this version reads"):
        fd.load(path)


@pytest.mark.parametrize("n", [1, 3])
def test_fit_checkpoint_state_round_trips(tmp_path, n):
    # the dict fd.fit writes (params, opt_state, counters, history, run fingerprint)
    model = fd.Module(nn.Linear(2, 1), ["x"], ["y"])
    params = model.init(fd.random.key(0))
    opt = fd.optim.adam(1e-2)
    state = {"params": params, "opt_state": opt.init(params), "epoch": torch.tensor(n)}
    state["run"] = {"epochs": 3, "key": "None", "params": [["0.weight", "float32[1, 2]"]]}
    path = str(tmp_path / "ckpt.safetensors")
    fd.save(state, path)
    back = fd.load(path)
    fd.testing.assert_close(back["params"], params)
    fd.testing.assert_close(back["opt_state"], state["opt_state"])
    assert back["run"] == state["run"] and int(back["epoch"]) == n


# ------------------------------------------------------------------ HF models
def _hf():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


def _gpt2():
    transformers = _hf()
    cfg = transformers.GPT2Config(
        vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=16, bos_token_id=0
    )
    cfg.eos_token_id = 0
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    transformers = _hf()
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg)


def _bf16_llama():
    return _llama().to(torch.bfloat16)


def _persistent(model: nn.Module, params: fd.TensorDict) -> fd.TensorDict:
    """``params`` without the non-persistent buffers (state_dict leaves them out)."""
    names = set(model.state_dict())
    drop = [k for k in params.keys(True, True) if ".".join(k) not in names]
    return params.exclude(*drop)


@pytest.mark.parametrize("make", [_gpt2, _llama, _bf16_llama], ids=["gpt2", "llama", "llama-bf16"])
def test_hf_model_safetensors_loads_as_from_module(tmp_path, make):
    model = make()
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied
    model.save_pretrained(tmp_path)
    loaded = fd.load(str(tmp_path / "model.safetensors"))
    m = fd.Module(model, {"ids": "input_ids"}, ["logits"])
    expected = _persistent(model, fd.from_module(m))
    assert set(loaded.keys(True, True)) == set(expected.keys(True, True))
    for k in expected.keys(True, True):
        assert _same_bits(loaded[k], expected[k]), k
    # the loaded params (plus the non-persistent buffers) run the model as torch does
    params = fd.from_module(m).update(loaded)
    ids = torch.randint(0, 64, (2, 8))
    model.eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    got = fd.nn.eval_mode(m)(params, fd.TensorDict({"ids": ids}, [2]))["logits"]
    assert torch.equal(got, want)


def test_functd_params_load_with_from_pretrained(tmp_path):
    model = _llama()
    m = fd.Module(model, {"ids": "input_ids"}, ["logits"])
    params = fd.from_module(m).apply(lambda t: t * 0.5 if t.is_floating_point() else t)
    model.config.save_pretrained(tmp_path)
    fd.save(_persistent(model, params), str(tmp_path / "model.safetensors"))
    other = _hf().LlamaForCausalLM.from_pretrained(tmp_path)
    for name, t in other.state_dict().items():
        if name == "lm_head.weight":  # tied: HF restores it from the embeddings
            name = "model.embed_tokens.weight"
        assert _same_bits(t, params[tuple(name.split("."))]), name
    assert other.lm_head.weight is other.model.embed_tokens.weight
