"""examples/ppo_agents.py: PPO agents as one fd.vmap of a pure training run.

Small sizes (a few short updates), eager only. The GAE is checked against a loop written
here, the loss against its formula on plain torch ops and torch.distributions, agent
independence by running agent 0 alone and inside a batch of 3 (float64).
"""

import json
import math

import pytest
import torch
from torch import distributions as D

import functd as fd
from tests._support.example_modules import load_example

P = load_example("ppo_agents")
F64 = torch.float64
# two updates of 4 envs x 16 steps, 2 epochs of 2 minibatches: seconds, not minutes
TINY = P.Config(steps=128, num_steps=16, epochs=2, minibatches=2, dtype=F64)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: OpenMP's waits dominate on a loaded machine
    yield
    torch.set_num_threads(n)


def test_agent_is_the_same_alone_and_in_a_batch():
    train = fd.vmap(P.make_train(TINY))
    lrs = torch.tensor([2.5e-4, 0.0, 1e-3], dtype=F64)
    params3, metrics3 = train(P.agent_keys(7, 3), lrs)
    params1, metrics1 = train(P.agent_keys(7, 1), lrs[:1])
    assert params3.batch_size == (3,) and params1.batch_size == (1,)
    fd.testing.assert_close(params3[0], params1[0], rtol=0, atol=1e-8)
    torch.testing.assert_close(metrics3["return_sum"][0], metrics1["return_sum"][0])
    # the agents differ, and lr = 0 left agent 1 at its initial params
    assert not torch.allclose(
        params3["actor", "4", "weight"][0], params3["actor", "4", "weight"][2]
    )
    init = P.init_params(fd.random.split(P.agent_keys(7, 3)[1], 3)[0], TINY)
    fd.testing.assert_close(params3[1], init, rtol=0, atol=0)
    # the unbatched run is the same agent too
    params0, _ = P.make_train(TINY)(P.agent_keys(7, 1)[0], lrs[0])
    fd.testing.assert_close(params0, params1[0], rtol=0, atol=1e-8)


def test_the_cli_driver_runs_the_same_updates_as_train():
    lrs = torch.full((2,), 2.5e-4, dtype=F64)
    runner, hist, _, _ = P.run(TINY, 2, 3, lrs, jit=False, progress=False)
    params, metrics = fd.vmap(P.make_train(TINY))(P.agent_keys(3, 2), lrs)
    fd.testing.assert_close(runner["params"], params, rtol=0, atol=1e-12)
    torch.testing.assert_close(hist["episodes"], metrics["episodes"])
    torch.testing.assert_close(P.final_return_batch(runner), metrics["final_return"])


@pytest.mark.parametrize("agents", [1, 3])
def test_the_driver_keeps_one_runner_layout_so_fd_jit_compiles_once(agents):
    """fd.jit's signature holds every leaf's strides: the runner made by init and
    the runners updates return have the same, so --jit compiles one update."""
    from functd._transforms._signature import describe_change, signature

    init, step = P.make_driver(TINY)
    runner = init(P.agent_keys(0, agents), torch.full((agents,), 2.5e-4, dtype=F64))
    sigs = [signature((runner,), {})]
    for _ in range(2):
        runner = step(runner)[0]
        sigs.append(signature((runner,), {}))
    assert sigs[1] == sigs[0], describe_change(sigs[0], sigs[1])
    assert sigs[2] == sigs[0], describe_change(sigs[0], sigs[2])


def _gae_reference(reward, value, done, last_value, gamma, lam):
    T, E = reward.shape
    adv = torch.zeros(T, E, dtype=reward.dtype)
    for e in range(E):
        running, next_value = 0.0, float(last_value[e])
        for t in reversed(range(T)):
            nonterminal = 0.0 if bool(done[t, e]) else 1.0
            delta = float(reward[t, e]) + gamma * next_value * nonterminal - float(value[t, e])
            running = delta + gamma * lam * nonterminal * running
            adv[t, e] = running
            next_value = float(value[t, e])
    return adv


def test_gae_matches_a_hand_written_loop():
    g = torch.Generator().manual_seed(0)
    T, E = 9, 3
    reward = torch.rand(T, E, generator=g, dtype=F64)
    value = torch.randn(T, E, generator=g, dtype=F64)
    done = torch.rand(T, E, generator=g) < 0.25
    last = torch.randn(E, generator=g, dtype=F64)
    traj = fd.TensorDict({"reward": reward, "value": value, "done": done}, [T, E])
    adv, target = P.gae(traj, last, 0.99, 0.95)
    want = _gae_reference(reward, value, done, last, 0.99, 0.95)
    torch.testing.assert_close(adv, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(target, want + value)
    assert done.any()


def _mlp(p, x):
    for j in ("0", "2"):
        x = torch.tanh(x @ p[j, "weight"].T + p[j, "bias"])
    return x @ p["4", "weight"].T + p["4", "bias"]


def test_loss_matches_the_clipped_ppo_formula():
    g = torch.Generator().manual_seed(1)
    n = 32
    params = P.init_params(fd.random.key(4), TINY)
    params = params.apply(lambda t: t + 0.3 * torch.randn(t.shape, generator=g, dtype=F64))
    obs = torch.randn(n, 4, generator=g, dtype=F64)
    batch = fd.TensorDict(
        {
            "observation": obs,
            "action": torch.randint(0, 2, (n,), generator=g),
            "log_prob": -torch.rand(n, generator=g, dtype=F64) - 0.2,
            "value": torch.randn(n, generator=g, dtype=F64),
            "advantage": torch.randn(n, generator=g, dtype=F64),
            "target": torch.randn(n, generator=g, dtype=F64),
        },
        [n],
    )
    total, parts = P.ppo_loss(params, batch, TINY)
    # the formula, on plain torch ops
    pi = D.Categorical(logits=_mlp(params["actor"], obs))
    value = _mlp(params["critic"], obs)[:, 0]
    ratio = (pi.log_prob(batch["action"]) - batch["log_prob"]).exp()
    a = batch["advantage"]
    a = (a - a.mean()) / (a.var(unbiased=False).sqrt() + 1e-8)
    actor = -torch.min(ratio * a, torch.clip(ratio, 0.8, 1.2) * a).mean()
    v_old, tgt = batch["value"], batch["target"]
    v_clip = v_old + torch.clip(value - v_old, -0.2, 0.2)
    critic = 0.5 * torch.max((value - tgt) ** 2, (v_clip - tgt) ** 2).mean()
    ent = pi.entropy().mean()
    torch.testing.assert_close(parts["actor_loss"], actor)
    torch.testing.assert_close(parts["value_loss"], critic)
    torch.testing.assert_close(parts["entropy"], ent)
    torch.testing.assert_close(total, actor + 0.5 * critic - 0.01 * ent)
    assert (ratio - 1).abs().max() > 0.2  # the clip was exercised


def test_last10_keeps_the_latest_finished_episodes_in_order():
    g = torch.Generator().manual_seed(2)
    buf, ok, seen = torch.zeros(10, dtype=F64), torch.zeros(10, dtype=torch.bool), []
    for _ in range(5):
        ret = torch.rand(4, 3, generator=g, dtype=F64)
        done = torch.rand(4, 3, generator=g) < 0.3
        seen += ret[done].tolist()  # time-major, env order within a step
        buf, ok = P._last10(buf, ok, ret, done)
        want = seen[-10:]
        assert buf[ok].tolist() == want
        assert ok.tolist() == [False] * (10 - len(want)) + [True] * len(want)
    runner = {"last10": buf, "last10_valid": ok}
    assert math.isclose(float(P.final_return(runner)), sum(seen[-10:]) / 10)


def test_orthogonal_init_is_orthogonal_with_its_gain():
    w = P.orthogonal(fd.random.key(0), (64, 4), math.sqrt(2), F64)
    torch.testing.assert_close(w.T @ w, 2 * torch.eye(4, dtype=F64))
    w = P.orthogonal(fd.random.key(1), (2, 64), 0.01, F64)
    torch.testing.assert_close(w @ w.T, 1e-4 * torch.eye(2, dtype=F64))


def test_cli_writes_the_json_and_the_stacked_params(tmp_path, capsys):
    out, saved = tmp_path / "out.json", tmp_path / "params.pt"
    argv = ["--agents", "2", "--steps", "512", "--seed", "1", "--dtype", "float64"]
    argv += ["--json", str(out), "--save", str(saved), "--no-progress"]
    P.main(argv)
    figures = json.loads(out.read_text())
    assert set(figures) == {
        "agents",
        "steps_per_agent",
        "compile_s",
        "train_s",
        "final_return",
        "env_steps_per_s",
    }
    assert figures["agents"] == 2 and figures["steps_per_agent"] == 512
    assert len(figures["final_return"]) == 2
    assert all(5 < r < 200 for r in figures["final_return"])
    assert figures["train_s"] > 0 and figures["compile_s"] > 0
    assert math.isclose(figures["env_steps_per_s"], 2 * 512 / figures["train_s"])
    params = fd.load(saved)
    assert params.batch_size == (2,) and params["actor", "0", "weight"].dtype == F64
    assert "final return per agent" in capsys.readouterr().out


def test_cli_refuses_a_wrong_number_of_learning_rates(capsys):
    with pytest.raises(SystemExit):
        P.parse_args(["--agents", "3", "--lr", "1e-3", "2e-3"])
    assert "--lr: give one value or 3" in capsys.readouterr().err


def test_config_refuses_too_few_steps():
    with pytest.raises(ValueError, match=r"ppo_agents: steps=100 .* ask for at least 512"):
        P.Config(steps=100)


@pytest.mark.compile
def test_fd_jit_of_the_vmapped_loss_gradient_equals_eager():
    """The compiled gradient of PPO's loss over 4 agents (one 128-row minibatch each,
    float64) equals eager. With inductor's realize_opcount_threshold at 8 (fd.jit
    pins 30), inductor (torch 2.13) computed the actor's gradient wrong here (off by
    up to 100%) while the loss and the critic's gradient were right
    (notes/compile.md)."""
    import functools

    cfg = P.Config(steps=512, dtype=F64)
    runner = fd.vmap(functools.partial(P.init_runner, cfg=cfg))(
        P.agent_keys(0, 4), torch.full((4,), cfg.lr, dtype=F64)
    )
    after, traj = fd.vmap(functools.partial(P.rollout, cfg=cfg))(P.standard_strides(runner))
    runner, minibatches, _ = fd.vmap(functools.partial(P.prepare, cfg=cfg))(after, traj)
    params, mb = P.standard_strides(runner["params"]), P.standard_strides(minibatches[:, 0, 0])
    grad = fd.vmap(fd.grad(functools.partial(P.ppo_loss, cfg=cfg), has_aux=True))
    fd.testing.assert_close(fd.jit(grad)(params, mb), grad(params, mb), rtol=1e-9, atol=1e-12)
