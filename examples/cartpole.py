"""A pure CartPole-v1 in functd, gymnax-style: Gymnasium's physics as functions of TensorDicts.

``reset(key, params) -> (state, obs)`` and ``step(key, state, action, params) -> (state,
obs, reward, done)``: the state (``x``, ``x_dot``, ``theta``, ``theta_dot``, ``t``) and the
env params are ``fd.TensorDict``s, nothing is stored anywhere, and every function is
branch-free (``torch.where``, no ``.item()``), so ``fd.vmap`` maps it over keys, states
and env params, and ``fd.jit`` traces it.

The dynamics are Gymnasium's ``CartPole-v1`` exactly: same constants, explicit Euler with
``tau = 0.02``, termination when ``|x| > 2.4`` or ``|theta| > 12 degrees``, truncation
at 500 steps (Gymnasium's ``TimeLimit``), reward 1 on every step (the terminating one
included), initial state uniform in ``(-0.05, 0.05)`` (drawn here with ``fd.random`` from
the key). The state is computed in its own dtype (float32 by default, float64 to compare
with Gymnasium's float64 state). ``step`` resets automatically when the episode ends
(terminated or truncated): the returned state and observation are then those of a fresh
episode, drawn from ``key``, and ``done`` is True.

Run: ``python examples/cartpole.py`` (a random policy on 8 vmapped envs, prints the
episode lengths). Importable: ``tests/test_cartpole.py`` and ``examples/ppo_agents.py``
load it by path.
"""

from __future__ import annotations

import math

import torch

import functd as fd

NUM_ACTIONS = 2
OBS_SIZE = 4
STATE_KEYS = ("x", "x_dot", "theta", "theta_dot", "t")


def default_params(dtype: torch.dtype = torch.float32) -> fd.TensorDict:
    """CartPole-v1's constants (Gymnasium's ``CartPoleEnv.__init__``) as a TensorDict.

    Example:
        >>> p = default_params(torch.float64)
        >>> float(p["gravity"])
        9.8
    """
    values = {
        "gravity": 9.8,
        "masscart": 1.0,
        "masspole": 0.1,
        "length": 0.5,  # half the pole's length
        "force_mag": 10.0,
        "tau": 0.02,  # seconds between state updates
        "theta_threshold": 12 * 2 * math.pi / 360,
        "x_threshold": 2.4,
    }
    data = {k: torch.tensor(v, dtype=dtype) for k, v in values.items()}
    data["max_steps"] = torch.tensor(500, dtype=torch.int64)
    return fd.TensorDict(data)


def _check(fn: str, state: fd.TensorDict) -> None:
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise KeyError(
            f"cartpole.{fn}: the state has no {missing}; build it with cartpole.reset(key, params)."
        )


def observe(state: fd.TensorDict) -> torch.Tensor:
    """The observation ``[x, x_dot, theta, theta_dot]`` (last dim 4) in the state's dtype."""
    _check("observe", state)
    return torch.stack(
        [
            state.get_tensor("x"),
            state.get_tensor("x_dot"),
            state.get_tensor("theta"),
            state.get_tensor("theta_dot"),
        ],
        -1,
    )


def reset(key: torch.Tensor, params: fd.TensorDict) -> tuple[fd.TensorDict, torch.Tensor]:
    """A fresh episode: the four variables uniform in ``(-0.05, 0.05)``, ``t = 0``.

    The state takes the dtype of ``params["gravity"]``.

    Example:
        >>> state, obs = reset(fd.random.key(0), default_params())
        >>> obs.shape
        torch.Size([4])
    """
    dtype = params["gravity"].dtype
    u = fd.random.uniform(key, (4,), dtype=dtype, minval=-0.05, maxval=0.05)
    x, x_dot, theta, theta_dot = u.unbind(-1)
    t = torch.zeros((), dtype=torch.int64, device=u.device)
    state = fd.TensorDict({"x": x, "x_dot": x_dot, "theta": theta, "theta_dot": theta_dot, "t": t})
    return state, u


def dynamics(
    state: fd.TensorDict, action: torch.Tensor, params: fd.TensorDict
) -> tuple[fd.TensorDict, torch.Tensor]:
    """One Euler step of Gymnasium's CartPole -> (next state, terminated); no reset.

    ``action`` is 0 (push left) or 1 (push right), an integer tensor.
    """
    _check("step", state)
    x, x_dot, theta, theta_dot = (
        state.get_tensor("x"),
        state.get_tensor("x_dot"),
        state.get_tensor("theta"),
        state.get_tensor("theta_dot"),
    )
    dtype = x.dtype
    p = {k: v.to(dtype) for k, v in params.items() if k != "max_steps"}
    total_mass = p["masspole"] + p["masscart"]
    polemass_length = p["masspole"] * p["length"]
    force = torch.where(action == 1, p["force_mag"], -p["force_mag"])
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
    thetaacc = (p["gravity"] * sintheta - costheta * temp) / (
        p["length"] * (4.0 / 3.0 - p["masspole"] * costheta**2 / total_mass)
    )
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    tau = p["tau"]
    new = {
        "x": x + tau * x_dot,
        "x_dot": x_dot + tau * xacc,
        "theta": theta + tau * theta_dot,
        "theta_dot": theta_dot + tau * thetaacc,
        "t": state.get_tensor("t") + 1,
    }
    terminated = (
        (new["x"] < -p["x_threshold"])
        | (new["x"] > p["x_threshold"])
        | (new["theta"] < -p["theta_threshold"])
        | (new["theta"] > p["theta_threshold"])
    )
    return fd.TensorDict(new), terminated


def step(
    key: torch.Tensor, state: fd.TensorDict, action: torch.Tensor, params: fd.TensorDict
) -> tuple[fd.TensorDict, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step with auto-reset -> ``(state, obs, reward, done)``.

    ``done`` is terminated or truncated (``t`` reached ``params["max_steps"]``); when it
    is True, ``state``/``obs`` are a fresh episode's (drawn from ``key``) and ``reward``
    is still the last step's (1). Shapes are those of one env: map with ``fd.vmap``.

    Example:
        >>> params = default_params()
        >>> state, obs = reset(fd.random.key(0), params)
        >>> state, obs, reward, done = step(fd.random.key(1), state, torch.tensor(1), params)
    """
    nxt, terminated = dynamics(state, action, params)
    done = terminated | (nxt.get_tensor("t") >= params.get_tensor("max_steps"))
    fresh, _ = reset(key, params)
    out = fd.TensorDict(
        {k: torch.where(done, fresh.get_tensor(k), nxt.get_tensor(k)) for k in STATE_KEYS}
    )
    reward = torch.ones_like(nxt.get_tensor("x"))
    return out, observe(out), reward, done


def main() -> None:
    """A uniformly random policy on 8 envs, 600 steps: prints the finished episodes' lengths."""
    n, params = 8, default_params()
    keys = fd.random.split(fd.random.key(0), n)
    state, _ = fd.vmap(reset, in_dims=(0, None))(keys, params)
    vstep = fd.vmap(step, in_dims=(0, 0, 0, None))
    lengths, run = [], torch.zeros(n)
    for i in range(600):
        k_act, k_step = fd.random.split(fd.random.fold_in(fd.random.key(1), i))
        action = fd.random.randint(k_act, (n,), 0, NUM_ACTIONS)
        state, _, reward, done = vstep(fd.random.split(k_step, n), state, action, params)
        run = run + reward
        lengths += run[done].tolist()
        run = torch.where(done, 0.0, run)
    mean = sum(lengths) / len(lengths)
    print(f"random policy: {len(lengths)} episodes, mean length {mean:.1f} steps")


if __name__ == "__main__":
    main()
