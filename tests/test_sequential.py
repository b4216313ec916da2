"""fd.Sequential: composition against nn.Sequential (values and gradients), keyword
calls, select_out_keys, slices, ``>>``, laws (hypothesis), compile; params with extra
entries refused on every path; intermediates freed after their last use (the hot path)
with the same result as keeping everything."""

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd.testing import assert_close
from tests._support.snapshot import assert_unchanged, snapshot


def _td(batch=5):
    return fd.TensorDict({"x": torch.randn(batch, 3)}, [batch])


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
    snap = snapshot(params, td)
    out = seq(params, td)
    assert_unchanged(snap)
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


# ---------------------------------------------------------------- errors
def test_non_module_in_sequential():
    with pytest.raises(TypeError, match="Wrap functions and torch modules with"):
        fd.Sequential(torch.relu)


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


# ---------------------------------------------------------------- intermediates freed early
P = fd.TensorDict({})  # params given (even empty) and no key: the hot path


def chain(sel):
    return fd.Sequential(
        fd.Module(torch.sin, ["x"], ["h"]),
        fd.Module(torch.cos, ["h"], ["z"]),
        fd.Module(lambda h, z: h * z, ["h", "z"], ["w"]),  # h is read again after z
        fd.Module(lambda x, w: x + w, ["x", "w"], ["y"]),
        fd.Module(torch.neg, ["y"], ["h"]),  # h written again, then dropped
        selected_out_keys=sel,
    )


def test_early_drop_same_result_and_keeps_what_later_modules_read():
    x = torch.randn(4, 3)
    td = fd.TensorDict({"x": x}, [4])
    full = chain(None)(P, td)
    for sel in (["y"], ["w", "y"], ["h"], ["z"]):
        out = chain(sel)(P, td)
        assert set(out.keys()) == {"x", *sel}
        assert_close(out, full.select("x", *sel))
    assert_close(full["w"], torch.sin(x) * torch.cos(torch.sin(x)))
    # the slow path (a key given) drops at the end: same outputs
    assert_close(chain(["y"])(None, td, key=fd.random.key(0)), chain(["y"])(P, td))
    # and under vmap
    assert_close(fd.vmap(lambda t: chain(["y"])(P, t))(td), chain(["y"])(P, td))
