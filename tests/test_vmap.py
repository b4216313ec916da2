"""fd.vmap: per-entry in_dims/out_dims over TensorDicts, batch sizes, errors, and its
flatten of the arguments (optree's, with the in_dims broadcast) against
torch.utils._pytree's."""

import collections
import inspect

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree
from hypothesis import example, given, settings
from hypothesis import strategies as st

import functd as fd
from functd._transforms._in_dims import in_leaves
from functd.testing import assert_close, tensordicts


def make(bs=(4, 5)):
    g = torch.Generator().manual_seed(0)
    return fd.TensorDict(
        {"x": torch.randn(*bs, 3, generator=g), "obs": {"pos": torch.randn(*bs, 2, generator=g)}},
        list(bs),
    )


def along(dim, i):
    return (slice(None),) * dim + (i,)


def snapshot(*trees):
    return [(id(v), v.clone()) for v in fd.tree.leaves(trees)]


def unchanged(before, *trees):
    after = fd.tree.leaves(trees)
    assert [i for i, _ in before] == [id(v) for v in after]
    for (_, v), w in zip(before, after):
        assert torch.equal(v, w)


def stat(t):
    """Uses t.batch_size: wrong shapes if the mapped dim leaked into it."""
    return t.set("z", torch.zeros(t.batch_size) + t["x"].sum(-1))


# ------------------------------------------------------------------ basics
@pytest.mark.parametrize("in_dim", [0, 1, -1, -2])
def test_in_dims_int_batch_size_inside_and_out(in_dim):
    td = make()
    seen = []

    def f(t):
        seen.append(t.batch_size)
        return stat(t)

    before = snapshot(td)
    out = fd.vmap(f, in_dims=in_dim)(td)
    d = in_dim % 2  # negative counts from the last batch dim (not the last feature dim)
    inside = torch.Size([5]) if d == 0 else torch.Size([4])
    assert seen == [inside]
    assert out.batch_size == torch.Size([td.batch_size[d], *inside])
    loop = fd.stack([stat(td[along(d, i)]) for i in range(td.batch_size[d])])
    assert_close(out, loop)
    unchanged(before, td)


@pytest.mark.parametrize(("in_dim", "out_dim"), [(0, 1), (1, 1), (1, 0), (0, -1), (1, -2)])
def test_out_dims_on_tensordict(in_dim, out_dim):
    td = make()
    out = fd.vmap(stat, in_dims=in_dim, out_dims=out_dim)(td)
    n = td.batch_size[in_dim]
    loop = fd.stack([stat(td[along(in_dim, i)]) for i in range(n)], dim=out_dim % 2)
    assert_close(out, loop)
    assert out["obs"].batch_size == out.batch_size


def test_out_dims_tuple_with_none_and_tensor():
    td = make()
    w = torch.randn(3)
    a, b, c = fd.vmap(
        lambda t, w: (t, t["x"] @ w, w * 2), in_dims=(0, None), out_dims=(1, 0, None)
    )(td, w)
    assert a.batch_size == torch.Size([5, 4])
    assert_close(a, td.apply(lambda x: x.transpose(0, 1), batch_size=[5, 4]))
    assert_close(b, td["x"] @ w)
    assert_close(c, w * 2)


def test_out_dims_one_tuple_for_a_single_output():
    td = make()
    out = fd.vmap(stat, out_dims=(1,))(td)
    assert out.batch_size == torch.Size([5, 4])
    x = torch.randn(4, 3)
    assert_close(fd.vmap(torch.sin, out_dims=(1,))(x), torch.vmap(torch.sin, out_dims=(1,))(x))


def test_out_dims_dict_for_dict_and_tensordict_outputs():
    td = make()
    out = fd.vmap(
        lambda t: {"td": t, "n": t["x"].norm()},
        out_dims={"td": {"x": 1, "obs": {"pos": 1}}, "n": 0},
    )(td)
    assert out["td"].batch_size == torch.Size([5, 4])
    assert_close(out["td"], td.apply(lambda x: x.transpose(0, 1), batch_size=[5, 4]))
    assert_close(out["n"], td["x"].flatten(1).norm(dim=1))


def test_in_dims_dict_per_entry_of_a_container_tensordict():
    """{'params': 0, 'td': None}: a batch_size-[] TensorDict holding independent entries."""
    params = fd.TensorDict({"w": torch.randn(6, 3), "b": torch.randn(6)}, [6])
    data = make((4,))
    box = fd.TensorDict({"params": params, "td": data}, [])
    seen = []

    def f(b):
        seen.append((b.batch_size, b["params"].batch_size, b["td"].batch_size))
        return b["td"]["x"] @ b["params", "w"] + b["params", "b"]

    out = fd.vmap(f, in_dims=({"params": 0, "td": None},))(box)
    assert seen == [(torch.Size([]), torch.Size([]), torch.Size([4]))]
    assert_close(out, torch.stack([data["x"] @ params["w"][i] + params["b"][i] for i in range(6)]))
    # the same prefix as a TensorDict of ints/None (e.g. built with fd.tree.map)
    dims_td = fd.tree.map(lambda _: None, box, none_is_leaf=True)
    dims_td = dims_td.set("params", fd.tree.map(lambda _: 0, params))
    assert_close(fd.vmap(f, in_dims=(dims_td,))(box), out)


def test_in_dims_dict_for_plain_dict_argument():
    td = make((4,))
    w = torch.randn(4, 3)
    out = fd.vmap(lambda d: d["td"]["x"] * d["w"], in_dims=({"td": 0, "w": 0},))({"td": td, "w": w})
    assert_close(out, td["x"] * w)


def test_feature_dim_of_a_batchless_tensordict_keeps_batch_size_empty():
    td = fd.TensorDict({"w": torch.randn(8, 3, 4)})  # batch_size []
    seen = []
    out = fd.vmap(lambda t: (seen.append(t.batch_size), t.apply(torch.sin))[1])(td)
    assert seen == [torch.Size([])]
    assert out.batch_size == torch.Size([8])
    assert_close(out["w"], td["w"].sin())
    out = torch.func.vmap(lambda t: t.apply(torch.sin))(td)  # plain torch.func too
    assert out.batch_size == torch.Size([8])


def test_nested_fd_vmap_and_plain_torch_vmap_agree():
    td = make()
    out = fd.vmap(fd.vmap(stat))(td)
    assert_close(out, torch.func.vmap(torch.func.vmap(stat))(td))
    assert out.batch_size == td.batch_size
    out = fd.vmap(fd.vmap(stat, in_dims=0), in_dims=1)(td)
    assert out.batch_size == torch.Size([5, 4])


def test_chunk_size_and_kwargs_not_mapped():
    td = make((7,))
    f = lambda t, scale: t.apply(lambda x: x * scale)  # noqa: E731
    out = fd.vmap(f, chunk_size=3)(td, scale=torch.tensor(2.0))
    assert_close(out, td.apply(lambda x: x * 2))


def test_wraps_keeps_name_doc_signature():
    def loss(params, td, *, scale=1.0):
        """Docstring of loss."""
        return params

    v = fd.vmap(loss)
    assert v.__wrapped__ is loss and v.__name__ == "loss" and v.__doc__ == loss.__doc__
    assert inspect.signature(v) == inspect.signature(loss)


def test_keys_as_inputs_make_randomness_error_fine():
    keys = fd.random.split(fd.random.key(0), 5)
    out = fd.vmap(lambda k: fd.random.normal(k, (3,)))(keys)
    loop = torch.stack([fd.random.normal(k, (3,)) for k in keys])
    assert_close(out, loop)
    assert not torch.equal(out[0], out[1])


# ------------------------------------------------------------------ errors
def test_error_dim_the_tensordict_lacks_names_key_and_shape():
    td = make((4,))
    before = snapshot(td)
    with pytest.raises(
        ValueError,
        match=r"maps dim 1 of args\[0\]\['obs'\]\['pos'\] \(shape \[4, 2\]\).*batch_size \[4\]",
    ):
        fd.vmap(stat, in_dims=1)(td)
    with pytest.raises(
        ValueError, match=r"in_dims maps dim -2 of the TensorDict at args\[0\].*batch_size \[4\]"
    ):
        fd.vmap(stat, in_dims=-2)(td)
    unchanged(before, td)
    with pytest.raises(
        ValueError,
        match=r"dim -2 of the TensorDict at args\[0\]\['e'\], which has batch_size \[4\]",
    ):
        fd.vmap(stat, in_dims=({"x": 0, "obs": 0, "e": -2},))(td.set("e", fd.TensorDict({}, [4])))


def test_error_in_dims_tree_mismatch_names_key_path():
    box = fd.TensorDict({"params": fd.TensorDict({"w": torch.randn(3, 2)}, [3]), "td": make((4,))})
    with pytest.raises(
        ValueError, match=r"in_dims at args\[0\]\['params'\].*missing \['w'\].*unexpected \['v'\]"
    ):
        fd.vmap(lambda b: b, in_dims=({"params": {"v": 0}, "td": None},))(box)
    with pytest.raises(ValueError, match=r"in_dims at args\[0\] does not match.*missing \['td'\]"):
        fd.vmap(lambda b: b, in_dims=({"params": 0},))(box)
    with pytest.raises(ValueError, match=r"in_dims has 1 entries but .* 2 positional"):
        fd.vmap(lambda a, b: a, in_dims=(0,))(box, box)
    with pytest.raises(
        ValueError, match=r"in_dims at args\[1\] is \(0, 0\) \(2 entries\) but .* tuple of 3"
    ):
        fd.vmap(lambda a, b: a, in_dims=(None, (0, 0)))(box, (torch.zeros(2),) * 3)
    with pytest.raises(TypeError, match=r"args\[0\]\['td'\]\['x'\] is \{'a': 0\}"):
        fd.vmap(lambda b: b, in_dims=({"params": 0, "td": {"x": {"a": 0}, "obs": 0}},))(box)


def test_error_entries_of_one_tensordict_mapped_differently():
    td = make((4,))
    with pytest.raises(
        ValueError,
        match=r"entries of the TensorDict at args\[0\] .*mapped differently.*\['obs'\]\['pos'\] over dim 0 but args\[0\]\['x'\] over dim None",
    ):
        fd.vmap(stat, in_dims=({"x": None, "obs": 0},))(td)


def test_error_sizes_differ_names_both_paths():
    with pytest.raises(
        ValueError, match=r"args\[0\]\['obs'\]\['pos'\] has size 4 .* args\[1\] has size 3"
    ):
        fd.vmap(lambda t, y: t["x"] + y)(make((4,)), torch.zeros(3, 3))


def test_error_nothing_mapped_and_non_tensor_mapped():
    with pytest.raises(ValueError, match="maps no tensor"):
        fd.vmap(lambda t: t, in_dims=None)(make())
    with pytest.raises(TypeError, match=r"args\[1\] is a float, not a tensor.*in_dims=None"):
        fd.vmap(lambda t, s: t["x"] * s)(make(), 2.0)
    with pytest.raises(ValueError, match=r"dim 2 of args\[0\], a tensor of shape \[4, 3\]"):
        fd.vmap(torch.sin, in_dims=2)(torch.zeros(4, 3))


def test_error_out_dims_not_a_batch_dim():
    with pytest.raises(
        ValueError, match=r"out_dims 2 at output\[1\] is not a batch dim.*batch_size \[5\]"
    ):
        fd.vmap(lambda t: (t["x"], t), out_dims=(0, 2))(make())
    with pytest.raises(
        ValueError, match=r"different dims .* for the entries of a TensorDict output"
    ):
        fd.vmap(lambda t: t, out_dims={"x": 0, "obs": 1})(make())


def test_error_data_dependent_control_flow_is_rewritten():
    def f(x):
        return x if x.sum() > 0 else -x

    with pytest.raises(fd.TransformError, match=r"fd.vmap\(f\).*torch.where\(cond, a, b\)"):
        fd.vmap(f)(torch.randn(4, 3))
    with pytest.raises(fd.TransformError, match=r"fd.vmap\(<lambda>\).*torch.where"):
        fd.vmap(lambda x: x * x.sum().item())(torch.randn(4, 3))
    with pytest.raises(fd.TransformError, match=r"fd.vmap\(f\).*torch.where") as info:
        fd.vmap(fd.vmap(f))(torch.randn(2, 4, 3))  # translated once, not twice
    assert str(info.value).count("fd.vmap(") == 1


def test_error_global_rng_points_to_keys():
    with pytest.raises(fd.TransformError, match=r"fd.random.split\(key, n\)"):
        fd.vmap(lambda x: x + torch.randn(3))(torch.zeros(4, 3))


# ------------------------------------------------------------------ hypothesis
VMAP_TDS = tensordicts(
    batch_shape=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
    max_depth=2,
    min_keys=1,
    dtypes=(torch.float32, torch.float64),
)


def batch_aware(t):
    first = t.values(True, True)[0]
    z = torch.zeros(t.batch_size, dtype=first.dtype) + first.reshape(*t.batch_size, -1).sum(-1)
    return t.apply(lambda x: x * 2).set("zz", z)


@settings(max_examples=25)
@given(VMAP_TDS, st.data())
def test_random_in_dims_out_dims_equal_loop(td, data):
    k = td.batch_dims
    in_dim = data.draw(st.integers(-k, k - 1), label="in_dim")
    out_dim = data.draw(st.integers(-k, k - 1), label="out_dim")
    before = snapshot(td)
    out = fd.vmap(batch_aware, in_dims=in_dim, out_dims=out_dim)(td)
    d = in_dim % k
    loop = fd.stack(
        [batch_aware(td[along(d, i)]) for i in range(td.batch_size[d])], dim=out_dim % k
    )
    assert_close(out, loop, atol=1e-5, rtol=1e-5)
    unchanged(before, td)


@settings(max_examples=20)
@given(VMAP_TDS, VMAP_TDS, st.data())
def test_random_per_entry_in_dims_over_a_container(a, b, data):
    """Two TensorDicts with their own batch shapes in one []-batch container; map one of
    them (over a random batch dim of it) and keep the other fixed."""
    box = fd.TensorDict({"a": a, "b": b}, [])
    which = data.draw(st.sampled_from(["a", "b"]), label="mapped")
    m = box[which]
    dim = data.draw(st.integers(0, m.batch_dims - 1), label="dim")
    dims = {"a": None, "b": None, which: dim}

    def f(c):
        return c.set("s", batch_aware(c[which]))

    out = fd.vmap(f, in_dims=(dims,), out_dims={"a": None, "b": None, "s": 0, which: 0})(box)
    parts = [f(box.set(which, m[along(dim, i)])) for i in range(m.batch_size[dim])]
    assert_close(out["s"], fd.stack([p["s"] for p in parts]), atol=1e-5, rtol=1e-5)
    other = "b" if which == "a" else "a"
    assert_close(out[other], box[other])


# ------------------------------------------------------------------ compile
@pytest.mark.compile
def test_compile_fullgraph_of_fd_vmap_grad_and_out_dims():
    from torch._dynamo.utils import counters

    block = fd.Sequential(
        fd.Module(torch.nn.Linear(3, 8), ["x"], ["h"]), fd.Module(torch.tanh, ["h"], ["y"])
    )
    ens = fd.vmap(block.init)(fd.random.split(fd.random.key(0), 4))
    td = fd.TensorDict({"x": torch.randn(5, 3)}, [5])

    def loss(p, t):
        return block(p, t)["y"].pow(2).mean()

    for f, args in [
        (fd.vmap(block, in_dims=(0, None), out_dims=1), (ens, td)),
        (fd.vmap(fd.grad(loss), in_dims=(0, None)), (ens, td)),
    ]:
        torch._dynamo.reset()
        counters.clear()
        out = torch.compile(f, fullgraph=True, backend="eager")(*args)
        assert_close(out, f(*args))
        assert not counters["graph_break"]
        assert counters["stats"]["unique_graphs"] == 1


def test_none_arguments_are_leaves_that_are_never_mapped():
    """torch's pytree treats None as a leaf: fd.vmap must agree (a key=None slot in a
    training step is common)."""
    td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])

    def f(t, key, extra):
        assert key is None and extra[1] is None
        return t["x"].sum(-1) * extra[0]

    scale = torch.tensor(2.0)
    out = fd.vmap(f, in_dims=(0, None, None))(td, None, (scale, None))
    ref = torch.func.vmap(f, in_dims=(0, None, None))(td, None, (scale, None))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(out, td["x"].sum(-1) * 2)
    # an int in_dims broadcast over a tuple holding None maps the tensors only
    out2 = fd.vmap(lambda t, k: t["x"] + 1, in_dims=0)(td, None)
    torch.testing.assert_close(out2, td["x"] + 1)


# ------------------------------------------------------------------ the flatten
# fd.vmap flattens its arguments with optree: the leaves and structure torch.utils._pytree
# gives, each leaf with its in_dim
NT = collections.namedtuple("NT", "a b")


def trees():
    tensors = st.builds(lambda n: torch.zeros(2, n), st.integers(1, 3))
    leaves = st.one_of(tensors, st.none())

    def extend(children):
        tds = st.dictionaries(st.sampled_from("abc"), tensors, min_size=1).map(
            lambda d: fd.TensorDict(d, [2])
        )
        return st.one_of(
            st.lists(children, max_size=3),
            st.lists(children, max_size=3).map(tuple),
            st.dictionaries(st.sampled_from("xyz"), children, max_size=3),
            st.tuples(children, children).map(lambda t: NT(*t)),
            tds,
        )

    return st.recursive(leaves, extend, max_leaves=8)


@given(trees())
@example({"y": None, "x": torch.zeros(2)})  # dict keys out of sorted order
def test_in_leaves_equal_torch_pytree_and_map_every_tensor(tree):
    """The leaves are torch's pytree leaves, in optree's order (a dict's keys sorted,
    where torch keeps insertion order), each tensor mapped, and the treespec puts
    back torch's structure (insertion order included)."""
    leaves, ref = torch_pytree.tree_flatten((tree,))
    if not any(isinstance(x, torch.Tensor) for x in leaves):
        with pytest.raises(ValueError, match="maps no tensor"):
            in_leaves("f", (tree,), 0)
        return
    flat, dims, spec = in_leaves("f", (tree,), 0)
    assert sorted(map(id, flat)) == sorted(map(id, leaves))
    sorted_order = optree.tree_leaves((tree,), none_is_leaf=True, namespace="functd")
    assert all(a is b for a, b in zip(flat, sorted_order, strict=True))
    assert dims == tuple(None if x is None else 0 for x in flat)
    assert torch_pytree.tree_structure(spec.unflatten(flat)) == ref


def test_vmap_with_nested_in_dims_and_none_leaves():
    td = fd.TensorDict({"p": torch.randn(3, 2), "q": {"r": torch.randn(3, 4)}}, [3])
    data = {"u": torch.randn(5), "none": None, "w": [torch.randn(3, 5), None]}

    def f(t, d):
        assert d["none"] is None and d["w"][1] is None
        return t["p"].sum() + t["q", "r"].sum() + d["u"].sum() + d["w"][0].sum()

    out = fd.vmap(f, in_dims=({"p": 0, "q": 0}, {"u": None, "none": None, "w": [0, None]}))(
        td, data
    )
    expect = td["p"].sum(1) + td["q", "r"].sum(1) + data["u"].sum() + data["w"][0].sum(1)
    torch.testing.assert_close(out, expect)
    with pytest.raises(ValueError, match="mapped differently"):
        fd.vmap(f, in_dims=({"p": 0, "q": None}, None))(td, data)


def test_in_dims_broadcast_is_cached_by_structure_and_bounded():
    """The per-leaf dims come from optree's prefix broadcasting, cached by the (prefix,
    treespec) pair; the cache keeps at most MAX_CACHED structures and a dropped one is
    computed again."""
    from functd._transforms import _in_dims

    _in_dims._CACHE.clear()
    x = torch.randn(4, 3)
    n = _in_dims.MAX_CACHED + 5
    boxes = [
        fd.TensorDict({"a": fd.TensorDict({"x": x}, [4]), f"k{i}": torch.ones(2)}, [])
        for i in range(n)
    ]
    for i, box in enumerate(boxes + boxes[:2]):  # the first two were dropped: again
        out = fd.vmap(
            lambda b, k=f"k{i % n}": b["a"]["x"].sum() * b[k].sum(),
            in_dims=({"a": 0, f"k{i % n}": None},),
        )(box)
        torch.testing.assert_close(out, x.sum(-1) * 2)
        assert len(_in_dims._CACHE) <= _in_dims.MAX_CACHED
    f = fd.vmap(lambda b: b["a"]["x"], in_dims=({"a": 0, "k0": None},))
    f(boxes[0])
    size = len(_in_dims._CACHE)
    f(boxes[0])  # the same structure: a hit
    assert len(_in_dims._CACHE) == size


def test_none_outputs_come_back_as_none_as_in_jax():
    """torch.func.vmap refuses a None output; jax.vmap returns it (a loop's ys, an
    optional aux). The tensors beside it equal the per-element loop."""
    x = torch.randn(3, 2)
    out, none = fd.vmap(lambda v: (v * 2, None))(x)
    assert none is None and torch.equal(out, x * 2)
    assert fd.vmap(lambda v: None)(x) is None
    got = fd.vmap(lambda v: {"a": v.sum(), "b": None}, out_dims={"a": 0, "b": None})(x)
    assert got["b"] is None and torch.equal(got["a"], x.sum(1))
    carry, ys = fd.vmap(lambda v: fd.scan(lambda c, y: (c + y, None), 0.0, v))(x)
    assert ys is None and torch.allclose(carry, x.sum(1))
    td = fd.TensorDict({"x": x}, [3])
    back, none = fd.vmap(lambda t: (t.set("y", t["x"] + 1), None))(td)
    assert none is None and back.batch_size == (3,) and torch.equal(back["y"], x + 1)
