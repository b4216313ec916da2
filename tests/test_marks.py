"""The params-check cache (``functd/_td/_marks.py``): the one slot of a TensorDict a
call may write, and nothing else a pure function is given changes."""

import torch
from torch import nn

import functd as fd
from functd._td import _marks
from functd._td._tree import flat_leaves, unflatten_like


def _slots(td: fd.TensorDict) -> dict:
    """Every slot but the cache, by identity, and the leaves by value, recursively."""
    out = {"bs": td._batch_size, "spec": td._spec, "keys": tuple(td._data)}
    for k, v in td._data.items():
        out[k] = _slots(v) if type(v) is fd.TensorDict else (v, v.clone())
    return out


def _same(before: dict, td: fd.TensorDict) -> None:
    assert before["bs"] is td._batch_size
    # the pytree spec is computed lazily once (a derived value, not the params check)
    assert before["spec"] is None or before["spec"] is td._spec
    assert before["keys"] == tuple(td._data)
    for k, v in td._data.items():
        if type(v) is fd.TensorDict:
            _same(before[k], v)
        else:
            obj, copy = before[k]
            assert obj is v and torch.equal(copy, v)


def test_a_pure_functions_input_changes_only_in_the_cache():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    params = fd.from_module(net)
    x = torch.randn(5, 3)
    before, text = _slots(params), repr(params)
    assert _marks.mark_of(params) is None
    fd.grad(lambda p: model(p, x=x).pow(2).mean())(params)
    _same(before, params)  # values, keys, batch size and spec: the same objects
    assert repr(params) == text
    assert _marks.mark_of(params) is not None  # only the cache was written
    assert _marks.is_checked(params, model.fn)


def test_the_cache_is_invisible_to_values_and_carried_by_rebuilds():
    lin = fd.Module(nn.Linear(3, 2), ["x"], ["y"])
    params = fd.from_module(lin)
    fresh = fd.from_module(lin)
    lin(params, fd.TensorDict({"x": torch.randn(2, 3)}, [2]))
    assert _marks.is_checked(params, lin.fn) and not _marks.is_checked(fresh, lin.fn)
    assert fd.tree.leaves(params) == fd.tree.leaves(params)  # (same objects)
    assert all(torch.equal(a, b) for a, b in zip(fd.tree.leaves(params), fd.tree.leaves(fresh)))
    # unflatten_like (the optimizers' and fd.grad's rebuild): same keys and shapes
    moved = unflatten_like(params, [t * 1 for t in flat_leaves(params)])
    assert _marks.is_checked(moved, lin.fn)
    _marks.mark(moved, None)
    assert _marks.mark_of(moved) is None and _marks.is_checked(params, lin.fn)
    assert not _marks.is_checked(None, lin.fn)
