"""Batch-dim operations: indexing, stack, cat, unbind, reshape, (un)squeeze, expand.

The reference for indexing is a tensor of the batch shape (for the new batch
size) and each leaf indexed on its batch dims (for the values); tensordict is a
second reference where it is installed. Bad input (mismatched keys, shapes or
batch sizes, indices past the batch dims) raises an error that names what failed, and
leaves its inputs unchanged.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd.testing import assert_close, batch_shapes, example_tensordicts, tensordicts
from tests._support.snapshot import Snapshot, unchanged_example


def make(bs=(4, 3)):
    g = torch.Generator().manual_seed(1)
    return fd.TensorDict(
        {
            "x": torch.randn(*bs, 2, generator=g),
            "s": torch.randn(*bs, generator=g),
            "obs": {"pos": torch.randn(*bs, 5, generator=g)},
        },
        list(bs),
    )


def expand_ellipsis(idx, n):
    """The index with ``...`` spelled out over the ``n`` batch dims only."""
    items = list(idx) if isinstance(idx, tuple) else [idx]
    used = sum(
        (it.ndim if it.dtype == torch.bool else 1) if isinstance(it, torch.Tensor) else 1
        for it in items
        if it is not None and it is not Ellipsis
    )
    if Ellipsis in items:
        i = next(j for j, it in enumerate(items) if it is Ellipsis)
        items[i : i + 1] = [slice(None)] * (n - used)
    return tuple(items)


def check_index(td, idx):
    out = td[idx]
    expected_bs = torch.empty(td.batch_size)[idx].shape
    assert out.batch_size == expected_bs, idx
    full = expand_ellipsis(idx, td.batch_dims)
    for k, v in td.items(include_nested=True):
        if isinstance(v, fd.TensorDict):
            assert out[k].batch_size[: len(expected_bs)] == expected_bs
        else:
            assert torch.equal(out[k], v[full]), (idx, k)
    return out


MASK = torch.tensor([True, False, True, True])
INDICES = [
    0,
    -1,
    slice(1, 3),
    slice(None, None, 2),
    slice(None),
    None,
    ...,
    (1, 2),
    (slice(1, 3), -1),
    (None, 0),
    (0, None),
    (..., 0),
    (..., None),
    (None, ..., None),
    (0, ...),
    MASK,
    (MASK, 1),
    (slice(None), torch.tensor([True, False, True])),
    torch.tensor([[True, False, True]] * 4),
    torch.tensor([3, 0, 0]),
    torch.tensor([[0, 1], [2, 3]]),
    (torch.tensor([0, 2]), torch.tensor([1, 1])),
    (slice(None), torch.tensor([2, 0])),
    [0, 2],
    (0, torch.tensor([2, 1])),
    (torch.tensor([1]), slice(None), None),
]


@pytest.mark.parametrize("idx", INDICES, ids=[str(i)[:40] for i in range(len(INDICES))])
def test_index_matches_tensor_indexing(idx):
    td = make()
    out = check_index(td, idx)
    assert td.batch_size == torch.Size([4, 3])  # input unchanged
    assert out["obs"].batch_size == out.batch_size


@pytest.mark.parametrize("idx", INDICES, ids=[str(i)[:40] for i in range(len(INDICES))])
def test_index_agrees_with_tensordict(idx):
    tensordict = pytest.importorskip("tensordict")
    td = make()
    ref = tensordict.TensorDict(td.to_dict(), batch_size=td.batch_size)[idx]
    out = td[idx]
    assert out.batch_size == ref.batch_size
    for k in out.keys(True, True):
        assert torch.equal(out[k], ref[k]), k


def test_index_scalar_batch():
    td = fd.TensorDict({"x": torch.zeros(3)}, [])
    assert td[None].batch_size == torch.Size([1])
    assert td[None]["x"].shape == (1, 3)
    assert td[...].batch_size == torch.Size([])


def test_index_nested_longer_batch():
    td = example_tensordicts()["longer_child"]  # [3] with a child of [3, 2]
    out = td[1:]
    assert out.batch_size == torch.Size([2])
    assert out["c"].batch_size == torch.Size([2, 2])
    assert torch.equal(out["c", "y"], td["c", "y"][1:])
    assert td[None]["c"].batch_size == torch.Size([1, 3, 2])


def test_index_empty_tensordict():
    td = fd.TensorDict({}, [4, 3])
    assert td[1:3].batch_size == torch.Size([2, 3])
    assert td[MASK].batch_size == torch.Size([3, 3])
    assert td[..., None, 0].batch_size == torch.Size([4, 1])


def test_index_shares_storage_for_basic_indexing():
    td = make()
    assert td[1:3]["x"].data_ptr() == td["x"][1:3].data_ptr()


@st.composite
def batch_and_index(draw):
    bs = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
    n = len(bs)
    k = draw(st.integers(0, n))  # number of dims the index uses
    ellipsis = k < n and draw(st.booleans())
    split = draw(st.integers(0, k)) if ellipsis else k  # items before the ellipsis
    dims = list(range(split)) + list(range(n - (k - split), n))
    items = []
    used_tensor = False
    for d in dims:
        size = bs[d]
        kind = draw(st.sampled_from(["int", "slice", "mask", "tensor"]))
        if kind in ("mask", "tensor") and used_tensor:
            kind = "slice"
        if kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            start = draw(st.none() | st.integers(-size, size))
            stop = draw(st.none() | st.integers(-size, size))
            step = draw(st.none() | st.integers(1, 3))
            items.append(slice(start, stop, step))
        elif kind == "mask":
            used_tensor = True
            items.append(torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size))))
        else:
            used_tensor = True
            idx = draw(st.lists(st.integers(-size, size - 1), min_size=1, max_size=4))
            items.append(torch.tensor(idx))
    if ellipsis:
        items.insert(split, Ellipsis)
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    if not items:  # td[()] is an (empty) key, not a batch index
        return bs, Ellipsis
    idx = tuple(items) if len(items) != 1 or draw(st.booleans()) else items[0]
    return bs, idx


@given(batch_and_index())
def test_index_property(case):
    bs, idx = case
    check_index(make(bs), idx)


# ------------------------------------------------------------------ stack / cat / unbind
def test_stack_and_cat_shapes():
    td = make()
    assert fd.stack([td, td]).batch_size == torch.Size([2, 4, 3])
    assert fd.stack([td, td, td], dim=1).batch_size == torch.Size([4, 3, 3])
    assert fd.stack([td, td], dim=-1).batch_size == torch.Size([4, 3, 2])
    assert fd.cat([td, td]).batch_size == torch.Size([8, 3])
    assert fd.cat([td, td], dim=-1).batch_size == torch.Size([4, 6])
    s = fd.stack([td, td], dim=2)
    assert s["obs"].batch_size == torch.Size([4, 3, 2])
    assert s["obs", "pos"].shape == (4, 3, 2, 5)
    assert torch.equal(s["x"], torch.stack([td["x"], td["x"]], 2))


def test_cat_values():
    a, b = make(), make().apply(lambda x: x + 1)
    c = fd.cat([a, b], dim=1)
    assert torch.equal(c["obs", "pos"], torch.cat([a["obs", "pos"], b["obs", "pos"]], 1))
    assert_close(c[:, :3], a)
    assert_close(c[:, 3:], b)
    small = a[:, :1]
    assert fd.cat([a, small], dim=1).batch_size == torch.Size([4, 4])


def test_stack_cat_agree_with_tensordict():
    tensordict = pytest.importorskip("tensordict")
    td = make()
    ref = tensordict.TensorDict(td.to_dict(), batch_size=td.batch_size)
    for dim in (0, 1, 2, -1):
        s, rs = fd.stack([td, td], dim), torch.stack([ref, ref], dim)
        assert s.batch_size == rs.batch_size
        assert torch.equal(s["obs", "pos"], rs["obs", "pos"])
    for dim in (0, 1, -1):
        c, rc = fd.cat([td, td], dim), torch.cat([ref, ref], dim)
        assert c.batch_size == rc.batch_size
        assert torch.equal(c["x"], rc["x"])


def test_unbind():
    td = make()
    parts = fd.unbind(td)
    assert len(parts) == 4
    assert all(p.batch_size == torch.Size([3]) for p in parts)
    assert_close(parts[2], td[2])
    parts1 = td.unbind(1)
    assert len(parts1) == 3 and parts1[0].batch_size == torch.Size([4])
    assert_close(fd.stack(list(parts1), 1), td)
    assert_close(fd.stack(list(td.unbind(-1)), -1), td)


def test_stack_keeps_inputs():
    a, b = make(), make()
    ids = [id(v) for v in a.values(True, True)]
    fd.stack([a, b])
    fd.cat([a, b])
    assert [id(v) for v in a.values(True, True)] == ids
    assert a.batch_size == torch.Size([4, 3])


@given(
    tensordicts(batch_shape=batch_shapes(max_dims=2), max_depth=2),
    st.integers(1, 3),
    st.data(),
)
def test_stack_then_index_gives_back_parts(td, n, data):
    parts = [td.apply(lambda x, i=i: x + i) for i in range(n)]
    dim = data.draw(st.integers(0, td.batch_dims))
    stacked = fd.stack(parts, dim)
    assert stacked.batch_size == torch.Size((*td.batch_size[:dim], n, *td.batch_size[dim:]))
    lead = (slice(None),) * dim
    for i, p in enumerate(parts):
        assert_close(stacked[(*lead, i)], p)
    for got, p in zip(fd.unbind(stacked, dim), parts):
        assert_close(got, p)


NONEMPTY_SHAPES = st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple)


@given(tensordicts(batch_shape=NONEMPTY_SHAPES, max_depth=2), st.data())
def test_cat_then_slice_gives_back_parts(td, data):
    dim = data.draw(st.integers(0, td.batch_dims - 1))
    other = td.apply(lambda x: x * 2)
    out = fd.cat([td, other], dim)
    size = td.batch_size[dim]
    lead = (slice(None),) * dim
    assert_close(out[(*lead, slice(0, size))], td)
    assert_close(out[(*lead, slice(size, None))], other)


# ------------------------------------------------------------------ reshape & co
def test_reshape():
    td = make()
    r = td.reshape(12)
    assert r.batch_size == torch.Size([12])
    assert r["obs", "pos"].shape == (12, 5)
    assert torch.equal(r["x"], td["x"].reshape(12, 2))
    assert td.reshape(2, -1).batch_size == torch.Size([2, 6])
    assert td.reshape((3, 4)).batch_size == torch.Size([3, 4])
    assert td.reshape(-1, 1, 2).batch_size == torch.Size([6, 1, 2])
    assert_close(r.reshape(4, 3), td)
    assert td.batch_size == torch.Size([4, 3])


def test_unsqueeze_squeeze():
    td = make()
    for dim, bs in [
        (0, [1, 4, 3]),
        (1, [4, 1, 3]),
        (2, [4, 3, 1]),
        (-1, [4, 3, 1]),
        (-3, [1, 4, 3]),
    ]:
        u = td.unsqueeze(dim)
        assert u.batch_size == torch.Size(bs), dim
        assert u["x"].shape == (*bs, 2)
        assert u.batch_size == torch.empty(4, 3).unsqueeze(dim).shape
        assert_close(u.squeeze(), td)
        assert_close(u.squeeze(dim), td)
    assert td.squeeze(0) is td or td.squeeze(0).batch_size == td.batch_size
    one = fd.TensorDict({"x": torch.zeros(1, 3, 1, 2)}, [1, 3, 1])
    assert one.squeeze().batch_size == torch.Size([3])
    assert one.squeeze().get("x").shape == (3, 2)
    assert one.squeeze(2).batch_size == torch.Size([1, 3])
    assert one.squeeze(-1)["x"].shape == (1, 3, 2)


def test_expand():
    td = make((1, 3))
    e = td.expand(2, 4, 3)
    assert e.batch_size == torch.Size([2, 4, 3])
    assert e["obs", "pos"].shape == (2, 4, 3, 5)
    assert torch.equal(e["x"][1, 2], td["x"][0])
    assert e["x"].data_ptr() == td["x"].data_ptr()  # no copy
    assert td.expand(-1, 3).batch_size == torch.Size([1, 3])
    assert td.expand((5, 3)).batch_size == torch.Size([5, 3])


@given(tensordicts(batch_shape=batch_shapes(max_dims=3), max_depth=2))
def test_reshape_flat_round_trip(td):
    flat = td.reshape(-1)
    assert flat.batch_size == torch.Size([td.numel()])
    assert_close(flat.reshape(td.batch_size), td)


def test_shape_and_repr_sit_below_the_class():
    # issue 14, circle B: the shape ops and the repr reach TensorDict through the
    # instances they are given; the container imports them, never the reverse
    from test_layers import GRAPH, cycles

    td_room = {m: {d for d in deps if d.startswith("functd._td")} for m, deps in GRAPH.items()}
    td_room = {m: d for m, d in td_room.items() if m.startswith("functd._td")}
    assert cycles(td_room) == []
    assert "functd._td._tensordict" not in GRAPH["functd._td._shape"]
    assert "functd._td._tensordict" not in GRAPH["functd._td._repr"]
    assert "functd._td._shape" in GRAPH["functd._td._tensordict"]


def test_stack_and_cat_reject_a_foreign_tensordict_like():
    # the type test of stack/cat/unstack knows a functd TensorDict by its class, not by
    # duck-typed attributes: an object with _batch_size and _data is still refused
    class Lookalike:
        _batch_size = torch.Size([2])
        _data = ()

    td = make((2,))
    for f in (fd.stack, fd.cat):
        with pytest.raises(TypeError, match="element 1 is a Lookalike, not a TensorDict"):
            f([td, Lookalike()])
    with pytest.raises(TypeError, match="unstack takes a TensorDict"):
        fd.unstack(Lookalike())


# ---------------------------------------------------------------- nested extra batch dims
def deep():
    """Batch [2, 3]; 'n' has batch [2, 3, 4] and 'n','m' has [2, 3, 4, 5]; one empty level."""
    g = torch.Generator().manual_seed(2)
    m = fd.TensorDict({"c": torch.randn(2, 3, 4, 5, 1, generator=g)}, [2, 3, 4, 5])
    n = fd.TensorDict({"b": torch.randn(2, 3, 4, 6, generator=g), "m": m,
                       "e": fd.TensorDict({}, [2, 3, 4, 7])}, [2, 3, 4])  # fmt: skip
    return fd.TensorDict({"a": torch.randn(2, 3, generator=g), "n": n}, [2, 3])


@pytest.mark.parametrize(
    ("op", "leaf"),
    [
        (lambda t: t.reshape(6), lambda x: x.reshape(6, *x.shape[2:])),
        (lambda t: t.reshape(3, -1), lambda x: x.reshape(3, 2, *x.shape[2:])),
        (lambda t: t.expand(7, 2, 3), lambda x: x.expand(7, *x.shape)),
        (lambda t: t.unsqueeze(1), lambda x: x.unsqueeze(1)),
        (lambda t: t.unsqueeze(-1), lambda x: x.unsqueeze(2)),
        (lambda t: t[1], lambda x: x[1]),
        (lambda t: t[:, [2, 0]], lambda x: x[:, [2, 0]]),
        (lambda t: t[..., None], lambda x: x[:, :, None]),
    ],
)
def test_shape_ops_keep_the_extra_batch_dims_of_nested_levels(op, leaf):
    td = deep()
    out = op(td)
    n0 = td.batch_dims
    for k, v in td.items(include_nested=True):  # every level: its new batch + its own extras
        if isinstance(v, fd.TensorDict):
            extra = v.batch_size[n0:]
            assert out[k].batch_size == (*out.batch_size, *extra), k
        else:
            assert torch.equal(out[k], leaf(v)), k
    assert out["n", "e"].batch_size == (*out.batch_size, 4, 7)  # the empty level too


def test_squeeze_and_unbind_of_nested_extra_batch_dims():
    td = deep().unsqueeze(0)
    out = td.squeeze()
    assert out.batch_size == (2, 3) and out["n", "m"].batch_size == (2, 3, 4, 5)
    assert_close(out, deep())
    parts = td.unbind(2)
    assert len(parts) == 3 and parts[1]["n", "m"].batch_size == (1, 2, 4, 5)
    assert torch.equal(parts[1]["n", "m", "c"], td["n", "m", "c"][:, :, 1])


def test_index_errors_are_functd_errors():
    td = make((4, 3))
    with pytest.raises(IndexError, match=r"index 4: 4 is out of range for batch dim 0 of size 4"):
        td[4]
    with pytest.raises(IndexError, match=r"-4 is out of range for batch dim 1 of size 3 .*-3 to 2"):
        td[:, -4]
    with pytest.raises(
        IndexError, match=r"a bool mask of shape \[3\] on batch dims 0.. of sizes \[4\]"
    ):
        td[torch.tensor([True, False, True])]
    with pytest.raises(
        IndexError, match=r"TensorDict index tensor\(\[5\]\) on batch_size \[4, 3\]: "
    ):
        td[torch.tensor([5])]  # a value out of range: torch's reason, in functd's error
    with pytest.raises(TypeError, match=r"an index tensor must hold integers or be a bool mask"):
        td[torch.tensor([0.0])]
    assert td[[]].batch_size == (0, 3)  # an empty list indexes nothing, as for a tensor


def test_rename_to_itself_keeps_the_order():
    td = make()
    assert td.rename({"x": "x"}).keys() == td.keys()
    assert td.rename({"x": "y"}).keys() == ("s", "obs", "y")  # a new name goes last


@pytest.fixture
def td():
    """A nested TensorDict the test must leave unchanged (checked at teardown)."""
    yield from unchanged_example()


# ------------------------------------------------------------------ stack / cat errors
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


# ------------------------------------------------------------------ indexing and reshape errors
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
