"""JAX's ``tests/lax_control_flow_test.py`` while_loop cases, translated to functd (the
expectations are JAX's; the code is written for functd). The scan and fori_loop cases,
and the table of JAX cases not translated, are in test_lax_scan.py."""

from __future__ import annotations

import pytest
import torch

import functd as fd
from functd._transforms._while import fori_while
from functd.testing import assert_close
from tests._support.lax import (
    D,
    _index,
    _jit,
    _rng,
    _t,
    _while_reference,
)


# ---------------------------------------------------------------------------- while
def test_callable_errors():
    with pytest.raises(TypeError, match=r"fd.while_loop: cond must be a callable"):
        fd.while_loop(42, 42, torch.zeros(()))
    with pytest.raises(TypeError, match=r"fd.scan: f must be a callable"):
        fd.scan(42, torch.zeros(()), torch.ones(1))


def _while_with_tuple(init):
    limit = 10
    _, count = fd.while_loop(lambda s: s[0] < limit, lambda s: (s[0] + 1, s[1] + 1), (init, 0))
    return count


def test_while_with_tuple():
    assert _while_with_tuple(_t(2)).item() == 8
    cloop = _jit(_while_with_tuple)
    assert cloop(_t(2)).item() == 8
    assert cloop(_t(2)).item() == 8
    assert cloop(_t(3)).item() == 7
    assert cloop.cache_size() == 1


def test_while_with_many_args():
    out = fd.while_loop(lambda s: s[0] < 2, lambda s: tuple(v + 1 for v in s), (_t(0),) * 256)
    assert len(out) == 256 and all(v.item() == 2 for v in out)


def _outer_loop(num):
    def inner_loop(i, count):
        return fd.while_loop(
            lambda s: s[1] <= s[0], lambda s: (s[0], s[1] + 1, s[2] + 1), (i, _t(0), count)
        )[2]

    _, i, count = fd.while_loop(
        lambda s: s[1] < s[0],
        lambda s: (s[0], s[1] + 1, inner_loop(s[1], s[2])),
        (num, _t(0), _t(0)),
    )
    return i, count


def test_nested_while():
    assert [v.item() for v in _outer_loop(_t(3))] == [3, 6]
    cloop = _jit(_outer_loop)
    for n, want in ((3, [3, 6]), (3, [3, 6]), (2, [2, 3]), (4, [4, 10])):
        assert [v.item() for v in cloop(_t(n))] == want


def _closure_loop(effect, jit_inner=False):
    def loop(init, local_limit, inc):
        def body(s):
            effect[0] = True
            pos, count = s
            if jit_inner:
                return fd.jit(lambda pos, inc: (pos + 1, count + inc), backend="fx")(pos, inc)
            return pos + 1, count + inc

        _, count = fd.while_loop(lambda s: s[0] < local_limit, body, (init, _t(0)))
        return count

    return loop


@pytest.mark.parametrize("jit_inner", [False, True], ids=["while_with_closure", "closure_jit"])
def test_while_with_closure(jit_inner):
    effect = [False]
    loop = _closure_loop(effect, jit_inner)
    cloop = _jit(loop)
    assert loop(_t(2), _t(10), _t(1)).item() == 8 and effect[0]
    effect[0] = False
    assert cloop(_t(2), _t(10), _t(1)).item() == 8 and effect[0]  # traced: body ran
    effect[0] = False
    assert cloop(_t(2), _t(10), _t(1)).item() == 8
    assert cloop(_t(3), _t(10), _t(1)).item() == 7
    assert not effect[0]  # compiled: body never ran again


def test_while_type_errors():
    with pytest.raises(TypeError, match=r"cond must return a bool scalar.*a tuple"):
        fd.while_loop(lambda c: (1.0, 1.0), lambda c: c, _t(0.0))
    with pytest.raises(TypeError, match=r"cond must return a bool scalar.*float32\[\] tensor"):
        fd.while_loop(lambda c: _t(1.0), lambda c: c, _t(0.0))
    with pytest.raises(TypeError, match=r"fd.while_loop: body changed the structure of the carry"):
        fd.while_loop(lambda c: True, lambda c: (_t(1.0), _t(1.0)), _t(0.0))
    with pytest.raises(
        TypeError, match=r"body changed the carry at carry\[1\]: init has float32\[\]"
    ):
        fd.while_loop(lambda c: True, lambda c: (_t(True), _t(True)), (_t(True), _t(0.0)))


def _dus_outer_loop(arr):
    num = 5

    def inner_loop(i, arr, out):
        def body(s):
            i, j, arr, out = s
            v = _index(_index(arr, i), j)
            return i, j + 1, arr, out.index_put((i.reshape(1), j.reshape(1)), v.reshape(1))

        return fd.while_loop(lambda s: s[1] <= s[0], body, (i, _t(0), arr, out))[3]

    def body(s):
        i, n, arr, out = s
        return i + 1, n, arr, inner_loop(i, arr, out)

    init = (_t(0), _t(num), arr, torch.zeros_like(arr))
    return fd.while_loop(lambda s: s[0] < s[1], body, init)[3]


def test_nested_while_with_dynamic_update_slice():
    arr = torch.randn(5, 5, dtype=D, generator=_rng())
    assert torch.equal(_dus_outer_loop(arr), torch.tril(arr))
    cloop = _jit(_dus_outer_loop)
    assert torch.equal(cloop(arr), torch.tril(arr))
    assert torch.equal(cloop(arr), torch.tril(arr))


def _sum_first_n_while(arr, num):
    def cond(s):
        arr, num, i, _ = s
        return (i < num) & (i < arr.shape[0])

    def body(s):
        arr, num, i, total = s
        return arr, num, i + 1, total + _index(arr, i)

    return fd.while_loop(cond, body, (arr, num, _t(0), 0.0))[3]


def test_loop_with_conjunction_condition():
    x = torch.randn(10, dtype=D, generator=_rng())
    cfun = _jit(_sum_first_n_while)
    for num in (0, 5, 10, 15):
        assert_close(_sum_first_n_while(x, _t(num)), x[:num].sum())
        assert_close(cfun(x, _t(num)), x[:num].sum())
        assert_close(cfun(x, _t(num)), x[:num].sum())


def _grow(x):
    return fd.while_loop(lambda x: x < 3, lambda x: x + 2, x)


def test_while_loop_batched():
    xs, expected = _t([0, 1, 2, 3]), _t([4, 3, 4, 3])
    assert torch.equal(fd.vmap(_grow)(xs), expected)
    assert torch.equal(_jit(fd.vmap(_grow))(xs), expected)


def test_while_loop_batched_with_const_body():
    def f(x):
        return fd.while_loop(lambda _: _t(False).logical_not() == _t(False), lambda _: _t(0.0), x)

    x = torch.arange(5, dtype=torch.float32)
    assert torch.equal(fd.vmap(f)(x), x)


def test_while_loop_cond_consts_batched():
    fun = fd.vmap(
        lambda x, y: fd.while_loop(lambda x: x < y, lambda x: x + 2, x), in_dims=(None, 0)
    )
    assert torch.equal(fun(_t(0), _t([2, 3])), _t([2, 4]))


def test_while_loop_body_consts_batched():
    fun = fd.vmap(
        lambda x, y: fd.while_loop(lambda x: x < 3, lambda x: x + y, x), in_dims=(None, 0)
    )
    assert torch.equal(fun(_t(0), _t([2, 3])), _t([4, 3]))


def test_while_loop_tuple_batched():
    def fun(x, y):
        return fd.while_loop(lambda c: c[0] + c[1] < 5, lambda c: (c[0] + 1, c[1]), (x, y))

    for f in (fd.vmap(fun), _jit(fd.vmap(fun))):
        x, y = f(_t([0, 0]), _t([1, 2]))
        assert torch.equal(x, _t([4, 3])) and torch.equal(y, _t([1, 2]))


def test_issue_3204():
    # vmap of nested loops
    def test(a, b):
        def body1(s):
            val, i, _ = s

            def body2(s):
                val, i, j = s
                return val + i + j, i, j + 1

            val = fd.while_loop(lambda s: s[2] < b + 1, body2, (val, i, _t(0)))[0]
            return val, i + 1, _t(0)

        return fd.while_loop(lambda s: s[1] < a + 1, body1, (_t(0), _t(0), _t(0)))[0]

    arr = torch.arange(5)
    expected = torch.stack([test(a, b) for a, b in zip(arr, arr)])
    # sum over i <= a, j <= a of i + j = (a + 1)^2 * a
    assert torch.equal(expected, (arr + 1) ** 2 * arr)
    assert torch.equal(fd.vmap(test)(arr, arr), expected)


def test_issue649():
    out = fd.while_loop(lambda x: x[1] < 10, lambda x: (_t(7), x[1] + 1), (_t(33), _t(4)))
    assert [v.item() for v in out] == [7, 10]


def test_while_cond_constant():
    assert fd.while_loop(lambda _: False, lambda _: (), ()) == ()


@pytest.mark.parametrize("jit_body", [False, True])
def test_while_jvp(jit_body):
    def cond(x):
        return x[0, 2] <= 8

    def body(x):
        return x * x

    loop_body = fd.jit(body, backend="fx") if jit_body else body
    x = torch.arange(9.0, dtype=D).reshape(3, 3)
    if jit_body:  # a jitted body inside fd.jvp runs uncompiled there, with one warning
        with pytest.warns(fd.JitWarning, match="inside fd.jvp"):
            ans = fd.jvp(lambda x: fd.while_loop(cond, loop_body, x), (x,), (x,))
    else:
        ans = fd.jvp(lambda x: fd.while_loop(cond, loop_body, x), (x,), (x,))
    expected = torch.func.jvp(lambda x: _while_reference(cond, body, x), (x,), (x,))
    assert_close(ans[0], expected[0])
    assert_close(ans[1], expected[1])


def test_while_jvp_with_growing_nonzero_tangents():
    y, z = torch.randn(2, dtype=D, generator=_rng(1)), torch.randn(2, dtype=D, generator=_rng(2))

    def loop(impl, x):
        def body(s):
            i, x, y, _ = s
            y = x * x
            return i + 1, x, y, y * y

        return impl(lambda s: s[0] < 2, body, (_t(0), x, y, z))[1]

    x = torch.randn(2, dtype=D, generator=_rng(3))
    ans = fd.jvp(lambda x: loop(fd.while_loop, x), (x,), (x,))
    expected = torch.func.jvp(lambda x: loop(_while_reference, x), (x,), (x,))
    assert_close(ans[1], expected[1])


def test_while_grad_error():
    def func(x):
        return fd.while_loop(lambda i: i < 5.0, lambda i: i + 1.0, x)

    with pytest.raises(RuntimeError, match=r"reverse-mode differentiation .* while loop"):
        fd.grad(func)(_t(1.0))
    assert fd.jvp(func, (_t(1.0),), (_t(1.0),))[1].item() == 1.0  # forward mode works


def test_disable_jit_while_loop_with_vmap():
    out = fd.vmap(lambda y: fd.while_loop(lambda x: x < 10.0, lambda x: x + 1.0, y))(_t([3.0, 4.0]))
    assert torch.equal(out, _t([10.0, 10.0]))


def test_vmaps_of_while_loop():
    def f(x, n):
        return fori_while(0, n, lambda _, x: x + 1, x)

    x, n = torch.arange(3), torch.arange(4)
    out = fd.vmap(fd.vmap(f, in_dims=(None, 0)), in_dims=(0, None))(x, n)
    assert torch.equal(out, x[:, None] + n[None, :])


@pytest.mark.parametrize(
    "dtype",
    [torch.int64, torch.int8, torch.int32, torch.uint8],
)
def test_while_loop_init_weak_type(dtype):
    increment = _t(1, dtype)
    result = fd.while_loop(lambda v: v < 2, lambda v, inc=increment: v + inc, 0)
    assert result.dtype == dtype and result.item() == 2


def test_while_loop_fixed_point_with_batched_pred_and_consts():
    def f(i, x):
        return fd.while_loop(
            lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] + x), (i, torch.ones(3))
        )[1]

    out = fd.vmap(f, in_dims=(0, 1))(torch.arange(4), torch.ones(3, 4))
    assert torch.equal(out, (1.0 + 5 - torch.arange(4.0))[:, None].expand(4, 3))


def test_while_readonly_carry_optimization():
    def foo(w, x, c_max):
        _, x, w = fd.while_loop(
            lambda v: v[0] < c_max, lambda v: (v[0] + 1, v[1] @ v[2], v[2]), (0, x, w)
        )
        return w, x

    w, xs, c_maxs = torch.ones(2, 2), torch.ones(4, 2), torch.arange(4)
    w_, x_ = fd.vmap(foo, in_dims=(None, 0, 0), out_dims=(None, 0))(w, xs, c_maxs)
    assert torch.equal(w_, w)
    assert torch.equal(x_, (2.0 ** c_maxs.float())[:, None].expand(4, 2))
