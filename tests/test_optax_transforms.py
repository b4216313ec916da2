"""optax's transform tests (optax/_src/transform_test.py: scalers, apply_every, scale;
optax/transforms/_constraining_test.py: zero_nans) translated to functd, with optax's
values as literals; then adam's ``mu_dtype`` against a Python loop of optax's
formula, and the laws (vmap == loop, compile(fullgraph) == eager) for every
transformation added with them."""

import functools

import pytest
import torch

import functd as fd
from functd.testing import assert_close
from tests._support.optim_cases import data, grads, make_net

optim = fd.optim
STEPS = 50
LR = 1e-2
NAN, INF = float("nan"), float("inf")


def _jit(fn):
    return torch.compile(fn, fullgraph=True, backend="eager")


def _pair(a, b):
    return fd.TensorDict({"0": torch.tensor(a), "1": torch.tensor(b)})


INIT_PARAMS = ([1.0, 2.0], [3.0, 4.0])
PER_STEP_UPDATES = ([500.0, 5.0], [300.0, 3.0])


@pytest.mark.parametrize(
    "scaler_constr",
    [optim.scale_by_adam, optim.scale_by_lion, optim.scale_by_rms],
    ids=["adam", "lion", "rmsprop"],
)
def test_scalers(scaler_constr):
    torch._dynamo.reset()
    params = _pair(*INIT_PARAMS)
    scaler = scaler_constr()
    state = _jit(scaler.init)(params)
    assert all(torch.isfinite(x).all() for x in fd.tree.leaves(state))
    updates, state = _jit(scaler.update)(_pair(*PER_STEP_UPDATES), state, params)
    for x in fd.tree.leaves((params, updates, state)):
        assert torch.isfinite(x).all()
    assert [x.shape for x in fd.tree.leaves(updates)] == [x.shape for x in fd.tree.leaves(params)]


def test_apply_every():
    torch._dynamo.reset()
    k = 4
    sgd = optim.sgd(LR, 0.0)
    sgd_params = _pair(*INIT_PARAMS)
    state_sgd = sgd.init(sgd_params)
    sgd_apply_every = optim.chain(
        optim.apply_every(k=k), optim.trace(momentum=0.0, nesterov=False), optim.scale(-LR)
    )
    every_params = _pair(*INIT_PARAMS)
    state_every = sgd_apply_every.init(every_params)
    transform_fn = _jit(sgd_apply_every.update)
    for i in range(STEPS):
        updates_sgd, state_sgd = sgd.update(_pair(*PER_STEP_UPDATES), state_sgd)
        sgd_params = optim.apply_updates(sgd_params, updates_sgd)
        updates_every, state_every = transform_fn(_pair(*PER_STEP_UPDATES), state_every)
        every_params = optim.apply_updates(every_params, updates_every)
        if i % k == k - 1:
            assert_close(every_params, sgd_params, atol=1e-6, rtol=1e-5)
        else:
            assert_close(updates_every, _pair([0.0, 0.0], [0.0, 0.0]), atol=0, rtol=0)


def test_scale():
    updates = _pair(*PER_STEP_UPDATES)
    for i in range(1, STEPS + 1):
        factor = 0.1**i
        rescaler = optim.scale(factor)
        scaled, _ = rescaler.update(updates, rescaler.init(updates))
        assert_close(scaled, updates.apply(lambda t: t * factor))  # noqa: B023


def _triple(a, b, c):
    return fd.TensorDict({"0": torch.tensor(a), "1": torch.tensor(b), "2": torch.tensor(c)})


def test_zero_nans():
    torch._dynamo.reset()
    params = fd.TensorDict({k: torch.zeros(3) for k in "012"})
    opt = optim.zero_nans()
    opt_state = _jit(opt.init)(params)
    update_fn = _jit(opt.update)

    def found(state):
        return [bool(state["found_nan", k]) for k in "012"]

    assert found(opt_state) == [False] * 3
    # an update with nans
    updates, opt_state = update_fn(_triple([1.0] * 3, [1.0, NAN, NAN], [NAN, 1.0, 1.0]), opt_state)
    assert found(opt_state) == [False, True, True]
    assert_close(updates, _triple([1.0] * 3, [1.0, 0.0, 0.0], [0.0, 1.0, 1.0]))
    # an update with nans and infs
    updates, opt_state = update_fn(_triple([1.0] * 3, [1.0, NAN, NAN], [INF, 1.0, 1.0]), opt_state)
    assert found(opt_state) == [False, True, False]
    assert_close(updates, _triple([1.0] * 3, [1.0, 0.0, 0.0], [INF, 1.0, 1.0]))
    # an update with only good values
    good = _triple([1.0] * 3, [1.0] * 3, [1.0] * 3)
    updates, opt_state = update_fn(good, opt_state)
    assert found(opt_state) == [False] * 3
    assert_close(updates, good)


# ------------------------------------------------------------------ mu_dtype
def test_scale_by_adam_mu_dtype_equals_a_loop_of_optax_formula():
    """optax's scale_by_adam: mu, nu moments, bias-corrected, ``m / (sqrt(v) + eps)``;
    mu rounded to ``mu_dtype`` after each step (the step itself in float64 here)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    g = torch.Generator().manual_seed(0)
    gs = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(6)]
    opt = optim.scale_by_adam(b1, b2, eps, mu_dtype=torch.bfloat16)
    params = fd.TensorDict({"w": torch.zeros(5, dtype=torch.float64)})
    state = opt.init(params)
    assert state["exp_avg", "w"].dtype == torch.bfloat16
    assert state["exp_avg_sq", "w"].dtype == torch.float64
    mu = nu = torch.zeros(5, dtype=torch.float64)
    for t, grad in enumerate(gs, start=1):
        updates, state = opt.update(fd.TensorDict({"w": grad}), state)
        mu = b1 * mu + (1 - b1) * grad
        nu = b2 * nu + (1 - b2) * grad**2
        expected = (mu / (1 - b1**t)) / ((nu / (1 - b2**t)).sqrt() + eps)
        mu = mu.to(torch.bfloat16).to(torch.float64)
        assert_close(updates["w"], expected, rtol=1e-12, atol=1e-12)
        assert torch.equal(state["exp_avg", "w"], mu.to(torch.bfloat16))
    with pytest.raises(TypeError, match=r"fd.optim.adam\(mu_dtype=torch.int8\): mu_dtype must be"):
        optim.adam(1e-3, mu_dtype=torch.int8)
    assert optim.adamw(1e-3, mu_dtype=None) == optim.adamw(1e-3)


# ------------------------------------------------------------------ laws of the new names
NEW = {
    "ema": lambda: optim.chain(optim.ema(0.9), optim.scale(-0.1)),
    "ema_nodebias_f32": lambda: optim.chain(
        optim.ema(0.8, debias=False, accumulator_dtype=torch.float32), optim.scale(-0.1)
    ),
    "inject_ema": lambda: optim.chain(
        optim.inject_hyperparams(optim.ema)(decay=0.9), optim.scale(-0.1)
    ),
    "inject_adam_mu_dtype": lambda: optim.inject_hyperparams(optim.adam)(
        lr=1e-2, mu_dtype=torch.float32
    ),
    "zero_nans_adam": lambda: optim.chain(optim.zero_nans(), optim.adam(1e-2)),
    "adamw_mu_dtype": lambda: optim.adamw(1e-2, mu_dtype=torch.float32),
    "multi_steps_skip_f32": lambda: optim.MultiSteps(
        optim.sgd(0.1, momentum=0.9),
        2,
        should_skip_update_fn=optim.skip_not_finite,
        accumulator_dtype=torch.float32,
    ),
    "multi_steps_large": lambda: optim.MultiSteps(
        optim.sgd(0.1),
        2,
        should_skip_update_fn=functools.partial(optim.skip_large_updates, max_squared_norm=1e4),
    ),
}


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_transformations_modify_nothing_given(name):
    params = fd.from_module(make_net()).clone()
    g = params.apply(lambda x: torch.cos(x) + 0.5).set(
        ("0", "bias"), torch.full((8,), NAN, dtype=torch.float64)
    )
    opt = NEW[name]()
    state = opt.init(params)
    given = [(x, x.clone(), x._version) for x in fd.tree.leaves((params, g, state))]
    for _ in range(2):
        _, state = opt.update(g, state, params)
    for x, copy, version in given:
        assert x._version == version
        torch.testing.assert_close(x, copy, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_transformations_vmap_over_members_equals_loop(name):
    x, y = data()
    ens = fd.stack([fd.from_module(make_net(seed)).clone() for seed in range(3)])
    opt = NEW[name]()

    def step(p, s):
        u, s = opt.update(grads(p, x, y), s, p)
        return optim.apply_updates(p, u), s

    vp, vs = ens, torch.func.vmap(opt.init)(ens)
    loop = [(ens[i], opt.init(ens[i])) for i in range(3)]
    for _ in range(3):
        vp, vs = torch.func.vmap(step)(vp, vs)
        loop = [step(p, s) for p, s in loop]
    assert_close(vp, fd.stack([p for p, _ in loop]), rtol=1e-6, atol=1e-9)
    assert_close(vs, fd.stack([s for _, s in loop]), rtol=1e-6, atol=1e-9)


# one of each kind (dynamo is the cost of this file): the others share their code paths
COMPILED = ["ema", "zero_nans_adam", "adamw_mu_dtype", "multi_steps_skip_f32"]


@pytest.mark.compile
@pytest.mark.parametrize("name", COMPILED)
def test_new_transformations_compile_fullgraph(name):
    torch._dynamo.reset()
    params = fd.TensorDict(
        {
            "w": torch.ones(2, 3, dtype=torch.float64),
            "b": {"c": torch.zeros(3, dtype=torch.float64)},
        }
    )
    g = params.apply(lambda x: torch.cos(x) + 0.5)
    opt = NEW[name]()

    def step(p, s):
        u, s = opt.update(g, s, p)
        return optim.apply_updates(p, u), s

    compiled = _jit(step)
    ep, es = params, opt.init(params)
    cp, cs = ep, es
    for _ in range(2):
        ep, es = step(ep, es)
        cp, cs = compiled(cp, cs)
    assert_close(cp, ep, rtol=1e-12, atol=1e-14)
    assert_close(cs, es, rtol=1e-12, atol=1e-14)
