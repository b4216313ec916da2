"""Hostile inputs that used to give a wrong answer, a leak or an unclear error
(issue 13): each test pins the fix."""

import gc
import os
import pickle
import warnings
import weakref

import pytest
import torch
from torch import nn

import functd as fd
from functd._modules import _params_check as _module
from functd.testing import assert_close


def _td(n=2):
    return fd.TensorDict({"x": torch.randn(n, 3)}, [n])


# ---------------------------------------------------------------- 1. nested out_key
def test_nested_out_key_through_an_input_tensor_raises_tds_error():
    td = _td()
    x = td["x"]
    with pytest.raises(KeyError) as by_set:
        td.set(("x", "h"), torch.zeros(2, 4))
    m = fd.Module(nn.Linear(3, 4), ["x"], [("x", "h")])
    with pytest.raises(KeyError, match=r"cannot set \('x', 'h'\): 'x' holds a Tensor") as by_m:
        m(fd.from_module(m), td)
    assert by_set.value.args[0] in by_m.value.args[0]  # the same message, plus the module
    assert "Module(Linear -> ('x', 'h'))" in by_m.value.args[0]
    assert td["x"] is x and td.keys() == ("x",)  # the input is untouched


def test_nested_out_key_through_a_deeper_tensor_names_the_full_path():
    td = fd.TensorDict({"o": {"x": torch.zeros(2, 3)}}, [2])
    m = fd.Module(torch.neg, [("o", "x")], [("o", "x", "h")])
    with pytest.raises(KeyError, match=r"cannot set \('o', 'x', 'h'\): \('o', 'x'\) holds a"):
        m(None, td)
    ok = fd.Module(torch.neg, [("o", "x")], [("o", "y")])(None, td)  # a sibling is fine
    assert torch.equal(ok["o", "y"], -td["o", "x"]) and torch.equal(ok["o", "x"], td["o", "x"])


# ---------------------------------------------------------------- 2. layout cache
class _Sub(nn.Linear):  # a subclass is never lowered: FunctionalCall, compared by identity
    pass


def test_dropped_wrapped_modules_leave_nothing_behind():
    n0 = len(_module._LAYOUTS)
    refs, layers = [], []
    x = torch.randn(2, 8)
    for i in range(1000):
        lin = (_Sub if i % 2 else nn.Linear)(8, 8)
        m = fd.Module(lin, ["x"], ["y"])
        m(fd.from_module(m), fd.TensorDict({"x": x}, [2]))
        refs.append(weakref.ref(lin))
        layers.append(weakref.ref(m.fn))
        del lin, m
    gc.collect()
    assert len(_module._LAYOUTS) == n0
    assert all(r() is None for r in refs), "a dropped nn.Module is still alive"
    assert all(r() is None for r in layers), "a dropped layer is kept by a cache"


class _Slotted:
    """A layer-like object without __dict__: its layout goes to the bounded weak table."""

    __slots__ = ("__weakref__", "n")

    def __init__(self, n):
        self.n = n

    def param_shapes(self):
        return {("w",): (self.n,)}


def test_layout_table_is_weak_and_bounded():
    kept = [_Slotted(i) for i in range(_module._LAYOUTS_MAX + 50)]
    for obj in kept:
        assert _module._layout(obj)[0] == {("w",): (obj.n,)}
    assert len(_module._LAYOUTS) <= _module._LAYOUTS_MAX
    del kept, obj
    gc.collect()
    assert len(_module._LAYOUTS) == 0


def test_layout_lives_on_the_layer_value():
    layer = fd.nn.Linear(3, 4)
    lay = _module._layout(layer)
    assert lay[0] == {("weight",): (4, 3), ("bias",): (4,)}
    assert _module._layout(layer) is lay  # cached
    assert layer == fd.nn.Linear(3, 4) and hash(layer) == hash(fd.nn.Linear(3, 4))


# ---------------------------------------------------------------- 3. extra params
def _seq():
    return fd.Sequential(
        fd.Module(nn.Linear(3, 4), ["x"], ["h"]),
        fd.Module(torch.relu, ["h"], ["a"]),
        fd.Module(nn.Linear(4, 2), ["a"], ["y"]),
    )


def test_extra_params_entry_raises_the_same_keyerror_for_module_and_sequential():
    lin = fd.Module(nn.Linear(3, 4), ["x"], ["h"])
    p = fd.from_module(lin)
    with pytest.raises(KeyError, match=r"unexpected 'extra'.*another module"):
        lin(p.set("extra", torch.zeros(1)), _td())
    seq = _seq()
    params = fd.from_module(seq)
    bad = params.set("7", params["0"])
    for call in (
        lambda: seq(bad, _td()),  # the hot path
        lambda: seq(bad, _td(), key=fd.random.key(0)),  # the general path
        lambda: seq.select_out_keys("y")(bad, _td()),
        lambda: seq[:2](bad, _td()),  # a slice takes the model's params, not more
        lambda: fd.nn.eval_mode(seq)(bad, _td()),
    ):
        with pytest.raises(KeyError, match=r"unexpected entry '7'.*'0', '2'.*another module"):
            call()


def test_slices_and_subsequences_still_take_the_whole_models_params():
    seq = _seq()
    params = fd.from_module(seq)
    full = seq(params, _td())
    td = full.select("x", "a")
    assert_close(seq[2:](params, td)["y"], full["y"])
    sub = seq.select_subsequence(in_keys=["a"])
    assert_close(sub(params, td)["y"], full["y"])


def test_probabilistic_sequential_rejects_extra_entries():
    pol = fd.ProbabilisticSequential(
        fd.Module(nn.Linear(3, 4), ["x"], ["h"]),
        fd.Module(fd.NormalParamExtractor(), ["h"], ["loc", "scale"]),
        fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal),
    )
    params = fd.from_module(pol)
    bad = params.set("9", params["0"])
    full = pol(params, _td())
    for m in (pol, pol[:2], pol[:1], pol.select_out_keys("action")):
        with pytest.raises(KeyError, match=r"unexpected entry '9'"):
            m(bad, full)
    td = _td()
    assert_close(pol[1:](params, pol[:1](params, td))["action"], pol(params, td)["action"])


# ---------------------------------------------------------------- 4. save of a view
def test_save_of_a_view_writes_only_the_view(tmp_path):
    big = torch.randn(1_000_000)
    td = fd.TensorDict({"v": big[:10], "w": big[500:520:2]}, [10])
    path = tmp_path / "view.pt"
    fd.save(td, path)
    assert os.path.getsize(path) < 10_000  # the whole storage would be 4 MB
    out = fd.load(path)
    assert_close(out, td)
    assert out["v"].untyped_storage().nbytes() == 40
    whole = tmp_path / "whole.pt"
    fd.save(fd.TensorDict({"v": big}, [1_000_000]), whole)  # a full tensor: unchanged
    assert os.path.getsize(whole) > 4_000_000
    assert big.shape == (1_000_000,) and td["v"].data_ptr() == big.data_ptr()  # nothing copied in


# ---------------------------------------------------------------- 5. unreadable files
@pytest.mark.parametrize(
    ("cut", "says"),
    [
        (0, r"the file is empty \(0 bytes\)"),
        (11, r"is not a functd/torch file"),
        (100, r"begins as a zip archive but its end .* is missing.*truncated"),
        (-20, r"begins as a zip archive but its end .* is missing.*truncated"),
    ],
)
def test_load_truncated_or_foreign_file_names_it(tmp_path, cut, says):
    good = tmp_path / "good.pt"
    fd.save(_td(), good)
    data = good.read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"hello world" if cut == 11 else data[:cut])
    with pytest.raises(ValueError, match=r"load\('.*bad\.pt'\): (?s:.*)" + says):
        fd.load(bad)


def test_load_of_code_still_refused_as_before(tmp_path):
    path = tmp_path / "code.pt"
    torch.save({"f": os.getcwd}, path)
    with pytest.raises(pickle.UnpicklingError, match="safe loader"):
        fd.load(path)


def test_load_of_a_tensordict_memmap_folder_says_how_to_convert(tmp_path):
    tensordict = pytest.importorskip("tensordict")
    ref = tensordict.TensorDict({"a": torch.randn(3, 2), "n": {"b": torch.arange(3)}}, [3])
    for writer in ("memmap", "save"):
        folder = tmp_path / writer
        getattr(ref, writer)(folder)
        with pytest.raises(ValueError, match=r"tensordict's TensorDict\.memmap/save.*load_memmap"):
            fd.load(folder)
    # the conversion the message gives works as written
    t = tensordict.TensorDict.load_memmap(tmp_path / "memmap").clone()
    td = fd.TensorDict(t, batch_size=t.batch_size)
    assert type(td) is fd.TensorDict and type(td["n"]) is fd.TensorDict
    assert torch.equal(td["a"], ref["a"]) and torch.equal(td["n", "b"], ref["n", "b"])
    with pytest.raises(ValueError, match="this is a folder"):
        fd.load(tmp_path)


# ---------------------------------------------------------------- 6. tensordict.TensorDict
def test_load_of_a_torch_saved_tensordict_returns_an_fd_tensordict(tmp_path):
    tensordict = pytest.importorskip("tensordict")
    ref = tensordict.TensorDict({"a": torch.randn(3, 2), "n": {"b": torch.ones(3, 1)}}, [3])
    path = tmp_path / "td.pt"
    torch.save({"td": ref, "many": [ref, ref]}, path)
    out = fd.load(path)
    for td in (out["td"], *out["many"]):
        assert type(td) is fd.TensorDict and type(td["n"]) is fd.TensorDict
        assert td.batch_size == ref.batch_size
        assert torch.equal(td["a"], ref["a"]) and torch.equal(td["n", "b"], ref["n", "b"])
    with pytest.raises(TypeError, match="immutable"):
        out["td"]["a"] = 0


# ---------------------------------------------------------------- 7. structure changes
class _Fake:
    """Stand-in recorder (runs f; replays by recomputing) for the CPU."""

    def available(self, device):
        return True

    def warm(self, f, args, kwargs, device):
        return f(*args, **kwargs)

    def record(self, f, args, kwargs, device):
        out = f(*args, **kwargs)
        return (lambda: None), out


def test_cuda_graph_warns_once_naming_the_changed_structure():
    step = fd.cuda_graph(lambda td: td["x"] * 2, warmup=0)
    step._recorder = _Fake()
    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(fd.TensorDict({"x": x}, [2]))
        step(fd.TensorDict({"x": x[:1]}, [1]))  # a new batch size: no warning
    with pytest.warns(
        fd.CudaGraphWarning,
        match=r"structure of args\[0\] changed \(keys added: 'y'; removed: none\).*select",
    ):
        step(fd.TensorDict({"x": x, "y": x}, [2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per wrapper
        step(fd.TensorDict({"x": x, "z": x}, [2]))
    assert step.cache_info().recordings == 4


# ---------------------------------------------------------------- fit's progress line
@pytest.mark.parametrize("n, word", [(1, "1 step,"), (8, "8 steps,")])
def test_fit_progress_line_counts_steps(monkeypatch, capsys, n, word):
    import functd._train as train

    monkeypatch.setattr(train, "_progress_bar", lambda total, desc: None)
    model = fd.Module(nn.Linear(1, 1), ["x"], ["pred"])

    def loss_fn(p, batch, key):
        return ((model(p, batch)["pred"] - batch["y"]) ** 2).mean()

    params = fd.from_module(model)
    opt = fd.optim.sgd(0.1)
    batches = [fd.TensorDict({"x": torch.ones(4, 1), "y": torch.zeros(4, 1)}, [4])] * n
    fd.fit(fd.train_step(loss_fn, opt), params, opt.init(params), batches)
    line = capsys.readouterr().out.strip()
    assert line.startswith("epoch 1/1: loss ") and f"({word}" in line
