"""fd.Module and fd.Sequential: semantics, against real torch, laws, errors."""

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd.testing import assert_close


def _td(batch=5):
    return fd.TensorDict({"x": torch.randn(batch, 3)}, [batch])


def _snapshot(*trees):
    """(leaf objects, cloned values) of every tree, to prove nothing changed."""
    out = []
    for t in trees:
        leaves = fd.tree.leaves(t)
        out.append(([id(v) for v in leaves], [v.clone() for v in leaves], fd.tree.structure(t)))
    return out


def _assert_unchanged(snap, *trees):
    for (ids, vals, spec), t in zip(snap, trees):
        leaves = fd.tree.leaves(t)
        assert fd.tree.structure(t) == spec
        assert [id(v) for v in leaves] == ids
        for a, b in zip(leaves, vals):
            assert torch.equal(a, b)


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


# ---------------------------------------------------------------- Sequential
def tutorial_block():
    lin0 = fd.Module(nn.Linear(3, 16), ["x"], ["linear0"])
    relu0 = fd.Module(torch.relu, ["linear0"], ["relu0"])
    lin1 = fd.Module(nn.Linear(16, 16), ["relu0"], ["linear1"])
    relu1 = fd.Module(nn.ReLU(), ["linear1"], ["relu1"])
    lin2 = fd.Module(nn.Linear(16, 3), ["relu1"], ["linear2"])
    res = fd.Module(lambda x, y: x + y, ["x", "linear2"], ["y"])
    return fd.Sequential(fd.Sequential(lin0, relu0), lin1 >> relu1 >> lin2, res)


def test_tutorial_block_matches_plain_module_with_same_weights():
    block = tutorial_block()
    params = block.init(fd.random.key(3))
    assert params.keys() == ("0", "2", "4")
    ref = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    fd.to_module(params, ref)  # same positions as nn.Sequential's state_dict
    td = _td(7)
    out = block(params, td)
    torch.testing.assert_close(out["y"], ref(td["x"]) + td["x"])
    assert set(out.keys()) == {"x", "linear0", "relu0", "linear1", "relu1", "linear2", "y"}
    assert block.in_keys == ("x",)
    assert block.out_keys == ("linear0", "relu0", "linear1", "relu1", "linear2", "y")


def test_sequential_of_wrapped_modules_matches_nn_sequential_and_gradients():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    seq = fd.Sequential(
        fd.Module(net[0], ["x"], ["a"]),
        fd.Module(net[1], ["a"], ["b"]),
        fd.Module(net[2], ["b"], ["c"]),
    )
    params = fd.from_module(seq)
    assert set(params.keys()) == {"0", "2"}
    assert_close(params, fd.from_module(net))  # mirrors nn.Sequential.state_dict()
    x = torch.randn(4, 3)
    torch.testing.assert_close(seq(params, x=x)[-1], net(x))

    def loss(p):
        return seq(p, fd.TensorDict({"x": x}, [4]))["c"].pow(2).sum()

    grads = torch.func.grad(loss)(params)
    net(x).pow(2).sum().backward()
    torch.testing.assert_close(grads["0", "weight"], net[0].weight.grad)
    torch.testing.assert_close(grads["2", "bias"], net[2].bias.grad)


def test_select_out_keys_is_pure_and_keeps_inputs():
    block = tutorial_block()
    params = block.init(0)
    small = block.select_out_keys("y")
    assert block.selected_out_keys is None and block.out_keys[-1] == "y"
    out = small(params, _td(1))
    assert set(out.keys()) == {"x", "y"}
    assert_close(out["y"], block(params, _td(1).set("x", out["x"]))["y"])
    same = fd.Sequential(*block.modules, selected_out_keys=["y"])
    assert same == small
    with pytest.raises(KeyError, match="no module writes 'nope'"):
        block.select_out_keys("nope")


def test_keyword_call_returns_tensors_in_out_keys_order():
    block = tutorial_block()
    params = block.init(0)
    x = torch.randn(2, 3)
    outs = block(params, x=x)
    assert isinstance(outs, tuple) and len(outs) == 6
    full = block(params, fd.TensorDict({"x": x}, [2]))
    for k, v in zip(block.out_keys, outs):
        torch.testing.assert_close(v, full[k])
    nested = fd.Module(torch.neg, [("obs", "pos")], ["n"])
    torch.testing.assert_close(nested(None, obs_pos=x), -x)


def test_indexing_and_slicing_keep_params_layout():
    block = tutorial_block()
    params = block.init(0)
    full = block(params, _td())
    head = block[:2]
    assert isinstance(head, fd.Sequential) and len(head) == 2
    out = head(params, _td().set("x", full["x"]))
    torch.testing.assert_close(out["relu0"], full["relu0"])
    tail = block[2:]
    out = tail(params, full.select("x", "relu0"))
    torch.testing.assert_close(out["y"], full["y"])
    assert block[4].modules[0].out_keys == ("linear2",)


def test_rshift_and_flattening_associative():
    a, b, c = (fd.Module(torch.neg, [k], [k + "'"]) for k in ("x", "x'", "x''"))
    assert (a >> b) >> c == a >> (b >> c) == fd.Sequential(a, b, c)
    assert hash((a >> b) >> c) == hash(a >> (b >> c))
    assert len(fd.Sequential(fd.Sequential(a, b), c)) == 3


# ---------------------------------------------------------------- laws (hypothesis)
_OPS = [torch.neg, torch.tanh, torch.sin, torch.relu]


@st.composite
def chains(draw):
    n = draw(st.integers(1, 6))
    mods, keys = [], ["x"]
    for i in range(n):
        src = draw(st.sampled_from(keys))
        if draw(st.booleans()):
            mods.append(fd.Module(nn.Linear(3, 3), [src], [f"k{i}"]))
        else:
            mods.append(fd.Module(draw(st.sampled_from(_OPS)), [src], [f"k{i}"]))
        keys.append(f"k{i}")
    return mods


@given(chains(), st.integers(0, 2**31 - 1))
def test_laws_purity_associativity_selection_keyword(mods, seed):
    seq = fd.Sequential(*mods)
    params = seq.init(seed)
    td = _td(3)
    snap = _snapshot(params, td)
    out = seq(params, td)
    _assert_unchanged(snap, params, td)
    # associativity: any split point gives the same module and output
    for cut in range(1, len(mods)):
        left, right = fd.Sequential(*mods[:cut]), fd.Sequential(*mods[cut:])
        assert (left >> right) == seq
    # select_out_keys output is a subset of the full output, with equal values
    last = seq.out_keys[-1]
    small = seq.select_out_keys(last)(params, td)
    assert set(small.keys()) <= set(out.keys())
    torch.testing.assert_close(small[last], out[last])
    # keyword call == td call
    kw = seq(params, x=td["x"])
    kw = kw if isinstance(kw, tuple) else (kw,)
    for k, v in zip(seq.out_keys, kw):
        torch.testing.assert_close(v, out[k])


@pytest.mark.compile
def test_compile_equals_eager_on_tutorial_block():
    torch._dynamo.reset()
    block = tutorial_block().select_out_keys("y")
    params = block.init(0)
    td = _td(4)
    compiled = torch.compile(block, fullgraph=True)
    assert_close(compiled(params, td), block(params, td))
    td2 = _td(4)
    assert_close(compiled(params, td2), block(params, td2))
