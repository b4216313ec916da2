"""The lean paths of TensorDict construction and fd.vmap's one-walk flatten give what
the general paths give: every construction error still raised, and fd.vmap's spec
and leaves equal torch.utils._pytree's."""

import collections

import pytest
import torch
import torch.utils._pytree as torch_pytree
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd._transforms._vmap import _walk

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
def test_one_walk_spec_and_leaves_equal_torch_pytree(tree):
    found = []
    spec = _walk("f", (tree,), None, (), found)
    leaves, ref = torch_pytree.tree_flatten((tree,))
    assert spec == ref
    assert len(found) == len(leaves) and all(a is b.value for a, b in zip(leaves, found))


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


# ------------------------------------------------------------------ the eager test
# functd._eager.plain gates every eager fast path (foreach optimizers, in-place PRNG,
# train_step's autograd.grad): True on plain tensors only, False under torch.func's
# levels (the reference: torch's own is_functorch_wrapped_tensor on the same values)
def test_plain_is_false_under_every_torch_func_level():
    from functd._eager import plain

    x = torch.zeros(3)
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    assert plain([x]) and plain([]) and plain([x, torch.nn.Parameter(x)])
    seen = []

    def probe(t):
        seen.append((plain([t]), plain([x, t]), wrapped(t)))
        return t.sum()

    torch.func.vmap(probe)(torch.zeros(2, 3))
    torch.func.grad(probe)(x)
    torch.func.jvp(probe, (x,), (x,))
    assert seen == [(False, False, True)] * 3


def test_plain_is_false_while_compiling():
    from functd._eager import plain

    @torch.compile(backend="eager", fullgraph=True)
    def f(t):
        return t + 1 if plain([t]) else t - 1

    assert f(torch.zeros(2)).tolist() == [-1.0, -1.0]  # traced: the general path
    assert plain([torch.zeros(2)])  # eager again afterwards
