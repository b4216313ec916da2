"""Bad input to functd.optim and the training helpers: clear errors, inputs unchanged."""

import pytest
import torch

import functd as fd

DT = torch.float64


def P():
    return fd.TensorDict(
        {"0": {"weight": torch.ones(4, 3, dtype=DT), "bias": torch.zeros(4, dtype=DT)}}
    )


def snapshot(*trees):
    return [(x, x.clone(), x._version) for t in trees for x in fd.tree.leaves(t)]


def unchanged(snap):
    return all(x._version == v and torch.equal(x, c) for x, c, v in snap)


def test_grads_with_a_missing_key_name_the_key():
    params = P()
    opt = fd.optim.adam(1e-3)
    state = opt.init(params)
    grads = params.exclude(("0", "bias")).apply(torch.ones_like)
    snap = snapshot(params, state, grads)
    with pytest.raises(
        ValueError,
        match=r"fd.optim.adam.update: grads and opt_state\['exp_avg'\] differ at key \('0', 'bias'\).*keys only in opt_state",
    ):
        opt.update(grads, state, params)
    assert unchanged(snap)


def test_grads_with_a_wrong_shape_name_the_key_and_shapes():
    params = P()
    opt = fd.optim.sgd(0.1, momentum=0.9)
    state = opt.init(params)
    grads = params.set(("0", "weight"), torch.ones(3, 4, dtype=DT))
    with pytest.raises(
        ValueError,
        match=r"differ at key \('0', 'weight'\) \(entry \('0', 'weight'\) has shape \[3, 4\] in grads but \[4, 3\]",
    ):
        opt.update(grads, state, params)


def test_state_of_another_params_layout():
    params = P()
    other = fd.TensorDict({"w": torch.ones(2, dtype=DT)})
    opt = fd.optim.rmsprop()
    state = opt.init(other)
    with pytest.raises(
        ValueError,
        match=r"rmsprop.update: grads and opt_state\['square_avg'\] differ at key .*opt.init\(params\)",
    ):
        opt.update(params.apply(torch.ones_like), state, params)


def test_state_of_another_optimizer():
    params = P()
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
    assert unchanged(snap)


def test_state_that_is_not_a_tensordict():
    params = P()
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
    params = P().set(("bn", "num_batches_tracked"), torch.tensor(3))
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
    assert unchanged(snap)


def test_params_that_are_not_a_tensordict():
    with pytest.raises(
        TypeError, match=r"fd.optim.sgd.init: params must be a functd TensorDict, got a dict. Wrap"
    ):
        fd.optim.sgd().init({"w": torch.ones(2)})


def test_weight_decay_needs_params():
    params = P()
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
    params = P()
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
    params = P()
    a = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-3)
    b = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-3, b1=0.8)
    with pytest.raises(
        ValueError,
        match=r"opt_state\['hyperparams'\]\): opt_state does not come from this optimizer's init: expected the entries \['b1', 'lr'\], got \['lr'\]",
    ):
        b.update(params, a.init(params), params)


# ------------------------------------------------------------------ training helpers
def test_train_step_rejects_bad_arguments_and_non_scalar_losses():
    params = P()
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
    assert unchanged(snap)

    def bad_aux(p, b, k):
        return p["0", "bias"].sum(), "note"

    step = fd.train_step(bad_aux, fd.optim.sgd(0.1))
    with pytest.raises(
        TypeError, match=r"the aux of loss_fn must be a tensor, a dict of tensors or a TensorDict"
    ):
        step(params, fd.optim.sgd(0.1).init(params), None, None)


def test_fit_rejects_iterators_for_several_epochs_and_bad_epochs():
    params = P()
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
