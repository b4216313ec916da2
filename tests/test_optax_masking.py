"""optax's tests of ``masked`` (optax/transforms/_masking_test.py) and of
``set_to_zero`` (optax/_src/base_test.py), translated to functd as a user would
write them: the params a TensorDict (optax's lists and tuples become entries
"0", "1"...), a mask a nested dict or a function ``(path, leaf) -> bool``; the
expected values are optax's.

optax's freeze and selective_transform tests (_freezing_test.py) are written as the
compositions those two are (masked + set_to_zero, multi_transform + set_to_zero).

Not translated: ``test_tree_map_params`` (functd's ``tree_map_params`` leaves
``masked`` states unmapped, and there are no ``MaskedNode`` placeholders: the inner
state holds the selected leaves only), ``test_mask_compatible_callable_pytree``
(equinox modules as masks; a functd mask is a dict or a function), the
``use_fn`` cases of ``test_tree_mismatch_fails`` (a functd mask function is
asked per leaf, so it has no tree to mismatch).
"""

import pytest
import torch

import functd as fd
from functd.testing import assert_close
from tests._support.optim_cases import optax_tree

optim = fd.optim


_td = optax_tree


def _mask_dict(d):
    """optax's mask tree with lists/tuples as "0", "1"... entries (bools kept)."""
    if isinstance(d, dict):
        return {k: _mask_dict(v) for k, v in d.items()}
    if isinstance(d, list | tuple):
        return {str(i): _mask_dict(v) for i, v in enumerate(d)}
    return d


def _mask_fn(mask):
    """The same mask as a function of the path (prefix entries cover their subtree)."""

    def fn(path, leaf):
        node = mask
        for part in path:
            if not isinstance(node, dict):
                break
            node = node[part]
        return node

    return fn


def _build_sgd():
    return optim.sgd(1.0)


def _build_stateful_sgd():
    # optax: sgd(1.0, momentum=0.0), whose trace is kept; functd drops the buffer of a
    # momentum that is the number 0, so the momentum is given as a tensor (kept)
    return optim.sgd(1.0, momentum=torch.tensor(0.0))


BUILDERS = {"sgd": _build_sgd, "stateful_sgd": _build_stateful_sgd}


def _map_masked(mask_fn, f, updates):
    paths = fd.tree.paths(updates)
    leaves = [f(x) if mask_fn(p, x) else x for p, x in zip(paths, fd.tree.leaves(updates))]
    return fd.tree.unflatten(fd.tree.structure(updates), leaves)


# ------------------------------------------------------------------ MaskedTest
@pytest.mark.parametrize("use_fn", [False, True])
@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_masked(builder, use_fn):
    mask = _mask_dict({"a": True, "b": [False, True], "c": {"d": True, "e": (False, True)}})
    params = _td({"a": 1.0, "b": [2.0, 3.0], "c": {"d": 4.0, "e": (5.0, 6.0)}})
    input_updates = params.apply(lambda x: x / 10.0)
    correct = _map_masked(_mask_fn(mask), torch.neg, input_updates)
    opt = optim.masked(BUILDERS[builder](), _mask_fn(mask) if use_fn else mask)
    state = opt.init(params)
    updates, state = opt.update(input_updates, state, params)
    assert_close(updates, correct)
    # repeated application, this time with no params
    updates, _ = opt.update(updates, state)
    assert_close(updates, _map_masked(_mask_fn(mask), torch.neg, correct))


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_prefix_mask(builder):
    mask = {"a": True, "b": False, "c": {"d": False, "e": True}}
    params = _td({"a": 1.0, "b": {"f": 2.0}, "c": {"d": 3.0, "e": ([4.0, 5.0], 6.0)}})
    input_updates = params.apply(lambda x: x / 10.0)
    correct = _td({"a": -0.1, "b": {"f": 0.2}, "c": {"d": 0.3, "e": ([-0.4, -0.5], -0.6)}})
    opt = optim.masked(BUILDERS[builder](), mask)
    state = opt.init(params)
    updates, state = opt.update(input_updates, state, params)
    assert_close(updates, correct)
    updates, _ = opt.update(updates, state)
    assert_close(updates, _td({"a": 0.1, "b": {"f": 0.2}, "c": {"d": 0.3, "e": ([0.4, 0.5], 0.6)}}))


def test_update_requires_params():
    wd = 0.1
    mask = _mask_dict({"a": True, "b": [False, True], "c": {"d": True, "e": (False, True)}})
    params = _td({"a": 1.0, "b": [2.0, 3.0], "c": {"d": 4.0, "e": (5.0, 6.0)}})
    input_updates = params.apply(lambda x: x / 10.0)
    keep = _mask_fn(mask)

    def decayed(u, p):
        return fd.tree.unflatten(
            fd.tree.structure(u),
            [
                x + wd * y if keep(path, x) else x
                for path, x, y in zip(fd.tree.paths(u), fd.tree.leaves(u), fd.tree.leaves(p))
            ],
        )

    opt = optim.masked(optim.add_decayed_weights(wd), mask)
    state = opt.init(params)
    updates, state = opt.update(input_updates, state, params)
    correct = decayed(input_updates, params)
    assert_close(updates, correct)
    params = optim.apply_updates(params, updates)
    # repeated application
    updates, _ = opt.update(correct, state, params)
    assert_close(updates, decayed(correct, params))
    assert_close(updates["a"], torch.tensor(0.1 + 0.1 * 1.0 + 0.1 * (1.0 + 0.2)))


def test_masked_empty():
    # optax's test_empty (list, tuple, dict): every empty container is an empty TensorDict
    empty = fd.TensorDict({}, [])
    opt = optim.masked(_build_sgd(), {})
    updates, state = opt.update(empty, opt.init(empty))
    assert not list(updates.keys())
    assert list(state["inner_state"].keys()) == ["count"]  # sgd's own state, nothing else


@pytest.mark.parametrize("extra_key_in_mask", [False, True])
def test_tree_mismatch_fails(extra_key_in_mask):
    mask = _mask_dict({"a": True, "b": [False, True], "c": {"d": True, "e": (False, True)}})
    params = _td({"a": 1.0, "b": [2.0, 3.0], "c": {"d": 4.0, "e": (5.0, 6.0)}})
    if extra_key_in_mask:
        mask["c"]["extra"] = True
        msg = r"fd.optim.masked.init: the mask names \('c', 'extra'\), which the params lack"
    else:
        # optax adds the int 7; functd refuses integer params on their own, so 7.0
        params = params.set(("c", "extra"), torch.tensor(7.0))
        msg = r"the mask has no entry for the params entry \('c', 'extra'\)"
    with pytest.raises(ValueError, match=msg):
        optim.masked(_build_sgd(), mask).init(params)


def test_mask_fn():
    params = fd.TensorDict(
        {"a": torch.ones(1, 2), "b": {"0": torch.ones(1), "1": torch.ones(1, 2, 3)}}, []
    )
    opt = optim.masked(optim.add_decayed_weights(0.1), lambda path, x: x.ndim > 1)
    grads = params.apply(lambda x: x * 2)
    updates, _ = opt.update(grads, opt.init(params), params)
    torch.testing.assert_close(updates["a"], grads["a"] + 0.1 * params["a"])
    torch.testing.assert_close(updates["b", "0"], grads["b", "0"])
    torch.testing.assert_close(updates["b", "1"], grads["b", "1"] + 0.1 * params["b", "1"])


def _linear_params():
    return fd.TensorDict(
        {
            "linear_1": {"w": torch.zeros(1, 1), "b": torch.zeros(1)},
            "linear_2": {"w": torch.zeros(1, 2), "b": torch.zeros(2)},
            "linear_3": {"w": torch.zeros(2, 3), "b": torch.zeros(3)},
        },
        [],
    )


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_nested_mask(builder):
    # optax#271: the inner mask covers the full tree, the outer one keeps the matrices
    params = _linear_params()
    outer_mask = lambda path, x: x.ndim > 1  # noqa: E731
    inner_mask = {k: {"w": True, "b": True} for k in ("linear_1", "linear_3")}
    inner_mask["linear_2"] = False
    inner = optim.masked(BUILDERS[builder](), inner_mask)
    opt = optim.masked(inner, outer_mask)
    input_updates = params.apply(torch.ones_like)
    correct = input_updates.set(("linear_1", "w"), -torch.ones(1, 1))
    correct = correct.set(("linear_3", "w"), -torch.ones(2, 3))
    state = opt.init(params)
    updates, _ = opt.update(input_updates, state, params)
    assert_close(updates, correct)


def test_masked_state_structure():
    params = fd.TensorDict(
        {
            "a": {"0": torch.ones(1), "1": {"0": torch.ones(2), "1": torch.ones(3)}},
            "b": {"c": torch.ones(4), "d": torch.ones(5)},
        },
        [],
    )
    mask = {"a": {"0": True, "1": {"0": True, "1": False}}, "b": False}
    state = optim.masked(_build_stateful_sgd(), mask).init(params)
    trace = state["inner_state", "momentum_buffer"]
    # optax keeps MaskedNode placeholders where functd leaves the entries out
    expected = fd.TensorDict({"a": {"0": torch.zeros(1), "1": {"0": torch.zeros(2)}}}, [])
    assert_close(trace, expected, rtol=0, atol=0)


# ------------------------------------------------------------------ base_test.py
def test_set_to_zero_returns_tree_of_correct_zero_arrays():
    grads = fd.TensorDict(
        {"0": {"a": torch.ones(3, 4), "b": torch.tensor(1.0)}, "1": torch.ones(1, 2, 3)}, []
    )
    opt = optim.set_to_zero()
    updates, _ = opt.update(grads, opt.init(grads))
    correct = fd.TensorDict(
        {"0": {"a": torch.zeros(3, 4), "b": torch.tensor(0.0)}, "1": torch.zeros(1, 2, 3)}, []
    )
    assert_close(updates, correct, rtol=0, atol=0)


def test_set_to_zero_is_stateless():
    # optax: init(params=None) is EmptyState(); a functd state is an empty TensorDict
    params = fd.TensorDict({"w": torch.ones(2)}, [])
    state = optim.set_to_zero().init(params)
    assert isinstance(state, fd.TensorDict) and not list(state.keys())


# ------------------------------------------------------------------ beyond optax's tests
def test_nested_mask_inside_multi_transform():
    # optax's partition masks each label's leaves: an inner full-tree mask works there too
    params = _linear_params()
    inner = optim.masked(
        _build_sgd(), {"linear_1": True, "linear_2": {"w": False, "b": True}, "linear_3": False}
    )
    opt = optim.multi_transform({"w": optim.scale(2.0), "b": inner}, lambda path, x: path[-1])
    ones = params.apply(torch.ones_like)
    updates, _ = opt.update(ones, opt.init(params), params)
    for i, (w, b) in {1: (2.0, -1.0), 2: (2.0, -1.0), 3: (2.0, 1.0)}.items():
        assert torch.all(updates[f"linear_{i}", "w"] == w)
        assert torch.all(updates[f"linear_{i}", "b"] == b)


def test_nested_mask_still_names_a_typo_and_a_missing_entry():
    params = _linear_params()
    typo = {"linear_1": True, "linear_2": False, "linear_3": True, "linear_4": True}
    with pytest.raises(ValueError, match=r"the mask names 'linear_4', which the params lack"):
        optim.masked(optim.masked(_build_sgd(), typo), lambda p, x: x.ndim > 1).init(params)
    short = {"linear_1": True, "linear_2": False}
    with pytest.raises(ValueError, match=r"no entry for the params entry \('linear_3', 'w'\)"):
        optim.masked(optim.masked(_build_sgd(), short), lambda p, x: x.ndim > 1).init(params)


# ------------------------------------------------------------------ _freezing_test.py
# optax.freeze(mask) is masked(set_to_zero(), mask) and optax.selective_transform(inner,
# freeze_mask) is partition({"train": inner, "freeze": set_to_zero()}, labels): functd
# has no separate names for them, so they are written as those compositions.
PARAMS_FLAT = {"w": [1.0, 2.0], "b": [3.0]}
GRAD_FLAT = {"w": [0.1, 0.2], "b": [0.3]}
PARAMS_NESTED = {"layer1": {"w": [[1.0, 2.0]], "b": [3.0]}, "layer2": {"w": [[4.0, 5.0]]}}
GRAD_NESTED = {"layer1": {"w": [[0.1, 0.2]], "b": [0.3]}, "layer2": {"w": [[0.4, 0.5]]}}


def _arrays(d):
    def conv(v):
        return {k: conv(x) for k, x in v.items()} if isinstance(v, dict) else torch.tensor(v)

    return fd.TensorDict(conv(d), [])


FREEZE_CASES = {
    "flat_partial": (
        PARAMS_FLAT, GRAD_FLAT, {"w": True, "b": False}, {"w": [0.0, 0.0], "b": [0.3]},
    ),
    "nested_partial": (
        PARAMS_NESTED, GRAD_NESTED, {"layer1": {"w": True, "b": False}, "layer2": {"w": False}},
        {"layer1": {"w": [[0.0, 0.0]], "b": [0.3]}, "layer2": {"w": [[0.4, 0.5]]}},
    ),
    "freeze_all": (
        PARAMS_NESTED, GRAD_NESTED, True,
        {"layer1": {"w": [[0.0, 0.0]], "b": [0.0]}, "layer2": {"w": [[0.0, 0.0]]}},
    ),
    "freeze_none": (PARAMS_NESTED, GRAD_NESTED, False, GRAD_NESTED),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(FREEZE_CASES))
def test_freeze_updates(case):
    params, grads, freeze_mask, expected = FREEZE_CASES[case]
    params, grads, expected = _arrays(params), _arrays(grads), _arrays(expected)
    optimizer = optim.masked(optim.set_to_zero(), freeze_mask)
    state = optimizer.init(params)
    updates, new_state = optimizer.update(grads, state, params)
    assert_close(updates, expected, rtol=0, atol=0)
    assert_close(new_state, state, rtol=0, atol=0)
    assert not list(state["inner_state"].keys())  # set_to_zero's empty state


def test_bad_structure_raises():
    opt = optim.masked(optim.set_to_zero(), {"layer1": {"w": True}})  # missing 'b'
    # optax raises at update; functd checks a dict mask's cover at init already
    with pytest.raises(ValueError, match=r"no entry for the params entry \('layer1', 'b'\)"):
        opt.update(_arrays(GRAD_NESTED), opt.init(_arrays(PARAMS_NESTED)), _arrays(PARAMS_NESTED))


SELECTIVE_CASES = {
    "flat_selective": (
        PARAMS_FLAT, GRAD_FLAT, {"w": True, "b": False}, {"w": [1.0, 2.0], "b": [2.7]},
    ),
    "nested_selective": (
        PARAMS_NESTED, GRAD_NESTED, {"layer1": {"w": True, "b": False}, "layer2": {"w": False}},
        {"layer1": {"w": [[1.0, 2.0]], "b": [2.7]}, "layer2": {"w": [[3.6, 4.5]]}},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SELECTIVE_CASES))
def test_selective_transform_effect(case):
    params, grads, mask, expected = SELECTIVE_CASES[case]
    params, grads, expected = _arrays(params), _arrays(grads), _arrays(expected)

    def label(path, leaf):
        node = mask
        for part in path:
            node = node[part] if isinstance(node, dict) else node
        return "freeze" if node else "train"

    optimizer = optim.multi_transform(
        {"train": optim.sgd(1.0), "freeze": optim.set_to_zero()}, label
    )
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    assert_close(optim.apply_updates(params, updates), expected, rtol=0, atol=1e-6)


@pytest.mark.compile
def test_nested_mask_init_compiles_fullgraph():
    torch._dynamo.reset()
    full = {f"linear_{i}": {"w": i != 2, "b": i != 2} for i in (1, 2, 3)}  # names the biases
    inner = optim.masked(_build_stateful_sgd(), full)
    opt = optim.masked(inner, lambda path, x: x.ndim > 1)
    params = _linear_params()
    compiled = torch.compile(opt.init, fullgraph=True, backend="eager")(params)
    assert_close(compiled, opt.init(params), rtol=0, atol=0)
