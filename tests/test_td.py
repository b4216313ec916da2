"""TensorDict basics: construction, reading, pure writes, leafwise helpers, repr.

Where functd follows tensordict (``len``, nested key sets, ``from_dict``), the
tests compare with ``tensordict.TensorDict`` directly. Bad input (a batch size the
leaves disagree with, a leaf that is not a tensor, mixed devices, an in-place write)
raises an error that names the entry and the fix, and leaves its inputs unchanged.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd.testing import assert_close, example_tensordicts, tensordicts
from tests._support.snapshot import Snapshot, unchanged_example


def make():
    return fd.TensorDict({"x": torch.randn(5, 3), "obs": {"pos": torch.randn(5, 2)}}, [5])


def leaf_ids(td):
    return {k: id(v) for k, v in td.items(include_nested=True, leaves_only=True)}


# ------------------------------------------------------------------ construction
def test_nested_mapping_becomes_nested_tensordict():
    pos = torch.randn(5, 2)
    td = fd.TensorDict({"obs": {"pos": pos, "deep": {"z": torch.zeros(5)}}}, batch_size=[5])
    assert isinstance(td["obs"], fd.TensorDict)
    assert isinstance(td["obs", "deep"], fd.TensorDict)
    assert td["obs"].batch_size == torch.Size([5])
    assert td["obs", "deep"].batch_size == torch.Size([5])
    assert td["obs", "pos"] is pos


def test_tensordict_values_are_kept_as_is():
    inner = fd.TensorDict({"a": torch.zeros(5, 2, 1)}, [5, 2])
    td = fd.TensorDict({"inner": inner, "x": torch.zeros(5)}, [5])
    assert td["inner"] is inner
    assert td["inner"].batch_size == torch.Size([5, 2])


def test_construction_from_tensordict_shares_leaves():
    td = make()
    td2 = fd.TensorDict(td, [5])
    assert leaf_ids(td2) == leaf_ids(td)
    assert fd.TensorDict(td, []).batch_size == torch.Size([])


@pytest.mark.parametrize(
    "bs, expected",
    [
        (None, []),
        ([], []),
        (5, [5]),
        ([5], [5]),
        ((5, 3), [5, 3]),
        (torch.Size([5, 3]), [5, 3]),
    ],
)
def test_batch_size_forms(bs, expected):
    td = fd.TensorDict({"x": torch.zeros(5, 3)}, batch_size=bs)
    assert td.batch_size == torch.Size(expected)
    assert isinstance(td.batch_size, torch.Size)
    assert td.shape == td.batch_size
    assert td.batch_dims == td.ndim == len(expected)
    assert td.numel() == torch.Size(expected).numel()


def test_construction_never_copies_leaves():
    x = torch.randn(5, 3)
    td = fd.TensorDict({"x": x}, [5])
    assert td["x"] is x
    assert td["x"].data_ptr() == x.data_ptr()


def test_empty():
    td = fd.TensorDict()
    assert td.batch_size == torch.Size([])
    assert td.keys() == ()
    assert td.is_empty()
    assert fd.TensorDict({"a": {}}, [3]).is_empty()
    assert not make().is_empty()


# the lean construction path (flat dicts of tensors) against the general one: the same
# errors, order, nesting and aliasing
X = torch.zeros(4, 3)


@pytest.mark.parametrize(
    "source, bs, err, pat",
    [
        ({"x": torch.zeros(3, 3)}, [4], ValueError, r"'x' has shape \[3, 3\]"),
        ({"x": torch.zeros(())}, [4], ValueError, r"'x' has shape \[\]"),  # 0-dim leaf
        ({"x": X, "y": torch.zeros(4, 2), "z": torch.zeros(5)}, [4], ValueError, "'z'"),
        ({"x": X}, [4, 3, 1], ValueError, r"'x' has shape \[4, 3\]"),
        ({"x": 1.0}, [4], TypeError, "'x'"),
        ({"x": [X]}, [4], TypeError, "'x'"),
        ({1: X}, [4], TypeError, "1"),
        ({("a", "b"): X}, [4], TypeError, "Nest mappings instead"),
        ({"x": X}, [-1], ValueError, "batch"),
        ({"x": X}, [True], ValueError, "batch"),
        ({"x": X}, [4.0], TypeError, "batch"),
        ({"x": {"y": torch.zeros(5)}}, [4], ValueError, r"\('x', 'y'\)|'x', 'y'"),
    ],
)
def test_construction_errors_are_still_raised(source, bs, err, pat):
    with pytest.raises(err, match=pat):
        fd.TensorDict(source, bs)


def test_construction_keeps_order_converts_nested_and_never_aliases_the_source():
    p = torch.nn.Parameter(torch.zeros(4, 2))
    src = {"b": X, "a": p, "n": {"c": X}}
    td = fd.TensorDict(src, [4])
    assert list(td.keys()) == ["b", "a", "n"]
    assert td["a"] is p and td["b"] is X
    assert isinstance(td["n"], fd.TensorDict) and td["n"].batch_size == (4,)
    src["b"] = None  # the caller's dict is not the TensorDict's storage
    assert td["b"] is X
    for bs in ([], [4], torch.Size([4, 3]), (4,), 4):
        flat = {"x": X, "y": X}
        assert fd.TensorDict(flat, bs).batch_size == torch.Size([bs] if isinstance(bs, int) else bs)


# ------------------------------------------------------------------ reading
def test_get_and_getitem_str_and_tuple():
    td = make()
    assert td["x"] is td.get("x")
    assert td["obs", "pos"] is td.get(("obs", "pos")) is td["obs"]["pos"]
    assert td[("x",)] is td["x"]
    assert td.get("z", None) is None
    assert td.get(("obs", "z"), 7) == 7
    assert td.get(("nope", "z"), 7) == 7


def test_dotted_key_is_literal():
    x = torch.zeros(2)
    td = fd.TensorDict({"a.b": x, "a": {"b": torch.ones(2)}}, [2])
    assert td["a.b"] is x
    assert not torch.equal(td["a", "b"], x)


def test_contains():
    td = make()
    assert "x" in td
    assert "obs" in td
    assert ("obs", "pos") in td
    assert ("obs", "nope") not in td
    assert ("x", "y") not in td
    assert "pos" not in td
    assert 3 not in td
    assert () not in td


def test_keys_values_items():
    td = make()
    assert td.keys() == ("x", "obs")
    assert td.keys(include_nested=True) == ("x", "obs", ("obs", "pos"))
    assert td.keys(include_nested=True, leaves_only=True) == ("x", ("obs", "pos"))
    assert td.keys(leaves_only=True) == ("x",)
    vals = td.values(include_nested=True, leaves_only=True)
    assert vals[0] is td["x"] and vals[1] is td["obs", "pos"]
    items = td.items(include_nested=True)
    assert [k for k, _ in items] == list(td.keys(include_nested=True))
    assert all(v is td[k] for k, v in items)


def test_len_is_first_batch_dim():
    assert len(make()) == 5
    assert len(fd.TensorDict({"x": torch.zeros(2, 3)}, [2, 3])) == 2
    assert len(fd.TensorDict({"x": torch.zeros(2, 3)}, [])) == 0


def test_iter_over_first_batch_dim():
    td = make()
    parts = list(td)
    assert len(parts) == 5
    assert torch.equal(parts[2]["x"], td["x"][2])
    with pytest.raises(TypeError, match="keys"):
        iter(fd.TensorDict({"x": torch.zeros(3)}, []))


def test_bool_is_ambiguous():
    with pytest.raises(TypeError, match="is_empty"):
        bool(make())


def test_device():
    assert make().device == torch.device("cpu")
    assert fd.TensorDict().device is None
    meta = fd.TensorDict({"a": torch.zeros(2), "b": torch.empty(2, device="meta")}, [2])
    assert meta.device is None
    assert fd.TensorDict({"a": torch.empty(2, device="meta")}, [2], device="meta").device == (
        torch.device("meta")
    )


# ------------------------------------------------------------------ pure writes
def test_set_returns_new_object_and_keeps_input():
    td = make()
    before = leaf_ids(td)
    y = torch.zeros(5, 1)
    td2 = td.set("y", y)
    assert td2 is not td
    assert "y" in td2 and "y" not in td
    assert leaf_ids(td) == before
    assert td2["y"] is y
    assert td2["x"] is td["x"]  # untouched leaves are shared, never copied
    assert td2["obs"] is td["obs"]


def test_set_replaces_and_nested_path():
    td = make()
    new = torch.ones(5, 2)
    td2 = td.set(("obs", "pos"), new)
    assert td2["obs", "pos"] is new
    assert td["obs", "pos"] is not new
    td3 = td.set(("obs", "vel"), new).set(("a", "b", "c"), torch.zeros(5))
    assert td3.keys(True, True) == ("x", ("obs", "pos"), ("obs", "vel"), ("a", "b", "c"))
    assert td3["a", "b"].batch_size == torch.Size([5])
    assert td.keys(True, True) == ("x", ("obs", "pos"))


def test_set_keeps_leaf_identity_and_storage():
    td = make()
    y = torch.randn(5, 4)
    ptr = y.data_ptr()
    td2 = td.set("y", y)
    assert td2["y"] is y and td2["y"].data_ptr() == ptr


def test_set_nested_tensordict_and_mapping():
    td = make().set("sub", {"a": torch.zeros(5, 2)})
    assert isinstance(td["sub"], fd.TensorDict)
    assert td["sub"].batch_size == torch.Size([5])


def test_select():
    td = make()
    s = td.select("x")
    assert s.keys() == ("x",) and s["x"] is td["x"]
    s = td.select(("obs", "pos"))
    assert s.keys(True) == ("obs", ("obs", "pos"))
    assert s["obs", "pos"] is td["obs", "pos"]
    assert s["obs"].batch_size == torch.Size([5])
    assert td.select().keys() == ()
    assert td.select("x", "nope", strict=False).keys() == ("x",)
    with pytest.raises(KeyError, match="nope"):
        td.select("nope")


def test_select_keeps_nested_batch_size():
    td = example_tensordicts()["longer_child"]
    s = td.select(("c", "y"))
    assert s["c"].batch_size == torch.Size([3, 2])


def test_exclude():
    td = make()
    e = td.exclude("x")
    assert e.keys() == ("obs",)
    assert e["obs"] is td["obs"]
    e = td.exclude(("obs", "pos"))
    assert e.keys(True) == ("x", "obs")
    assert td.exclude("missing", ("obs", "missing")).keys(True) == td.keys(True)
    assert td.keys(True) == ("x", "obs", ("obs", "pos"))


def test_update_merges_nested():
    td = make()
    vel = torch.zeros(5, 2)
    x = torch.ones(5, 3)
    u = td.update({"obs": {"vel": vel}, "x": x})
    assert u["obs", "pos"] is td["obs", "pos"]
    assert u["obs", "vel"] is vel
    assert u["x"] is x
    assert td.keys(True, True) == ("x", ("obs", "pos"))
    u2 = td.update(fd.TensorDict({"obs": {"pos": torch.zeros(5, 7)}}, [5]))
    assert u2["obs", "pos"].shape == (5, 7)
    u3 = td.update({("obs", "a"): torch.zeros(5)})
    assert ("obs", "a") in u3 and ("obs", "pos") in u3


def test_rename():
    td = make()
    r = td.rename({"x": "x0"})
    assert r.keys() == ("obs", "x0")
    assert r["x0"] is td["x"]
    assert "x" in td
    r = td.rename(x="y")
    assert r["y"] is td["x"]
    r = td.rename({("obs", "pos"): "pos"})
    assert r["pos"] is td["obs", "pos"]
    assert ("obs", "pos") not in r
    with pytest.raises(KeyError, match="nope"):
        td.rename({"nope": "a"})


def test_apply_single_and_several():
    td = make()
    out = td.apply(lambda x: x * 2)
    assert torch.equal(out["obs", "pos"], td["obs", "pos"] * 2)
    other = td.apply(torch.ones_like)
    third = td.apply(lambda x: torch.full_like(x, 3.0))
    out = td.apply(lambda a, b, c: a + b * c, other, third)
    assert torch.equal(out["x"], td["x"] + 3)
    assert out.keys(True) == td.keys(True)


def test_apply_none_drops_entry():
    td = make()
    out = td.apply(lambda x: None if x.shape[-1] == 3 else x)
    assert "x" not in out
    assert out["obs", "pos"] is td["obs", "pos"]


def test_apply_batch_size():
    td = make()
    out = td.apply(lambda x: x[:2], batch_size=[2])
    assert out.batch_size == torch.Size([2])
    assert out["obs"].batch_size == torch.Size([2])
    with pytest.raises(ValueError, match="batch size"):
        td.apply(lambda x: x, batch_size=[3])


def test_apply_rejects_non_tensordict_and_mismatched_keys():
    td = make()
    with pytest.raises(TypeError, match="not a TensorDict"):
        td.apply(torch.add, {"x": 1})
    with pytest.raises(KeyError, match=r"'x'.*same keys"):
        td.apply(torch.add, td.exclude("x"))


def test_apply_result_validated():
    with pytest.raises(ValueError, match="'x'"):
        make().apply(lambda x: x.sum())


def test_to_clone_detach():
    td = make().apply(lambda x: x.requires_grad_())
    c = td.clone()
    assert_close(c, td)
    assert c["x"] is not td["x"] and c["x"].data_ptr() != td["x"].data_ptr()
    d = td.detach()
    assert not d["x"].requires_grad and td["x"].requires_grad
    assert d["x"].data_ptr() == td["x"].data_ptr()
    t = td.to(torch.float64)
    assert t["obs", "pos"].dtype == torch.float64 and td["x"].dtype == torch.float32
    m = td.detach().to("meta")
    assert m.device == torch.device("meta") and m.batch_size == td.batch_size
    assert td.cpu().device == torch.device("cpu")


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float", torch.float32),
        ("double", torch.float64),
        ("half", torch.float16),
        ("bfloat16", torch.bfloat16),
        ("int", torch.int32),
        ("long", torch.int64),
        ("bool", torch.bool),
    ],
)
def test_dtype_casts(name, dtype):
    td = example_tensordicts()["mixed_dtypes"]
    out = getattr(td, name)()
    assert {v.dtype for v in out.values(True, True)} == {dtype}
    assert out.keys(True) == td.keys(True)
    assert len({v.dtype for v in td.values(True, True)}) == 4  # input unchanged


def test_to_dict_from_dict():
    td = make()
    d = td.to_dict()
    assert type(d) is dict and type(d["obs"]) is dict
    assert d["x"] is td["x"] and d["obs"]["pos"] is td["obs", "pos"]
    back = fd.TensorDict.from_dict(d)
    assert back.batch_size == torch.Size([5])  # auto batch size: common leading dims
    assert_close(back, td)
    assert fd.TensorDict.from_dict(d, batch_size=[]).batch_size == torch.Size([])
    auto = fd.TensorDict.from_dict({"a": torch.zeros(3, 4, 5), "b": {"c": torch.zeros(3, 4)}})
    assert auto.batch_size == torch.Size([3, 4])


# ------------------------------------------------------------------ repr
def test_repr_exact():
    td = fd.TensorDict({"x": torch.randn(5, 3), "obs": {"pos": torch.randn(5, 2)}}, batch_size=[5])
    assert repr(td) == (
        "TensorDict(batch_size=[5], fields={obs: TensorDict(batch_size=[5], "
        "fields={pos: f32[2]}), x: f32[3]})"
    )


def test_repr_dtypes_and_empty():
    td = example_tensordicts()["mixed_dtypes"]
    assert repr(td) == (
        "TensorDict(batch_size=[4], fields={b: bool[1], f16: f16[], f64: f64[2], i64: i64[]})"
    )
    assert repr(fd.TensorDict()) == "TensorDict(batch_size=[], fields={})"


def test_repr_device():
    td = fd.TensorDict({"a": torch.empty(2, 3, device="meta")}, [2])
    assert repr(td) == "TensorDict(batch_size=[2], device=meta, fields={a: f32[3]})"
    mixed = fd.TensorDict({"a": torch.empty(2, device="meta"), "b": torch.zeros(2)}, [2])
    assert repr(mixed) == "TensorDict(batch_size=[2], fields={a: f32[]@meta, b: f32[]})"


# ------------------------------------------------------------------ properties
@given(tensordicts(max_depth=3))
def test_clone_close_and_distinct(td):
    c = td.clone()
    assert_close(c, td)
    for a, b in zip(c.values(True, True), td.values(True, True)):
        assert a is not b


@given(tensordicts(max_depth=3))
def test_to_dict_from_dict_round_trip(td):
    assert_close(fd.TensorDict.from_dict(td.to_dict(), td.batch_size), td)


# ------------------------------------------------------------------ tensordict reference
def to_reference(td):
    tensordict = pytest.importorskip("tensordict")
    return tensordict.TensorDict(td.to_dict(), batch_size=td.batch_size)


@pytest.mark.parametrize("name", list(example_tensordicts()))
def test_keys_len_agree_with_tensordict(name):
    td = example_tensordicts()[name]
    ref = to_reference(td)
    assert len(td) == len(ref)
    assert td.batch_size == ref.batch_size
    for nested in (False, True):
        for leaves in (False, True):
            assert set(td.keys(nested, leaves)) == set(ref.keys(nested, leaves)), (nested, leaves)
    for k in td.keys(True, True):
        assert torch.equal(td[k], ref[k])
        assert (k in td) == (k in ref.keys(True))


def test_from_dict_agrees_with_tensordict():
    tensordict = pytest.importorskip("tensordict")
    for d in (
        {"a": torch.zeros(3, 4, 5), "b": {"c": torch.zeros(3, 4, 2)}},
        {"a": torch.zeros(3, 4, 5), "b": {"c": torch.zeros(3, 4, 5)}},
        {"a": torch.zeros(3), "b": {"c": torch.zeros(2)}},
    ):
        ref = tensordict.TensorDict.from_dict(d, auto_batch_size=True)
        assert fd.TensorDict.from_dict(d).batch_size == ref.batch_size


@pytest.fixture
def td():
    """A nested TensorDict the test must leave unchanged (checked at teardown)."""
    yield from unchanged_example()


# ------------------------------------------------------------------ batch size errors
def test_leaf_leading_dims_disagree():
    x = torch.randn(4, 3)
    source = {"x": x}
    with pytest.raises(ValueError, match=r"entry 'x' has shape \[4, 3\].*batch size \[5\]"):
        fd.TensorDict(source, [5])
    assert source["x"] is x and list(source) == ["x"]
    with pytest.raises(ValueError, match=r"batch_size=\[4\]"):  # the suggestion fits the leaf
        fd.TensorDict(source, [5])


def test_nested_leaf_disagrees_names_full_path():
    with pytest.raises(ValueError, match=r"entry \('obs', 'pos'\) has shape \[5\].*\[5, 2\]"):
        fd.TensorDict({"obs": {"pos": torch.zeros(5)}}, [5, 2])
    inner = fd.TensorDict({"b": torch.zeros(4)}, [4])
    with pytest.raises(ValueError, match=r"'a' has a nested TensorDict of batch_size \[4\]"):
        fd.TensorDict({"a": inner}, [5])


def test_set_wrong_shape(td):
    with pytest.raises(ValueError, match=r"entry 'y' has shape \[4\].*batch size \[5\]"):
        td.set("y", torch.zeros(4))
    with pytest.raises(ValueError, match=r"entry \('obs', 'pos'\) has shape \[4, 2\]"):
        td.set(("obs", "pos"), torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"entry \('obs', 'v'\)"):
        td.update({"obs": {"v": torch.zeros(3)}})


@pytest.mark.parametrize(
    "bs, exc",
    [([-1], ValueError), ([5, -2], ValueError), ([2.0], TypeError), ("5", TypeError)],
)
def test_bad_batch_dims(bs, exc):
    x = torch.zeros(5)
    with pytest.raises(exc, match=r"batch_size must be a sequence of non-negative ints"):
        fd.TensorDict({"x": x}, bs)


def test_bool_batch_dim_rejected():
    with pytest.raises((TypeError, ValueError), match=r"non-negative ints, got \[True\]"):
        fd.TensorDict({}, [True])


# ------------------------------------------------------------------ leaf errors
@pytest.mark.parametrize("value, tname", [(3, "int"), ([1, 2], "list"), ("a", "str")])
def test_non_tensor_leaf(value, tname):
    source = {"x": torch.zeros(2), "bad": value}
    with pytest.raises(TypeError, match=rf"entry 'bad' has type {tname}.*torch\.as_tensor"):
        fd.TensorDict(source, [2])
    assert source["bad"] is value


def test_non_tensor_nested_and_set(td):
    with pytest.raises(TypeError, match=r"entry \('a', 'b'\) has type float"):
        fd.TensorDict({"a": {"b": 1.0}}, [])
    with pytest.raises(TypeError, match=r"entry 'y' has type int"):
        td.set("y", 1)
    with pytest.raises(TypeError, match=r"entry 'x' has type int"):
        td.update({"x": 1})


def test_mixed_devices_when_device_given():
    meta = torch.empty(3, device="meta")
    source = {"a": torch.zeros(3), "b": {"c": meta}}
    with pytest.raises(ValueError, match=r"device=cpu, but entry \('b', 'c'\) is on meta.*\.to"):
        fd.TensorDict(source, [3], device="cpu")
    assert source["b"]["c"] is meta
    inner = fd.TensorDict({"c": meta}, [3])
    snap = Snapshot(inner)
    with pytest.raises(ValueError, match=r"entry \('b', 'c'\) is on meta"):
        fd.TensorDict({"b": inner}, [3], device=torch.device("cpu"))
    snap.check()


# ------------------------------------------------------------------ immutability errors
def test_setitem(td):
    with pytest.raises(TypeError, match=r"td\['x'\] = value.*td\.set\('x', value\)"):
        td["x"] = torch.zeros(5, 3)
    with pytest.raises(TypeError, match=r"td\.set\(\('obs', 'pos'\), value\)"):
        td["obs", "pos"] = torch.zeros(5, 2)


def test_setattr(td):
    with pytest.raises(TypeError, match=r"cannot assign attribute 'x'.*td\.set\('x', value\)"):
        td.x = torch.zeros(5, 3)
    with pytest.raises(TypeError, match=r"immutable"):
        td._data = {}
    with pytest.raises(TypeError, match=r"immutable"):
        del td.x


def test_delitem(td):
    with pytest.raises(TypeError, match=r"del td\['x'\].*td\.exclude\('x'\)"):
        del td["x"]


@pytest.mark.parametrize(
    "name, pure",
    [("update_", "update"), ("set_", "set"), ("apply_", "apply"), ("zero_", "apply")],
)
def test_inplace_methods_point_to_pure(td, name, pure):
    with pytest.raises(AttributeError, match=rf"no in-place method '{name}'.*td\.{pure}\("):
        getattr(td, name)
    with pytest.raises(TypeError, match=rf"td\.{pure}\("):  # also a TypeError, as design.md says
        getattr(td, name)
    assert not hasattr(td, name)


def test_unknown_attribute(td):
    with pytest.raises(AttributeError, match=r"no attribute 'nope'"):
        td.nope


def test_the_one_call_constructor_equals_the_slot_descriptors_and_holds_no_extra_reference():
    """``_alloc_ext`` (built with the package) sets the four slots in one call; the
    Python fallback sets them through the descriptors: the same TensorDict, and the
    data and batch size are referenced once each (no leak, no early free)."""
    import sys

    from functd._td import _tensordict as T

    assert type(T.new_unchecked).__name__ == "builtin_function_or_method"  # the C path here
    data, bs = {"a": torch.ones(2, 3)}, torch.Size([2])
    before = sys.getrefcount(data), sys.getrefcount(bs)
    for make in (T.new_unchecked, T._new_slots):
        td = make(data, bs)
        assert type(td) is fd.TensorDict and td._data is data and td._batch_size is bs
        assert td._spec is None and td._check_cache is None
        assert (sys.getrefcount(data), sys.getrefcount(bs)) == (before[0] + 1, before[1] + 1)
        del td
        assert (sys.getrefcount(data), sys.getrefcount(bs)) == before
    td = T.new_unchecked({"b": torch.zeros(2)}, bs)
    T.init_unchecked(td, data, bs)  # overwrites: the old dict is released
    assert td._data is data and dict(td.items()) == data
    with pytest.raises(TypeError, match="td of the bound class"):
        T.init_unchecked(object(), data, bs)
    with pytest.raises(TypeError, match="not a slot of the class"):
        T._alloc_ext.bind(dict, frozenset(), {}, len)


_SOURCES = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", 1, ("a", "b")]),
        st.sampled_from(["t3", "t3x2", "t2", "scalar", "param3", "nested", "int"]),
    ),
    max_size=4,
)
_BATCHES = st.sampled_from([[3], [2], [0], [-1], [True], [2**70], [3.0], (3,), [3, 1], []])


@given(_SOURCES, _BATCHES)
def test_the_constructors_common_case_in_c_agrees_with_python(items, bs):
    """``init_batch1`` (C, _alloc_ext.c) and its Python twin take the same cases and
    build the same TensorDict; the cases both refuse go to the general path."""
    from functd._td import _tensordict as T

    leaf = {
        "t3": torch.ones(3),
        "t3x2": torch.ones(3, 2),
        "t2": torch.ones(2),
        "scalar": torch.tensor(1.0),
        "param3": torch.nn.Parameter(torch.ones(3)),
        "nested": {"x": torch.ones(3)},
        "int": 3,
    }
    source = {k: leaf[v] for k, v in items}
    got = []
    for init in (T.init_batch1, T._init_batch1):
        td = T.alloc_uninit(fd.TensorDict)
        ok = init(td, source, bs)
        got.append((ok, list(td._data.items()) if ok else None, td._batch_size if ok else None))
        if ok:
            assert td._data is not source and td._spec is None and td._check_cache is None
    assert got[0] == got[1]
