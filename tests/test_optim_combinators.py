"""masked, multi_transform, set_to_zero, MultiSteps, apply_every, incremental_update and
periodic_update: optax's own test cases, ported to TensorDicts (same numbers), plus
gradient accumulation in lockstep with torch.optim."""

import pytest
import torch

import functd as fd
from functd.testing import assert_close

optim = fd.optim


def _tensors(d):
    return {k: _tensors(v) if isinstance(v, dict) else torch.as_tensor(v) for k, v in d.items()}


def td(d):
    return fd.TensorDict(_tensors(d), [])


def tmap(f, t):
    return t.apply(f)


# ------------------------------------------------------------------ masked (optax tests)
MASK = {"a": True, "b": {"x": False, "y": True}, "c": {"d": True, "e": {"x": False, "y": True}}}


def _params():
    return td({"a": 1.0, "b": {"x": 2.0, "y": 3.0}, "c": {"d": 4.0, "e": {"x": 5.0, "y": 6.0}}})


def _masked_negate(updates, mask_fn):
    paths = updates.keys(True, True)
    out = updates
    for p in paths:
        path = p if isinstance(p, tuple) else (p,)
        if mask_fn(path, None):
            out = out.set(p, -updates.get(p))
    return out


@pytest.mark.parametrize("momentum", [False, True])  # optax's sgd and stateful sgd
@pytest.mark.parametrize("as_fn", [False, True])
def test_masked_negates_where_the_mask_is_true(momentum, as_fn):
    params = _params()
    inner = (
        optim.sgd(1.0, momentum=0.0)
        if not momentum
        else optim.chain(optim.trace(momentum=0.0), optim.scale(-1.0))
    )
    keep = optim._masking._keep("t", MASK)
    mask = (lambda path, leaf: keep(path, leaf)) if as_fn else MASK
    opt = optim.masked(inner, mask)
    state = opt.init(params)
    updates = tmap(lambda x: x / 10, params)
    correct = _masked_negate(updates, keep)
    new, state = opt.update(updates, state, params)
    assert_close(new, correct)
    new2, _ = opt.update(new, state)  # repeated, this time without params
    assert_close(new2, _masked_negate(correct, keep))


def test_masked_prefix_mask_and_params_requiring_transform():
    params = _params()
    mask = {"a": True, "b": False, "c": {"d": False, "e": True}}
    opt = optim.masked(optim.add_decayed_weights(0.1), mask)
    state = opt.init(params)
    updates = tmap(lambda x: x / 10, params)
    new, _ = opt.update(updates, state, params)
    for path, expected in {
        ("a",): 0.1 + 0.1 * 1.0,
        ("b", "x"): 0.2,
        ("b", "y"): 0.3,
        ("c", "d"): 0.4,
        ("c", "e", "x"): 0.5 + 0.1 * 5.0,
        ("c", "e", "y"): 0.6 + 0.1 * 6.0,
    }.items():
        torch.testing.assert_close(new.get(path), torch.tensor(expected))


def test_masked_mask_function_by_rank():
    params = fd.TensorDict(
        {"a": torch.ones(1, 2), "b": {"c": torch.ones(1), "d": torch.ones(1, 2, 3)}}, []
    )
    opt = optim.masked(optim.add_decayed_weights(0.1), lambda path, x: x.ndim > 1)
    grads = tmap(lambda x: x * 2, params)
    new, _ = opt.update(grads, opt.init(params), params)
    torch.testing.assert_close(new["a"], grads["a"] + 0.1 * params["a"])
    torch.testing.assert_close(new["b", "c"], grads["b", "c"])
    torch.testing.assert_close(new["b", "d"], grads["b", "d"] + 0.1 * params["b", "d"])


def test_masked_nested_masks():
    params = fd.TensorDict(
        {
            f"linear_{i}": {"w": torch.zeros(*s), "b": torch.zeros(s[-1])}
            for i, s in ((1, (1, 1)), (2, (1, 2)), (3, (2, 3)))
        },
        [],
    )
    inner = optim.masked(optim.sgd(1.0), {"linear_1": True, "linear_2": False, "linear_3": True})
    opt = optim.masked(inner, lambda path, x: x.ndim > 1)
    ones = tmap(torch.ones_like, params)
    new, _ = opt.update(ones, opt.init(params), params)
    for i in (1, 2, 3):
        w = -1.0 if i != 2 else 1.0
        assert torch.all(new[f"linear_{i}", "w"] == w) and torch.all(new[f"linear_{i}", "b"] == 1)


def test_masked_tree_mismatch_fails():
    params = _params()
    with pytest.raises(ValueError, match=r"the mask names \('c', 'extra'\), which the params lack"):
        optim.masked(optim.sgd(1.0), {**MASK, "c": {**MASK["c"], "extra": True}}).init(params)
    with pytest.raises(
        ValueError, match=r"the mask has no entry for the params entry \('c', 'z'\)"
    ):
        optim.masked(optim.sgd(1.0), MASK).init(params.set(("c", "z"), torch.tensor(7.0)))


# ------------------------------------------------------------------ multi_transform (optax)
@pytest.mark.parametrize("as_fn", [True, False])
def test_multi_transform_gives_each_label_its_transformation(as_fn):
    params = td({"a1": 1.0, "b1": 2.0, "z1": {"a2": 3.0, "z2": {"c1": 4.0}}})
    txs = {
        "a": optim.scale(-1.0),
        "b": optim.trace(momentum=0.0),
        "c": optim.scale(2.0),
    }  # b: stateful

    def label(path, leaf):
        return path[-1][0]

    labels = label if as_fn else {"a1": "a", "b1": "b", "z1": {"a2": "a", "z2": {"c1": "c"}}}
    opt = optim.multi_transform(txs, labels)
    state = opt.init(params)
    updates = tmap(lambda x: x / 10, params)
    factor = {"a1": -1.0, "b1": 1.0, "a2": -1.0, "c1": 2.0}
    new, state = opt.update(updates, state, params)
    for path in params.keys(True, True):
        path = path if isinstance(path, tuple) else (path,)
        torch.testing.assert_close(new.get(path), updates.get(path) * factor[path[-1]])
    again, _ = opt.update(new, state)
    for path in params.keys(True, True):
        path = path if isinstance(path, tuple) else (path,)
        torch.testing.assert_close(again.get(path), new.get(path) * factor[path[-1]])


def test_multi_transform_labels_mismatch_fails():
    params = td({"a": 1.0, "b": {"x": 2.0, "y": 3.0}})
    txs = {0: optim.sgd(1.0), 1: optim.adam(1.0)}
    optim.multi_transform(txs, {"a": 0, "b": 1}).init(params)
    with pytest.raises(ValueError, match=r"'a' has the label 3, which has no transformation"):
        optim.multi_transform(txs, {"a": 3, "b": 1}).init(params)


def test_freezing_with_set_to_zero_trains_the_rest_like_adam_alone():
    params = td({"emb": [1.0, 2.0], "head": [3.0, 4.0]})
    grads = td({"emb": [0.5, -0.5], "head": [0.1, 0.2]})
    opt = optim.multi_transform(
        {"train": optim.adam(0.1), "frozen": optim.set_to_zero()},
        lambda path, x: "frozen" if path[0] == "emb" else "train",
    )
    new, _ = opt.update(grads, opt.init(params), params)
    assert torch.equal(new["emb"], torch.zeros(2))
    alone, _ = optim.adam(0.1).update(
        grads.select("head"), optim.adam(0.1).init(params.select("head"))
    )
    torch.testing.assert_close(new["head"], alone["head"])


# ------------------------------------------------------------------ MultiSteps (optax)
def test_multi_steps_updates_every_k_and_the_loss_falls():
    k = 4
    w = torch.randn(7, 10, generator=torch.Generator().manual_seed(0))
    params = fd.TensorDict({"w": w, "b": torch.zeros(10)}, [])
    data = torch.ones(32, 7)

    def loss(p):
        return ((data @ p["w"] + p["b"]) ** 2).sum()

    opt = optim.MultiSteps(
        optim.chain(optim.scale_by_adam(), optim.add_decayed_weights(1e-2), optim.scale(-1e-4)), k
    )
    state = opt.init(params)
    prev = loss(params)
    for idx in range(5 * k):
        updates, state = opt.update(fd.grad(loss)(params), state, params)
        new = optim.apply_updates(params, updates)
        if idx % k < k - 1:
            assert_close(new, params, rtol=0, atol=0)
            assert not opt.has_updated(state)
        else:
            assert loss(new) < prev
            prev = loss(new)
            assert opt.has_updated(state)
        params = new


def test_multi_steps_every_k_schedule():
    opt = optim.MultiSteps(optim.sgd(1e-4), lambda step: torch.where(step < 2, 1, 3))
    params, grads = td({"a": 0.0}), td({"a": 0.0})
    state = opt.init(params)
    assert not opt.has_updated(state)
    for _ in range(2):
        _, state = opt.update(grads, state, params)
        assert opt.has_updated(state)
    for _ in range(5):
        for _ in range(2):
            _, state = opt.update(grads, state, params)
            assert not opt.has_updated(state)
        _, state = opt.update(grads, state, params)
        assert opt.has_updated(state)


def test_multi_steps_computes_the_mean():
    opt = optim.MultiSteps(optim.scale(1.0), 4, use_grad_mean=True)
    params = td({"a": 0.0})
    state = opt.init(params)
    for g in (1.0, 2.0, 3.0):
        _, state = opt.update(td({"a": g}), state, params)
        assert not opt.has_updated(state)
    new, state = opt.update(td({"a": 4.0}), state, params)
    assert opt.has_updated(state)
    assert float(new["a"]) == 2.5


def test_multi_steps_skips_non_finite_mini_steps():
    def not_finite(updates, step, params):
        return torch.stack([~torch.isfinite(x).all() for x in updates.values(True, True)]).any()

    opt = optim.MultiSteps(optim.sgd(1.0), 2, should_skip_update_fn=not_finite)
    params = td({"a": 0.0})
    state = opt.init(params)
    for g, mini, a in [(1.0, 1, 0.0), (1.0, 0, -1.0), (float("inf"), 0, -1.0),
                       (float("nan"), 0, -1.0), (1.0, 1, -1.0), (1.0, 0, -2.0)]:  # fmt: skip
        updates, state = opt.update(td({"a": g}), state, params)
        params = optim.apply_updates(params, updates)
        assert int(state["mini_step"]) == mini
        assert float(params["a"]) == a


def test_multi_steps_adam_equals_torch_adam_on_the_accumulated_gradient():
    """k micro-batches' mean gradient, one Adam step: torch.optim.Adam after summing
    loss / k over the micro-batches (float64)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).double()
    model = fd.Module(lin, ["x"], ["y"])
    params = fd.from_module(model).clone()
    opt = optim.MultiSteps(optim.adam(1e-2), 3)
    state = opt.init(params)
    ref = torch.optim.Adam(lin.parameters(), lr=1e-2)
    for _ in range(2):
        ref.zero_grad()
        for _ in range(3):
            x = torch.randn(5, 3, dtype=torch.float64)
            g = fd.grad(lambda p, x: (model(p, x=x) ** 2).mean())(params, x)
            updates, state = opt.update(g, state, params)
            params = optim.apply_updates(params, updates)
            ((lin(x) ** 2).mean() / 3).backward()
        ref.step()
    assert_close(params, fd.from_module(lin), rtol=0, atol=1e-12)


def test_multi_steps_under_vmap_and_compile():
    opt = optim.MultiSteps(optim.adam(0.1), 2)
    params = fd.stack([td({"a": [1.0, 2.0]}), td({"a": [3.0, 4.0]})])
    state = fd.vmap(opt.init)(params)
    grads = tmap(torch.ones_like, params)
    step = fd.vmap(lambda g, s, p: opt.update(g, s, p))
    u1, s1 = step(grads, state, params)
    u2, _ = step(grads, s1, params)
    assert torch.equal(u1["a"], torch.zeros(2, 2)) and not torch.equal(u2["a"], torch.zeros(2, 2))
    f = torch.compile(lambda g, s, p: opt.update(g, s, p), fullgraph=True, backend="eager")
    c, _ = f(grads[0], f(grads[0], state[0], params[0])[1], params[0])
    torch.testing.assert_close(c["a"], u2["a"][0])


# ------------------------------------------------------------------ apply_every (optax)
def test_apply_every_equals_sgd_every_k_steps():
    k, lr = 4, 1e-2
    params = td({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    per_step = td({"a": [500.0, 5.0], "b": [300.0, 3.0]})
    sgd = optim.sgd(lr)
    every = optim.chain(optim.apply_every(k), optim.trace(momentum=0.0), optim.scale(-lr))
    p_sgd, s_sgd = params, sgd.init(params)
    p_every, s_every = params, every.init(params)
    for i in range(50):
        u, s_sgd = sgd.update(per_step, s_sgd)
        p_sgd = optim.apply_updates(p_sgd, u)
        u, s_every = every.update(per_step, s_every)
        p_every = optim.apply_updates(p_every, u)
        if i % k == k - 1:
            assert_close(p_every, p_sgd, atol=1e-6, rtol=1e-5)
        else:
            assert all(torch.all(x == 0) for x in u.values(True, True))


# ------------------------------------------------------------------ target networks (optax)
def test_incremental_update():
    p1 = fd.TensorDict({"a": torch.ones(3, 2), "b": torch.ones(1)}, [])
    p2 = tmap(lambda t: 2 * t, p1)
    assert_close(optim.incremental_update(p2, p1, 0.5), tmap(lambda t: 1.5 * t, p1))


@pytest.mark.parametrize("tensor_steps", [False, True])
def test_periodic_update(tensor_steps):
    p1 = fd.TensorDict({"a": torch.ones(3, 2), "b": torch.ones(1)}, [])
    p2 = tmap(lambda t: 2 * t, p1)
    period = 5

    def steps(n):
        return torch.tensor(n) if tensor_steps else n

    for j in range(3):
        for i in range(1, period):
            assert_close(optim.periodic_update(p2, p1, steps(j * period + i), period), p1)
        assert_close(optim.periodic_update(p2, p1, steps((j + 1) * period), period), p2)


def test_target_updates_check_layouts():
    p1 = fd.TensorDict({"a": torch.ones(2)}, [])
    with pytest.raises(ValueError, match=r"fd.optim.incremental_update"):
        optim.incremental_update(p1, p1.set("b", torch.ones(1)), 0.1)
    with pytest.raises(ValueError, match=r"update_period must be an int >= 1"):
        optim.periodic_update(p1, p1, 0, 0)


# ------------------------------------------------------------------ laws
COMBINATORS = {
    "masked": lambda: optim.chain(
        optim.masked(optim.add_decayed_weights(0.1), lambda path, x: x.ndim > 1), optim.adam(1e-2)
    ),
    "multi_transform": lambda: optim.multi_transform(
        {"adam": optim.adam(1e-2), "sgd": optim.sgd(0.05, momentum=0.9)},
        lambda path, x: "adam" if path[0] == "w" else "sgd",
    ),
    "MultiSteps": lambda: optim.MultiSteps(optim.adam(1e-2), 2),
    "apply_every": lambda: optim.chain(optim.apply_every(2), optim.sgd(0.05)),
}


def _law_params():
    g = torch.Generator().manual_seed(0)
    return fd.TensorDict(
        {"w": torch.randn(2, 3, generator=g, dtype=torch.float64),
         "b": {"c": torch.randn(3, generator=g, dtype=torch.float64)}},
        [],
    )  # fmt: skip


def _step(opt):
    def step(p, s):
        u, s = opt.update(p.apply(lambda x: torch.cos(x) + 0.5), s, p)
        return optim.apply_updates(p, u), s

    return step


@pytest.mark.parametrize("name", sorted(COMBINATORS))
def test_combinators_are_pure_and_vmap_equals_loop(name):
    opt = COMBINATORS[name]()
    step = _step(opt)
    params = _law_params()
    before = params.clone()
    state = opt.init(params)
    state_before = state.clone()
    step(params, state)
    assert_close(params, before, rtol=0, atol=0)
    assert_close(state, state_before, rtol=0, atol=0)
    ens = fd.stack([params, params.apply(lambda x: x * 2), params.apply(torch.neg)])
    vp, vs = ens, fd.vmap(opt.init)(ens)
    loop = [(ens[i], opt.init(ens[i])) for i in range(3)]
    for _ in range(3):
        vp, vs = fd.vmap(step)(vp, vs)
        loop = [step(p, s) for p, s in loop]
    assert_close(vp, fd.stack([p for p, _ in loop]), rtol=1e-10, atol=1e-12)


@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(COMBINATORS))
def test_combinators_compile_fullgraph(name):
    torch._dynamo.reset()
    opt = COMBINATORS[name]()
    step = _step(opt)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    ep = cp = _law_params()
    es = cs = opt.init(ep)
    for _ in range(3):
        ep, es = step(ep, es)
        cp, cs = compiled(cp, cs)
    assert_close(cp, ep, rtol=1e-12, atol=1e-14)
