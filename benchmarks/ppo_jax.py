"""The JAX column of issue 24's table: PPO on CartPole, jitted and vmapped over agents.

The same algorithm as ``examples/ppo_agents.py`` (PureJaxRL's design and CartPole
hyperparameters: 4 envs x 128 steps an update, GAE, 4 epochs x 4 minibatches, clipped
PPO loss, ``clip_by_global_norm(0.5)`` then Adam(2.5e-4, eps 1e-5), 64 tanh units,
orthogonal init), written here on plain ``jax.numpy`` and optax: the env is Gymnasium's
CartPole-v1 physics (``examples/cartpole.py``'s), the whole run one ``lax.scan`` over
updates, ``jax.jit(jax.vmap(train))`` over agents. It measures JAX on the machine that
measures functd, instead of the issue's anchors from another machine.

Run (jax and optax are not dependencies of functd; any environment that has them):
``python benchmarks/ppo_jax.py [--agents 1,64,256] [--steps 16384] [--threads 1]``.
``--threads 1`` (the default, as functd's rows) restricts XLA's CPU runtime to one
thread; ``--threads 0`` leaves XLA's default (every core). Prints one line per agent
count: compile s (``lower().compile()``), train s (the compiled run, after one
untimed run), env steps/s, and the agents' mean return over their last update.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agents", default="1,64,256")
    p.add_argument("--steps", type=int, default=16_384, help="env steps per agent")
    p.add_argument("--threads", type=int, default=1, help="XLA CPU threads (0: XLA's default)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    # before jax is imported. XLA's concurrency-optimized scheduler: off, since with it
    # (jax 0.10.2, CPU) the run from 32 agents up never finished, every thread asleep
    flags = " --xla_cpu_enable_concurrency_optimized_scheduler=false"
    if args.threads == 1:
        flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + flags
    try:
        import jax
    except ImportError:
        sys.exit("ppo_jax: jax is not installed here (pip install jax optax); nothing measured.")
    train = make_train(args.steps)
    print(f"# JAX {jax.__version__}, {args.steps} env steps per agent, threads={args.threads}")
    for n in [int(a) for a in args.agents.split(",")]:
        keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(args.seed), i))(
            jax.numpy.arange(n)
        )
        t0 = time.perf_counter()
        compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
        compile_s = time.perf_counter() - t0
        jax.block_until_ready(compiled(keys))  # untimed: first-run effects
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(keys))
        train_s = time.perf_counter() - t0
        ret = float(out.mean())
        rate = n * args.steps / train_s
        print(
            f"jax agents={n} compile_s={compile_s:.2f} train_s={train_s:.3f} "
            f"env_steps_per_s={rate:,.0f} last_update_return={ret:.1f}",
            flush=True,
        )


def make_train(
    steps: int,
    num_envs: int = 4,
    num_steps: int = 128,
    epochs: int = 4,
    minibatches: int = 4,
    lr: float = 2.5e-4,
    hidden: int = 64,
    gamma: float = 0.99,
    lam: float = 0.95,
    clip: float = 0.2,
    vf_coef: float = 0.5,
    ent_coef: float = 0.01,
    max_norm: float = 0.5,
):
    """``train(key) -> mean return of the episodes finished in the last update``."""
    import jax
    import jax.numpy as jnp
    import optax

    num_updates = steps // (num_envs * num_steps)
    batch = num_envs * num_steps
    mb = batch // minibatches
    # Gymnasium's CartPole-v1
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_th, x_th, max_t = 12 * 2 * math.pi / 360, 2.4, 500
    total_mass, pml = masspole + masscart, masspole * length

    def env_reset(key):
        s = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)
        return (s, jnp.zeros((), jnp.int32)), s

    def env_step(key, state, action):
        (x, x_dot, th, th_dot), t = state[0], state[1]
        force = jnp.where(action == 1, force_mag, -force_mag)
        c, s = jnp.cos(th), jnp.sin(th)
        temp = (force + pml * th_dot**2 * s) / total_mass
        thacc = (gravity * s - c * temp) / (length * (4.0 / 3.0 - masspole * c**2 / total_mass))
        xacc = temp - pml * thacc * c / total_mass
        new = jnp.stack(
            [x + tau * x_dot, x_dot + tau * xacc, th + tau * th_dot, th_dot + tau * thacc]
        )
        t = t + 1
        done = (jnp.abs(new[0]) > x_th) | (jnp.abs(new[2]) > theta_th) | (t >= max_t)
        (fresh, t0), _ = env_reset(key)
        new = jnp.where(done, fresh, new)
        return (new, jnp.where(done, t0, t)), new, jnp.ones(()), done

    def dense(key, n_in, n_out, gain):
        w = jax.nn.initializers.orthogonal(gain)(key, (n_in, n_out))
        return {"w": w, "b": jnp.zeros(n_out)}

    def mlp_init(key, n_out, last_gain):
        k = jax.random.split(key, 3)
        return [
            dense(k[0], 4, hidden, math.sqrt(2)),
            dense(k[1], hidden, hidden, math.sqrt(2)),
            dense(k[2], hidden, n_out, last_gain),
        ]

    def mlp(p, x):
        for layer in p[:-1]:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return x @ p[-1]["w"] + p[-1]["b"]

    opt = optax.chain(optax.clip_by_global_norm(max_norm), optax.adam(lr, eps=1e-5))

    def loss_fn(params, b):
        logits = mlp(params["actor"], b["obs"])
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, b["action"][:, None], -1)[:, 0]
        entropy = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
        value = mlp(params["critic"], b["obs"])[:, 0]
        v_clip = b["value"] + jnp.clip(value - b["value"], -clip, clip)
        v_loss = 0.5 * jnp.maximum((value - b["target"]) ** 2, (v_clip - b["target"]) ** 2).mean()
        ratio = jnp.exp(logp - b["log_prob"])
        adv = (b["adv"] - b["adv"].mean()) / (b["adv"].std() + 1e-8)
        a_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip, 1 + clip) * adv).mean()
        return a_loss + vf_coef * v_loss - ent_coef * entropy

    def train(key):
        k_params, k_env, key = jax.random.split(key, 3)
        ka, kc = jax.random.split(k_params)
        params = {"actor": mlp_init(ka, 2, 0.01), "critic": mlp_init(kc, 1, 1.0)}
        opt_state = opt.init(params)
        env_state, obs = jax.vmap(env_reset)(jax.random.split(k_env, num_envs))

        def step(carry, _):
            params, env_state, obs, ret, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            logits = mlp(params["actor"], obs)
            action = jax.random.categorical(k_act, logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]
            value = mlp(params["critic"], obs)[:, 0]
            env_state, next_obs, reward, done = jax.vmap(env_step)(
                jax.random.split(k_env, num_envs), env_state, action
            )
            ret = ret + reward
            tr = {
                "obs": obs,
                "action": action,
                "log_prob": log_prob,
                "value": value,
                "reward": reward,
                "done": done,
                "finished": jnp.where(done, ret, 0.0),
            }
            return (params, env_state, next_obs, jnp.where(done, 0.0, ret), key), tr

        def update(carry, _):
            params, opt_state, env_state, obs, ret, key = carry
            (_, env_state, obs, ret, key), traj = jax.lax.scan(
                step, (params, env_state, obs, ret, key), None, num_steps
            )
            last_value = mlp(params["critic"], obs)[:, 0]

            def gae(c, t):
                adv, next_value = c
                nd = 1.0 - t["done"].astype(jnp.float32)
                delta = t["reward"] + gamma * next_value * nd - t["value"]
                adv = delta + gamma * lam * nd * adv
                return (adv, t["value"]), adv

            xs = {k: traj[k] for k in ("reward", "value", "done")}
            _, adv = jax.lax.scan(gae, (jnp.zeros_like(last_value), last_value), xs, reverse=True)
            data = {
                "obs": traj["obs"],
                "action": traj["action"],
                "log_prob": traj["log_prob"],
                "value": traj["value"],
                "adv": adv,
                "target": adv + traj["value"],
            }
            data = jax.tree_util.tree_map(lambda v: v.reshape((batch, *v.shape[2:])), data)
            key, k_ep = jax.random.split(key)

            def epoch(c, k):
                perm = jax.random.permutation(k, batch)
                shuffled = jax.tree_util.tree_map(
                    lambda v: v[perm].reshape((minibatches, mb, *v.shape[1:])), data
                )

                def minibatch(c, b):
                    params, opt_state = c
                    grads = jax.grad(loss_fn)(params, b)
                    updates, opt_state = opt.update(grads, opt_state, params)
                    return (optax.apply_updates(params, updates), opt_state), None

                return jax.lax.scan(minibatch, c, shuffled)[0], None

            (params, opt_state), _ = jax.lax.scan(
                epoch, (params, opt_state), jax.random.split(k_ep, epochs)
            )
            mean_ret = traj["finished"].sum() / jnp.maximum(traj["done"].sum(), 1)
            return (params, opt_state, env_state, obs, ret, key), mean_ret

        init = (params, opt_state, env_state, obs, jnp.zeros(num_envs), key)
        _, rets = jax.lax.scan(update, init, None, num_updates)
        return rets[-1]

    return train


if __name__ == "__main__":
    main()
