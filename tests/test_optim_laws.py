"""Laws of functd.optim: purity, vmap == loop, compile == eager, descent on a convex
problem, chain algebra, save/load round trip."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd._torch import TORCH_VERSION
from functd.testing import assert_close, tensordicts
from tests._support.optim_cases import CASES, DT, data, grads, make_net

OPTIMIZERS = {name: make for name, (make, _) in CASES.items()}
OPTIMIZERS["chain_clip_adamw_cosine"] = lambda: fd.optim.chain(
    fd.optim.clip_by_global_norm(0.5),
    fd.optim.adamw(fd.optim.warmup_cosine_decay(1e-3, 1e-2, 3, 20)),
)
OPTIMIZERS["inject_sgd"] = lambda: fd.optim.inject_hyperparams(fd.optim.sgd)(lr=0.05, momentum=0.9)
OPTIMIZERS["skip_nonfinite_adam"] = lambda: fd.optim.skip_nonfinite(fd.optim.adam(1e-2))


def snapshot(*trees):
    """Clones and version counters of every leaf: detects any write."""
    leaves = [x for t in trees for x in fd.tree.leaves(t)]
    return [(x, x.clone(), x._version) for x in leaves]


def assert_unchanged(snap):
    for x, copy, version in snap:
        assert x._version == version, "a leaf was written in place"
        assert torch.equal(x, copy)


# ------------------------------------------------------------------ purity
@given(
    params=tensordicts(batch_shape=(), min_keys=1, max_depth=2, dtypes=(torch.float64,)),
    name=st.sampled_from(sorted(OPTIMIZERS)),
)
def test_purity_nothing_given_is_modified(params, name):
    opt = OPTIMIZERS[name]()
    g = params.apply(lambda x: torch.cos(x) + 0.5)
    snap = snapshot(params, g)
    state = opt.init(params)
    for _ in range(2):
        state_snap = snapshot(state)
        updates, new_state = opt.update(g, state, params)
        new_params = fd.optim.apply_updates(params, updates)
        assert_unchanged(state_snap)
        assert_unchanged(snap)
        state = new_state
    assert fd.tree.structure(new_params) == fd.tree.structure(params)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_layout_is_params_shaped_plus_count(name):
    params = fd.from_module(make_net())
    state = OPTIMIZERS[name]().init(params)
    for key, leaf in state.items(include_nested=True, leaves_only=True):
        if key[-1] in ("count", "nonfinite_count"):
            assert leaf.shape == () and leaf.dtype == torch.int64
    assert state.batch_size == torch.Size([])


# ------------------------------------------------------------------ convexity
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_one_step_reduces_a_convex_loss(name):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 4, generator=g, dtype=DT)
    target = torch.randn(6, generator=g, dtype=DT)
    params = fd.TensorDict(
        {"w": torch.randn(4, generator=g, dtype=DT), "b": {"c": torch.zeros(6, dtype=DT)}}
    )

    def loss(p):
        return ((a @ p["w"] + p["b", "c"] - target) ** 2).mean() + 0.01 * (p["w"] ** 2).sum()

    opt = OPTIMIZERS[name]()
    state = opt.init(params)
    updates, _ = opt.update(torch.func.grad(loss)(params), state, params)
    assert loss(fd.optim.apply_updates(params, updates)) < loss(params)


# ------------------------------------------------------------------ vmap
def member_params(n=3):
    return fd.stack([fd.from_module(make_net(seed)).clone() for seed in range(n)])


@pytest.mark.parametrize(
    "name",
    [
        "adam_amsgrad",
        "sgd_dampening_wd",
        "rmsprop_centered",
        "lion",
        "chain_clip_adamw_cosine",
        "skip_nonfinite_adam",
        "adagrad_options",
    ],
)
def test_vmap_over_members_equals_loop(name):
    x, y = data()
    ens = member_params()
    opt = OPTIMIZERS[name]()

    def step(p, s):
        u, s = opt.update(grads(p, x, y), s, p)
        return fd.optim.apply_updates(p, u), s

    vp, vs = ens, torch.func.vmap(opt.init)(ens)
    loop = [(ens[i], opt.init(ens[i])) for i in range(3)]
    for _ in range(3):
        vp, vs = torch.func.vmap(step)(vp, vs)
        loop = [step(p, s) for p, s in loop]
    assert_close(vp, fd.stack([p for p, _ in loop]), rtol=1e-10, atol=1e-12)
    assert_close(vs, fd.stack([s for _, s in loop]), rtol=1e-10, atol=1e-12)


def test_vmap_over_learning_rates_with_inject_hyperparams():
    x, y = data()
    ens = member_params(4)
    lrs = torch.tensor([1e-3, 1e-2, 3e-2, 0.1], dtype=DT)
    opt = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-3)
    state = torch.func.vmap(opt.init)(ens).set(("hyperparams", "lr"), lrs)

    def step(p, s):
        u, s = opt.update(grads(p, x, y), s, p)
        return fd.optim.apply_updates(p, u), s

    p, s = ens, state
    for _ in range(5):
        p, s = torch.func.vmap(step)(p, s)
    for i, lr in enumerate(lrs.tolist()):
        ref_opt = fd.optim.adam(lr)
        q, t = ens[i], ref_opt.init(ens[i])
        for _ in range(5):
            u, t = ref_opt.update(grads(q, x, y), t, q)
            q = fd.optim.apply_updates(q, u)
        assert_close(p[i], q, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(p[0]["0", "weight"], p[3]["0", "weight"])


def test_vmap_train_step_over_members_and_keys():
    x, y = data()
    ens = member_params()
    batch = fd.TensorDict({"x": x, "y": y}, [32])

    def loss_fn(p, b, key):
        noise = fd.random.normal(key, b["y"].shape, dtype=DT) * 0.01
        return ((fd_forward(p, b["x"]) - b["y"] - noise) ** 2).mean(), {"noise": noise.std()}

    from tests._support.optim_cases import forward as fd_forward

    opt = fd.optim.adam(1e-2)
    step = fd.train_step(loss_fn, opt)
    keys = fd.random.split(fd.random.key(0), 3)
    vp, vs, vm = torch.func.vmap(step, in_dims=(0, 0, None, 0))(
        ens, torch.func.vmap(opt.init)(ens), batch, keys
    )
    for i in range(3):
        p, s, m = step(ens[i], opt.init(ens[i]), batch, keys[i])
        assert_close(vp[i], p, rtol=1e-10, atol=1e-12)
        assert_close(vs[i], s, rtol=1e-10, atol=1e-12)
        assert_close(vm[i], m, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ compile
@pytest.mark.compile
@pytest.mark.parametrize("name", ["adam_amsgrad", "chain_clip_adamw_cosine"])
def test_compiled_step_equals_eager_without_recompiling(name):
    torch._dynamo.reset()
    x, y = data()
    params = fd.from_module(make_net()).clone()
    opt = OPTIMIZERS[name]()

    def step(p, s):
        u, s = opt.update(grads(p, x, y), s, p)
        return fd.optim.apply_updates(p, u), s

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    ep, es = params, opt.init(params)
    cp, cs = ep, es
    for i in range(5):
        # after the first two calls (the inputs' cached pytree specs settle), the
        # growing count must not recompile
        with torch._dynamo.config.patch(error_on_recompile=i >= 2):
            ep, es = step(ep, es)
            cp, cs = compiled(cp, cs)
    assert_close(cp, ep, rtol=1e-10, atol=1e-12)
    assert_close(cs, es, rtol=1e-10, atol=1e-12)


@pytest.mark.compile
def test_inductor_train_step_fullgraph_equals_eager():
    torch._dynamo.reset()
    x, y = data()
    from tests._support.optim_cases import forward

    def loss_fn(p, b, key):
        return ((forward(p, b["x"]) - b["y"]) ** 2).mean()

    step = fd.train_step(loss_fn, fd.optim.adam(fd.optim.cosine_decay(1e-2, 10)))
    params = fd.from_module(make_net()).clone()
    batch = fd.TensorDict({"x": x, "y": y}, [32])
    compiled = torch.compile(step, fullgraph=True)
    ep, es = params, fd.optim.adam(1e-2).init(params)
    cp, cs = ep, es
    for i in range(4):
        with torch._dynamo.config.patch(error_on_recompile=i >= 2):
            ep, es, em = step(ep, es, batch, None)
            cp, cs, cm = compiled(cp, cs, batch, None)
    assert_close(cp, ep, rtol=1e-9, atol=1e-12)
    assert_close(cm, em, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ chain algebra
def test_chain_flattens_drops_identities_and_compares_by_value():
    a, b, c = fd.optim.clip(1.0), fd.optim.scale_by_adam(), fd.optim.scale(-0.1)
    assert fd.optim.chain(fd.optim.chain(a, b), c) == fd.optim.chain(a, fd.optim.chain(b, c))
    assert fd.optim.chain(a, fd.optim.identity(), b, c) == fd.optim.chain(a, b, c)
    assert hash(fd.optim.chain(a, b)) == hash(fd.optim.chain(fd.optim.clip(1.0), b))
    assert fd.optim.chain(a) is a
    assert fd.optim.chain() == fd.optim.identity()
    assert fd.optim.adam(1e-3) == fd.optim.adam(1e-3) != fd.optim.adam(1e-2)
    assert len({fd.optim.adam(1e-3), fd.optim.adam(1e-3), fd.optim.sgd(0.1)}) == 2
    assert repr(fd.optim.chain(a, c)) == "chain(clip(max_delta=1.0), scale(step_size=-0.1))"
    params = fd.TensorDict({"w": torch.ones(3)})
    assert fd.optim.chain(a, b, c).init(params).keys() == ("0", "1", "2")


def test_chain_flattens_a_nested_chain_by_type_not_by_name():
    a, b, c = fd.optim.clip(1.0), fd.optim.scale_by_adam(), fd.optim.scale(-0.1)
    inner = fd.optim.chain(a, b)
    # a hand-made transformation whose update merely carries the name "chain"
    named = fd.optim.GradientTransformation(
        fd.optim.Partial(lambda params, **kw: params, name="chain", txs=(a, b)),
        fd.optim.Partial(lambda u, s, p=None, **kw: (u, s), name="chain", txs=(a, b)),
    )
    assert isinstance(inner, fd.optim.GradientTransformation)
    assert fd.optim.chain(inner, c).update.kwargs["txs"] == (a, b, c)
    assert fd.optim.chain(named, c).update.kwargs["txs"] == (named, c)


def test_chain_of_nested_chains_gives_the_same_updates():
    x, y = data()
    params = fd.from_module(make_net()).clone()
    flat = fd.optim.chain(fd.optim.clip(0.1), fd.optim.trace(0.9), fd.optim.scale(-0.01))
    nested = fd.optim.chain(
        fd.optim.chain(fd.optim.clip(0.1)),
        fd.optim.chain(fd.optim.trace(0.9), fd.optim.chain(fd.optim.scale(-0.01))),
    )
    g = grads(params, x, y)
    u1, _ = flat.update(g, flat.init(params), params)
    u2, _ = nested.update(g, nested.init(params), params)
    assert_close(u1, u2)


# ------------------------------------------------------------------ NaN
def test_nan_gradients_propagate_like_torch_optim():
    params = fd.TensorDict({"w": torch.ones(3, dtype=DT)})
    g = fd.TensorDict({"w": torch.tensor([1.0, float("nan"), 1.0], dtype=DT)})
    opt = fd.optim.adam(0.1)
    u, s = opt.update(g, opt.init(params), params)
    w = torch.nn.Parameter(torch.ones(3, dtype=DT))
    w.grad = g["w"].clone()
    torch.optim.Adam([w], 0.1).step()
    torch.testing.assert_close(fd.optim.apply_updates(params, u)["w"], w.detach(), equal_nan=True)
    assert torch.isnan(s["exp_avg", "w"][1])


def test_skip_nonfinite_skips_and_counts():
    params = fd.TensorDict({"w": torch.ones(3, dtype=DT)})
    good = fd.TensorDict({"w": torch.ones(3, dtype=DT)})
    bad = fd.TensorDict({"w": torch.tensor([1.0, float("inf"), 1.0], dtype=DT)})
    opt = fd.optim.skip_nonfinite(fd.optim.adam(0.1))
    s0 = opt.init(params)
    _, s1 = opt.update(good, s0, params)
    u_bad, s2 = opt.update(bad, s1, params)
    assert torch.equal(u_bad["w"], torch.zeros(3, dtype=DT))
    assert_close(s2["inner_state"], s1["inner_state"])
    assert s2["nonfinite_count"].item() == 1 and s1["nonfinite_count"].item() == 0
    u3, _ = opt.update(good, s2, params)
    u_ref, _ = fd.optim.adam(0.1).update(good, s1["inner_state"], params)
    assert_close(u3, u_ref)


# ------------------------------------------------------------------ save / load
def test_save_load_round_trip_of_params_and_state(tmp_path):
    x, y = data()
    params = fd.from_module(make_net()).clone()
    opt = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-2, amsgrad=True)
    state = opt.init(params)
    for _ in range(3):
        u, state = opt.update(grads(params, x, y), state, params)
        params = fd.optim.apply_updates(params, u)
    fd.save({"params": params, "opt_state": state}, tmp_path / "ckpt.pt")
    loaded = fd.load(tmp_path / "ckpt.pt")
    assert_close(loaded["params"], params)
    assert_close(loaded["opt_state"], state)

    def cont(p, s):
        for _ in range(3):
            u, s = opt.update(grads(p, x, y), s, p)
            p = fd.optim.apply_updates(p, u)
        return p, s

    assert_close(cont(loaded["params"], loaded["opt_state"]), cont(params, state))


# ------------------------------------------------------------------ interop
def test_to_module_after_training_gives_the_trained_torch_module():
    x, y = data()
    from tests._support.optim_cases import forward

    def loss_fn(p, b, key):
        return ((forward(p, b["x"]) - b["y"]) ** 2).mean()

    params = fd.from_module(make_net()).clone()
    opt = fd.optim.adam(1e-2)
    step = fd.train_step(loss_fn, opt)
    batch = fd.TensorDict({"x": x, "y": y}, [32])
    p, s = params, opt.init(params)
    for _ in range(10):
        p, s, _ = step(p, s, batch, None)
    net = fd.to_module(p, make_net(seed=5))
    with torch.no_grad():
        torch.testing.assert_close(net(x), forward(p, x), rtol=0, atol=0)
    assert not torch.allclose(net(x), forward(params, x))


@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_compiles_fullgraph(name):
    """No graph break in any optimizer's update (dynamo only: backend="eager")."""
    if name == "inject_sgd" and TORCH_VERSION < (2, 13):
        pytest.skip(
            "dynamo before torch 2.13 cannot trace inject_hyperparams' update in one graph: "
            "it rebuilds the optimizer (locals(), a new Partial) each step"
        )
    torch._dynamo.reset()
    params = fd.TensorDict({"w": torch.ones(2, 3, dtype=DT), "b": {"c": torch.zeros(3, dtype=DT)}})
    g = params.apply(lambda x: torch.cos(x) + 0.5)
    opt = OPTIMIZERS[name]()

    def step(p, s):
        u, s = opt.update(g, s, p)
        return fd.optim.apply_updates(p, u), s

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    ep, es = params, opt.init(params)
    cp, cs = ep, es
    for _ in range(2):
        ep, es = step(ep, es)
        cp, cs = compiled(cp, cs)
    assert_close(cp, ep, rtol=1e-12, atol=1e-14)
    assert_close(cs, es, rtol=1e-12, atol=1e-14)
