"""``TensorDict.get_tensor``/``get_tensordict``: ``td[key]`` typed ``Tensor`` or
``TensorDict`` (the typed accessors of issue 39); the other kind of entry is a TypeError
that names the key and the accessor to use."""

from __future__ import annotations

import pytest
import torch

import functd as fd


def _td() -> fd.TensorDict:
    return fd.TensorDict(
        {"x": torch.arange(6.0).reshape(3, 2), "obs": {"pos": torch.ones(3, 4)}}, [3]
    )


def test_get_tensor_returns_the_leaf_itself():
    td = _td()
    assert td.get_tensor("x") is td["x"]
    assert td.get_tensor(("obs", "pos")) is td["obs"]["pos"]
    assert td.get_tensor(("x",)) is td["x"]


def test_get_tensor_of_a_nested_tensordict_names_the_key_and_a_leaf():
    td = _td()
    with pytest.raises(TypeError, match=r"get_tensor\('obs'\).*nested TensorDict.*'pos'"):
        td.get_tensor("obs")
    with pytest.raises(TypeError, match=r"e\.g\. \('obs', 'pos'\).*get_tensordict\(\('obs',\)\)"):
        td.get_tensor(("obs",))


def test_get_tensordict_returns_the_nested_tensordict_itself():
    td = _td()
    assert td.get_tensordict("obs") is td["obs"]
    assert td.get_tensordict(("obs",)) is td["obs"]
    assert td.get_tensordict("obs").batch_size == (3,)


def test_get_tensordict_of_a_tensor_names_the_key_its_shape_and_get_tensor():
    td = _td()
    with pytest.raises(
        TypeError, match=r"get_tensordict\('x'\).*tensor of shape \[3, 2\].*get_tensor\('x'\)"
    ):
        td.get_tensordict("x")
    with pytest.raises(TypeError, match=r"get_tensordict\(\('obs', 'pos'\)\).*\[3, 4\]"):
        td.get_tensordict(("obs", "pos"))
    with pytest.raises(KeyError, match="has no key 'y'"):
        td.get_tensordict("y")


def test_get_tensor_of_a_missing_key_is_the_getitem_key_error():
    td = _td()
    with pytest.raises(KeyError, match="has no key 'y'") as info:
        td.get_tensor("y")
    with pytest.raises(KeyError) as plain:
        td["y"]
    assert str(info.value) == str(plain.value)


def test_get_tensor_leaves_the_tensordict_unchanged():
    td = _td()
    before = {k: v.clone() for k, v in td.items(True, True)}
    td.get_tensor("x")
    with pytest.raises(TypeError):
        td.get_tensor("obs")
    assert td.keys(True, True) == tuple(before)
    for k, v in before.items():
        assert torch.equal(td[k], v)


def test_get_tensor_in_a_loss_gives_getitems_gradient():
    params = fd.TensorDict({"w": torch.tensor([1.0, -2.0])}, [])

    def loss(p: fd.TensorDict) -> torch.Tensor:
        return (p.get_tensor("w") ** 2).sum()

    def loss_ref(p: fd.TensorDict) -> torch.Tensor:
        return (p["w"] ** 2).sum()

    g = fd.grad(loss)(params)
    assert torch.equal(g["w"], fd.grad(loss_ref)(params)["w"])
    assert torch.equal(g["w"], torch.tensor([2.0, -4.0]))
