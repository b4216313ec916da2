"""optax's accumulation tests (optax/transforms/_accumulation_test.py), translated to
functd as a user would write them: TensorDict params, ``torch.compile(fullgraph=True)``
(dynamo only, ``backend="eager"``) where optax jits, ``fd.scan`` where it scans. The
expected values are optax's, copied as literals."""

import functools

import pytest
import torch
import torch.nn.functional as F

import functd as fd
from functd.testing import assert_close

optim = fd.optim


def _jit(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")


def _scalar(x):
    return fd.TensorDict({"a": torch.as_tensor(x, dtype=torch.float32)})


# ------------------------------------------------------------------ ema
def test_ema():
    ema = optim.ema(decay=0.9, debias=False)
    state = ema.init(_scalar(5.0))
    update = _jit(ema.update)
    mean, state = update(_scalar(5.0), state)
    assert_close(mean["a"], torch.tensor(0.5), atol=1e-4, rtol=0)  # (1 - d) * v0
    mean, _ = update(_scalar(7.0), state)
    assert_close(mean["a"], torch.tensor(1.15), atol=1e-2, rtol=0)  # (1 - d)(v1 + d v0)


def test_ema_debias():
    ema = optim.ema(decay=0.9)
    state = ema.init(_scalar(5.0))
    update = _jit(ema.update)
    mean, state = update(_scalar(5.0), state)
    assert_close(mean["a"], torch.tensor(5.0), atol=1e-4, rtol=0)
    mean, state = update(_scalar(7.0), state)
    # ((1 - d) v1 + d (1 - d) v0) / (1 - d**2) = 1.15 / 0.19
    assert_close(mean["a"], torch.tensor(1.15 / 0.19), atol=1e-2, rtol=0)
    # the state is not debiased
    assert_close(state["ema", "a"], torch.tensor(1.15), atol=1e-2, rtol=0)


# ------------------------------------------------------------------ should_skip_update_fn
def _two(first):
    return fd.TensorDict({"0": torch.tensor(first), "1": torch.zeros([])})


@pytest.mark.parametrize(
    ("first", "skip", "num"),
    [(float("inf"), True, 1), (-float("inf"), True, 1), (float("nan"), True, 1), (11.0, False, 0)],
    ids=["test_pos_inf", "test_neg_inf", "test_nan", "test_finite"],
)
def test_skip_not_finite(first, skip, num):
    step = torch.zeros([], dtype=torch.int64)
    should_skip, skip_state = optim.skip_not_finite(_two(first), step, None)
    assert bool(should_skip) is skip
    assert bool(skip_state["should_skip"]) is skip
    assert int(skip_state["num_not_finite"]) == num


@pytest.mark.parametrize(
    ("first", "skip", "norm_sq"),
    [
        (float("inf"), True, float("inf")),
        (float("nan"), True, None),
        (11.0, True, 121.0),
        (0.0, False, 0.0),
    ],
    ids=["test_inf", "test_nan", "test_large", "test_small"],
)
def test_skip_large_updates(first, skip, norm_sq):
    step = torch.zeros([], dtype=torch.int64)
    should_skip, skip_state = optim.skip_large_updates(_two(first), step, None, 100.0)
    assert bool(should_skip) is skip
    assert bool(skip_state["should_skip"]) is skip
    got = float(skip_state["norm_squared"])
    assert got != got if norm_sq is None else got == norm_sq  # NaN != NaN


# ------------------------------------------------------------------ MultiSteps
def _dense(seed=0, dtype=torch.float32):
    """flax's Dense(10) on 7 features, as functd params (nn.Linear's layout)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(10, 7, generator=g) / 7**0.5).to(dtype)
    return fd.TensorDict({"weight": w, "bias": torch.zeros(10, dtype=dtype)})


def _loss(params, data):
    return (F.linear(data, params["weight"], params["bias"]) ** 2).sum()


def test_multi_steps():
    k_steps = 4
    data = torch.ones(32, 7)
    params = _dense()
    # a non-trivial inner optimizer: it has a state and needs the params
    ms_opt = optim.MultiSteps(
        optim.chain(optim.scale_by_adam(), optim.add_decayed_weights(1e-2), optim.scale(-1e-4)),
        k_steps,
    )

    def train_step(data, opt_state, params):
        grad = torch.func.grad(_loss)(params, data)
        return ms_opt.update(grad, opt_state, params)

    opt_state = ms_opt.init(params)
    prev_loss = _loss(params, data)
    for idx in range(5 * k_steps):
        updates, opt_state = train_step(data, opt_state, params)
        new_params = optim.apply_updates(params, updates)
        new_loss = _loss(new_params, data)
        if idx % k_steps < k_steps - 1:
            assert_close(new_params, params, rtol=0, atol=0)
            assert torch.equal(new_loss, prev_loss)
            assert not ms_opt.has_updated(opt_state)
        else:
            assert new_loss < prev_loss
            prev_loss = new_loss
            assert ms_opt.has_updated(opt_state)
        params = new_params


def test_multi_steps_every_k_schedule():
    ms_opt = optim.MultiSteps(optim.sgd(1e-4), lambda step: torch.where(step < 2, 1, 3))
    params = _scalar(0.0)
    opt_state = ms_opt.init(params)
    grad = _scalar(0.0)
    assert not ms_opt.has_updated(opt_state)
    for _ in range(2):  # first two steps: 1 mini-step per update
        _, opt_state = ms_opt.update(grad, opt_state, params)
        assert ms_opt.has_updated(opt_state)
    for _ in range(5):  # then 3 mini-steps per update
        for _ in range(2):
            _, opt_state = ms_opt.update(grad, opt_state, params)
            assert not ms_opt.has_updated(opt_state)
        _, opt_state = ms_opt.update(grad, opt_state, params)
        assert ms_opt.has_updated(opt_state)


def test_multi_steps_scan_dtype_stability():
    ms_opt = optim.MultiSteps(optim.sgd(1e-4), 2, accumulator_dtype=torch.float32)
    params = fd.TensorDict({"a": torch.zeros([], dtype=torch.bfloat16)})

    def train_step(state, _):
        grad = fd.TensorDict({"a": torch.ones([], dtype=torch.bfloat16)})
        updates, opt_state = ms_opt.update(grad, state, params)
        return opt_state, updates

    final_state, _ = fd.scan(train_step, ms_opt.init(params), torch.arange(4))
    assert final_state["acc_grads", "a"].dtype == torch.float32


def test_multi_steps_zero_nans():  # optax issue 828
    ms_opt = optim.MultiSteps(optim.chain(optim.zero_nans(), optim.sgd(1e-4)), every_k_schedule=2)
    params = _scalar(0.0)
    opt_state = ms_opt.init(params)
    updates, opt_state = ms_opt.update(_scalar(0.0), opt_state, params)
    assert float(updates["a"]) == 0.0 and int(opt_state["mini_step"]) == 1


def test_multi_steps_computes_mean():
    ms_opt = optim.MultiSteps(optim.scale(1.0), 4, use_grad_mean=True)
    params = _scalar(0.0)
    opt_state = ms_opt.init(params)
    grads = [_scalar(float(i)) for i in [1, 2, 3, 4]]
    assert not ms_opt.has_updated(opt_state)
    for grad in grads[:-1]:
        _, opt_state = ms_opt.update(grad, opt_state, params)
        assert not ms_opt.has_updated(opt_state)
    new_params, opt_state = ms_opt.update(grads[-1], opt_state, params)
    assert ms_opt.has_updated(opt_state)
    assert float(new_params["a"]) == 2.5


def test_multi_steps_skip_not_finite():
    ms_opt = optim.MultiSteps(optim.sgd(1.0), 2, should_skip_update_fn=optim.skip_not_finite)
    opt_init, opt_update = (
        _jit(ms_opt.init),
        torch.compile(ms_opt.update, fullgraph=True, backend="eager"),
    )
    params = _scalar(0.0)
    opt_state = opt_init(params)

    def step(g, mini_step):
        nonlocal params, opt_state
        updates, opt_state = opt_update(_scalar(g), opt_state, params)
        assert int(opt_state["mini_step"]) == mini_step
        params = optim.apply_updates(params, updates)

    step(1.0, 1)  # test_good_updates
    step(1.0, 0)
    assert float(params["a"]) == -1.0
    step(float("inf"), 0)  # test_inf_updates: no increase in mini_step
    assert float(params["a"]) == -1.0
    step(float("nan"), 0)  # test_nan_updates
    assert float(params["a"]) == -1.0
    step(1.0, 1)  # test_final_good_updates
    step(1.0, 0)
    assert float(params["a"]) == -2.0


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


COMBOS = [pytest.param(p, u, id=f"{p}-{u}".replace("torch.", "")) for p in DTYPES for u in DTYPES]


@pytest.mark.parametrize("mu_dtype", [None, torch.float32], ids=["adam", "adam_mu_dtype"])
@pytest.mark.parametrize(("param_dtype", "upd_dtype"), COMBOS)
def test_multi_steps_mixed_precision(mu_dtype, upd_dtype, param_dtype):
    k_steps = 4
    data = torch.ones(32, 7, dtype=param_dtype)
    opt = optim.adam(0.1, mu_dtype=mu_dtype)
    ms_opt = optim.MultiSteps(opt, k_steps)

    def train_step(opt_state, params, update):
        grad = torch.func.grad(_loss)(params, data).apply(lambda x: x.to(upd_dtype))
        return update(grad, opt_state, params)

    params = _dense(dtype=param_dtype)
    opt_state, ms_opt_state = opt.init(params), ms_opt.init(params)
    for _ in range(k_steps + 1):
        updates, opt_state = train_step(opt_state, params, opt.update)
        ms_updates, ms_opt_state = train_step(ms_opt_state, params, ms_opt.update)
        assert [x.dtype for x in fd.tree.leaves(updates)] == [
            x.dtype for x in fd.tree.leaves(ms_updates)
        ]
        new_params = optim.apply_updates(params, ms_updates)
        assert [x.dtype for x in fd.tree.leaves(new_params)] == [param_dtype] * 2
        params = new_params


# ------------------------------------------------------------------ functd's own checks
def test_multi_steps_should_skip_update_fn_must_return_a_bool_scalar():
    ms_opt = optim.MultiSteps(optim.sgd(1.0), 2, should_skip_update_fn=lambda u, s, p: u["a"])
    params = _scalar(0.0)
    with pytest.raises(
        ValueError, match=r"MultiSteps.init: should_skip_update_fn must return a bool"
    ):
        ms_opt.init(params)


def test_multi_steps_skip_large_updates_by_partial_and_bare_bool_fn():
    skip = functools.partial(optim.skip_large_updates, max_squared_norm=4.0)
    ms_opt = optim.MultiSteps(optim.sgd(1.0), 1, should_skip_update_fn=skip)
    bare = optim.MultiSteps(optim.sgd(1.0), 1, should_skip_update_fn=lambda u, s, p: u["a"] > 1.5)
    params = _scalar(0.0)
    for opt in (ms_opt, bare):
        state = opt.init(params)
        assert ("skip_state" in state) is (opt is ms_opt)
        small, state = opt.update(_scalar(1.0), state, params)
        large, state = opt.update(_scalar(3.0), state, params)
        assert float(small["a"]) == -1.0 and float(large["a"]) == 0.0
        assert int(state["gradient_step"]) == 1
    assert float(state["inner_state", "count"]) == 1


def test_multi_steps_accumulator_dtype_default_and_bad():
    bf = fd.TensorDict({"a": torch.zeros(2, dtype=torch.bfloat16)})
    f64 = fd.TensorDict({"a": torch.zeros(2, dtype=torch.float64)})
    ms = optim.MultiSteps(optim.sgd(1.0), 3)
    assert ms.init(bf)["acc_grads", "a"].dtype == torch.float32  # as optax's default
    assert ms.init(f64)["acc_grads", "a"].dtype == torch.float64  # not narrowed
    # a bfloat16 running mean of 1/3-steps stays exact in the float32 accumulator
    state = ms.init(bf)
    for g in (0.1, 0.2, 0.3):
        u, state = ms.update(
            fd.TensorDict({"a": torch.full((2,), g, dtype=torch.bfloat16)}), state, bf
        )
    assert u["a"].dtype == torch.bfloat16
    assert_close(u["a"], torch.full((2,), -0.2, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"MultiSteps\(accumulator_dtype=torch.int32\)"):
        optim.MultiSteps(optim.sgd(1.0), 2, accumulator_dtype=torch.int32)
