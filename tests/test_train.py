"""fd.train_step and fd.fit: the same numbers as a hand-written loop, pure, with history;
bad arguments and non-scalar losses refused with a clear error; the progress line."""

import importlib.util

import pytest
import torch
from torch import nn

import functd as fd
from functd.testing import assert_close
from tests._support.optim_cases import DT, data, forward, make_net
from tests._support.snapshot import assert_unchanged, snapshot


def loss_fn(p, batch, key):
    pred = forward(p, batch["x"])
    return ((pred - batch["y"]) ** 2).mean(), {"mae": (pred - batch["y"]).abs().mean()}


def batches():
    x, y = data()
    return [fd.TensorDict({"x": x[i : i + 8], "y": y[i : i + 8]}, [8]) for i in range(0, 32, 8)]


def test_train_step_equals_the_hand_written_step_and_is_pure():
    params = fd.from_module(make_net()).clone()
    opt = fd.optim.adamw(1e-2)
    state = opt.init(params)
    batch = batches()[0]
    snap = [(x, x.clone(), x._version) for x in fd.tree.leaves((params, state, batch))]
    new_p, new_s, metrics = fd.train_step(loss_fn, opt)(params, state, batch, None)
    for x, c, v in snap:
        assert x._version == v and torch.equal(x, c)
    (g, (loss, aux)) = torch.func.grad_and_value(loss_fn, has_aux=True)(params, batch, None)
    u, ref_s = opt.update(g, state, params)
    assert_close(new_p, fd.optim.apply_updates(params, u), rtol=1e-12, atol=1e-14)
    assert_close(new_s, ref_s, rtol=1e-12, atol=1e-14)
    assert metrics.keys() == ("loss", "mae")
    torch.testing.assert_close(metrics["loss"], loss)
    torch.testing.assert_close(metrics["mae"], aux["mae"])
    assert not metrics["loss"].requires_grad


def test_train_step_accepts_a_plain_loss_and_unused_params():
    params = fd.from_module(make_net()).clone().set("unused", torch.ones(2, dtype=DT))
    opt = fd.optim.sgd(0.1)

    def plain(p, batch, key):
        return ((forward(p, batch["x"]) - batch["y"]) ** 2).mean()

    p, _, m = fd.train_step(plain, opt)(params, opt.init(params), batches()[0], None)
    assert m.keys() == ("loss",)
    assert torch.equal(p["unused"], params["unused"])  # zero gradient


def test_fit_equals_a_loop_and_returns_the_history(capsys):
    params = fd.from_module(make_net()).clone()
    opt = fd.optim.adam(1e-2)
    step = fd.train_step(loss_fn, opt)
    p, s, hist = fd.fit(step, params, opt.init(params), batches(), epochs=3, progress=False)
    assert capsys.readouterr().out == ""
    q, t = params, opt.init(params)
    losses = []
    for _ in range(3):
        for b in batches():
            q, t, m = step(q, t, b, None)
            losses.append(m["loss"])
    assert_close(p, q)
    assert_close(s, t)
    assert hist.batch_size == torch.Size([12])
    torch.testing.assert_close(hist["loss"], torch.stack(losses))
    assert hist["loss"][-4:].mean() < hist["loss"][:4].mean()


def test_fit_folds_the_key_per_step_and_takes_a_function_of_the_epoch():
    params = fd.TensorDict({"w": torch.zeros(3)})
    seen = []

    def noisy(p, batch, key):
        seen.append(key)
        return ((p["w"] - fd.random.normal(key, (3,))) ** 2).sum()

    step = fd.train_step(noisy, fd.optim.sgd(0.1))
    key = fd.random.key(7)
    fd.fit(
        step,
        params,
        fd.optim.sgd(0.1).init(params),
        lambda e: [e] * 2,
        key,
        epochs=2,
        progress=False,
    )
    assert len(seen) == 4
    for i, k in enumerate(seen):
        assert torch.equal(k, fd.random.fold_in(key, i))


@pytest.mark.skipif(importlib.util.find_spec("tqdm") is not None, reason="tqdm installed")
def test_fit_prints_plain_progress_without_tqdm(capsys):
    params = fd.from_module(make_net()).clone()
    opt = fd.optim.sgd(0.05)
    fd.fit(fd.train_step(loss_fn, opt), params, opt.init(params), batches(), epochs=2)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("epoch 1/2: loss ") and "mae " in lines[0] and "4 steps" in lines[0]


def test_train_step_keeps_the_params_check_mark_so_later_steps_skip_the_check(monkeypatch):
    """The modules check the detached copy of params the step differentiates; the mark
    is kept on the given params, so the next step's params (built from them) skip the
    check; a params TensorDict of another layout is still checked (and refused)."""
    import functd._modules._plan as plan_mod
    from functd._modules import _params_check

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])

    def loss(p, batch, key):
        return ((model(p, x=batch["x"]) - batch["y"]) ** 2).mean()

    opt = fd.optim.adam(1e-2)
    step = fd.train_step(loss, opt)
    params = fd.from_module(net)
    batch = fd.TensorDict({"x": torch.randn(5, 3), "y": torch.randn(5, 1)}, [5])
    p1, s1, _ = step(params, opt.init(params), batch, None)
    assert params._check_cache is not None  # the cache slot, as after model(params, ...)
    calls = []
    real = _params_check._check_params

    def counting(m, p):
        calls.append(m)
        return real(m, p)

    monkeypatch.setattr(_params_check, "_check_params", counting)
    monkeypatch.setattr(plan_mod, "_check_params", counting)
    p2, _, _ = step(p1, s1, batch, None)
    assert calls == []
    # the same numbers as torch (two Adam steps)
    topt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(2):
        topt.zero_grad()
        ((net(batch["x"]) - batch["y"]) ** 2).mean().backward()
        topt.step()
    assert_close(p2, fd.from_module(net), rtol=1e-5, atol=1e-6)
    wrong = fd.from_module(
        torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    )
    with pytest.raises(ValueError, match="expected \\[4, 3\\]"):
        step(wrong, opt.init(wrong), batch, None)
    assert len(calls) >= 1


def test_fd_grad_keeps_the_params_check_mark_on_the_params_it_is_given():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    x = torch.randn(5, 3)

    def loss(p, x):
        return model(p, x=x).pow(2).mean()

    params = fd.from_module(net)
    assert params._check_cache is None
    grads = fd.grad(loss)(params, x)
    assert params._check_cache is not None and grads.keys() == params.keys()
    net(x).pow(2).mean().backward()
    for name, w in net.named_parameters():
        torch.testing.assert_close(grads[tuple(name.split("."))], w.grad)


def test_train_step_is_a_frozen_value_equal_to_the_function_it_describes():
    opt = fd.optim.adam(1e-2)

    def loss_fn(params, batch, key):
        return ((params["w"] * batch).sum() - 1.0) ** 2

    step = fd.train_step(loss_fn, opt)
    assert isinstance(step, fd.TrainStep)
    assert step.loss_fn is loss_fn and step.optimizer is opt
    assert step == fd.train_step(loss_fn, fd.optim.adam(1e-2))
    assert hash(step) == hash(fd.train_step(loss_fn, fd.optim.adam(1e-2)))
    assert step != fd.train_step(loss_fn, fd.optim.adam(1e-3))
    with pytest.raises(AttributeError, match=r"fd.train_step\(loss_fn, ...\) is a frozen value"):
        step.optimizer = fd.optim.sgd(0.1)
    params = fd.TensorDict({"w": torch.tensor([1.0, 2.0])}, [])
    batch = torch.tensor([0.5, -1.0])
    new, _, metrics = step(params, opt.init(params), batch, None)
    # the same step by hand, with torch.optim.Adam as the reference
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    ref = torch.optim.Adam([w], lr=1e-2)
    loss = ((w * batch).sum() - 1.0) ** 2
    loss.backward()
    ref.step()
    torch.testing.assert_close(new["w"], w.detach())
    torch.testing.assert_close(metrics["loss"], loss.detach())
    assert torch.equal(params["w"], torch.tensor([1.0, 2.0]))  # not modified


# ---------------------------------------------------------------- errors
def _p():
    return fd.TensorDict(
        {"0": {"weight": torch.ones(4, 3, dtype=DT), "bias": torch.zeros(4, dtype=DT)}}
    )


def test_train_step_rejects_bad_arguments_and_non_scalar_losses():
    params = _p()
    with pytest.raises(
        TypeError,
        match=r"fd.train_step\(loss_fn, optimizer\): optimizer must be a GradientTransformation",
    ):
        fd.train_step(lambda p, b, k: p["0", "bias"].sum(), fd.optim.adam)

    def per_example(p, b, k):
        return p["0", "bias"] * 2

    step = fd.train_step(per_example, fd.optim.sgd(0.1))
    snap = snapshot(params)
    with pytest.raises(
        TypeError,
        match=r"fd.train_step\(per_example, ...\): loss_fn\(params, batch, key\) must return a scalar tensor .* got a tensor of shape \[4\]. Reduce",
    ):
        step(params, fd.optim.sgd(0.1).init(params), None, None)
    assert_unchanged(snap)

    def bad_aux(p, b, k):
        return p["0", "bias"].sum(), "note"

    step = fd.train_step(bad_aux, fd.optim.sgd(0.1))
    with pytest.raises(
        TypeError, match=r"the aux of loss_fn must be a tensor, a dict of tensors or a TensorDict"
    ):
        step(params, fd.optim.sgd(0.1).init(params), None, None)


def test_fit_rejects_iterators_for_several_epochs_and_bad_epochs():
    params = _p()
    opt = fd.optim.sgd(0.1)
    step = fd.train_step(lambda p, b, k: (p["0", "bias"] ** 2).sum(), opt)
    state = opt.init(params)
    with pytest.raises(
        ValueError, match=r"fd.fit: batches is an iterator, which is exhausted after one epoch"
    ):
        fd.fit(step, params, state, iter([None, None]), epochs=2, progress=False)
    with pytest.raises(ValueError, match=r"fd.fit\(epochs=0\): epochs must be an int >= 1"):
        fd.fit(step, params, state, [None], epochs=0, progress=False)
    with pytest.raises(ValueError, match=r"fd.fit: batches gave no batch"):
        fd.fit(step, params, state, [], progress=False)


@pytest.mark.parametrize("n, word", [(1, "1 step,"), (8, "8 steps,")])
def test_fit_progress_line_counts_steps(monkeypatch, capsys, n, word):
    import functd._train as train

    monkeypatch.setattr(train, "_progress_bar", lambda total, desc: None)
    model = fd.Module(nn.Linear(1, 1), ["x"], ["pred"])

    def loss_fn(p, batch, key):
        return ((model(p, batch)["pred"] - batch["y"]) ** 2).mean()

    params = fd.from_module(model)
    opt = fd.optim.sgd(0.1)
    batches = [fd.TensorDict({"x": torch.ones(4, 1), "y": torch.zeros(4, 1)}, [4])] * n
    fd.fit(fd.train_step(loss_fn, opt), params, opt.init(params), batches)
    line = capsys.readouterr().out.strip()
    assert line.startswith("epoch 1/1: loss ") and f"({word}" in line
