"""Transforms of a jitted function, as in JAX: ``T(fd.jit(f))`` equals the eager
``T(f)`` and runs compiled (``fd.jit(T(f))``, cached on the jitted function).

References: the eager functd transform of the plain function (itself checked
against torch.func in test_autodiff.py / test_vmap.py) and torch.func directly.
Most cases trace with ``backend="fx"`` (the same trace and cache as inductor,
without the C++ compile); one compiles with inductor.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import functd as fd
from functd.testing import assert_close, count_compiles

FX = {"backend": "fx"}

BLOCK = fd.Sequential(
    fd.Module(nn.Linear(3, 8), ["x"], ["h"]),
    fd.Module(torch.tanh, ["h"], ["a"]),
    fd.Module(nn.Linear(8, 2), ["a"], ["y"]),
)


def _td(n=4):
    return fd.TensorDict({"x": torch.randn(n, 3, generator=torch.Generator().manual_seed(n))}, [n])


def loss(p, td):
    return BLOCK(p, td)["y"].pow(2).mean()


def loss_aux(p, td):
    y = BLOCK(p, td)["y"]
    return y.pow(2).mean(), {"ymax": y.max()}


def _params():
    return BLOCK.init(0)


# ---------------------------------------------------------------- each transform
@pytest.mark.parametrize(
    "make",
    [
        lambda f: fd.grad(f),
        lambda f: fd.value_and_grad(f),
        lambda f: fd.grad(f, argnums=(0, 1)),
    ],
    ids=["grad", "value_and_grad", "grad_argnums"],
)
def test_grad_of_jit_equals_the_eager_grad_and_compiles_once(make):
    params, td = _params(), _td()
    jloss = fd.jit(loss, **FX)
    g = make(jloss)
    with count_compiles() as c:
        got = g(params, td)
        again = g(params, _td())
    assert_close(got, make(loss)(params, td))
    assert_close(again, make(loss)(params, _td()))
    assert c.jit == 1  # one trace of fd.grad(loss), reused by the second call
    assert jloss.cache_size() == 0  # the jitted loss itself never ran


def test_grad_with_aux_of_jit_equals_eager():
    params, td = _params(), _td()
    got = fd.value_and_grad(fd.jit(loss_aux, **FX), has_aux=True)(params, td)
    assert_close(got, fd.value_and_grad(loss_aux, has_aux=True)(params, td))


def test_transforms_of_a_jitted_function_equal_torch_func():
    x = torch.randn(3, generator=torch.Generator().manual_seed(1))

    def f(x):
        return (x.sin() * x).sum()

    def vec(x):
        return torch.stack([x.sin().sum(), (x * x).prod()])

    jf, jvec = fd.jit(f, **FX), fd.jit(vec, **FX)
    assert_close(fd.grad(jf)(x), torch.func.grad(f)(x))
    assert_close(fd.hessian(jf)(x), torch.func.hessian(f)(x))
    assert_close(fd.jacrev(jvec)(x), torch.func.jacrev(vec)(x))
    assert_close(fd.jacfwd(jvec)(x), torch.func.jacfwd(vec)(x))
    t = torch.ones(3)
    assert_close(fd.jvp(jvec, (x,), (t,)), torch.func.jvp(vec, (x,), (t,)))
    out, vjp_fn = fd.vjp(jvec, x)
    ref_out, ref_fn = torch.func.vjp(vec, x)
    ct = torch.tensor([1.0, -2.0])
    assert_close(out, ref_out)
    assert_close(vjp_fn(ct), ref_fn(ct))


def test_jvp_and_vjp_of_a_jitted_function_compile_once_across_calls():
    jvec = fd.jit(lambda x: x.sin() * 2, **FX)
    xs = [torch.randn(3) for _ in range(3)]
    with count_compiles() as c:
        for x in xs:
            fd.jvp(jvec, (x,), (torch.ones(3),))
            _, fn = fd.vjp(jvec, x)
            fn(torch.ones(3))
    assert c.jit == 3  # jvp, the forward of vjp and its backward: once each


def test_vjp_of_a_jitted_function_checks_the_cotangents():
    _, fn = fd.vjp(fd.jit(lambda x: x * 2, **FX), torch.ones(3))
    with pytest.raises(ValueError, match=r"fd.vjp\(<lambda>\).*cotangents"):
        fn(torch.ones(4))


@pytest.mark.parametrize("in_dims", [0, (0, None), ({"0": 0, "2": 0}, None)])
def test_vmap_of_jit_equals_the_eager_vmap(in_dims):
    ens = fd.vmap(BLOCK.init)(fd.random.split(fd.random.key(0), 3))
    td = _td()
    if in_dims == 0:
        td = fd.stack([_td(), _td(5)[:4], _td(6)[:4]])
    jb = fd.jit(BLOCK, **FX)
    assert_close(fd.vmap(jb, in_dims=in_dims)(ens, td), fd.vmap(BLOCK, in_dims=in_dims)(ens, td))


def test_vmap_of_jit_with_out_dims_and_axis_name():
    x = torch.randn(4, 3)

    def f(x):
        return x - fd.pmean(x, "i"), x.sum()

    got = fd.vmap(fd.jit(f, **FX), out_dims=(1, 0), axis_name="i")(x)
    assert_close(got, fd.vmap(f, out_dims=(1, 0), axis_name="i")(x))


def test_composed_transforms_of_jit_equal_eager_in_any_order():
    ens = fd.vmap(BLOCK.init)(fd.random.split(fd.random.key(1), 2))
    td = _td()
    jloss = fd.jit(loss, **FX)
    per_member = fd.vmap(fd.grad(jloss), in_dims=(0, None))(ens, td)
    assert_close(per_member, fd.vmap(fd.grad(loss), in_dims=(0, None))(ens, td))
    mean_loss = fd.jit(lambda e, td: fd.vmap(loss, in_dims=(0, None))(e, td).sum(), **FX)
    assert_close(
        fd.grad(mean_loss)(ens, td),
        fd.grad(lambda e, td: fd.vmap(loss, in_dims=(0, None))(e, td).sum())(ens, td),
    )


# ---------------------------------------------------------------- the derived wrapper
def test_a_transform_of_a_jitted_function_is_a_jitted_function_kept_on_it():
    jloss = fd.jit(loss, static_argnums=(), cache_size=3, **FX)
    g = fd.grad(jloss)
    assert fd.grad(jloss) is g  # built again in a loop: the same compiled code
    assert fd.grad(jloss, argnums=1) is not g
    assert repr(g) == "jit(grad(loss), backend='fx', cache_size=3)"
    jloss.cache_clear()
    assert fd.grad(jloss) is not g


def test_static_argnums_carry_over_to_the_transformed_function():
    def f(x, power):
        return (x**power).sum()

    jf = fd.jit(f, static_argnums=1, **FX)
    x = torch.rand(3) + 0.5
    g = fd.grad(jf)
    assert_close(g(x, 3), 3 * x**2)
    assert_close(g(x, 2), 2 * x)
    assert g.cache_size() == 2


def test_jit_of_jit_inlines_and_transforms_see_through_both():
    inner = fd.jit(loss, **FX)
    outer = fd.jit(lambda p, td: inner(p, td) * 3, **FX)
    params, td = _params(), _td()
    assert_close(fd.grad(outer)(params, td), fd.grad(lambda p, td: loss(p, td) * 3)(params, td))
    assert inner.cache_size() == 0


def test_torch_func_transforms_of_a_jitted_function_run_f_with_a_warning():
    x = torch.randn(3)
    jf = fd.jit(lambda x: (x.cos() * x).sum(), **FX)
    with pytest.warns(fd.JitWarning, match=r"torch.func.grad.*fd.grad\(jitted\)"):
        got = torch.func.grad(jf)(x)
    assert_close(got, torch.func.grad(lambda x: (x.cos() * x).sum())(x))
    jv = fd.jit(lambda x: x.sin(), **FX)
    with pytest.warns(fd.JitWarning, match=r"torch.func.vmap.*fd.vmap\(jitted\)"):
        assert_close(torch.func.vmap(jv)(torch.ones(2, 3)), torch.ones(2, 3).sin())
    assert jf.cache_size() == 0 and jv.cache_size() == 0


@pytest.mark.compile
def test_grad_of_jit_compiles_with_inductor_and_equals_eager():
    params, td = _params(), _td()
    g = fd.grad(fd.jit(loss))
    assert_close(g(params, td), fd.grad(loss)(params, td))
    assert "grad(loss)" in repr(g) and g.cache_info().compiles == 1
