"""functd.optim against torch.optim: every optimizer in lockstep for 50 steps (float64);
bad input (grads, state, hyperparameters, params) gives a clear error, inputs unchanged.

Lion is not in torch.optim: its reference is the paper's Algorithm 2 written
here as an in-place torch loop.
"""

import pytest
import torch

import functd as fd
from tests._support.optim_cases import CASES, DT, data, grads, make_net
from tests._support.snapshot import assert_unchanged, snapshot

STEPS = 50
RTOL = 1e-6


def torch_params(net):
    return {tuple(k.split(".")): v.detach() for k, v in net.state_dict().items()}


def assert_params_close(p: fd.TensorDict, net, rtol=RTOL):
    for key, ref in torch_params(net).items():
        torch.testing.assert_close(p[key], ref, rtol=rtol, atol=rtol * ref.abs().max().item())


def minibatch(x, y, i):
    j = (i % 4) * 8
    return x[j : j + 8], y[j : j + 8]


def run_torch(net, opt, x, y, steps=STEPS, scheduler=None, hook=None):
    for i in range(steps):
        xb, yb = minibatch(x, y, i)
        opt.zero_grad()
        ((net(xb) - yb) ** 2).mean().backward()
        if hook is not None:
            hook(net)
        opt.step()
        if scheduler is not None:
            scheduler.step()


def run_functd(opt, params, x, y, steps=STEPS):
    state = opt.init(params)
    for i in range(steps):
        g = grads(params, *minibatch(x, y, i))
        updates, state = opt.update(g, state, params)
        params = fd.optim.apply_updates(params, updates)
    return params, state


def lion_reference(net, x, y, lr, b1, b2, wd, steps=STEPS):
    """Chen et al. 2023, Algorithm 2 (decoupled weight decay)."""
    ms = [torch.zeros_like(p) for p in net.parameters()]
    for i in range(steps):
        xb, yb = minibatch(x, y, i)
        net.zero_grad()
        ((net(xb) - yb) ** 2).mean().backward()
        with torch.no_grad():
            for p, m in zip(net.parameters(), ms):
                c = b1 * m + (1 - b1) * p.grad
                p.add_(torch.sign(c) + wd * p, alpha=-lr)
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_lockstep_with_torch_optim(name):
    make_fd, make_torch = CASES[name]
    x, y = data()
    net = make_net()
    params = fd.from_module(net).clone()  # torch.optim writes into net
    if make_torch is None:
        lion_reference(net, x, y, lr=1e-3, b1=0.9, b2=0.99, wd=0.5)
    else:
        run_torch(net, make_torch(net.parameters()), x, y)
    out, state = run_functd(make_fd(), params, x, y)
    assert_params_close(out, net)
    assert state["count"].item() == STEPS
    assert not torch.equal(out["0", "weight"], params["0", "weight"])  # it trained


def test_state_matches_torch_state_names_and_values():
    x, y = data()
    net = make_net()
    params = fd.from_module(net).clone()  # torch.optim writes into net
    opt = torch.optim.Adam(net.parameters(), 1e-2, amsgrad=True)
    run_torch(net, opt, x, y, steps=5)
    _, state = run_functd(fd.optim.adam(1e-2, amsgrad=True), params, x, y, steps=5)
    names = dict(zip(net.parameters(), net.state_dict()))
    for p, st in opt.state.items():
        key = tuple(names[p].split("."))
        for entry in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            torch.testing.assert_close(state[entry][key], st[entry], rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ schedules
SCHEDULED = {
    "exponential": (
        lambda lr: fd.optim.exponential_decay(lr, 1, 0.95),
        lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.95),
    ),
    "step": (
        lambda lr: fd.optim.exponential_decay(lr, 7, 0.5, staircase=True),
        lambda o: torch.optim.lr_scheduler.StepLR(o, 7, 0.5),
    ),
    "cosine": (
        lambda lr: fd.optim.cosine_decay(lr, STEPS, alpha=0.1),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, STEPS, eta_min=0.1 * 0.05),
    ),
    "linear": (
        lambda lr: fd.optim.linear(0.2 * lr, lr, transition_steps=20),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.2, 1.0, total_iters=20),
    ),
}


@pytest.mark.parametrize("sched", sorted(SCHEDULED))
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_schedules_in_lockstep_with_lr_scheduler(sched, opt_name):
    make_sched, make_torch_sched = SCHEDULED[sched]
    x, y = data()
    net = make_net()
    params = fd.from_module(net).clone()  # torch.optim writes into net
    if opt_name == "sgd":
        topt = torch.optim.SGD(net.parameters(), 0.05, momentum=0.9)
        opt = fd.optim.sgd(make_sched(0.05), momentum=0.9)
    else:
        topt = torch.optim.Adam(net.parameters(), 0.05)
        opt = fd.optim.adam(make_sched(0.05))
    run_torch(net, topt, x, y, scheduler=make_torch_sched(topt))
    out, _ = run_functd(opt, params, x, y)
    assert_params_close(out, net)


@pytest.mark.parametrize("sched", sorted(SCHEDULED))
def test_schedule_values_match_lr_scheduler(sched):
    make_sched, make_torch_sched = SCHEDULED[sched]
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], 0.05)
    ts = make_torch_sched(opt)
    s = make_sched(0.05)
    for count in range(STEPS):
        lr = opt.param_groups[0]["lr"]
        assert s(torch.tensor(count, dtype=DT)).item() == pytest.approx(lr, rel=1e-9, abs=1e-15)
        opt.step()
        ts.step()


def test_warmup_cosine_decay_closed_form():
    import math

    s = fd.optim.warmup_cosine_decay(0.1, 1.0, warmup_steps=10, decay_steps=50, end_value=0.05)
    for t in range(70):
        if t < 10:
            want = 0.1 + 0.9 * t / 10
        else:
            frac = min(t - 10, 40) / 40
            want = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))
        assert s(torch.tensor(t, dtype=DT)).item() == pytest.approx(want, rel=1e-12)
    assert s(5).dtype == torch.get_default_dtype()  # Python ints are accepted


def test_constant_and_exponential_end_value():
    assert fd.optim.constant(0.3)(torch.tensor(7, dtype=DT)).item() == 0.3
    s = fd.optim.exponential_decay(1.0, 1, 0.5, transition_begin=2, end_value=0.2)
    got = [s(torch.tensor(t, dtype=DT)).item() for t in range(6)]
    assert got == [1.0, 1.0, 1.0, 0.5, 0.25, 0.2]


# ------------------------------------------------------------------ building blocks
def test_clip_by_global_norm_matches_clip_grad_norm():
    x, y = data()
    net = make_net()
    params = fd.from_module(net).clone()  # torch.optim writes into net
    topt = torch.optim.SGD(net.parameters(), 0.1)

    def hook(n):
        torch.nn.utils.clip_grad_norm_(n.parameters(), 0.3)

    run_torch(net, topt, x, y, hook=hook)
    opt = fd.optim.chain(fd.optim.clip_by_global_norm(0.3), fd.optim.sgd(0.1))
    out, _ = run_functd(opt, params, x, y)
    assert_params_close(out, net)


def test_clip_matches_clip_grad_value():
    x, y = data()
    net = make_net()
    params = fd.from_module(net).clone()  # torch.optim writes into net
    topt = torch.optim.Adam(net.parameters(), 0.01)

    def hook(n):
        torch.nn.utils.clip_grad_value_(n.parameters(), 0.05)

    run_torch(net, topt, x, y, hook=hook)
    out, _ = run_functd(fd.optim.chain(fd.optim.clip(0.05), fd.optim.adam(0.01)), params, x, y)
    assert_params_close(out, net)


CHAINS = {
    "adam_wd": (
        fd.optim.adam(1e-2, weight_decay=0.1),
        fd.optim.chain(
            fd.optim.add_decayed_weights(0.1),
            fd.optim.scale_by_adam(),
            fd.optim.scale_by_learning_rate(1e-2),
        ),
    ),
    "adamw": (
        fd.optim.adamw(1e-2, weight_decay=0.1),
        fd.optim.chain(
            fd.optim.scale_by_adam(),
            fd.optim.add_decayed_weights(0.1),
            fd.optim.scale(-1e-2),
        ),
    ),
    "sgd_nesterov": (
        fd.optim.sgd(0.05, momentum=0.9, nesterov=True),
        fd.optim.chain(fd.optim.trace(0.9, nesterov=True), fd.optim.scale_by_learning_rate(0.05)),
    ),
    "rmsprop": (
        fd.optim.rmsprop(1e-2, centered=True),
        fd.optim.chain(
            fd.optim.scale_by_rms(centered=True),
            fd.optim.scale_by_learning_rate(fd.optim.constant(1e-2)),
        ),
    ),
    "lion": (
        fd.optim.lion(1e-3),
        fd.optim.chain(
            fd.optim.scale_by_lion(), fd.optim.scale_by_schedule(fd.optim.constant(-1e-3))
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_optimizer_equals_its_chain_of_building_blocks(name):
    alias, chained = CHAINS[name]
    x, y = data()
    params = fd.from_module(make_net())
    a, _ = run_functd(alias, params, x, y, steps=20)
    b, _ = run_functd(chained, params, x, y, steps=20)
    fd.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_inject_hyperparams_lockstep_and_lr_change_mid_run():
    x, y = data()
    net = make_net()
    params = fd.from_module(net).clone()  # torch.optim writes into net
    topt = torch.optim.Adam(net.parameters(), 1e-2, betas=(0.8, 0.999))
    run_torch(net, topt, x, y, steps=20)
    topt.param_groups[0]["lr"] = 3e-3
    run_torch(net, topt, x, y, steps=30)

    opt = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-2, b1=0.8)
    state = opt.init(params)
    assert state["hyperparams", "lr"].dtype == DT
    for i in range(50):
        if i == 20:
            state = state.set(("hyperparams", "lr"), torch.tensor(3e-3, dtype=DT))
        g = grads(params, *minibatch(x, y, i % 20 if i < 20 else i - 20))
        updates, state = opt.update(g, state, params)
        params = fd.optim.apply_updates(params, updates)
    assert_params_close(params, net)
    assert state["hyperparams", "b1"].item() == 0.8


def test_inject_hyperparams_schedule_is_evaluated_at_the_count():
    sched = fd.optim.exponential_decay(1.0, 1, 0.5)
    opt = fd.optim.inject_hyperparams(fd.optim.sgd)(lr=sched)
    params = fd.TensorDict({"w": torch.zeros(2, dtype=DT)})
    g = fd.TensorDict({"w": torch.ones(2, dtype=DT)})
    state = opt.init(params)
    for t in range(4):
        updates, state = opt.update(g, state)
        assert torch.allclose(updates["w"], torch.full((2,), -(0.5**t), dtype=DT))
        assert state["hyperparams", "lr"].item() == 0.5**t


def test_every_optimizer_has_a_lockstep_case():
    from functd.optim import _alias

    public = {
        n
        for n in dir(_alias)
        if n in fd.optim.__all__ and callable(getattr(_alias, n)) and n.islower()
    }
    assert public == {"sgd", "adam", "adamw", "rmsprop", "adagrad", "lion"}
    covered = {name.split("_")[0] for name in CASES}
    assert public <= covered, f"no lockstep case for {sorted(public - covered)}"


# ------------------------------------------------------------------ errors
def _p():
    return fd.TensorDict(
        {"0": {"weight": torch.ones(4, 3, dtype=DT), "bias": torch.zeros(4, dtype=DT)}}
    )


def test_grads_with_a_missing_key_name_the_key():
    params = _p()
    opt = fd.optim.adam(1e-3)
    state = opt.init(params)
    grads = params.exclude(("0", "bias")).apply(torch.ones_like)
    snap = snapshot(params, state, grads)
    with pytest.raises(
        ValueError,
        match=r"fd.optim.adam.update: grads and opt_state\['exp_avg'\] differ at key \('0', 'bias'\).*keys only in opt_state",
    ):
        opt.update(grads, state, params)
    assert_unchanged(snap)


def test_grads_with_a_wrong_shape_name_the_key_and_shapes():
    params = _p()
    opt = fd.optim.sgd(0.1, momentum=0.9)
    state = opt.init(params)
    grads = params.set(("0", "weight"), torch.ones(3, 4, dtype=DT))
    with pytest.raises(
        ValueError,
        match=r"differ at key \('0', 'weight'\) \(entry \('0', 'weight'\) has shape \[3, 4\] in grads but \[4, 3\]",
    ):
        opt.update(grads, state, params)


def test_state_of_another_params_layout():
    params = _p()
    other = fd.TensorDict({"w": torch.ones(2, dtype=DT)})
    opt = fd.optim.rmsprop()
    state = opt.init(other)
    with pytest.raises(
        ValueError,
        match=r"rmsprop.update: grads and opt_state\['square_avg'\] differ at key .*opt.init\(params\)",
    ):
        opt.update(params.apply(torch.ones_like), state, params)


def test_state_of_another_optimizer():
    params = _p()
    state = fd.optim.sgd(0.1, momentum=0.9).init(params)
    snap = snapshot(state)
    with pytest.raises(
        ValueError,
        match=r"fd.optim.adam.update: opt_state does not come from this optimizer's init: expected the entries \['count', 'exp_avg', 'exp_avg_sq'\], got \['count', 'momentum_buffer'\]",
    ):
        fd.optim.adam().update(params, state, params)
    with pytest.raises(ValueError, match=r"amsgrad or momentum on/off"):
        fd.optim.adam(amsgrad=True).update(params, fd.optim.adam().init(params), params)
    with pytest.raises(ValueError, match=r"fd.optim.chain.update: opt_state does not come"):
        fd.optim.chain(fd.optim.clip(1.0), fd.optim.adam()).update(params, state, params)
    assert_unchanged(snap)


def test_state_that_is_not_a_tensordict():
    params = _p()
    with pytest.raises(
        TypeError, match=r"fd.optim.adam.update: opt_state must be a functd TensorDict, got a dict"
    ):
        fd.optim.adam().update(params, {}, params)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: fd.optim.adam(lr=-1.0),
            r"fd.optim.adam\(lr=-1.0\): lr must be a finite number >= 0. To maximize",
        ),
        (lambda: fd.optim.sgd(lr=-0.1), r"fd.optim.sgd\(lr=-0.1\): lr must be"),
        (lambda: fd.optim.adamw(lr=float("nan")), r"fd.optim.adamw\(lr=nan\)"),
        (lambda: fd.optim.adam(b1=1.0), r"fd.optim.adam\(b1=1.0\): b1 must be in \[0, 1\)"),
        (lambda: fd.optim.adam(b2=-0.1), r"fd.optim.adam\(b2=-0.1\): b2 must be in \[0, 1\)"),
        (lambda: fd.optim.lion(b2=1.5), r"fd.optim.lion\(b2=1.5\): b2 must be in \[0, 1\)"),
        (lambda: fd.optim.rmsprop(alpha=1.0), r"fd.optim.rmsprop\(alpha=1.0\): alpha must be in"),
        (lambda: fd.optim.adam(eps=-1e-8), r"fd.optim.adam\(eps=-1e-08\): eps must be a finite"),
        (lambda: fd.optim.sgd(momentum=-0.5), r"fd.optim.sgd\(momentum=-0.5\)"),
        (lambda: fd.optim.adagrad(weight_decay=-1), r"fd.optim.adagrad\(weight_decay=-1\)"),
        (lambda: fd.optim.adagrad(lr_decay=-1.0), r"fd.optim.adagrad\(lr_decay=-1.0\)"),
        (
            lambda: fd.optim.adagrad(initial_accumulator_value=-1.0),
            r"fd.optim.adagrad\(initial_accumulator_value=-1.0\)",
        ),
        (lambda: fd.optim.rmsprop(momentum=-1.0), r"fd.optim.rmsprop\(momentum=-1.0\)"),
        # several bad values: the first in signature order is named
        (lambda: fd.optim.rmsprop(-1.0, alpha=2.0), r"fd.optim.rmsprop\(lr=-1.0\)"),
        (lambda: fd.optim.lion(b2=2.0, weight_decay=-1.0), r"fd.optim.lion\(b2=2.0\)"),
        (lambda: fd.optim.adamw(eps=-1.0, weight_decay=-1.0), r"fd.optim.adamw\(eps=-1.0\)"),
        (
            lambda: fd.optim.sgd(-0.1, momentum=0.0, nesterov=True),
            r"fd.optim.sgd\(lr=-0.1\)",
        ),
        (
            lambda: fd.optim.sgd(0.1, nesterov=True),
            r"fd.optim.sgd\(nesterov=True\) needs momentum > 0 and dampening = 0",
        ),
        (lambda: fd.optim.scale_by_learning_rate(-1e-3), r"scale_by_learning_rate\(lr=-0.001\)"),
        (
            lambda: fd.optim.cosine_decay(1.0, 0),
            r"fd.optim.cosine_decay\(decay_steps=0\): decay_steps must be an int >= 1",
        ),
        (
            lambda: fd.optim.warmup_cosine_decay(0.0, 1.0, 10, 10),
            r"decay_steps counts the warmup too",
        ),
        (lambda: fd.optim.exponential_decay(1.0, 10, 0.0), r"decay_rate must be > 0"),
    ],
)
def test_bad_hyperparameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_non_floating_params_name_the_key_and_say_to_split_them_off():
    params = _p().set(("bn", "num_batches_tracked"), torch.tensor(3))
    snap = snapshot(params)
    for opt in (
        fd.optim.adam(),
        fd.optim.clip(1.0),
        fd.optim.chain(fd.optim.clip(1.0), fd.optim.sgd()),
    ):
        with pytest.raises(
            TypeError,
            match=r"params entry \('bn', 'num_batches_tracked'\) has dtype torch.int64.*split "
            r"non-trainable entries.*fd.partition\(params, fd.trainable\(model\)\).*fd.combine",
        ):
            opt.init(params)
    assert_unchanged(snap)


def test_params_that_are_not_a_tensordict():
    with pytest.raises(
        TypeError, match=r"fd.optim.sgd.init: params must be a functd TensorDict, got a dict. Wrap"
    ):
        fd.optim.sgd().init({"w": torch.ones(2)})


def test_weight_decay_needs_params():
    params = _p()
    opt = fd.optim.adamw(1e-3)
    with pytest.raises(
        ValueError,
        match=r"fd.optim.adamw.update: weight_decay=0.01 needs the current params; call opt.update\(grads, opt_state, params\)",
    ):
        opt.update(params, opt.init(params))
    blk = fd.optim.add_decayed_weights(0.1)
    with pytest.raises(
        ValueError,
        match=r"add_decayed_weights.update: add_decayed_weights needs the current params",
    ):
        blk.update(params, blk.init(params))


def test_apply_updates_mismatch():
    params = _p()
    with pytest.raises(
        ValueError,
        match=r"fd.optim.apply_updates: params and updates differ at key \('0', 'bias'\)",
    ):
        fd.optim.apply_updates(params, params.exclude(("0", "bias")))
    with pytest.raises(TypeError, match=r"apply_updates: updates must be a functd TensorDict"):
        fd.optim.apply_updates(params, [torch.ones(1)])


def test_chain_and_wrappers_reject_non_transformations():
    with pytest.raises(
        TypeError,
        match=r"fd.optim.chain: argument 1 is a function, not a GradientTransformation.*call the factory",
    ):
        fd.optim.chain(fd.optim.clip(1.0), fd.optim.adam)
    with pytest.raises(TypeError, match=r"fd.optim.skip_nonfinite wraps a GradientTransformation"):
        fd.optim.skip_nonfinite(fd.optim.adam)
    with pytest.raises(TypeError, match=r"takes the factory, not a built optimizer"):
        fd.optim.inject_hyperparams(fd.optim.adam(1e-3))
    with pytest.raises(
        TypeError, match=r"inject_hyperparams\(adam\): got an unexpected keyword argument 'betas'"
    ):
        fd.optim.inject_hyperparams(fd.optim.adam)(betas=(0.9, 0.99))
    with pytest.raises(ValueError, match=r"fd.optim.adam\(lr=-1\)"):
        fd.optim.inject_hyperparams(fd.optim.adam)(lr=-1)


def test_inject_state_with_other_hyperparams():
    params = _p()
    a = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-3)
    b = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-3, b1=0.8)
    with pytest.raises(
        ValueError,
        match=r"opt_state\['hyperparams'\]\): opt_state does not come from this optimizer's init: expected the entries \['b1', 'lr'\], got \['lr'\]",
    ):
        b.update(params, a.init(params), params)
