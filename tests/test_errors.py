"""Every bad input raises a clear error, and leaves its inputs unchanged.

Each test checks the exception type, the message (what failed, where, how to
fix it) and that the TensorDicts or mappings given are exactly as before: same
keys, same leaf objects, same values.
"""

import pytest
import torch

import functd as fd


def make():
    return fd.TensorDict({"x": torch.randn(5, 3), "obs": {"pos": torch.randn(5, 2)}}, [5])


class Snapshot:
    """Keys, leaf identities, leaf values and batch sizes of a TensorDict or nested dict."""

    def __init__(self, obj):
        self.obj = obj
        self.state = self._state(obj)

    @classmethod
    def _state(cls, obj):
        if isinstance(obj, fd.TensorDict):
            return (
                "td",
                tuple(obj.batch_size),
                tuple((k, cls._state(v)) for k, v in obj._data.items()),
            )
        if isinstance(obj, dict):
            return ("dict", tuple((k, cls._state(v)) for k, v in obj.items()))
        if isinstance(obj, torch.Tensor):
            return ("tensor", id(obj), obj.clone() if obj.device.type != "meta" else obj.shape)
        return ("other", id(obj))

    def check(self):
        assert self._equal(self._state(self.obj), self.state), "the input changed"

    @classmethod
    def _equal(cls, a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, torch.Tensor):
            return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, tuple):
            return len(a) == len(b) and all(cls._equal(x, y) for x, y in zip(a, b))
        return a == b


@pytest.fixture
def td():
    t = make()
    snap = Snapshot(t)
    yield t
    snap.check()


# ------------------------------------------------------------------ keys
def test_missing_key_lists_existing_keys(td):
    with pytest.raises(KeyError, match=r"no key 'nope'; it has: 'x', 'obs'"):
        td["nope"]
    with pytest.raises(KeyError, match=r"no key 'nope'; it has: 'x', 'obs'"):
        td.get("nope")


def test_missing_nested_key_says_where_it_broke(td):
    with pytest.raises(KeyError, match=r"\('obs', 'vel'\).*broke after 'obs' \(level 1\).*'pos'"):
        td["obs", "vel"]
    with pytest.raises(KeyError, match=r"no key \('a', 'b'\); it has: 'x', 'obs'"):
        td.get(("a", "b"))


def test_key_through_a_leaf(td):
    with pytest.raises(KeyError, match=r"goes through 'x', which is a Tensor"):
        td["x", "y"]
    with pytest.raises(KeyError, match=r"cannot set \('x', 'y'\): 'x' holds a Tensor"):
        td.set(("x", "y"), torch.zeros(5))
    with pytest.raises(KeyError, match=r"cannot set \('obs', 'pos', 'z'\): \('obs', 'pos'\)"):
        td.set(("obs", "pos", "z"), torch.zeros(5))


@pytest.mark.parametrize("key", [3, 1.5, ("obs", 1), (b"x",), None, ["x"]])
def test_bad_key_type(td, key):
    with pytest.raises(TypeError, match=r"keys are str or non-empty tuples of str"):
        td.get(key)
    with pytest.raises(TypeError, match=r"keys are str or non-empty tuples of str"):
        td.set(key, torch.zeros(5))


def test_bad_key_in_source():
    x = torch.zeros(3)
    source = {1: x}
    with pytest.raises(TypeError, match=r"got 1 of type int"):
        fd.TensorDict(source, [3])
    assert source == {1: x} and source[1] is x
    with pytest.raises(TypeError, match=r"keys must be str; got the tuple \('a', 'b'\).*Nest"):
        fd.TensorDict({("a", "b"): x}, [3])
    with pytest.raises(TypeError, match=r"nested mapping keys must be str"):
        fd.TensorDict({"a": {("b",): x}}, [3])


def test_bad_source():
    with pytest.raises(TypeError, match=r"takes a mapping.*got a list"):
        fd.TensorDict([torch.zeros(3)], [3])


def test_empty_tuple_key(td):
    with pytest.raises(KeyError, match=r"empty tuple.*td\[\.\.\.\]"):
        td[()]
    with pytest.raises(KeyError, match=r"empty tuple"):
        td.get(())
    with pytest.raises(KeyError, match=r"empty tuple"):
        td.set((), torch.zeros(5))
    with pytest.raises(KeyError, match=r"empty tuple"):
        td.select(())


def test_mixed_key_and_batch_index(td):
    with pytest.raises(TypeError, match=r"mixes keys and batch indices.*td\['x'\]\[\.\.\.\]"):
        td["x", 0]
    with pytest.raises(TypeError, match=r"mixes keys and batch indices"):
        td[0, "x"]


# ------------------------------------------------------------------ batch size
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


# ------------------------------------------------------------------ leaves
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


# ------------------------------------------------------------------ stack / cat
def test_stack_different_keys_names_them(td):
    other = td.exclude("x").set("y", torch.zeros(5))
    snap = Snapshot(other)
    with pytest.raises(ValueError, match=r"different keys; only in 0: 'x'; only in 1: 'y'"):
        fd.stack([td, other])
    with pytest.raises(ValueError, match=r"only in 0: 'x'; only in 1: 'y'"):
        fd.cat([td, other])
    snap.check()


def test_stack_different_nested_keys_names_full_path(td):
    other = td.set(("obs", "vel"), torch.zeros(5))
    with pytest.raises(ValueError, match=r"only in 0: \(none\); only in 1: \('obs', 'vel'\)"):
        fd.stack([td, other])


def test_stack_different_feature_shapes(td):
    other = td.set(("obs", "pos"), torch.zeros(5, 4))
    with pytest.raises(ValueError, match=r"entry \('obs', 'pos'\) has feature shape \[2\].*\[4\]"):
        fd.stack([td, other])
    with pytest.raises(ValueError, match=r"feature shape \[2\] in TensorDict 0 but \[4\]"):
        fd.cat([td, other])


def test_stack_cat_batch_sizes(td):
    with pytest.raises(ValueError, match=r"batch_size \[5\] but TensorDict 1 has \[2\]"):
        fd.stack([td, td[:2]])
    with pytest.raises(ValueError, match=r"may differ only in dim 0"):
        fd.cat([td, fd.stack([td, td])])


def test_stack_cat_nested_batch_sizes_differ():
    a = fd.TensorDict({"c": fd.TensorDict({"y": torch.zeros(3, 2)}, [3, 2])}, [3])
    b = fd.TensorDict({"c": fd.TensorDict({"y": torch.zeros(3, 4)}, [3, 4])}, [3])
    snaps = Snapshot(a), Snapshot(b)
    msg = r"entry 'c' is a TensorDict of batch_size \[3, 2\] in TensorDict 0 but \[3, 4\]"
    with pytest.raises(ValueError, match=msg):
        fd.stack([a, b])
    with pytest.raises(ValueError, match=msg):
        fd.cat([a, b])
    for snap in snaps:
        snap.check()
    assert fd.cat([a, fd.cat([a, a])])["c"].batch_size == torch.Size([9, 2])


def test_stack_entry_type_differs(td):
    other = td.set("obs", torch.zeros(5))
    with pytest.raises(ValueError, match=r"entry 'obs' is a TensorDict in TensorDict 0"):
        fd.stack([td, other])


def test_stack_bad_arguments(td):
    with pytest.raises(TypeError, match=r"non-empty list"):
        fd.stack([])
    with pytest.raises(TypeError, match=r"non-empty list"):
        fd.stack(td)
    with pytest.raises(TypeError, match=r"element 1 is a dict"):
        fd.cat([td, {"x": 1}])
    with pytest.raises(IndexError, match=r"dim 3 is out of range"):
        fd.stack([td, td], 3)


# ------------------------------------------------------------------ indexing
@pytest.mark.parametrize("idx", [(0, 0), (..., 0, 1), (slice(None), 0), torch.zeros(5, 2) > 0])
def test_index_past_batch_dims(td, idx):
    with pytest.raises(IndexError, match=r"uses 2 dims, but the TensorDict has only 1 batch dims"):
        td[idx]


def test_bad_index_types(td):
    with pytest.raises(TypeError, match=r"type float is not supported"):
        td[1.5]
    with pytest.raises(TypeError, match=r"Python bools"):
        td[True]
    with pytest.raises(IndexError, match=r"single ellipsis"):
        td[..., ...]


def test_shape_op_errors(td):
    with pytest.raises(ValueError, match=r"cannot become \[7\]"):
        td.reshape(7)
    with pytest.raises(ValueError, match=r"only one dim can be -1"):
        td.reshape(-1, -1)
    with pytest.raises(ValueError, match=r"size 5 cannot expand to 3"):
        td.expand(3)
    with pytest.raises(IndexError, match=r"unsqueeze: dim 3 is out of range"):
        td.unsqueeze(3)


# ------------------------------------------------------------------ frozen
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
