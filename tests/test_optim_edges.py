"""The optimizers on the edges optax handles: mixed precision (grads and params of
different floating dtypes) and empty params trees.

Mixed precision: each step is checked against ``torch.optim`` in float64 (lion,
which torch lacks, against its paper's formula written out here), fed the same
rounded inputs; the statistics keep the params' dtype, the updates come in the
promoted dtype of grads and params (optax's type promotion).
"""

import pytest
import torch

import functd as fd
from functd.testing import assert_close
from tests._support.optim_cases import CASES

optim = fd.optim
F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64

# (grads dtype, params dtype) -> tolerance of the float64 reference
MIXED = {
    (F16, F32): 1e-6,  # computed in float32 from the rounded grads
    (BF16, F32): 1e-6,
    (F32, F16): 2e-3,  # the statistics are stored in float16: two float16 epsilons
    (F32, BF16): 1.6e-2,  # two bfloat16 epsilons
}


def _params(dtype):
    g = torch.Generator().manual_seed(0)
    return fd.TensorDict(
        {"w": torch.randn(3, 4, generator=g), "b": {"c": torch.randn(5, generator=g)}}, []
    ).apply(lambda x: x.to(dtype))


def _grads(step, dtype):
    # magnitudes in [0.5, 1.5], signs fixed across steps: float16 statistics stay normal
    g = torch.Generator().manual_seed(1)
    w = (torch.rand(3, 4, generator=g) + 0.5) * torch.randn(3, 4, generator=g).sign()
    c = (torch.rand(5, generator=g) + 0.5) * torch.randn(5, generator=g).sign()
    return fd.TensorDict({"w": w, "b": {"c": c}}, []).apply(
        lambda x: (x * (1 + 0.1 * step)).to(dtype)
    )


def _torch_updates(make, params, grads_per_step):
    """torch.optim in float64 on one tensor per leaf; each step starts from ``params``."""
    keys = sorted(params.keys(True, True), key=str)
    p0 = [params.get(k).to(F64) for k in keys]
    ps = [x.clone().requires_grad_() for x in p0]
    opt = make(ps)
    out = []
    for grads in grads_per_step:
        with torch.no_grad():
            for p, x, k in zip(ps, p0, keys):
                p.copy_(x)
                p.grad = grads.get(k).to(F64)
        opt.step()
        out.append({k: (p.detach() - x) for k, p, x in zip(keys, ps, p0)})
    return out


def _lion_updates(params, grads_per_step, lr=1e-3, b1=0.9, b2=0.99, wd=0.5):
    keys = sorted(params.keys(True, True), key=str)
    m = {k: torch.zeros_like(params.get(k), dtype=F64) for k in keys}
    out = []
    for grads in grads_per_step:
        step = {}
        for k in keys:
            g, p = grads.get(k).to(F64), params.get(k).to(F64)
            step[k] = -lr * (torch.sign(b1 * m[k] + (1 - b1) * g) + wd * p)
            m[k] = b2 * m[k] + (1 - b2) * g
        out.append(step)
    return out


@pytest.mark.parametrize("dtypes", sorted(MIXED, key=str), ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("name", sorted(CASES))
def test_mixed_precision_steps_equal_a_float64_reference(name, dtypes):
    gdt, pdt = dtypes
    make, make_torch = CASES[name]
    opt = make()
    params = _params(pdt)
    grads = [_grads(i, gdt) for i in range(3)]
    ref = (
        _lion_updates(params, grads) if make_torch is None
        else _torch_updates(make_torch, params, grads)
    )  # fmt: skip
    # the dtype of what the step reads: plain sgd reads the grads alone (-lr * g)
    out_dt = gdt if name == "sgd" else torch.promote_types(gdt, pdt)
    rtol = max(MIXED[dtypes], 2 * torch.finfo(out_dt).eps)
    state = opt.init(params)
    for i, g in enumerate(grads):
        updates, state = opt.update(g, state, params)
        for k, expected in ref[i].items():
            got = updates.get(k)
            assert got.dtype == out_dt, (k, got.dtype)
            torch.testing.assert_close(got.to(F64), expected, rtol=rtol, atol=1e-7)
        for path, leaf in zip(fd.tree.paths(state), fd.tree.leaves(state)):
            if path[0] != "count":
                assert leaf.dtype == pdt, (path, leaf.dtype)
    new = optim.apply_updates(params, updates)
    assert all(x.dtype == pdt for x in fd.tree.leaves(new))


def test_mixed_precision_adam_from_the_issue():
    params = fd.TensorDict({"w": torch.ones(3)}, [])
    for half in (F16, BF16):
        grads = fd.TensorDict({"w": torch.full((3,), 0.5, dtype=half)}, [])
        opt = optim.adam(0.1)
        updates, state = opt.update(grads, opt.init(params), params)
        # the first Adam step is -lr * sign(g) (up to eps)
        assert_close(updates, fd.TensorDict({"w": torch.full((3,), -0.1)}, []), rtol=1e-6, atol=0)
        assert state["exp_avg", "w"].dtype == F32


# ------------------------------------------------------------------ empty trees
def _factories():
    sched = optim.constant(0.1)
    return {
        "sgd": optim.sgd(0.1, momentum=0.9, weight_decay=0.1),
        "adam": optim.adam(0.1, amsgrad=True),
        "adamw": optim.adamw(0.1),
        "rmsprop": optim.rmsprop(0.1, momentum=0.5, centered=True),
        "adagrad": optim.adagrad(0.1, lr_decay=0.1),
        "lion": optim.lion(0.1, weight_decay=0.1),
        "add_decayed_weights": optim.add_decayed_weights(0.1),
        "clip": optim.clip(1.0),
        "clip_by_global_norm": optim.clip_by_global_norm(1.0),
        "scale": optim.scale(0.5),
        "scale_by_adam": optim.scale_by_adam(),
        "scale_by_learning_rate": optim.scale_by_learning_rate(sched),
        "scale_by_lion": optim.scale_by_lion(),
        "scale_by_rms": optim.scale_by_rms(),
        "scale_by_schedule": optim.scale_by_schedule(sched),
        "trace": optim.trace(0.9),
        "identity": optim.identity(),
        "set_to_zero": optim.set_to_zero(),
        "chain": optim.chain(optim.clip(1.0), optim.adam(0.1)),
        "named_chain": optim.named_chain(("clip", optim.clip(1.0)), ("adam", optim.adam(0.1))),
        "masked": optim.masked(optim.sgd(1.0), {}),
        "multi_transform": optim.multi_transform({0: optim.sgd(1.0)}, lambda path, x: 0),
        "MultiSteps": optim.MultiSteps(optim.adam(0.1), 2),
        "apply_every": optim.apply_every(2),
        "inject_hyperparams": optim.inject_hyperparams(optim.adam)(0.1),
        "skip_nonfinite": optim.skip_nonfinite(optim.adam(0.1)),
        "ema": optim.ema(0.9),
        "zero_nans": optim.zero_nans(),
        "adam_mu_dtype": optim.adam(0.1, mu_dtype=torch.bfloat16),
    }


#: public names of functd.optim that are not transformations (or not factories of one)
NOT_TRANSFORMATIONS = {
    "GradientTransformation", "Partial", "apply_updates", "incremental_update",
    "periodic_update", "constant", "cosine_decay", "exponential_decay", "linear",
    "warmup_cosine_decay", "skip_large_updates", "skip_not_finite", "tree_map_params",
}  # fmt: skip


def test_every_public_transformation_is_checked_on_an_empty_tree():
    missing = set(optim.__all__) - NOT_TRANSFORMATIONS - set(_factories())
    assert not missing, f"add {sorted(missing)} to _factories()"


@pytest.mark.parametrize("name", sorted(_factories()))
def test_empty_params_tree_is_a_no_op(name):
    opt = _factories()[name]
    empty = fd.TensorDict({}, [])
    state = opt.init(empty)
    for _ in range(2):  # MultiSteps/apply_every: both branches
        updates, state = opt.update(empty, state, empty)
        assert isinstance(updates, fd.TensorDict) and not list(updates.keys())
    assert optim.apply_updates(empty, updates).keys() == empty.keys()


@pytest.mark.parametrize("dtypes", sorted(MIXED, key=str), ids=lambda d: f"{d[0]}-{d[1]}")
def test_every_public_transformation_steps_mixed_precision_as_in_float64(dtypes):
    # none may crash; each equals its own float64 run (the same formula) within the
    # tolerance of the dtypes at play
    gdt, pdt = dtypes
    txs = _factories()
    txs["masked"] = optim.masked(optim.sgd(1.0, momentum=0.9), lambda path, x: x.ndim > 1)
    txs["multi_transform"] = optim.multi_transform(
        {0: optim.adam(0.1), 1: optim.lion(0.1)}, lambda path, x: int(x.ndim > 1)
    )
    params = _params(pdt)
    p64 = params.apply(lambda x: x.to(F64))
    for name, opt in sorted(txs.items()):
        s, s64 = opt.init(params), opt.init(p64)
        for i in range(3):
            g = _grads(i, gdt)
            u, s = opt.update(g, s, params)
            u64, s64 = opt.update(g.apply(lambda x: x.to(F64)), s64, p64)
        for a, b in zip(fd.tree.leaves(u), fd.tree.leaves(u64)):
            rtol = max(MIXED[dtypes], 2 * torch.finfo(a.dtype).eps)
            scale = b.abs().max().item()  # relative to the leaf's scale (signs may cross 0)
            torch.testing.assert_close(a.to(F64), b, rtol=0, atol=rtol * scale, msg=name)


def test_mixed_precision_under_vmap_equals_a_loop():
    opt = optim.adamw(0.1)
    g = torch.Generator().manual_seed(2)
    ens = fd.stack(
        [_params(F32).apply(lambda x: x + torch.randn(x.shape, generator=g)) for _ in range(2)]
    )
    grads = fd.stack([_grads(0, F16), _grads(1, F16)])
    uv, sv = fd.vmap(opt.update)(grads, fd.vmap(opt.init)(ens), ens)
    assert uv["w"].dtype == F32 and sv["exp_avg", "w"].dtype == F32
    for i in range(2):
        ul, sl = opt.update(grads[i], opt.init(ens[i]), ens[i])
        # vmap steps with a tensor count (the eager path with a Python float): float32 rounding
        assert_close(uv[i], ul, rtol=1e-5, atol=1e-6)
        assert_close(sv[i], sl, rtol=1e-5, atol=1e-6)
