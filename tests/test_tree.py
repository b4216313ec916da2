"""Pytree registration: optree (namespace "functd", ``fd.tree``) and torch.utils._pytree;
the key paths the transforms' messages print, against torch's keystr."""

import copy
import pickle
import re

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd._transforms._paths import fmt_call_path, fmt_path
from functd.testing import assert_close, batch_shapes, example_tensordicts, tensordicts

EXAMPLES = example_tensordicts()
TREES = tensordicts(max_depth=3, dtypes=(torch.float32, torch.int64, torch.bool))


def make():
    return fd.TensorDict({"x": torch.randn(5, 3), "obs": {"pos": torch.randn(5, 2)}}, [5])


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_round_trips_on_examples(name):
    td = EXAMPLES[name]
    leaves, spec = fd.tree.flatten(td)
    assert_close(fd.tree.unflatten(spec, leaves), td)
    tleaves, tspec = torch_pytree.tree_flatten(td)
    assert_close(torch_pytree.tree_unflatten(tleaves, tspec), td)


@given(TREES)
def test_optree_and_torch_round_trips(td):
    leaves, spec = fd.tree.flatten(td)
    back = fd.tree.unflatten(spec, leaves)
    assert isinstance(back, fd.TensorDict)
    assert_close(back, td)
    assert all(a is b for a, b in zip(fd.tree.leaves(back), leaves))
    assert back.keys(True) == td.keys(True)  # the insertion order survives
    tleaves, tspec = torch_pytree.tree_flatten(td)
    tback = torch_pytree.tree_unflatten(tleaves, tspec)
    assert_close(tback, td)
    assert tback.keys(True) == td.keys(True)


def leaves_in_order(td):
    """Canonical order: keys sorted at each level, nested TensorDicts flattened in place."""
    out = []
    for k in sorted(td.keys()):
        v = td[k]
        out.extend(leaves_in_order(v) if isinstance(v, fd.TensorDict) else [v])
    return out


@given(TREES)
def test_same_leaves_same_order_in_both_registries(td):
    a = fd.tree.leaves(td)
    b = torch_pytree.tree_leaves(td)
    expected = leaves_in_order(td)
    assert len(a) == len(b) == len(expected)
    assert all(x is y is z for x, y, z in zip(a, b, expected))


def test_round_trip_keeps_insertion_order():
    td = fd.TensorDict({"z": torch.zeros(2), "a": {"y": torch.ones(2), "b": torch.ones(2)}}, [2])
    assert fd.tree.flatten_with_path(td)[0] == [("a", "b"), ("a", "y"), ("z",)]  # canonical
    back = fd.tree.map(lambda x: x + 1, td)
    assert back.keys(True) == ("z", "a", ("a", "y"), ("a", "b"))
    spec = torch_pytree.tree_structure(td)
    loaded = torch_pytree.treespec_loads(torch_pytree.treespec_dumps(spec))
    back = torch_pytree.tree_unflatten(torch_pytree.tree_leaves(td), loaded)
    assert back.keys(True) == td.keys(True)


def test_optree_without_namespace_sees_a_leaf():
    td = make()
    assert optree.tree_leaves(td) == [td]
    assert len(optree.tree_leaves(td, namespace="functd")) == 2


def test_tree_map_several_trees_and_containers():
    a, b = make(), make()
    out = fd.tree.map(torch.add, a, b)
    assert isinstance(out, fd.TensorDict) and out.batch_size == a.batch_size
    assert torch.equal(out["obs", "pos"], a["obs", "pos"] + b["obs", "pos"])
    tout = torch_pytree.tree_map(torch.add, {"p": a}, {"p": b})
    assert_close(tout["p"], out)
    nested = fd.tree.map(lambda x: x * 0, [a, {"k": (b,)}])
    assert isinstance(nested[1]["k"][0], fd.TensorDict)


def test_tree_map_that_drops_batch_dims():
    td = EXAMPLES["batch_2x3"]
    out = fd.tree.map(lambda x: x[0], td)
    assert out.batch_size == torch.Size([3])
    assert out["b"].batch_size == torch.Size([3])
    assert torch.equal(out["a"], td["a"][0])


def test_tree_map_keeps_empty_nested_batch_consistent():
    td = fd.TensorDict({"e": {}, "x": torch.randn(4, 3)}, [4])
    out = fd.tree.map(lambda x: x[0], td)
    assert out.batch_size == torch.Size([])
    assert out["e"].batch_size == torch.Size([])  # derived from the parent, not stale [4]
    assert_close(fd.tree.map(lambda x: x, td), td)


# ------------------------------------------------------------------ structures
def permuted(td, perm_seed):
    """The same content, built with its keys inserted in another order."""
    g = torch.Generator().manual_seed(perm_seed)

    def rebuild(t):
        keys = list(t.keys())
        order = torch.randperm(len(keys), generator=g).tolist()
        return {
            keys[i]: rebuild(t[keys[i]]) if isinstance(t[keys[i]], fd.TensorDict) else t[keys[i]]
            for i in order
        }

    return fd.TensorDict(rebuild(td), td.batch_size)


@given(TREES, st.integers(0, 1000), batch_shapes())
def test_structure_independent_of_order_and_batch_size(td, seed, bs):
    other = permuted(td, seed)
    assert fd.tree.structure(other) == fd.tree.structure(td)
    assert hash(fd.tree.structure(other)) == hash(fd.tree.structure(td))
    assert torch_pytree.tree_structure(other) == torch_pytree.tree_structure(td)
    la, lb = fd.tree.leaves(other), fd.tree.leaves(td)
    assert len(la) == len(lb) and all(a is b for a, b in zip(la, lb))
    # the same keys with another batch size (and other leaves) give the same structure
    resized = fd.TensorDict(
        fd.tree.map(lambda x: torch.zeros((*bs, *x.shape[td.batch_dims :])), td).to_dict(), bs
    )
    assert resized.batch_size == torch.Size(bs)
    assert fd.tree.structure(resized) == fd.tree.structure(td)
    assert torch_pytree.tree_structure(resized) == torch_pytree.tree_structure(td)


def test_structure_differs_for_different_keys():
    a = make()
    assert fd.tree.structure(a) != fd.tree.structure(a.set("y", torch.zeros(5)))
    assert fd.tree.structure(a) != fd.tree.structure(a.rename({"x": "z"}))
    b = a.set("obs", torch.zeros(5))  # same top keys, but 'obs' is a leaf now
    assert fd.tree.structure(a) != fd.tree.structure(b)
    assert torch_pytree.tree_structure(a) != torch_pytree.tree_structure(b)


# ------------------------------------------------------------------ key paths
def test_optree_paths():
    td = make()
    paths, leaves, _ = fd.tree.flatten_with_path(td)
    assert paths == [("obs", "pos"), ("x",)]
    assert leaves[0] is td["obs", "pos"] and leaves[1] is td["x"]
    accessors, _, _ = fd.tree.flatten_with_accessor(td)
    assert accessors[0](td) is td["obs", "pos"]


def test_torch_paths():
    td = make()
    with_path, _ = torch_pytree.tree_flatten_with_path(td)
    paths = [p for p, _ in with_path]
    assert paths == [
        (torch_pytree.MappingKey("obs"), torch_pytree.MappingKey("pos")),
        (torch_pytree.MappingKey("x"),),
    ]
    assert torch_pytree.keystr(paths[0]) == "['obs']['pos']"
    assert with_path[1][1] is td["x"]
    mapped = torch_pytree.tree_map_with_path(lambda p, x: torch.full_like(x, len(p)), td)
    assert torch.equal(mapped["obs", "pos"], torch.full((5, 2), 2.0))


@given(TREES)
def test_paths_index_the_tensordict(td):
    paths, leaves, _ = fd.tree.flatten_with_path(td)
    for p, leaf in zip(paths, leaves):
        assert td[p] is leaf
    tpaths, _ = torch_pytree.tree_flatten_with_path(td)
    assert [tuple(k.key for k in p) for p, _ in tpaths] == paths


# ------------------------------------------------------------------ serialization
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_treespec_dumps_loads(name):
    td = EXAMPLES[name]
    leaves, spec = torch_pytree.tree_flatten(td)
    text = torch_pytree.treespec_dumps(spec)
    assert "functd.TensorDict" in text
    loaded = torch_pytree.treespec_loads(text)
    assert loaded == spec
    assert_close(torch_pytree.tree_unflatten(leaves, loaded), td)


@given(TREES)
def test_pickle_and_deepcopy(td):
    back = pickle.loads(pickle.dumps(td))
    assert_close(back, td)
    assert back.keys(True) == td.keys(True)
    deep = copy.deepcopy(td)
    assert_close(deep, td)
    for a, b in zip(deep.values(True, True), td.values(True, True)):
        assert a is not b
    shallow = copy.copy(td)
    assert_close(shallow, td)


def test_pickle_keeps_nested_batch_sizes():
    td = EXAMPLES["longer_child"]
    back = pickle.loads(pickle.dumps(td))
    assert back["c"].batch_size == torch.Size([3, 2])
    assert_close(back, td)


# ------------------------------------------------------------------ purity
def state(td):
    return [(k, id(v), v.clone()) for k, v in td.items(True, True)], td.keys(True)


def assert_same_state(td, before):
    leaves, keys = before
    assert td.keys(True) == keys
    now = td.items(True, True)
    assert len(now) == len(leaves)
    for (k, v), (k0, i0, v0) in zip(now, leaves):
        assert k == k0 and id(v) == i0 and torch.equal(v, v0)


@given(TREES, st.data())
def test_pure_methods_never_change_input(td, data):
    before = state(td)
    keys = list(td.keys(True))
    key = data.draw(st.sampled_from(keys)) if keys else "new"
    leaf = torch.ones(*td.batch_size, 2)
    td.set("new", leaf)
    td.set(("deep", "new"), leaf)
    td.select(*keys[: len(keys) // 2])
    td.exclude(key)
    td.update({"new": leaf, "obs": {"z": leaf}})
    td.update(td.apply(lambda x: x))
    td.apply(lambda x: x * 2)
    td.clone()
    if keys:
        td.rename({key: "renamed"})
    assert_same_state(td, before)


@pytest.mark.parametrize(
    ("fn", "keeps"),
    [
        (lambda x: x * 2, True),
        (lambda x: x.unsqueeze(0), True),  # batch [1, 3]: every rank beyond it kept
        (lambda x: x.sum(0), True),  # batch []
        (lambda x: x if x.ndim == 3 else x[..., None], False),  # 'b' gains a feature dim
    ],
)
def test_rebuilt_tensordict_spec_is_the_one_computed_from_scratch(fn, keeps):
    # torch's unflatten may hand a rebuilt TensorDict the spec it came from (when every
    # entry keeps its rank); whatever it keeps must equal a spec computed afresh
    from functd._td._tree import spec_of as _spec

    td = fd.TensorDict(
        {"w": torch.ones(3, 2, 4), "b": torch.ones(3, 2), "sub": {"z": torch.ones(3, 5)}}, [3]
    )
    out = torch_pytree.tree_map(fn, td)
    assert (out._spec is not None) == keeps
    for o in (out, out["sub"]):
        f = copy.copy(o)
        object.__setattr__(f, "_spec", None)
        s, r = _spec(o), _spec(f)
        assert (s.keys, s.ranks, s.full, s.order, s.batch_size) == (
            r.keys,
            r.ranks,
            r.full,
            r.order,
            r.batch_size,
        )


# ------------------------------------------------------------------ flat-leaf helpers
# the one owner of the fast flat-leaf paths (optimizers, train_step, collectives):
# checked against optree's generic flatten and unflatten of the same TensorDict
@given(TREES)
def test_flat_leaves_and_unflatten_like_agree_with_optree(td):
    from functd._td._tree import flat_leaves, unflatten_like

    leaves, spec = fd.tree.flatten(td)
    ours = flat_leaves(td)
    assert len(ours) == len(leaves) and all(a is b for a, b in zip(ours, leaves))
    new = [torch.zeros_like(x) if x.is_floating_point() else x + 1 for x in leaves]
    back = unflatten_like(td, new)
    ref = fd.tree.unflatten(spec, new)
    assert_close(back, ref)
    assert back.keys(True) == td.keys(True)  # insertion order at every level
    assert all(a is b for a, b in zip(fd.tree.leaves(back), new))
    for k, v in td.items(True):  # batch sizes of every level are the template's
        if isinstance(v, fd.TensorDict):
            assert back[k].batch_size == v.batch_size
    assert all(a is b for a, b in zip(fd.tree.leaves(td), leaves))  # template untouched


@given(TREES, TREES)
def test_same_keys_is_equality_of_tree_structures(a, b):
    from functd._td._tree import same_keys

    assert same_keys(a, a)
    assert same_keys(a, b) == (fd.tree.structure(a) == fd.tree.structure(b))


def test_same_keys_names_nesting():
    from functd._td._tree import same_keys

    a = fd.TensorDict({"x": torch.zeros(2), "s": {"y": torch.zeros(2)}}, [2])
    assert same_keys(a, a.apply(torch.ones_like))
    assert not same_keys(a, a.set("s", torch.zeros(2)))  # a leaf where a TensorDict was
    assert not same_keys(a, a.set(("s", "z"), torch.zeros(2)))  # a key more, nested


# ------------------------------------------------------------------ the key-path formatter
# the one formatter of the transforms' messages (functd._transforms._paths): torch's own
# keystr is the reference for torch key paths
PATH_KEYS = st.text(alphabet="ab'\"x_ ", min_size=1, max_size=4)
PATH_TREES = st.recursive(
    st.just(torch.zeros(())),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(tuple),
        st.dictionaries(PATH_KEYS, inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


@given(PATH_TREES)
def test_torch_key_paths_format_as_keystr(tree):
    pairs, _ = torch_pytree.tree_flatten_with_path(tree)
    for path, _ in pairs:
        assert fmt_path(path, "out") == "out" + torch_pytree.keystr(path)


@given(st.lists(st.one_of(PATH_KEYS, st.integers(0, 9)), max_size=4))
def test_plain_paths_and_torch_paths_agree(steps):
    # a path of str keys and ints formats as the torch path of the same steps
    torch_steps = tuple(
        torch_pytree.MappingKey(s) if isinstance(s, str) else torch_pytree.SequenceKey(s)
        for s in steps
    )
    assert (
        fmt_path(tuple(steps))
        == fmt_path(torch_steps)
        == "args" + "".join(f"[{s!r}]" for s in steps)
    )


def test_call_paths_and_attributes():
    assert fmt_call_path((0, 2, "obs", "pos")) == "args[2]['obs']['pos']"
    assert fmt_call_path((1, "td", "x")) == "td=['x']"
    assert fmt_call_path((1, "lr")) == "lr="
    assert fmt_path((torch_pytree.GetAttrKey("weight"), 0), "m") == "m.weight[0]"


def test_the_transforms_name_paths_with_it():
    # one formatter behind fd.grad's and fd.vmap's messages: the same spelling
    td = fd.TensorDict({"obs": {"n": torch.zeros(3, dtype=torch.int64)}}, [3])
    with pytest.raises(TypeError, match=re.escape(fmt_path((0, "obs", "n")) + " has dtype")):
        fd.grad(lambda t: t["obs", "n"].sum())(td)
    with pytest.raises(ValueError, match=re.escape(f"in_dims at {fmt_path((0,))} does not")):
        fd.vmap(lambda t: t, in_dims=({"obs": 0, "x": 0},))(td)
