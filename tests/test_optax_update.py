"""optax's update tests (optax/_src/update_test.py), translated to functd: optax's
tuple-of-dict params ``({'a': ones(3, 2)}, ones(1))`` become the TensorDict
``{"0": {"a": ...}, "1": ...}``; ``jax.jit`` becomes ``torch.compile(fullgraph=True)``
(dynamo only). Plus where functd differs on purpose: None params and None leaves."""

import pytest
import torch

import functd as fd
from functd.testing import assert_close

optim = fd.optim


def _jit(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")


def _params(dtype=torch.float32):
    return fd.TensorDict(
        {"0": {"a": torch.ones(3, 2, dtype=dtype)}, "1": torch.ones(1, dtype=dtype)}
    )


def test_apply_updates():
    params = _params()
    grads = params.apply(lambda t: 2 * t)
    new_params = _jit(optim.apply_updates)(params, grads)
    assert_close(new_params, params.apply(lambda t: 3 * t), atol=1e-10, rtol=1e-5)


def test_apply_updates_mixed_precision():
    params = _params(torch.bfloat16)
    grads = params.apply(lambda t: (2 * t).to(torch.float32))
    new_params = _jit(optim.apply_updates)(params, grads)
    assert [x.dtype for x in fd.tree.leaves(new_params)] == [torch.bfloat16] * 2
    assert_close(new_params, params.apply(lambda t: 3 * t), rtol=0, atol=0)


def test_incremental_update():
    params_1 = _params()
    params_2 = params_1.apply(lambda t: 2 * t)
    new_params = _jit(optim.incremental_update)(params_2, params_1, 0.5)
    assert_close(new_params, params_1.apply(lambda t: 1.5 * t), atol=1e-10, rtol=1e-5)


def test_periodic_update():
    params_1 = _params()
    params_2 = params_1.apply(lambda t: 2 * t)
    update_period = 5
    update_fn = _jit(optim.periodic_update)
    for j in range(3):
        for i in range(1, update_period):
            step = torch.tensor(j * update_period + i)
            new_params = update_fn(params_2, params_1, step, update_period)
            assert_close(new_params, params_1, atol=1e-10, rtol=1e-5)
        step = torch.tensor((j + 1) * update_period)
        new_params = update_fn(params_2, params_1, step, update_period)
        assert_close(new_params, params_2, atol=1e-10, rtol=1e-5)


# optax's test_none_argument calls apply_updates(None, x) and incremental_update(None, x, 1)
# and expects no error (None is an empty pytree there). functd's optimizers take
# TensorDicts only, and a TensorDict cannot hold None: None is refused with the fix.
@pytest.mark.parametrize(
    "operation",
    [optim.apply_updates, lambda x, y: optim.incremental_update(x, y, 1)],
    ids=["apply_updates", "incremental_update"],
)
def test_none_argument(operation):
    x = fd.TensorDict({"a": torch.tensor([1.0, 2.0, 3.0])})
    with pytest.raises(
        TypeError, match=r"fd\.optim\.\w+: \w+ must be a functd TensorDict, got a NoneType"
    ):
        operation(None, x)


def test_none_leaves_are_refused_naming_them_and_empty_subtrees_pass_through():
    """optax skips None leaves (empty subtrees); functd's equivalent is an entry left
    out or an empty nested TensorDict, which every stage passes through."""
    w = torch.tensor([1.0, -2.0])
    with pytest.raises(
        TypeError,
        match=r"adam.init: .* It holds None at \['b', \('c', '0'\)\]: .* leave those entries out",
    ):
        optim.adam(0.1).init({"w": w, "b": None, "c": [None]})
    params = fd.TensorDict({"w": w, "empty": {}})
    reference = fd.TensorDict({"w": w})
    for opt in (optim.adam(0.1), optim.chain(optim.zero_nans(), optim.ema(0.9)), optim.sgd(0.1)):
        state = opt.init(params)
        updates, state = opt.update(params, state, params)
        new = optim.apply_updates(params, updates)
        assert list(new["empty"].keys()) == []
        ref_updates, _ = opt.update(reference, opt.init(reference), reference)
        assert_close(new["w"], optim.apply_updates(reference, ref_updates)["w"], rtol=0, atol=0)
