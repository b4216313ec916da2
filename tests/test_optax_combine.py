"""optax's tests of ``chain``, ``partition`` (functd's ``multi_transform``) and
``named_chain`` (optax/transforms/_combining_test.py) and of ``apply_updates``
(optax/_src/update_test.py), translated to functd as a user would write them:
TensorDict params (optax's tuples become entries "0", "1"...), optax's expected
values.

Not translated (see the report of issue 38): the ``ExtraArgsTest`` cases and
``PartitionTest.test_extra_args`` (functd's ``update`` takes ``(updates, state,
params)`` only: no extra keyword arguments); ``test_none_argument`` (params are
a TensorDict, ``None`` is refused with a TypeError); ``test_incremental_update``
and ``test_periodic_update`` are in tests/test_optim_combinators.py already.
"""

import pytest
import torch

import functd as fd
from functd.testing import assert_close
from tests._support.optim_cases import optax_tree

optim = fd.optim
STEPS = 50
LR = 1e-2


_td = optax_tree


# ------------------------------------------------------------------ CombiningTest
def test_chain():
    init_params = fd.TensorDict({"0": torch.tensor([1.0, 2.0]), "1": torch.tensor([3.0, 4.0])}, [])
    per_step_updates = fd.TensorDict(
        {"0": torch.tensor([500.0, 5.0]), "1": torch.tensor([300.0, 3.0])}, []
    )
    transformations = [
        optim.scale_by_adam(),
        optim.trace(momentum=0.0, nesterov=False),
        optim.scale(-LR),
    ]
    chained = optim.chain(*transformations)
    chain_params, state = init_params, chained.init(init_params)
    assert isinstance(state, fd.TensorDict)
    for _ in range(STEPS):
        updates, state = chained.update(per_step_updates, state)
        assert isinstance(state, fd.TensorDict)
        chain_params = optim.apply_updates(chain_params, updates)
    # manually apply the sequence of transformations
    manual_params = init_params
    states = [t.init(manual_params) for t in transformations]
    for _ in range(STEPS):
        updates, new_states = per_step_updates, []
        for t, s in zip(transformations, states):
            updates, s = t.update(updates, s)
            new_states.append(s)
        manual_params, states = optim.apply_updates(manual_params, updates), new_states
    assert_close(manual_params, chain_params, rtol=1e-4, atol=0)
    # and the chain is Adam: torch.optim.Adam on the same gradients
    ps = [init_params[k].clone().requires_grad_() for k in ("0", "1")]
    adam = torch.optim.Adam(ps, lr=LR)
    for _ in range(STEPS):
        for p, k in zip(ps, ("0", "1")):
            p.grad = per_step_updates[k].clone()
        adam.step()
    assert_close(
        chain_params, fd.TensorDict({"0": ps[0], "1": ps[1]}, []).detach(), rtol=1e-5, atol=1e-6
    )


# ------------------------------------------------------------------ PartitionTest
@pytest.mark.parametrize("use_fn", [True, False])
def test_partition(use_fn):
    params = _td({"a1": 1.0, "b1": 2.0, "z1": {"a2": 3.0, "z2": {"c1": 4.0}}})
    input_updates = params.apply(lambda x: x / 10.0)
    tx_dict = {
        "a": optim.scale(-1.0),
        # optax's ema(0.0) (stateful, returns its input); a tensor momentum keeps a buffer
        "b": optim.trace(momentum=torch.tensor(0.0)),
        "c": optim.scale(2.0),
    }
    labels = {"a1": "a", "b1": "b", "z1": {"a2": "a", "z2": {"c1": "c"}}}
    param_labels = (lambda path, x: path[-1][0]) if use_fn else labels
    tx = optim.multi_transform(tx_dict, param_labels)
    state = tx.init(params)
    updates, state = tx.update(input_updates, state, params)
    correct = _td({"a1": -0.1, "b1": 0.2, "z1": {"a2": -0.3, "z2": {"c1": 0.8}}})
    assert_close(updates, correct)
    # repeated application, this time with no params
    updates, _ = tx.update(updates, state)
    assert_close(updates, _td({"a1": 0.1, "b1": 0.2, "z1": {"a2": 0.3, "z2": {"c1": 1.6}}}))


def test_multi_transform_empty():
    # optax's test_empty (list, tuple, dict): every empty container is an empty TensorDict
    empty = fd.TensorDict({}, [])
    tx = optim.multi_transform({0: optim.sgd(1.0)}, lambda path, x: 0)
    updates, _ = tx.update(empty, tx.init(empty))
    assert_close(updates, empty)


@pytest.mark.parametrize("use_fn", [False, True])
@pytest.mark.parametrize("use_extra_label", [False, True])
def test_labels_mismatch(use_extra_label, use_fn):
    params = _td({"a": 1.0, "b": [2.0, 3.0], "c": {"d": 4.0, "e": (5.0, 6.0)}})
    label_tree = {"a": 0, "b": {"0": 1, "1": 0}, "c": 1}  # a prefix of the params
    if use_extra_label:
        label_tree["a"] = 3
    transforms = {
        0: optim.sgd(1.0),
        1: optim.adam(1.0, b1=0.0, b2=0.0),
        2: optim.trace(1.0),  # no leaf carries label 2
    }

    def label_fn(path, x):
        node = label_tree
        for part in path:
            if not isinstance(node, dict):
                break
            node = node[part]
        return node

    tx = optim.multi_transform(transforms, label_fn if use_fn else label_tree)
    if use_extra_label:
        with pytest.raises(ValueError, match=r"'a' has the label 3, which has no transformation"):
            tx.init(params)
    else:
        state = tx.init(params)
        updates, state = tx.update(params.apply(lambda x: x / 10.0), state)
        # sgd(1.0): -u; adam(1.0, b1=b2=0) at step 1: -sign(u) (up to eps)
        expected = _td({"a": -0.1, "b": [-1.0, -0.3], "c": {"d": -1.0, "e": (-1.0, -1.0)}})
        assert_close(updates, expected, rtol=1e-6, atol=1e-6)
        assert not list(state["2", "momentum_buffer"].keys())


# ------------------------------------------------------------------ NamedChainTest
def test_named_chain():
    # optax chains scale(0.1) with scale_by_loss() and passes loss=0.1 (an extra
    # argument, which functd's update does not take); scale(1 / 0.1) is that step
    tx = optim.named_chain(("scale", optim.scale(0.1)), ("scale_loss", optim.scale(1 / 0.1)))
    params = fd.TensorDict({"a": torch.ones(4)}, [])
    grads = params
    opt_state = tx.init(params)
    updates, new_state = tx.update(grads, opt_state, params)
    assert_close(updates, fd.TensorDict({"a": torch.ones(4)}, []))
    assert tuple(new_state.keys()) == ("scale", "scale_loss")  # optax's docstring example


# ------------------------------------------------------------------ UpdateTest
def test_apply_updates():
    params = fd.TensorDict({"0": {"a": torch.ones(3, 2)}, "1": torch.ones(1)}, [])
    grads = params.apply(lambda t: 2 * t)
    new_params = optim.apply_updates(params, grads)
    assert_close(new_params, params.apply(lambda t: 3 * t), atol=1e-10, rtol=1e-5)


def test_apply_updates_mixed_precision():
    bf16 = torch.bfloat16
    params = fd.TensorDict(
        {"0": {"a": torch.ones(3, 2, dtype=bf16)}, "1": torch.ones(1, dtype=bf16)}, []
    )
    grads = params.apply(lambda t: (2 * t).float())
    new_params = optim.apply_updates(params, grads)
    assert all(leaf.dtype == bf16 for leaf in fd.tree.leaves(new_params))


# ------------------------------------------------------------------ named_chain beyond optax
def test_named_chain_state_is_keyed_by_name_and_steps_as_chain():
    g = torch.Generator().manual_seed(0)
    params = fd.TensorDict(
        {"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)}, []
    )
    parts = (("clip", optim.clip_by_global_norm(0.5)), ("adam", optim.adam(1e-2)))
    named, chained = optim.named_chain(*parts), optim.chain(*(tx for _, tx in parts))
    ns, cs = named.init(params), chained.init(params)
    for i in range(1, 4):
        grads = params.apply(lambda x, i=i: torch.cos(x * i))
        nu, ns = named.update(grads, ns, params)
        cu, cs = chained.update(grads, cs, params)
        assert_close(nu, cu, rtol=0, atol=0)
    assert list(ns.keys()) == ["clip", "adam"]
    assert_close(ns["adam"], cs["1"], rtol=0, atol=0)
    assert int(ns["adam", "count"]) == 3


def test_named_chain_is_a_value_and_keeps_nested_chains_whole():
    a = optim.named_chain(("s", optim.scale(2.0)), ("inner", optim.chain()))
    assert a == optim.named_chain(("s", optim.scale(2.0)), ("inner", optim.chain()))
    assert repr(a) == "named_chain(('s', scale(step_size=2.0)), ('inner', identity()))"
    params = fd.TensorDict({"w": torch.ones(2)}, [])
    assert list(a.init(params).keys()) == ["s", "inner"]  # identity keeps its entry
    assert optim.chain(a, optim.scale(3.0)).txs[0] is a


def test_named_chain_errors_name_the_argument():
    sgd = optim.sgd(0.1)
    with pytest.raises(ValueError, match=r"named_chain: the names must be unique .* 'x' is given"):
        optim.named_chain(("x", sgd), ("x", optim.scale(1.0)))
    with pytest.raises(
        TypeError, match=r"named_chain: argument 1 is a GradientTransformation, not"
    ):
        optim.named_chain(("x", sgd), sgd)
    with pytest.raises(TypeError, match=r"named_chain: the name of argument 0 is 3; names must be"):
        optim.named_chain((3, sgd))
    with pytest.raises(TypeError, match=r"the transformation named 'x' is a function, not"):
        optim.named_chain(("x", optim.adam))
    state = optim.named_chain(("x", sgd)).init(fd.TensorDict({"w": torch.ones(1)}, []))
    with pytest.raises(ValueError, match=r"fd.optim.named_chain.update"):
        optim.named_chain(("y", sgd)).update(state, state)
