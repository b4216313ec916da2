"""Laws every public module obeys, run over the conformance registry."""

import pytest
import torch

import functd as fd
from functd.testing import assert_close, assert_max_compiles, assert_no_graph_break, variants
from tests._support.conformance import ENTRIES, PUBLIC, call, members, output, params_for

NAMES = sorted(ENTRIES)
KEY = fd.random.key(7)


def _call(m, params, td):
    """The module's output td; ``(td, new_state)`` for a stateful module."""
    return call(m, params, td, KEY)


def _stack(results):
    if isinstance(results[0], tuple):
        return tuple(fd.stack(list(parts)) for parts in zip(*results))
    return fd.stack(results)


def test_every_public_module_has_an_entry():
    covered = {e.covers for e in ENTRIES.values()}
    missing = [c.__name__ for c in PUBLIC if c not in covered]
    assert not missing, f"add conformance entries for: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_purity_inputs_unchanged_and_deterministic(name):
    e = ENTRIES[name]
    m = e.make()
    params, td = params_for(m), e.example()
    before = [(id(v), v.clone()) for v in fd.tree.leaves((params, td))]
    out1 = _call(m, params, td)
    out2 = _call(m, params, td)
    after = fd.tree.leaves((params, td))
    assert [i for i, _ in before] == [id(v) for v in after]
    for (_, v), w in zip(before, after):
        assert torch.equal(v, w)
    assert_close(out1, out2)
    assert set(td.keys()) <= set(output(out1).keys())
    assert hash(m) == hash(e.make()) or m != e.make()


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_data_equals_loop(name):
    e = ENTRIES[name]
    m = e.make()
    params, td = params_for(m), e.example()
    batched = torch.func.vmap(lambda t: _call(m, params, t))(td)
    looped = _stack([_call(m, params, td[i]) for i in range(td.batch_size[0])])
    assert_close(batched, looped, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_params_equals_loop(name):
    e = ENTRIES[name]
    m = e.make()
    if not m.has_params:
        pytest.skip("no parameters")
    ps = members(m, 3)
    ens = fd.stack(ps)
    td = e.example()
    batched = torch.func.vmap(lambda p: _call(m, p, td))(ens)
    looped = _stack([_call(m, p, td) for p in ps])
    assert_close(batched, looped, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_float64_works(name):
    e = ENTRIES[name]
    m = e.make()
    params = params_for(m, dtype=torch.float64)
    td = e.example()
    if e.float_inputs:
        td = td.double()
    out = output(_call(m, params, td))
    for k in m.out_keys:
        if out[k].is_floating_point():
            assert out[k].dtype == torch.float64, k


@pytest.mark.compile
@pytest.mark.parametrize(
    "name",
    [
        "Sequential(tutorial block)",
        "GRUCell",
        "Module(functional_call)",
        "Residual(user-defined kind, BatchNorm)",
    ],
)
def test_compile_equals_eager(name):
    torch._dynamo.reset()
    e = ENTRIES[name]
    m = e.make()
    params, td = params_for(m), e.example()
    compiled = torch.compile(lambda p, t: _call(m, p, t), fullgraph=True)
    with assert_no_graph_break():
        assert_close(compiled(params, td), _call(m, params, td), rtol=1e-5, atol=1e-6)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["GRUCell", "Residual(user-defined kind, BatchNorm)"])
def test_jit_inductor_equals_eager(name):
    e = ENTRIES[name]
    m = e.make()
    params, td = params_for(m), e.example()
    jitted = fd.jit(lambda p, t: _call(m, p, t))
    with assert_max_compiles(1):
        assert_close(jitted(params, td), _call(m, params, td), rtol=1e-5, atol=1e-6)
        td2 = td.apply(lambda v: v + 1)
        assert_close(jitted(params, td2), _call(m, params, td2), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ fd.jit (traced graphs)
@variants(backend="fx")
@pytest.mark.parametrize("name", NAMES)
def test_variants_equal_eager(name, variant):
    """eager, fd.jit, fd.vmap over a batch of one, fd.grad: the same outputs (values);
    fd.jit compiles once for two calls with new values and a new key."""
    e = ENTRIES[name]
    m = e.make()
    params, td = params_for(m), e.example()
    f = variant(lambda p, t, k: call(m, p, t, k))
    with assert_max_compiles(1):
        assert_close(f(params, td, KEY), _call(m, params, td), rtol=1e-5, atol=1e-6)
        key = fd.random.key(8)
        assert_close(f(params, td, key), call(m, params, td, key), rtol=1e-5, atol=1e-6)


def _weighted_loss(m, out_keys, td_example):
    g = torch.Generator().manual_seed(1)
    out = output(_call(m, params_for(m, dtype=torch.float64), td_example))
    weights = {
        k: torch.randn(out[k].shape, generator=g, dtype=torch.float64)
        for k in out_keys
        if out[k].is_floating_point()
    }

    def loss(p, state, t):
        o = output(call(m, fd.nn.merge_state(p, state), t, KEY))
        return sum((o[k] * w).sum() for k, w in weights.items())

    return loss, weights


@pytest.mark.parametrize("name", NAMES)
def test_jit_of_grad_equals_grad(name):
    """fd.jit(fd.grad(loss)) == fd.grad(loss), float64, over the params and the data."""
    e = ENTRIES[name]
    m = e.make()
    td = e.example().double() if e.float_inputs else e.example()
    loss, weights = _weighted_loss(m, m.out_keys, td)
    argnums = tuple(i for i, ok in ((0, m.has_params), (2, e.float_inputs)) if ok)
    if not weights or not argnums:
        pytest.skip("nothing to differentiate")
    params, state = fd.nn.split_state(m, params_for(m, dtype=torch.float64))
    g = fd.grad(loss, argnums=argnums)
    got = fd.jit(g, backend="fx")(params, state, td)
    # decompositions may round differently (Hardsigmoid backward: 3e-8 relative)
    assert_close(got, g(params, state, td), rtol=1e-6, atol=1e-8)
