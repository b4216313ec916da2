"""fd.Module: wrapping torch modules, functions and layers, against the torch module;
dict in_keys binding td entries to arguments by name; init; bad input (a clear error,
nothing given changed); the params-check cache (weak, bounded, the one slot a call
writes)."""

import gc
import itertools
import weakref

import pytest
import torch
import torch.nn as nn

import functd as fd
from functd._modules import _params_check as _module
from functd._td import _marks
from functd._td._tree import flat_leaves, unflatten_like
from functd.testing import assert_close
from tests._support.snapshot import assert_unchanged, snapshot


def _td(batch=5):
    return fd.TensorDict({"x": torch.randn(batch, 3)}, [batch])


# ---------------------------------------------------------------- Module basics
def test_module_wraps_torch_module_and_matches_it():
    lin = nn.Linear(3, 4)
    m = fd.Module(lin, in_keys=["x"], out_keys=["h"])
    td = _td()
    params = fd.from_module(m)
    out = m(params, td)
    torch.testing.assert_close(out["h"], lin(td["x"]))
    assert "h" not in td and out["x"] is td["x"]


def test_module_callable_several_inputs_and_outputs():
    td = _td().set("a", torch.randn(5, 3))
    add = fd.Module(lambda x, y: x + y, in_keys=["x", "a"], out_keys=["y"])
    torch.testing.assert_close(add(None, td)["y"], td["x"] + td["a"])
    split = fd.Module(lambda x: x.chunk(2, -1), in_keys=["x6"], out_keys=["l", "r"])
    td6 = fd.TensorDict({"x6": torch.randn(5, 6)}, [5])
    out = split(None, td6)
    torch.testing.assert_close(out["l"], td6["x6"][:, :3])
    torch.testing.assert_close(out["r"], td6["x6"][:, 3:])


def test_module_dict_in_keys_map_to_kwargs_and_mapping_outputs():
    td = _td().set("b", torch.ones(5, 3))
    m = fd.Module(
        lambda *, first, second: {"s": first - second},
        in_keys={"x": "first", "b": "second"},
        out_keys=["s"],
    )
    torch.testing.assert_close(m(None, td)["s"], td["x"] - 1)


def test_nested_keys_in_and_out():
    td = fd.TensorDict({"obs": {"pos": torch.randn(5, 2)}}, [5])
    m = fd.Module(torch.neg, in_keys=[("obs", "pos")], out_keys=[("out", "neg")])
    out = m(None, td)
    torch.testing.assert_close(out["out", "neg"], -td["obs", "pos"])
    assert out["out"].batch_size == torch.Size([5])


def test_module_is_frozen_hashable_value():
    a = fd.Module(torch.relu, ["x"], ["y"])
    b = fd.Module(torch.relu, ["x"], ["y"])
    assert a == b and hash(a) == hash(b)
    assert a != fd.Module(torch.relu, ["x"], ["z"])
    with pytest.raises(TypeError, match="immutable"):
        a.in_keys = ("z",)
    assert {a: 1}[b] == 1
    la = fd.Module(nn.Linear(3, 4), ["x"], ["h"])
    lb = fd.Module(nn.Linear(3, 4), ["x"], ["h"])
    assert la == lb  # same computation, same description


def test_init_deterministic_and_pure():
    m = fd.Module(nn.Linear(3, 4), ["x"], ["h"])
    p1, p2 = m.init(fd.random.key(0)), m.init(fd.random.key(0))
    assert_close(p1, p2)
    p3 = m.init(fd.random.key(1))
    assert not torch.equal(p1["weight"], p3["weight"])
    assert set(p1.keys()) == {"weight", "bias"}
    assert fd.Module(torch.relu, ["x"], ["y"]).init(0).is_empty()


def test_init_under_vmap_gives_an_ensemble():
    m = fd.Sequential(fd.Module(nn.Linear(3, 4), ["x"], ["h"]), fd.Module(torch.relu, ["h"], ["a"]))
    keys = fd.random.split(fd.random.key(0), 6)
    ens = torch.func.vmap(m.init)(keys)
    assert ens.batch_size == torch.Size([6])
    assert ens["0", "weight"].shape == (6, 4, 3)
    for i in range(6):
        assert_close(ens[i], m.init(keys[i]))
    assert not torch.equal(ens["0", "weight"][0], ens["0", "weight"][1])


# ---------------------------------------------------------------- binding by name
# A dict in_keys binds td entries to arguments by name, for every kind of callable: torch
# modules (lowered or run through FunctionalCall) bind to their forward's names, functd
# layers to their __call__'s, functions to their own; the mapping may be written in any
# order. Checked against the torch module's own keyword call.
class ThreeInputs(nn.Module):
    """Not lowered: runs through FunctionalCall; arguments of different roles."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, a, b=None, c=None, scale=1.0):
        out = self.lin(a) * scale
        if b is not None:
            out = out + 2 * b
        if c is not None:
            out = out - 3 * c
        return out


def _td4(**tensors):
    return fd.TensorDict(tensors, [4])


A, B, C = (torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(3))


@pytest.mark.parametrize("order", list(itertools.permutations(["a", "b", "c"])))
def test_fallback_module_binds_by_forward_name_in_any_order(order):
    net = ThreeInputs()
    names = {"a": "ka", "b": "kb", "c": "kc"}
    m = fd.Module(net, {names[n]: n for n in order}, ["y"])
    out = m(fd.from_module(m), _td4(ka=A, kb=B, kc=C))["y"]
    torch.testing.assert_close(out, net(a=A, b=B, c=C))


def test_fallback_module_binds_a_subset_and_keeps_forward_defaults():
    net = ThreeInputs()
    m = fd.Module(net, {"kc": "c", "ka": "a"}, ["y"])
    torch.testing.assert_close(m(fd.from_module(m), _td4(ka=A, kc=C))["y"], net(a=A, c=C))


def test_lowered_multihead_attention_binds_torch_names_including_key():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    q, k, v = (torch.randn(4, 5, 8) for _ in range(3))
    mask = torch.zeros(4, 5, dtype=torch.bool)
    mask[0, 3:] = True
    m = fd.Module(
        mha,
        {"pad": "key_padding_mask", "v": "value", "k": "key", "q": "query"},
        ["o", "w"],
    )
    assert isinstance(m.fn, fd.nn.MultiheadAttention)  # lowered, bound to positions
    out = m(fd.from_module(m), _td4(q=q, k=k, v=v, pad=mask))
    ref_o, ref_w = mha(query=q, key=k, value=v, key_padding_mask=mask)
    torch.testing.assert_close(out["o"], ref_o)
    torch.testing.assert_close(out["w"], ref_w)
    # a later argument with the default of the ones before it (need_weights=True)
    m2 = fd.Module(
        mha, {"q": "query", "k": "key", "v": "value", "nw": "average_attn_weights"}, ["o", "w"]
    )
    assert m2._desc.fn.defaults[4] is True  # need_weights: torch's default


def test_lowered_linear_binds_torchs_input_name():
    lin = nn.Linear(3, 2)
    m = fd.Module(lin, {"obs": "input"}, ["y"])
    torch.testing.assert_close(m(fd.from_module(m), _td4(obs=A))["y"], lin(input=A))


def test_functd_layer_binds_its_own_call_names():
    layer = fd.nn.MultiheadAttention(8, 2, batch_first=True)
    params = layer.init(fd.random.key(0))
    q, k = torch.randn(4, 5, 8), torch.randn(4, 5, 8)
    m = fd.Module(layer, {"kk": "key_", "vv": "value", "qq": "query"}, ["o", "w"])
    out = m(params, _td4(qq=q, kk=k, vv=k))
    ref = layer(params, q, k, k)
    torch.testing.assert_close(out["o"], ref[0])


def test_functions_bind_by_name():
    m = fd.Module(lambda x, y: x - y, {"b": "y", "a": "x"}, ["d"])
    torch.testing.assert_close(m(None, _td4(a=A, b=B))["d"], A - B)


def test_tensordicts_out_to_in_map_binds_the_same():
    net = ThreeInputs()
    m = fd.Module(net, {"c": "kc", "a": "ka"}, ["y"], out_to_in_map=True)
    torch.testing.assert_close(m(fd.from_module(m), _td4(ka=A, kc=C))["y"], net(a=A, c=C))


def test_binding_errors_name_the_module_the_argument_and_the_fix():
    with pytest.raises(
        TypeError,
        match=r"Module\(Linear -> 'y'\): in_keys names the argument\(s\) \['x'\], which Linear.forward does not take; its arguments are \['input'\]",
    ):
        fd.Module(nn.Linear(3, 2), {"obs": "x"}, ["y"])
    with pytest.raises(
        TypeError,
        match=r"ThreeInputs.forward does not take; its arguments are \['a', 'b', 'c', 'scale'\]",
    ):
        fd.Module(ThreeInputs(), {"obs": "d"}, ["y"])
    with pytest.raises(
        TypeError,
        match=r"MultiheadAttention.forward needs its argument 'key', which in_keys does not give",
    ):
        fd.Module(nn.MultiheadAttention(8, 2), {"q": "query", "v": "value"}, ["o", "w"])
    with pytest.raises(ValueError, match=r"gives the argument\(s\) \['x'\] more than one td key"):
        fd.Module(lambda x: x, {"a": "x", "b": "x"}, ["y"])


def test_an_entry_named_key_works_with_a_tensordict_and_positionally():
    m = fd.Module(lambda key, x: key * x, ["key", "x"], ["y"])
    td = _td4(key=A, x=B)
    torch.testing.assert_close(m(None, td)["y"], A * B)
    torch.testing.assert_close(m(None, A, B), A * B)
    with pytest.raises(
        TypeError,
        match=r"reads the entry 'key', whose keyword key= is also the call option key=.*fd.TensorDict",
    ):
        m(None, key=A, x=B)


def test_labels_name_the_torch_class():
    m = fd.Module(ThreeInputs(), ["a"], ["y"])
    assert m._label() == "Module(ThreeInputs -> 'y')"
    with pytest.raises(KeyError, match=r"Module\(ThreeInputs -> 'y'\) reads 'a'"):
        m(fd.from_module(m), _td4(b=A))


def test_keyword_bound_module_under_vmap_grad_and_eval_switch():
    net = ThreeInputs()
    m = fd.Module(net, {"kc": "c", "ka": "a"}, ["y"])
    params = fd.from_module(m)
    ens = fd.stack([params, params.apply(lambda t: t * 2)])
    out = fd.vmap(m, in_dims=(0, None))(ens, _td4(ka=A, kc=C))["y"]
    torch.testing.assert_close(out[1], m(ens[1], _td4(ka=A, kc=C))["y"])
    g = fd.grad(lambda p: m(p, _td4(ka=A, kc=C))["y"].sum())(params)
    net.zero_grad()
    net(a=A, c=C).sum().backward()
    torch.testing.assert_close(g["lin", "weight"], net.lin.weight.grad)
    e = fd.nn.eval_mode(m)
    assert e._kwargs == m._kwargs and e.in_keys == m.in_keys
    torch.testing.assert_close(e(params, _td4(ka=A, kc=C))["y"], net(a=A, c=C))


def test_keyword_bound_module_inside_a_sequential_plan():
    net = ThreeInputs()
    m = fd.Module(net, {"kc": "c", "ka": "a"}, ["y"])
    seq = m >> fd.Module(torch.tanh, ["y"], ["z"])
    params = fd.from_module(seq)
    for _ in range(2):  # the second call runs the cached plan
        out = seq(params, _td4(ka=A, kc=C))
        torch.testing.assert_close(out["z"], torch.tanh(net(a=A, c=C)))


def test_lstm_outputs_flatten_onto_out_keys():
    """nn.LSTM returns (output, (h_n, c_n)): three out_keys take the three tensors."""
    lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
    m = fd.Module(lstm, ["x"], ["out", "h", "c"])
    x = torch.randn(5, 7, 3)
    out = m(fd.from_module(m), fd.TensorDict({"x": x}, []))
    ref_out, (ref_h, ref_c) = lstm(x)
    torch.testing.assert_close(out["out"], ref_out)
    torch.testing.assert_close(out["h"], ref_h)
    torch.testing.assert_close(out["c"], ref_c)
    # h_n, c_n are (layers, N, H): a batched td takes the selected output only
    sel = m.select_out_keys("out")(fd.from_module(m), fd.TensorDict({"x": x}, [5]))
    torch.testing.assert_close(sel["out"], ref_out)


def test_from_module_of_a_lowered_layer_points_to_the_torch_module():
    net = nn.Sequential(nn.Linear(3, 3), nn.Softmin(-1))
    with pytest.raises(TypeError, match=r"Pass the torch module itself, fd.Module\(net"):
        fd.from_module(fd.Module(fd.nn.lower(net, fallback=True), ["x"], ["y"]))


# ---------------------------------------------------------------- errors
@pytest.fixture
def lin():
    m = fd.Module(nn.Linear(3, 4), ["x"], ["h"])
    return m, m.init(0)


def test_missing_input_key_names_module_key_and_present_keys(lin):
    m, params = lin
    td = fd.TensorDict({"obs": torch.zeros(2, 3), "h0": torch.zeros(2, 4)}, [2])
    snap = snapshot(params, td)
    with pytest.raises(
        KeyError,
        match=r"Module\(Linear -> 'h'\) reads 'x', which the tensordict lacks; it has: 'obs', 'h0'",
    ):
        m(params, td)
    assert_unchanged(snap)


def test_wrong_number_of_outputs():
    m = fd.Module(lambda x: (x, x, x), ["x"], ["a", "b"])
    td = fd.TensorDict({"x": torch.zeros(2)}, [2])
    snap = snapshot(td)
    with pytest.raises(ValueError, match=r"returned 3 output\(s\) but out_keys has 2"):
        m(None, td)
    assert_unchanged(snap)


def test_output_not_a_tensor():
    m = fd.Module(lambda x: 3.0, ["x"], ["y"])
    td = fd.TensorDict({"x": torch.zeros(2)}, [2])
    with pytest.raises(TypeError, match="output 'y' is a float, not a tensor"):
        m(None, td)


def test_output_losing_batch_dims():
    m = fd.Module(lambda x: x.sum(), ["x"], ["y"])
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    with pytest.raises(
        ValueError,
        match=r"output 'y' has shape \[\], which does not start with the batch size \[2\]",
    ):
        m(None, td)


def test_duplicate_out_keys():
    with pytest.raises(ValueError, match="out_keys has duplicates: 'a'"):
        fd.Module(lambda x: (x, x), ["x"], ["a", "a"])


def test_params_missing_entry(lin):
    m, params = lin
    bad = params.exclude("bias")
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    snap = snapshot(bad, td)
    with pytest.raises(KeyError, match="missing 'bias'"):
        m(bad, td)
    assert_unchanged(snap)


def test_params_wrong_shape(lin):
    m, params = lin
    bad = params.set("bias", torch.zeros(1))
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    snap = snapshot(bad, td)
    with pytest.raises(ValueError, match=r"params entry 'bias' has shape \[1\], expected \[4\]"):
        m(bad, td)
    assert_unchanged(snap)


def test_params_of_another_module(lin):
    m, _ = lin
    other = fd.Module(nn.GRUCell(3, 4), ["x"], ["h"]).init(0)
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    with pytest.raises(KeyError, match="another module"):
        m(other, td)
    seq = fd.Sequential(m, fd.Module(torch.relu, ["h"], ["a"]))
    with pytest.raises(KeyError, match="params lack entry '0'"):
        seq(fd.TensorDict({"5": other}), td)


def test_calling_without_params(lin):
    m, _ = lin
    td = fd.TensorDict({"x": torch.zeros(2, 3)}, [2])
    with pytest.raises(TypeError, match="has parameters but was given nothing as params"):
        m(None, td)
    with pytest.raises(TypeError, match="takes \\(params, td\\); got one TensorDict"):
        m(td)
    seq = fd.Sequential(m)
    with pytest.raises(TypeError, match="has parameters but was given nothing"):
        seq(None, td)


def test_keyword_call_unknown_or_missing_names(lin):
    m, params = lin
    with pytest.raises(TypeError, match=r"unknown name\(s\) \['y'\] and lacks \['x'\]"):
        m(params, y=torch.zeros(2, 3))


def test_lambda_arity_differs_from_in_keys():
    with pytest.raises(
        TypeError, match=r"takes 2 positional argument\(s\) \(x, y\) but in_keys has 1"
    ):
        fd.Module(lambda x, y: x + y, ["x"], ["z"])


def test_bad_keys():
    with pytest.raises(TypeError, match="keys are str or non-empty tuples of str"):
        fd.Module(torch.relu, [3], ["y"])
    with pytest.raises(KeyError, match="empty tuple"):
        fd.Module(torch.relu, [()], ["y"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: fd.Module(torch.neg, ["x"], ["y"]),
        lambda: fd.Sequential(fd.Module(torch.neg, ["x"], ["y"])),
        lambda: fd.Probabilistic({"x": "loc", "s0": "scale"}, ["s"], torch.distributions.Normal),
        lambda: fd.ProbabilisticSequential(
            fd.Module(torch.abs, ["x"], ["scale"]),
            fd.Probabilistic({"x": "loc", "scale": "scale"}, ["s"], torch.distributions.Normal),
        ),
    ],
)
def test_every_module_kind_refuses_a_td_and_keyword_tensors_together(make):
    m = make()
    td = fd.TensorDict({"x": torch.ones(2)}, [2])
    x = torch.ones(2)
    with pytest.raises(TypeError, match=r"pass either a TensorDict or keyword tensors, not both"):
        m(None, td, x=x)
    with pytest.raises(TypeError, match=r"the second argument must be a TensorDict, got dict"):
        m(None, {"x": x})
    assert torch.equal(td["x"], torch.ones(2)) and torch.equal(x, torch.ones(2))


def test_nested_out_key_through_an_input_tensor_raises_tds_error():
    td = _td(2)
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


# ---------------------------------------------------------------- the params-check cache
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


def _slots(td: fd.TensorDict) -> dict:
    """Every slot but the cache, by identity, and the leaves by value, recursively."""
    out = {"bs": td._batch_size, "spec": td._spec, "keys": tuple(td._data)}
    for k, v in td._data.items():
        out[k] = _slots(v) if type(v) is fd.TensorDict else (v, v.clone())
    return out


def _same(before: dict, td: fd.TensorDict) -> None:
    assert before["bs"] is td._batch_size
    # the pytree spec is computed lazily once (a derived value, not the params check)
    assert before["spec"] is None or before["spec"] is td._spec
    assert before["keys"] == tuple(td._data)
    for k, v in td._data.items():
        if type(v) is fd.TensorDict:
            _same(before[k], v)
        else:
            obj, copy = before[k]
            assert obj is v and torch.equal(copy, v)


def test_a_pure_functions_input_changes_only_in_the_cache():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    params = fd.from_module(net)
    x = torch.randn(5, 3)
    before, text = _slots(params), repr(params)
    assert _marks.mark_of(params) is None
    fd.grad(lambda p: model(p, x=x).pow(2).mean())(params)
    _same(before, params)  # values, keys, batch size and spec: the same objects
    assert repr(params) == text
    assert _marks.mark_of(params) is not None  # only the cache was written
    assert _marks.is_checked(params, model.fn)


def test_the_cache_is_invisible_to_values_and_carried_by_rebuilds():
    lin = fd.Module(nn.Linear(3, 2), ["x"], ["y"])
    params = fd.from_module(lin)
    fresh = fd.from_module(lin)
    lin(params, fd.TensorDict({"x": torch.randn(2, 3)}, [2]))
    assert _marks.is_checked(params, lin.fn) and not _marks.is_checked(fresh, lin.fn)
    assert fd.tree.leaves(params) == fd.tree.leaves(params)  # (same objects)
    assert all(torch.equal(a, b) for a, b in zip(fd.tree.leaves(params), fd.tree.leaves(fresh)))
    # unflatten_like (the optimizers' and fd.grad's rebuild): same keys and shapes
    moved = unflatten_like(params, [t * 1 for t in flat_leaves(params)])
    assert _marks.is_checked(moved, lin.fn)
    _marks.mark(moved, None)
    assert _marks.mark_of(moved) is None and _marks.is_checked(params, lin.fn)
    assert not _marks.is_checked(None, lin.fn)
