"""examples/train_policy.py: REINFORCE on the tutorial's GRU policy learns, purely.

The example is imported (QUICK=1) and its training function run; its loss and
gradient are checked against plain torch (nn.GRUCell, tensordict's
NormalParamExtractor, torch.distributions.Normal, loss.backward()).
"""

import importlib.util
import pathlib

import pytest
import torch
from torch import distributions as D

import functd as fd

PATH = pathlib.Path(__file__).parents[1] / "examples" / "train_policy.py"


@pytest.fixture(scope="module")
def ex():
    mp = pytest.MonkeyPatch()
    mp.setenv("QUICK", "1")
    try:
        spec = importlib.util.spec_from_file_location("train_policy_example", PATH)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        mp.undo()
    return mod


def _snapshot(*trees):
    return [(x, x.clone(), x._version) for x in fd.tree.leaves(trees)]


def _unchanged(snap):
    for x, c, v in snap:
        assert x._version == v and torch.equal(x, c)


def test_quick_training_improves_the_reward_and_the_deterministic_error(ex):
    assert ex.QUICK and ex.ITERS <= 200
    params, history = ex.train()
    (i0, r0, e0), (i1, r1, e1) = history[0], history[-1]
    assert (i0, i1) == (1, ex.ITERS)
    assert r0 < -0.8 and r1 > -0.45, (r0, r1)  # the average reward rose a lot
    assert e1 < e0 / 10, (e0, e1)  # the mean action is close to the target
    # the trained deterministic policy on fresh observations, checked here directly
    obs = fd.random.uniform(fd.random.key(123), (64, ex.OBS), minval=-1.0, maxval=1.0)
    td = fd.TensorDict({"input": obs, "hidden": torch.zeros(64, ex.HIDDEN)}, [64])
    err = ((ex.POLICY(params, td)["action"] - ex.target(obs)) ** 2).mean()
    assert err < 0.03


def test_the_training_step_is_pure_and_changes_the_params(ex):
    params = ex.POLICY.init(fd.random.key(0))
    opt_state = ex.OPTIMIZER.init(params)
    episodes = ex.rollout(params, fd.random.key(1), episodes=16)
    snap = _snapshot(params, opt_state, episodes)
    step = fd.train_step(ex.loss_fn, ex.OPTIMIZER)
    new_p, new_s, metrics = step(params, opt_state, episodes, None)
    _unchanged(snap)
    assert all(not torch.equal(a, b) for a, b in zip(fd.tree.leaves(new_p), fd.tree.leaves(params)))
    assert int(new_s["count"]) == 1 and int(opt_state["count"]) == 0
    assert torch.equal(metrics["reward"], episodes["reward"].mean())
    # same inputs, same outputs
    again = step(params, opt_state, episodes, None)
    fd.testing.assert_close(again[0], new_p, rtol=0, atol=0)


def test_rollout_is_a_pure_function_of_params_and_key(ex):
    params = ex.POLICY.init(fd.random.key(0))
    snap = _snapshot(params)
    a = ex.rollout(params, fd.random.key(5), episodes=8)
    _unchanged(snap)
    assert a.batch_size == (8, ex.STEPS)
    fd.testing.assert_close(ex.rollout(params, fd.random.key(5), episodes=8), a, rtol=0, atol=0)
    b = ex.rollout(params, fd.random.key(6), episodes=8)
    assert not torch.equal(a["action"], b["action"]) and not torch.equal(a["input"], b["input"])
    # the reward is the example's formula, the return sums the rewards from t on
    r = -((a["action"] - ex.target(a["input"])) ** 2).mean(-1)
    torch.testing.assert_close(a["reward"], r)
    torch.testing.assert_close(a["return"][:, 0], r.sum(1))
    torch.testing.assert_close(a["return"][:, -1], r[:, -1])


def test_loss_and_gradient_match_plain_torch(ex):
    tdnn = pytest.importorskip("tensordict.nn")
    params = ex.POLICY.init(fd.random.key(2))
    episodes = ex.rollout(params, fd.random.key(3), episodes=32)
    loss, aux = ex.loss_fn(params, episodes, None)
    grads = torch.func.grad(lambda p: ex.loss_fn(p, episodes, None)[0])(params)

    gru = torch.nn.GRUCell(ex.OBS, ex.HIDDEN)
    gru.load_state_dict(dict(params["0"].items()))
    extractor = tdnn.NormalParamExtractor()
    h = torch.zeros(32, ex.HIDDEN)
    logps = []
    for t in range(ex.STEPS):
        h = gru(episodes["input"][:, t], h)
        loc, scale = extractor(h)
        logps.append(D.Normal(loc, scale).log_prob(episodes["action"][:, t]).sum(-1))
    ret = episodes["return"]
    adv = (ret - ret.mean(0)) / (ret.std(0) + 1e-6)
    ref = -(adv * torch.stack(logps, 1)).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    for name, p in gru.named_parameters():
        torch.testing.assert_close(grads["0", name], p.grad, msg=name)
    torch.testing.assert_close(aux["reward"], episodes["reward"].mean())
