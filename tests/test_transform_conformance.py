"""fd.vmap and fd.grad over every entry of the conformance registry.

- ``fd.vmap == loop``: in_dims over the params (an ensemble), over the data,
  and over both (data per member).
- ``fd.grad`` in float64: for entries made of torch modules, against the
  ``nn.Module`` itself (weights loaded, ``.backward()``); for the pure layers,
  against ``torch.autograd.grad`` of the same function.
"""

import copy

import pytest
import torch

import functd as fd
from functd.testing import assert_close
from tests._support.conformance import ENTRIES, members, output, params_for
from tests._support.conformance import call as call_entry

NAMES = sorted(ENTRIES)
KEY = fd.random.key(7)
M = 3  # ensemble members


def call(m, params, td):
    """The output td (a stateful module's new state is checked in test_nn_batchnorm.py)."""
    return output(call_entry(m, params, td, KEY))


def per_member_data(e, dtype=None):
    td = e.example()
    if dtype is not None and e.float_inputs:
        td = td.apply(lambda v: v.to(dtype))
    scale = lambda i: lambda v: v * (1 + 0.5 * i) if v.is_floating_point() else v  # noqa: E731
    return [td.apply(scale(i)) for i in range(M)]


# ------------------------------------------------------------------ vmap == loop
@pytest.mark.parametrize("name", NAMES)
def test_fd_vmap_over_data_equals_loop(name):
    e = ENTRIES[name]
    m = e.make()
    params, td = params_for(m), e.example()
    out = fd.vmap(lambda p, t: call(m, p, t), in_dims=(None, 0))(params, td)
    loop = fd.stack([call(m, params, td[i]) for i in range(td.batch_size[0])])
    assert_close(out, loop, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_fd_vmap_over_params_equals_loop(name):
    e = ENTRIES[name]
    m = e.make()
    if not m.has_params:
        pytest.skip("no parameters")
    ps, td = members(m, M), e.example()
    out = fd.vmap(lambda p, t: call(m, p, t), in_dims=(0, None))(fd.stack(ps), td)
    loop = fd.stack([call(m, p, td) for p in ps])
    assert out.batch_size == torch.Size([M, *td.batch_size])
    assert_close(out, loop, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_fd_vmap_over_params_and_data_equals_loop(name):
    e = ENTRIES[name]
    m = e.make()
    ps = members(m, M) if m.has_params else [params_for(m)] * M
    tds = per_member_data(e)
    in_p = 0 if m.has_params else None
    out = fd.vmap(lambda p, t: call(m, p, t), in_dims=(in_p, 0))(
        fd.stack(ps) if m.has_params else ps[0], fd.stack(tds)
    )
    loop = fd.stack([call(m, p, t) for p, t in zip(ps, tds)])
    assert_close(out, loop, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ grad
def out_weights(m, out):
    """Fixed random weights for each float output, so the loss has no trivial gradient."""
    g = torch.Generator().manual_seed(1)
    return {
        k: torch.randn(out[k].shape, generator=g, dtype=torch.float64)
        for k in m.out_keys
        if out[k].is_floating_point()
    }


def weighted(outputs, weights):
    return sum((outputs[k] * w).sum() for k, w in weights.items())


def torch_sources(m):
    """The torch modules behind an entry (a Module or a Sequential of them), or None when
    some parameters live only in a functd layer, or the entry is of another kind (a
    probabilistic one, a user-defined one: checked against torch.autograd instead)."""
    if type(m) is fd.Sequential:
        subs = [torch_sources(c) for _, c in m.children()]
        return None if any(s is None for s in subs) else dict(zip(m.names, subs))
    if type(m) is not fd.Module:
        return None
    if m.torch_source() is not None:
        return m.torch_source()
    return None if m.has_params else False  # False: a parameter-free callable


def nn_forward(m, sources, data):
    """Run the entry's computation with the torch modules themselves (no functd)."""
    if m.children():  # a Sequential (torch_sources accepts no other kind with children)
        for name, child in m.children():
            nn_forward(child, sources[name], data)
        return
    fn = sources if sources is not False else m.fn
    out = fn(*[data[k] for k in m.in_keys])
    outs = out if isinstance(out, tuple) else (out,)
    data.update(zip(m.out_keys, outs))


def nn_grads(m, sources):
    if m.children():
        return fd.TensorDict({n: nn_grads(c, sources[n]) for n, c in m.children() if c.has_params})
    return fd.TensorDict(
        {k: t.grad for k, t in sources.state_dict(keep_vars=True).items() if t.grad is not None}
    )


@pytest.mark.parametrize("name", NAMES)
def test_fd_grad_float64_matches_torch(name):
    e = ENTRIES[name]
    m = e.make()
    params = params_for(m, dtype=torch.float64)
    td = e.example()
    if e.float_inputs:
        td = td.double()
    weights = out_weights(m, call(m, params, td))
    if not weights:
        pytest.skip("no floating output")

    # differentiate the trainable part only (BatchNorm's running statistics are state)
    params, state = fd.nn.split_state(m, params)

    def loss(p, t):
        return weighted(call(m, fd.nn.merge_state(p, state), t), weights)

    argnums = tuple(i for i, ok in ((0, m.has_params), (1, e.float_inputs)) if ok)
    grads = fd.grad(loss, argnums=argnums)(params, td)
    grads = dict(zip(argnums, grads))

    sources = torch_sources(m)
    if m.has_params and sources is not None:
        # against the torch modules themselves: load the weights, run, .backward()
        sources = copy.deepcopy(sources)
        _load(m, sources, fd.nn.merge_state(params, state))
        data = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in td.items()}
        nn_forward(m, sources, data)
        weighted(data, weights).backward()
        ref = nn_grads(m, sources).select(*grads[0].keys(True, True))
        assert_close(grads[0], ref, rtol=1e-7, atol=1e-9)
        if 1 in grads:
            for k in td.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch)
                assert_close(grads[1][k], data[k].grad, rtol=1e-7, atol=1e-9)
        return
    # against torch.autograd.grad of the same pure function
    leaves, spec = torch.utils._pytree.tree_flatten((params, td))
    req = [x.detach().requires_grad_(x.is_floating_point()) for x in leaves]
    p2, t2 = torch.utils._pytree.tree_unflatten(req, spec)
    wrt = [x for x in fd.tree.leaves([(p2, t2)[i] for i in argnums])]
    ref = torch.autograd.grad(loss(p2, t2), wrt, allow_unused=True)
    ref = [torch.zeros_like(w) if r is None else r for r, w in zip(ref, wrt)]
    got = fd.tree.leaves([grads[i] for i in argnums])
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_entries_made_of_torch_modules_are_checked_against_them():
    torch_made = {
        n for n in NAMES if ENTRIES[n].make().has_params and torch_sources(ENTRIES[n].make())
    }
    assert torch_made == {
        "Module(BatchNorm1d training)",
        "Sequential(Linear, BatchNorm1d training)",
        "Module(nn.Linear lowered)",
        "Module(functional_call)",
        "Sequential(tutorial block)",
        "Sequential(selected)",
    }


def _load(m, sources, params):
    """Load float64 params into the copied torch modules (and make buffers other than
    running statistics require grad, since functd differentiates them like any entry)."""
    if m.children():
        for n, c in m.children():
            if c.has_params:
                _load(c, sources[n], params[n])
        return
    sources.to(torch.float64)
    fd.to_module(params, sources)
    for mod in sources.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._NormBase):
            continue  # running statistics are state (split off), not differentiated
        for b in mod.buffers(recurse=False):
            if b.is_floating_point():
                b.requires_grad_()
