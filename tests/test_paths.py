"""The one key-path formatter of the transforms' messages (functd._transforms._paths):
torch's own ``keystr`` is the reference for torch key paths."""

import re

import pytest
import torch
import torch.utils._pytree as torch_pytree
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd._transforms._paths import fmt_call_path, fmt_path

KEYS = st.text(alphabet="ab'\"x_ ", min_size=1, max_size=4)
TREES = st.recursive(
    st.just(torch.zeros(())),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(tuple),
        st.dictionaries(KEYS, inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


@given(TREES)
def test_torch_key_paths_format_as_keystr(tree):
    pairs, _ = torch_pytree.tree_flatten_with_path(tree)
    for path, _ in pairs:
        assert fmt_path(path, "out") == "out" + torch_pytree.keystr(path)


@given(st.lists(st.one_of(KEYS, st.integers(0, 9)), max_size=4))
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
