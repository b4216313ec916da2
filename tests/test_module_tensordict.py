"""fd.Module / fd.Sequential against tensordict 0.15's TensorDictModule and
TensorDictSequential: select_out_keys, nested key flattening, TensorDict outputs,
positional dispatch, dict in_keys (out_to_in_map) and select_subsequence, on the
same weights and inputs (immutability differences aside: functd returns new values)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import functd as fd
from functd._modules._keys import as_keys

tensordict = pytest.importorskip("tensordict")
tdnn = pytest.importorskip("tensordict.nn")
TDM, TDS = tdnn.TensorDictModule, tdnn.TensorDictSequential


def _same(ours: fd.TensorDict, ref, keys=None):
    keys = keys if keys is not None else list(ref.keys(True, True))
    assert set(ours.keys(True, True)) == set(ref.keys(True, True))
    for k in keys:
        torch.testing.assert_close(ours[k], ref[k], rtol=0, atol=0)


# ---------------------------------------------------------------- select_out_keys
def test_module_select_out_keys_matches_tensordict_and_is_a_new_value():
    f = lambda x, y: (x + 1, y * 2, x - y)  # noqa: E731
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    ref = TDM(f, ["a", "b"], ["c", "d", "e"]).select_out_keys("d")
    ours_full = fd.Module(f, ["a", "b"], ["c", "d", "e"])
    ours = ours_full.select_out_keys("d")
    assert ours_full.out_keys == ("c", "d", "e")  # unchanged
    assert ours.out_keys == tuple(ref.out_keys) == ("d",)
    assert ours.out_keys_source == tuple(ref.out_keys_source)
    td = fd.TensorDict({"a": a, "b": b}, [4])
    _same(ours(None, td), ref(tensordict.TensorDict({"a": a, "b": b}, [4])))
    # dispatch returns the selected tensor only, in both
    torch.testing.assert_close(ours(None, a, b), ref(a, b))
    torch.testing.assert_close(ours(None, a=a, b=b), ref(a=a, b=b))
    assert ours != ours_full and ours == ours_full.select_out_keys("d")
    assert hash(ours) == hash(ours_full.select_out_keys("d"))


def test_module_select_out_keys_in_a_sequential_and_with_params():
    lin = nn.Linear(3, 4)
    two = fd.Module(lambda h: (h.relu(), h.tanh()), ["h"], ["r", "t"]).select_out_keys("t")
    seq = fd.Module(lin, ["x"], ["h"]) >> two
    assert seq.out_keys == ("h", "t")
    ref = TDS(TDM(lin, ["x"], ["h"]), TDM(lambda h: (h.relu(), h.tanh()), ["h"], ["r", "t"]))
    ref[1].select_out_keys("t")
    x = torch.randn(5, 3)
    out = seq(fd.from_module(seq), fd.TensorDict({"x": x}, [5]))
    _same(out, ref(tensordict.TensorDict({"x": x}, [5])))
    sel = fd.Module(lin, ["x"], ["h"]).select_out_keys("h")  # a layer with params
    torch.testing.assert_close(sel(fd.from_module(sel), x), lin(x))


def test_module_select_out_keys_unknown_key_raises():
    m = fd.Module(lambda x: (x, x), ["a"], ["b", "c"])
    with pytest.raises(KeyError, match=r"select_out_keys: it writes no 'z'.*'b', 'c'"):
        m.select_out_keys("z")
    with pytest.raises(KeyError, match=r"not a list: pass them unpacked"):
        m.select_out_keys(["b", "c"])
    with pytest.raises(KeyError, match="writes no 'b'"):  # a selection narrows out_keys
        m.select_out_keys("c").select_out_keys("b")


def test_selected_module_still_checks_its_output_count():
    m = fd.Module(lambda x: x, ["a"], ["b", "c"]).select_out_keys("b")
    with pytest.raises(ValueError, match=r"returned 1 output\(s\) but out_keys has 2"):
        m(None, fd.TensorDict({"a": torch.zeros(2)}, [2]))


def test_eval_mode_keeps_a_selection():
    m = fd.Module(nn.Dropout(0.5), ["x"], ["y"]).select_out_keys("y")
    e = fd.nn.eval_mode(m)
    assert e.out_keys == ("y",) and e.out_keys_source == ("y",)
    two = fd.Module(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)), ["x"], ["y"])
    assert fd.nn.eval_mode(two).out_keys == ("y",)


# ---------------------------------------------------------------- nested keys
@pytest.mark.parametrize(
    "key, flat",
    [
        (("c", ("d",)), ("c", "d")),
        (("3", ("other", ("thing",))), ("3", "other", "thing")),
        ((("a",),), "a"),
    ],
)
def test_nested_key_tuples_are_flattened_as_tensordict(key, flat):
    ref = TDM(lambda x: x + 1, in_keys=[key], out_keys=[("o", key)])
    ours = fd.Module(lambda x: x + 1, in_keys=[key], out_keys=[("o", key)])
    assert ours.in_keys == tuple(ref.in_keys) == (flat,)
    assert ours.out_keys == tuple(ref.out_keys)
    x = torch.randn(2)
    ref_out = ref(tensordict.TensorDict({flat: x}, []))
    _same(ours(None, fd.TensorDict({}, []).set(flat, x)), ref_out)


_names = st.text("abc", min_size=1, max_size=2)
_nested = st.recursive(
    _names, lambda inner: st.lists(inner, min_size=1, max_size=3).map(tuple), max_leaves=6
)


@given(_nested)
def test_key_flattening_equals_tensordicts_unravel_key(key):
    from tensordict.utils import unravel_key

    assert as_keys([key], "in_keys") == (unravel_key(key),)


# ---------------------------------------------------------------- TensorDict outputs
def test_function_returning_a_tensordict_is_read_by_key():
    a = torch.randn(3)
    ours = fd.Module(lambda x: fd.TensorDict({"b": x * 2, "z": x}, []), ["a"], ["b"])
    out = ours(None, fd.TensorDict({"a": a}, []))
    assert isinstance(out["b"], torch.Tensor)
    ref = TDM(lambda x: tensordict.TensorDict({"b": x * 2, "z": x}, []), ["a"], ["b"])
    _same(out, ref(tensordict.TensorDict({"a": a}, [])))
    # a tensordict.TensorDict returned by the function is read by key too
    theirs = fd.Module(lambda x: tensordict.TensorDict({"c": x, "b": -x}, []), ["a"], ["b", "c"])
    out = theirs(None, fd.TensorDict({"a": a}, []))
    assert torch.equal(out["b"], -a) and torch.equal(out["c"], a)


def test_tensordict_output_without_the_key_is_a_value_and_with_several_keys_must_hold_them():
    a = torch.randn(3)
    sub = fd.Module(lambda x: fd.TensorDict({"z": x}, []), ["a"], ["b"])
    out = sub(None, fd.TensorDict({"a": a}, []))
    assert torch.equal(out["b", "z"], a)  # as tensordict: written as a sub-td
    two = fd.Module(lambda x: fd.TensorDict({"b": x}, []), ["a"], ["b", "c"])
    with pytest.raises(KeyError, match=r"returned a mapping without 'c'; it has 'b'"):
        two(None, fd.TensorDict({"a": a}, []))


# ---------------------------------------------------------------- positional dispatch
def test_positional_dispatch_matches_tensordict():
    gru = nn.GRUCell(4, 8)
    x, h = torch.randn(3, 4), torch.randn(3, 8)
    ref = TDM(gru, ["x", "h"], ["h2"])
    ours = fd.Module(gru, ["x", "h"], ["h2"])
    params = fd.from_module(ours)
    torch.testing.assert_close(ours(params, x, h), ref(x, h), rtol=0, atol=0)
    torch.testing.assert_close(ours(params, x, h=h), ref(x, h=h), rtol=0, atol=0)
    seq = ours >> fd.Module(lambda a, b: (a + b, a - b), ["h2", "h"], ["s", "d"])
    ref_seq = TDS(ref, TDM(lambda a, b: (a + b, a - b), ["h2", "h"], ["s", "d"]))
    ours_out, ref_out = seq(fd.from_module(seq), x, h), ref_seq(x, h)
    assert seq.out_keys == tuple(ref_seq.out_keys) == ("h2", "s", "d")
    assert len(ours_out) == len(ref_out) == 3  # every out_key, in order
    for a, b in zip(ours_out, ref_out):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_positional_dispatch_of_a_policy_matches_tensordict():
    from tensordict.nn import NormalParamExtractor as TNPE
    from tensordict.nn import ProbabilisticTensorDictModule as TPM
    from tensordict.nn import ProbabilisticTensorDictSequential as TPS

    gru, ext = nn.GRUCell(4, 8), fd.NormalParamExtractor()
    x, h = torch.randn(3, 4), torch.randn(3, 8)
    head = fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal)
    pol = fd.ProbabilisticSequential(
        fd.Module(gru, ["x", "h"], ["h2"]), fd.Module(ext, ["h2"], ["loc", "scale"]), head
    )
    ref = TPS(
        TDM(gru, ["x", "h"], ["h2"]),
        TDM(TNPE(), ["h2"], ["loc", "scale"]),
        TPM(["loc", "scale"], ["action"], distribution_class=torch.distributions.Normal),
    )
    params = fd.from_module(pol)
    ours, theirs = pol(params, x, h), ref(x, h)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    loc, scale = ours[1], ours[2]
    torch.testing.assert_close(head(None, loc, scale), loc)  # deterministic: the mean
    k = fd.random.key(0)
    drawn = pol(params, x, h, key=k, interaction="random")
    by_td = pol(params, fd.TensorDict({"x": x, "h": h}, [3]), key=k, interaction="random")
    torch.testing.assert_close(drawn[-1], by_td["action"], rtol=0, atol=0)


def test_positional_dispatch_errors():
    m = fd.Module(lambda x, y: x + y, ["x", "y"], ["z"])
    x = torch.zeros(2)
    with pytest.raises(TypeError, match=r"3 positional tensors but in_keys has 2"):
        m(None, x, x, x)
    with pytest.raises(TypeError, match=r"'x' is given both positionally and as x="):
        m(None, x, x=x)
    with pytest.raises(TypeError, match=r"lacks \['y'\]"):
        m(None, x)
    with pytest.raises(TypeError, match="takes no further positional arguments"):
        m(None, fd.TensorDict({"x": x, "y": x}, []), x)
    with pytest.raises(TypeError, match=r"positional input 'y' is a list"):
        m(None, x, [1.0])
    with pytest.raises(TypeError, match=r"params come first: m\(None, x\)"):
        fd.Module(torch.neg, ["x"], ["y"])(x)


# ---------------------------------------------------------------- dict in_keys
def test_out_to_in_map_true_is_tensordicts_default_direction():
    f = lambda x, *, y, z: x + y + z  # noqa: E731
    td_in = {"1": torch.ones(()), "2": torch.ones(()) * 2}
    ref = TDM(f, in_keys={"x": "1", "y": "2", "z": "2"}, out_keys=["t"])
    ours = fd.Module(f, in_keys={"x": "1", "y": "2", "z": "2"}, out_keys=["t"], out_to_in_map=True)
    _same(ours(None, fd.TensorDict(td_in, [])), ref(tensordict.TensorDict(td_in, [])))
    # False (and functd's default, None): {td_key: argument}
    g = lambda x, *, y: x - y  # noqa: E731
    ref2 = TDM(g, in_keys={"1": "x", "2": "y"}, out_keys=["z"], out_to_in_map=False)
    for flag in (False, None):
        ours2 = fd.Module(g, in_keys={"1": "x", "2": "y"}, out_keys=["z"], out_to_in_map=flag)
        _same(ours2(None, fd.TensorDict(td_in, [])), ref2(tensordict.TensorDict(td_in, [])))


def test_out_to_in_map_errors():
    with pytest.raises(ValueError, match="out_to_in_map only applies to a dict in_keys"):
        fd.Module(torch.neg, ["x"], ["y"], out_to_in_map=True)
    with pytest.raises(TypeError, match="pass out_to_in_map=True"):
        fd.Module(lambda x: x, {"x": ("a", "b")}, ["y"])


# ---------------------------------------------------------------- select_subsequence
def _idn(x):
    return x


def _chain(make_mod, make_seq):
    return make_seq(
        make_mod(_idn, ["a"], ["b"]),
        make_mod(_idn, ["b"], ["c"]),
        make_mod(_idn, ["c"], ["d"]),
        make_mod(_idn, ["a"], ["e"]),
    )


def _shape(seq):
    return [(tuple(m.in_keys), tuple(m.out_keys)) for m in seq]


@pytest.mark.parametrize(
    "kw",
    [
        {"in_keys": ["c"]},
        {"out_keys": ["c"]},
        {"in_keys": ["a"], "out_keys": ["e"]},
        {"in_keys": ["b"], "out_keys": ["d"]},
        {},
    ],
)
def test_select_subsequence_matches_tensordict(kw):
    ref = _chain(TDM, TDS).select_subsequence(**kw)
    ours = _chain(fd.Module, fd.Sequential).select_subsequence(**kw)
    assert _shape(ours) == _shape(ref)
    assert ours.in_keys == tuple(ref.in_keys) and ours.out_keys == tuple(ref.out_keys)


def test_select_subsequence_nested_matches_tensordict():
    def build(mod, seq, select):
        inner1 = seq(mod(_idn, ["a"], ["b"]), mod(_idn, ["b"], ["c"]))
        inner2 = seq(mod(_idn, ["b"], ["d"]), mod(_idn, ["d"], ["e"]))
        if select:  # functd flattens an unselected nested Sequential
            inner1, inner2 = inner1.select_out_keys("b", "c"), inner2.select_out_keys("d", "e")
        return seq(inner1, inner2)

    ref = build(TDM, TDS, False).select_subsequence(in_keys=["b", "d"], out_keys=["e"])
    ours = build(fd.Module, fd.Sequential, True).select_subsequence(
        in_keys=["b", "d"], out_keys=["e"]
    )
    assert len(ours) == len(ref) == 1
    assert ours[0].modules[0].out_keys == tuple(ref[0].out_keys) == ("d", "e")
    assert ours.out_keys == tuple(ref.out_keys)


def test_select_subsequence_keeps_names_params_and_leaves_self_unchanged():
    lin1, lin2 = nn.Linear(3, 3), nn.Linear(3, 3)
    seq = fd.Sequential(
        fd.Module(lin1, ["a"], ["b"]),
        fd.Module(torch.relu, ["b"], ["c"]),
        fd.Module(lin2, ["a"], ["e"]),
        selected_out_keys=["c", "e"],
    )
    before = (seq.modules, seq.names, seq.out_keys)
    sub = seq.select_subsequence(out_keys=["e"])
    assert (seq.modules, seq.names, seq.out_keys) == before
    assert sub.names == ("2",) and sub.modules[0] is seq.modules[2]
    params = fd.from_module(seq)  # the whole model's params work
    a = torch.randn(4, 3)
    torch.testing.assert_close(sub(params, a=a), lin2(a))
    ref = TDS(TDM(lin1, ["a"], ["b"]), TDM(torch.relu, ["b"], ["c"]), TDM(lin2, ["a"], ["e"]))
    assert _shape(sub) == _shape(ref.select_subsequence(out_keys=["e"]))
    with pytest.raises(ValueError, match="no module is left"):
        seq.select_subsequence(in_keys=["zz"])


def test_select_out_keys_of_a_probabilistic_head_points_to_the_sequential():
    head = fd.Probabilistic(["loc", "scale"], ["a"], torch.distributions.Normal)
    with pytest.raises(TypeError, match=r"ProbabilisticSequential\(\.\.\.\)\.select_out_keys"):
        head.select_out_keys("a")
