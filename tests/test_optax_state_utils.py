"""optax's ``tree_map_params`` tests (optax/tree_utils/_state_utils_test.py), translated
to functd: the state is a TensorDict, so the sharding specs optax maps to
(``FakeShardSpec(axis)``) are int64 tensors here (``-1`` for optax's ``None`` axis)."""

import pytest
import torch

import functd as fd
from functd.testing import assert_close

optim = fd.optim
MODULES = ("my/fake/module", "my/other/fake/module")


def _fake_params():
    return fd.TensorDict({m: {"w": torch.zeros(1, 2), "b": torch.zeros(3, 4)} for m in MODULES})


def _fake_param_sharding():
    return fd.TensorDict(
        {m: {"w": torch.tensor(2 * i), "b": torch.tensor(2 * i + 1)} for i, m in enumerate(MODULES)}
    )


def _spec(state):
    """The state as nested dicts of ints (optax compares trees of FakeShardSpec)."""
    return {k: _spec(v) if isinstance(v, fd.TensorDict) else int(v) for k, v in state.items()}


SPECS = {"my/fake/module": {"b": 1, "w": 0}, "my/other/fake/module": {"b": 3, "w": 2}}


def _scale_by_adam_with_dicts():
    """A user transformation whose state nests the moments under "params"."""
    t = optim.scale_by_adam()

    def init(params):
        s = t.init(params)
        return fd.TensorDict(
            {"count": s["count"], "params": {"mu": s["exp_avg"], "nu": s["exp_avg_sq"]}}
        )

    def update(updates, state, params=None):
        inner = fd.TensorDict(
            {
                "count": state["count"],
                "exp_avg": state["params", "mu"],
                "exp_avg_sq": state["params", "nu"],
            }
        )
        updates, s = t.update(updates, inner, params)
        return updates, init_like(s)

    def init_like(s):
        return fd.TensorDict(
            {"count": s["count"], "params": {"mu": s["exp_avg"], "nu": s["exp_avg_sq"]}}
        )

    return optim.GradientTransformation(init, update)


def test_dict_based_optimizers():
    opt = optim.chain(_scale_by_adam_with_dicts(), optim.scale(1e-3))
    opt_state = opt.init(_fake_params())
    specs = optim.tree_map_params(
        opt,
        lambda _, spec: spec,
        opt_state,
        _fake_param_sharding(),
        transform_non_params=lambda _: torch.tensor(-1),
    )
    expected = {"0": {"count": -1, "params": {"mu": SPECS, "nu": SPECS}}, "1": {}}
    assert _spec(specs) == expected


def test_adam():
    opt = optim.adam(1e-4)
    opt_state = opt.init(_fake_params())
    specs = optim.tree_map_params(
        opt,
        lambda _, spec: spec,
        opt_state,
        _fake_param_sharding(),
        transform_non_params=lambda _: torch.tensor(-1),
    )
    assert _spec(specs) == {"count": -1, "exp_avg": SPECS, "exp_avg_sq": SPECS}


def test_inject_hparams():
    opt = optim.inject_hyperparams(optim.adamw)(lr=1e-3)
    params = _fake_params()
    state = optim.tree_map_params(opt, lambda v: v + 1, opt.init(params))
    assert float(state["hyperparams", "lr"]) == pytest.approx(1e-3)
    assert_close(state["inner_state", "exp_avg"], params.apply(lambda v: v + 1))
    assert int(state["inner_state", "count"]) == 0


def test_map_params_to_none():
    """optax maps the params to None; a TensorDict holds tensors only: refused, named."""
    opt = optim.adagrad(1e-4)
    state = opt.init(fd.TensorDict({"a": torch.zeros(1, 2)}))
    with pytest.raises(
        TypeError, match=r"tree_map_params: f returned a NoneType for state entry \('sum', 'a'\)"
    ):
        optim.tree_map_params(opt, lambda _: None, state)


def test_map_non_params_to_none():
    opt = optim.adam(optim.linear(1e-2, 1e-4, 10))
    state = opt.init(fd.TensorDict({"a": torch.zeros(1, 2)}))
    state = optim.tree_map_params(
        opt, lambda v: torch.tensor(1), state, transform_non_params=lambda _: torch.tensor(-1)
    )
    assert _spec(state) == {"count": -1, "exp_avg": {"a": 1}, "exp_avg_sq": {"a": 1}}


# ------------------------------------------------------------------ functd's own checks
def test_tree_map_params_casts_a_chain_and_an_ensemble_state():
    params = fd.stack([_fake_params(), _fake_params().apply(lambda x: x + 1)])
    opt = optim.chain(optim.clip_by_global_norm(1.0), optim.ema(0.9), optim.adam(1e-2))
    state = torch.func.vmap(opt.init)(params)
    half = optim.tree_map_params(opt, lambda x: x.to(torch.bfloat16), state)
    for key in (("1", "ema"), ("2", "exp_avg"), ("2", "exp_avg_sq")):
        assert {x.dtype for x in fd.tree.leaves(half[key])} == {torch.bfloat16}
    assert half["2", "count"].dtype == torch.int64
    assert half["2", "count"].shape == (2,)
    # the state's params-shaped parts of an sgd without momentum: none
    sgd = optim.sgd(0.1)
    assert_close(
        optim.tree_map_params(sgd, lambda x: x + 1, sgd.init(params[0])), sgd.init(params[0])
    )


def test_tree_map_params_refuses_rest_of_another_layout():
    opt = optim.adam(1e-3)
    state = opt.init(_fake_params())
    with pytest.raises(
        ValueError, match=r"tree_map_params: initable.init on params laid out as rest\[0\]"
    ):
        optim.tree_map_params(opt, lambda x, y: x, state, fd.TensorDict({"x": torch.zeros(2)}))
    with pytest.raises(TypeError, match=r"tree_map_params: state must be a functd TensorDict"):
        optim.tree_map_params(opt, lambda x: x, {"count": 0})


def test_tree_map_params_leaves_a_hyperparameter_shaped_like_the_params_alone():
    """inject_hyperparams(sgd)(lr=...) on params {"lr": scalar}: state["hyperparams"]
    has the params' keys and shapes, yet it is no params-shaped part (init's probe)."""
    opt = optim.inject_hyperparams(optim.sgd)(lr=0.1, momentum=0.9)
    state = opt.init(fd.TensorDict({"lr": torch.tensor(1.0)}))
    out = optim.tree_map_params(opt, lambda x: x + 100, state)
    assert float(out["hyperparams", "lr"]) == pytest.approx(0.1)
    assert float(out["inner_state", "momentum_buffer", "lr"]) == 100.0
    plain = optim.inject_hyperparams(optim.sgd)(lr=0.1)  # no params-shaped part at all
    out = optim.tree_map_params(
        plain, lambda x: x + 100, plain.init(fd.TensorDict({"lr": torch.tensor(1.0)}))
    )
    assert float(out["hyperparams", "lr"]) == pytest.approx(0.1)
