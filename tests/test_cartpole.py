"""examples/cartpole.py: the pure CartPole against Gymnasium's own CartPole-v1.

Gymnasium (the dev extra) is the reference nobody here wrote: its env is put in random
states (``env.unwrapped.state``), stepped, and compared with ``cartpole.step`` in float64.
"""

import math

import numpy as np
import pytest
import torch

import functd as fd
from tests._support.example_modules import load_example

cp = load_example("cartpole")
F64 = torch.float64


def _state(values, t=0, dtype=F64):
    x, x_dot, theta, theta_dot = (torch.tensor(float(v), dtype=dtype) for v in values)
    return fd.TensorDict(
        {"x": x, "x_dot": x_dot, "theta": theta, "theta_dot": theta_dot, "t": torch.tensor(t)}
    )


def _random_states(n, seed):
    """States inside and near the termination bounds, as numpy float64 rows."""
    rng = np.random.default_rng(seed)
    lim = np.array([2.6, 3.0, 0.25, 3.5])
    return rng.uniform(-lim, lim, size=(n, 4))


def test_step_matches_gymnasium_on_random_states():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    params = cp.default_params(F64)
    terminated_seen = {True: 0, False: 0}
    for i, row in enumerate(_random_states(300, seed=1)):
        action = i % 2
        env.unwrapped.state = row.copy()
        env.unwrapped.steps_beyond_terminated = None
        obs, reward, terminated, truncated, _ = env.step(action)
        nxt, term = cp.dynamics(_state(row), torch.tensor(action), params)
        ours = cp.observe(nxt)
        want = torch.as_tensor(np.asarray(env.unwrapped.state, dtype=np.float64))
        torch.testing.assert_close(ours, want, rtol=0, atol=1e-12)
        # gymnasium returns the float64 state rounded to float32 as obs
        np.testing.assert_allclose(ours.numpy(), obs.astype(np.float64), rtol=0, atol=1e-6)
        assert bool(term) == terminated and not truncated
        terminated_seen[terminated] += 1
        # the full step (with auto-reset) pays gymnasium's reward, and is done on termination
        _, _, r, done = cp.step(fd.random.key(i), _state(row), torch.tensor(action), params)
        assert float(r) == reward == 1.0 and r.dtype == F64
        assert bool(done) == terminated
    assert min(terminated_seen.values()) > 30  # both outcomes were exercised


def test_truncation_at_500_steps_like_gymnasium_timelimit():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    calm = np.zeros(4)
    params = cp.default_params(F64)
    for t, want_trunc in ((498, False), (499, True)):
        env.unwrapped.state = calm.copy()
        env.unwrapped.steps_beyond_terminated = None
        env._elapsed_steps = t  # the TimeLimit wrapper's counter
        _, _, terminated, truncated, _ = env.step(0)
        assert (terminated, truncated) == (False, want_trunc)
        _, _, _, done = cp.step(fd.random.key(0), _state(calm, t), torch.tensor(0), params)
        assert bool(done) == want_trunc


def test_reset_is_uniform_in_the_gymnasium_range_and_keyed():
    params = cp.default_params()
    keys = fd.random.split(fd.random.key(3), 2000)
    state, obs = fd.vmap(cp.reset, in_dims=(0, None))(keys, params)
    assert obs.shape == (2000, 4) and obs.dtype == torch.float32
    assert obs.abs().max() < 0.05 and obs.abs().max() > 0.049
    assert abs(float(obs.mean())) < 0.003
    assert torch.equal(state["t"], torch.zeros(2000, dtype=torch.int64))
    _, o1 = cp.reset(keys[5], params)
    torch.testing.assert_close(o1, obs[5], rtol=0, atol=0)
    assert not torch.equal(obs[0], obs[1])


def test_auto_reset_on_termination_draws_from_the_key():
    params = cp.default_params(F64)
    falling = _state([2.399, 1.0, 0.0, 0.0], t=17)  # x crosses 2.4 this step
    key = fd.random.key(9)
    state, obs, reward, done = cp.step(key, falling, torch.tensor(1), params)
    _, fresh_obs = cp.reset(key, params)
    assert bool(done) and float(reward) == 1.0
    torch.testing.assert_close(obs, fresh_obs, rtol=0, atol=0)
    assert int(state["t"]) == 0
    # not done: no reset, time advances
    calm = _state([0.0, 0.0, 0.01, 0.0], t=17)
    state, obs, _, done = cp.step(key, calm, torch.tensor(1), params)
    assert not bool(done) and int(state["t"]) == 18
    assert float(obs[1]) > 0  # pushed right


def test_vmap_over_keys_states_actions_and_params_equals_the_loop():
    n = 6
    base = cp.default_params(F64)
    params = fd.stack([base.set("gravity", torch.tensor(9.8 + i, dtype=F64)) for i in range(n)])
    rows = _random_states(n, seed=4)
    states = fd.stack([_state(r, t=490 + 2 * i) for i, r in enumerate(rows)])
    keys = fd.random.split(fd.random.key(2), n)
    actions = torch.tensor([0, 1, 1, 0, 1, 0])
    got = fd.vmap(cp.step)(keys, states, actions, params)
    for i in range(n):
        want = cp.step(keys[i], states[i], actions[i], params[i])
        for g, w in zip(got[1:], want[1:], strict=True):
            torch.testing.assert_close(g[i], w, rtol=0, atol=0)
        fd.testing.assert_close(got[0][i], want[0])
    assert got[3].any() and not got[3].all()  # some reset, some did not


def test_float32_state_stays_float32_and_follows_float64():
    params32, params64 = cp.default_params(), cp.default_params(F64)
    row = [0.01, -0.2, 0.03, 0.4]
    s32, s64 = _state(row, dtype=torch.float32), _state(row)
    for i in range(12):  # the pole falls at step 13 (after that the resets differ by dtype)
        s32, o32, r32, d32 = cp.step(fd.random.key(i), s32, torch.tensor(i % 2), params32)
        s64, o64, _, d64 = cp.step(fd.random.key(i), s64, torch.tensor(i % 2), params64)
        assert not d32 and not d64
    assert o32.dtype == r32.dtype == torch.float32
    torch.testing.assert_close(o32.double(), o64, rtol=0, atol=1e-5)


def test_a_state_without_its_keys_is_refused_with_the_fix():
    bad = fd.TensorDict({"x": torch.tensor(0.0)})
    with pytest.raises(KeyError, match=r"cartpole.step: the state has no .*cartpole.reset"):
        cp.step(fd.random.key(0), bad, torch.tensor(0), cp.default_params())


def test_thresholds_are_gymnasiums():
    p = cp.default_params(F64)
    assert float(p["theta_threshold"]) == 12 * 2 * math.pi / 360
    assert float(p["x_threshold"]) == 2.4 and int(p["max_steps"]) == 500
