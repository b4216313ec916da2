"""JAX's ``tests/lax_control_flow_test.py`` cases about scan, fori_loop and while_loop,
translated to functd (the expectations are JAX's; the code is written for functd).

Each test is named after its JAX case (``testWhileWithTuple`` -> ``test_while_with_tuple``).
``fd.fori_loop`` with a bound held in a tensor is ``fori_while`` here (fd.fori_loop
dispatches to it for a traced or mapped bound). ``lax.dynamic_index_in_dim``
is ``index_select``; ``lax.dynamic_update_slice`` is ``index_put``.

JAX cases not translated, and why:

| JAX case | why |
|---|---|
| testCallableErrors (cond/switch/associative_scan parts) | no functd counterpart (the while part is here) |
| testCond*, testSwitch*, testIssue514, testIssue1379, testNestedCond, test_cond_* | no lax.cond/switch in functd |
| testWhileLoopAxisIndexBatched | no ``lax.axis_index`` in functd |
| testWhileLoopCustomPytreeDiffAuxData | JAX's pytree registration with keys; functd uses optree's registry |
| testForiLoopErrors, testForiLoopScalarLimits, test_fori_loop_with_dynamic_indices_cannot_unroll | numpy scalar bounds (np.int16): numpy is not a dependency of the test environment |
| testForiLoopBatchedIssue1190, testIssue810, test_scan_lowering_doesnt_introduce_singleton, test_scan_typecheck_param | inspect jaxprs / HLO text |
| testStaticForiGrad, testWhileGradError (fori variants) | float loop bounds (``fori_loop(x, x + 2.)``); functd's bounds are ints |
| testScanLinearize, testWhileLinearize, test_grad_remat_while_fixpoint (linearize) | no jax.linearize (the jvp cases are here) |
| testIssue804, test_while_loop_of_pmap*, test_scan_vmap_collectives | pmap / collectives over devices |
| testMap, testMapEmpty | no lax.map |
| testCaching*, test_caches_depend_on_axis_env | JAX's tracing caches |
| testAssociativeScan* | no associative_scan |
| test_disable_jit_while_loop_with_mutation, test_*_constification_*, test_*_forwarding_*, test_scan_vjp_forwards_extensive_residuals, test_scan_diff_of_print, test_scan_fixpoint_instantiate, test_scan_readonly_carry_optimization | JAX internals (constification, forwarding, residuals, debug print) |
| test_xla_cpu_gpu_loop_cond_bug, test_platform_dependent*, test_issue_29329 | XLA / platform specific |
| test_scan_unroll_concrete_error, test_scan_length_concrete_error | JAX's concretization errors (functd: ``length``/``unroll`` are Python values; a tensor length is refused by fd.scan's own check, tested in test_loops) |
| the SCAN_IMPLS_WITH_FOR / checkpoint variants | one fd.scan implementation |
"""

from __future__ import annotations

import pytest
import torch

import functd as fd
from functd._transforms._while import fori_while
from functd.testing import assert_close
from tests._support.lax import (
    UNROLLED,
    D,
    _index,
    _jit,
    _rng,
    _scan_reference,
    _t,
)


# ---------------------------------------------------------------------------- fori_loop
def _count(num):
    return fori_while(0, num, lambda i, tot: tot + i, 0)


def test_fori_loop_basic():
    for n, want in ((2, 1), (3, 3), (4, 6)):
        assert _count(_t(n)).item() == want
        assert _jit(_count)(_t(n)).item() == want


def test_fori_loop_basic_static_bounds():
    # (JAX's count(num) with Python int bounds: fd.fori_loop with a Python scalar carry)
    assert [fd.fori_loop(0, n, lambda i, tot: tot + i, 0).item() for n in (2, 3, 4)] == [1, 3, 6]


def test_fori_loop_closure():
    def count(num):
        return fori_while(0, num, lambda i, tot: num + tot + i, _t(0))

    cfun = _jit(count)
    for n in (2, 3, 4):
        assert count(_t(n)).item() == n * (n - 1) // 2 + n * n
        assert cfun(_t(n)).item() == count(_t(n)).item()


def _sum_first_n(state_kind):
    def sum_first_n(arr, num):
        def body(i, state):
            if state_kind == "dict":
                return {"arr": state["arr"], "total": state["total"] + _index(state["arr"], i)}
            if state_kind == "empty":
                arr, total, _ = state
                return arr, total + _index(arr, i), ()
            arr, total = state
            return arr, total + _index(arr, i)

        zero = torch.zeros((), dtype=arr.dtype)
        init = {"dict": {"arr": arr, "total": zero}, "empty": (arr, zero, ()), "tuple": (arr, zero)}
        out = fori_while(0, torch.clamp(num, max=arr.shape[0]), body, init[state_kind])
        return out["total"] if state_kind == "dict" else out[1]

    return sum_first_n


@pytest.mark.parametrize(
    "kind", ["tuple", "dict", "empty"], ids=["tuple_state", "dict_state", "empty_tuple_in_state"]
)
def test_fori_loop_state(kind):
    f = _sum_first_n(kind)
    cfun = _jit(f)
    x = torch.randn(10, dtype=D, generator=_rng())
    for num in (0, 5, 10, 15):
        assert_close(f(x, _t(num)), x[:num].sum())
        assert_close(cfun(x, _t(num)), x[:num].sum())
    assert cfun.cache_size() == 1


@pytest.mark.parametrize("unroll", [3, True, False])
def test_fori_loop_supports_unrolling(unroll):
    init = _t(10.0)
    assert fd.fori_loop(0, 10, lambda i, c: c + 1, init, unroll=unroll).item() == 20.0


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("upper", [0, -1])
def test_fori_loop_returns_init_with_nonpositive_length(jit, upper):
    def f(init):
        return fd.fori_loop(0, upper, lambda i, c: c + 1, init)

    init = _t(10.0)
    assert torch.equal((_jit(f) if jit else f)(init), init)


def test_fori_loop_returns_init_with_nonpositive_length_unroll():
    init = _t(10.0)
    assert torch.equal(fd.fori_loop(0, -1, lambda i, c: c + 1, init, unroll=True), init)


def test_fori_loop_batched():
    def fun(x):
        return fd.fori_loop(0, 10, lambda i, c: (c[0] + 1, c[1] + 2), (x, 0))

    x, y = fd.vmap(fun)(_t([0, 1]))
    assert torch.equal(x, _t([10, 11])) and torch.equal(y, _t([20, 20]))


def test_fori_loop_issue8152():
    assert fd.fori_loop(0, 0, lambda x, i: x + i, 1.0).item() == 1.0
    carry, _ = fd.scan(lambda c, x: (c + x, x), 0.0, torch.zeros(0))
    assert carry.item() == 0.0


def test_while_jvp_via_fori_loop():
    for body, value, tangent in (
        (lambda i, x: x * 2, 16.0, 8.0),
        (lambda i, x: x * (i + 1), 12.0, 6.0),
    ):

        def f(x, body=body):
            return fd.fori_loop(0, 3, body, x)

        assert f(_t(2.0)).item() == value
        out, t = fd.jvp(f, (_t(2.0),), (_t(1.0),))
        assert (out.item(), t.item()) == (value, tangent)
        out, t = fd.jvp(lambda x, body=body: fori_while(0, _t(3), body, x), (_t(2.0),), (_t(1.0),))
        assert (out.item(), t.item()) == (value, tangent)


def test_scan_metadata_error():
    with pytest.raises(
        TypeError, match=r"changed the structure of the carry: init is .*'t'.* returned .*'T'"
    ):
        fd.fori_loop(0, 1, lambda i, x: {"T": _t([0.5])}, {"t": _t([1.0])})


# ---------------------------------------------------------------------------- scan
def _scan_f(d):
    def f(c, a):
        assert a.shape == (3,) and c.shape == (4,)
        b = torch.cos(torch.sin(a).sum() + torch.cos(c).sum() + d.sum())
        return torch.sin(c * b), b

    return f


def _scan_inputs(seed=0):
    g = _rng(seed)
    d = torch.randn(2, dtype=D, generator=g)
    return d, torch.randn(5, 3, dtype=D, generator=g), torch.randn(4, dtype=D, generator=g)


@pytest.mark.parametrize("jit_scan", [False, True])
@pytest.mark.parametrize("jit_f", [False, True])
def test_scan_impl(jit_scan, jit_f):
    d, as_, c = _scan_inputs()
    f = _scan_f(d)
    g = fd.jit(f, backend="fx") if jit_f else f
    scan = (
        _jit(lambda c, as_: fd.scan(g, c, as_)) if jit_scan else (lambda c, as_: fd.scan(g, c, as_))
    )
    ans, expected = scan(c, as_), _scan_reference(f, c, as_)
    assert_close(ans[0], expected[0])
    assert_close(ans[1], expected[1])


@UNROLLED
@pytest.mark.parametrize("jit_scan", [False, True])
def test_scan_jvp(jit_scan):
    d, as_, c = _scan_inputs()
    f = _scan_f(d)

    def scan(c, as_):
        return fd.scan(f, c, as_)

    if jit_scan:
        ans = _jit(lambda c, as_: fd.jvp(scan, (c, as_), (c, as_)))(c, as_)
    else:
        ans = fd.jvp(scan, (c, as_), (c, as_))
    expected = torch.func.jvp(lambda c, as_: _scan_reference(f, c, as_), (c, as_), (c, as_))
    for a, e in zip(
        torch.utils._pytree.tree_leaves(ans), torch.utils._pytree.tree_leaves(expected)
    ):
        assert_close(a, e, rtol=1e-12, atol=1e-12)


@UNROLLED
@pytest.mark.parametrize("jit_scan", [False, True])
def test_scan_grad(jit_scan):
    g = _rng(0)
    d, as_, c = (torch.randn(s, dtype=D, generator=g) for s in ((2,), (5, 3), (4,)))

    def f(c, a):
        b = torch.sin(a).sum() + torch.sin(c).sum() + torch.sin(d).sum()
        return torch.sin(c * b), b

    def loss(c, as_):
        return fd.scan(f, c, as_)[0].sum()

    grad = fd.grad(loss, argnums=(0, 1))
    ans = _jit(grad)(c, as_) if jit_scan else grad(c, as_)
    expected = torch.func.grad(lambda c, as_: _scan_reference(f, c, as_)[0].sum(), argnums=(0, 1))(
        c, as_
    )
    assert_close(ans[0], expected[0], rtol=1e-13, atol=1e-13)
    assert_close(ans[1], expected[1], rtol=1e-13, atol=1e-13)


def test_scan_rnn():
    r = _rng(0)
    n_in, n_hid, n_out, length = 4, 2, 1, 3
    params = (
        torch.randn(n_hid, n_hid + n_in, dtype=D, generator=r),
        torch.randn(n_out, n_hid + n_in, dtype=D, generator=r),
    )
    inputs = torch.randn(length, n_in, dtype=D, generator=r)
    targets = torch.randn(length, n_out, dtype=D, generator=r)

    def step(params, state, inp):
        w_trans, w_out = params
        stacked = torch.cat([state, inp])
        return torch.tanh(w_trans @ stacked), torch.tanh(w_out @ stacked)

    def loss_with(scan):
        def loss(params, inputs, targets):
            _, outputs = scan(lambda s, x: step(params, s, x), torch.zeros(n_hid, dtype=D), inputs)
            return ((outputs - targets) ** 2).sum()

        return loss

    loss, ref = _jit(loss_with(fd.scan)), loss_with(_scan_reference)
    assert_close(loss(params, inputs, targets), ref(params, inputs, targets))
    tangents = (params, inputs, targets)
    ans = fd.jvp(loss_with(fd.scan), (params, inputs, targets), tangents)
    expected = torch.func.jvp(ref, (params, inputs, targets), tangents)
    assert_close(ans[1], expected[1])
    g = fd.grad(loss_with(fd.scan))(params, inputs, targets)
    ge = torch.func.grad(ref)(params, inputs, targets)
    assert_close(g[0], ge[0])
    assert_close(g[1], ge[1])
    bi = torch.randn(7, length, n_in, dtype=D, generator=r)
    bt = torch.randn(7, length, n_out, dtype=D, generator=r)
    with pytest.warns(fd.JitWarning, match="inside fd.vmap"):  # jitted loss in a closure
        losses = fd.vmap(lambda x, y: loss(params, x, y))(bi, bt)
    assert_close(losses, torch.stack([ref(params, x, y) for x, y in zip(bi, bt)]))


def test_issue711():
    def minimize_structure(test_params):
        def energy_fn(conf):
            return (conf * test_params).sum()

        def apply_carry(carry, _):
            i, x = carry
            return (i + 1, x - 0.1 * fd.grad(energy_fn)(x)), None

        (_, x_final), _ = fd.scan(apply_carry, (0, _t([1.0, 2.0, 3.0], D)), torch.zeros(75, 0))
        return x_final

    def loss(p):
        return torch.sin(1.0 - minimize_structure(p)).sum()

    p = _t(0.25, D)
    expected = (torch.cos(1.0 - (_t([1.0, 2.0, 3.0], D) - 7.5 * p)) * 7.5).sum()
    assert_close(fd.grad(loss)(p), expected)


def test_issue744():
    with pytest.raises(
        TypeError, match=r"fd.scan: xs\[0\] is a int, not a tensor with a leading dim"
    ):
        fd.scan(lambda p, i: ((p[0] + 1, p[1] + 1), i), (_t(1), _t(2)), list(range(5)))


def test_scan_body_output_error():
    with pytest.raises(
        TypeError, match=r"fd.scan: f must return a pair \(carry, y\); it returned a Tensor"
    ):
        fd.scan(lambda c, x: _t(0.0), _t(0.0), torch.arange(5.0))


def test_scan_body_carry_pytree_mismatch_errors():
    with pytest.raises(TypeError, match=r"fd.scan: f changed the structure of the carry"):
        fd.scan(lambda c, x: ((_t(0), _t(0), _t(0)), x), (_t(1), (_t(2), _t(3))), torch.arange(5.0))
    with pytest.raises(TypeError, match=r"fd.scan: f changed the structure of the carry"):
        fd.scan(lambda x, _: ((x[0].float(),), None), (_t(0, torch.int32),) * 2, None, length=1)
    with pytest.raises(TypeError, match=r"fd.scan: f changed the structure of the carry"):
        fd.scan(lambda x, _: ([x[0].float()] * 2, None), (_t(0, torch.int32),) * 2, None, length=1)
    with pytest.raises(TypeError, match=r"fd.scan: f changed the structure of the carry"):
        fd.scan(
            lambda x, _: ({"a": x["a"], "b": x["a"]}, None),
            {"a": _t(0, torch.int32)},
            None,
            length=1,
        )


def test_scan_body_carry_type_mismatch_errors():
    with pytest.raises(
        TypeError,
        match=r"f changed the carry at carry: init has int32\[\] and f returned float32\[\]",
    ):
        fd.scan(lambda x, _: (x.float(), None), _t(0, torch.int32), None, length=1)
    with pytest.raises(
        TypeError, match=r"at carry\[1\]: init has int32\[\] and f returned float32\[\]"
    ):
        fd.scan(
            lambda x, _: ((x[0], x[1].float()), None), (_t(0, torch.int32),) * 2, None, length=1
        )


def test_scan_length_error():
    with pytest.raises(ValueError, match=r"length=5 but xs has 10 steps along dim 0"):
        fd.scan(lambda *args: args, _t(0), torch.arange(10), length=5)


def test_scan_invalid_unroll_raises():
    with pytest.raises(ValueError, match=r"unroll"):
        fd.scan(lambda x, _: (x, x), _t(0), torch.arange(5), unroll=-1)


def test_scan_higher_order_differentiation():
    d = 0.75

    def f(c, a):
        b = torch.sin(c * torch.cos(d * a).sum())
        c = 0.9 * torch.cos(d * torch.sin(c * a).sum())
        return c, b

    as_ = torch.arange(6.0, dtype=D).reshape(3, 2)
    c = _t(1.0, D)

    def loss(scan):
        return lambda c: scan(f, c, as_)[1].sum() + scan(f, c, as_)[0]

    ans = fd.grad(fd.grad(loss(fd.scan)))(c)
    expected = torch.func.grad(torch.func.grad(loss(_scan_reference)))(c)
    assert_close(ans, expected)


@pytest.mark.parametrize("jit_scan", [False, True])
@pytest.mark.parametrize("in_axes", [(0, None), (None, 1), (1, 2), (0, 0)])
def test_scan_vmap(jit_scan, in_axes):
    d, _, _ = _scan_inputs()
    f = _scan_f(d)
    g = _rng(1)
    c_shape, as_shape = [4], [5, 3]
    if in_axes[0] is not None:
        c_shape.insert(in_axes[0], 7)
    if in_axes[1] is not None:
        as_shape.insert(in_axes[1], 7)
    c, as_ = (
        torch.randn(*c_shape, dtype=D, generator=g),
        torch.randn(*as_shape, dtype=D, generator=g),
    )
    mapped = fd.vmap(lambda c, as_: fd.scan(f, c, as_), in_dims=in_axes)
    ans = _jit(mapped)(c, as_) if jit_scan else mapped(c, as_)
    expected = torch.func.vmap(lambda c, as_: _scan_reference(f, c, as_), in_dims=in_axes)(c, as_)
    assert_close(ans[0], expected[0], rtol=1e-5, atol=1e-5)
    assert_close(ans[1], expected[1], rtol=1e-5, atol=1e-5)


def test_scan_vmap_tuples():
    def f(c, a):
        a1, a2 = a
        c1, c2 = c
        b = torch.cos(a1).sum() * (c2 * a2).sum()
        return (c1 * torch.sin((a1 * a2).sum()), c2 * torch.cos(a1.sum())), b

    r = _rng(0)
    as_ = (torch.randn(3, 7, dtype=D, generator=r), torch.randn(3, 4, 7, dtype=D, generator=r))
    c = (torch.randn(7, 2, dtype=D, generator=r), torch.randn(7, dtype=D, generator=r))
    outs = [fd.scan(f, (c[0][i], c[1][i]), (as_[0][:, i], as_[1][:, :, i])) for i in range(7)]
    (c0, c1), bs = fd.vmap(lambda c, as_: fd.scan(f, c, as_), in_dims=(0, (1, 2)))(c, as_)
    assert_close(c0, torch.stack([o[0][0] for o in outs]))
    assert_close(c1, torch.stack([o[0][1] for o in outs]))
    assert_close(bs, torch.stack([o[1] for o in outs]))


def test_scan_vmap_fixpoint():
    def f(carry_init):
        return fd.scan(
            lambda c, x: ((c[1], c[2], c[3], 0.0), None),
            (0.0, 1.0, 2.0, carry_init),
            torch.zeros(2),
        )

    carry_init = _t([3.0, 4.0, 5.0])
    carry_out, _ = fd.vmap(f)(carry_init)
    assert torch.equal(carry_out[3], torch.zeros(3)) and torch.equal(carry_out[2], torch.zeros(3))
    assert torch.equal(carry_out[1], carry_init) and torch.equal(
        carry_out[0], torch.full((3,), 2.0)
    )


@UNROLLED
def test_issue757():
    def loop(val):
        def apply_carry(x, i):
            return fd.grad(torch.cos)(x), i

        return fd.scan(apply_carry, val, torch.arange(10))[0]

    def loop_ref(val):
        for _ in range(10):
            val = -torch.sin(val)
        return val

    arg = _t(0.5, D)
    assert_close(_jit(fd.jacfwd(loop))(arg), torch.func.jacfwd(loop_ref)(arg))


def test_issue1316():
    def f(carry, _):
        c, key = carry
        key, _ = fd.random.split(key)
        return (c, key), ()

    key = fd.random.key(0)
    assert fd.grad(lambda c: fd.scan(f, (c, key), torch.ones(3))[0][0])(_t(0.0)).item() == 1.0


@UNROLLED
def test_issue1361():
    @_jit
    def jit_run_scan(x):
        (x, _), _ = fd.scan(
            lambda c, _: ((2 * c[0], torch.zeros(())), None), (x, torch.zeros(())), torch.arange(3)
        )
        return x

    assert fd.grad(jit_run_scan)(_t(0.0)).item() == 8.0


def test_scan_length_arg():
    ys = fd.scan(lambda c, _: (c + 1, c), 0, None, length=10)[1]
    assert torch.equal(ys, torch.arange(10))


@pytest.mark.parametrize("jit", [False, True])
def test_scan_reverse(jit):
    def cumsum(x, reverse):
        return fd.scan(lambda c, x: (c + x, c + x), 0, x, reverse=reverse)[1]

    x = _t([3, 1, 4, 1, 5, 9])
    run = _jit(cumsum) if jit else cumsum
    assert torch.equal(run(x, False), torch.cumsum(x, 0))
    assert torch.equal(run(x, True), torch.cumsum(x.flip(0), 0).flip(0))


def test_scan_unroll():
    d, _, _ = _scan_inputs()
    f = _scan_f(d)
    xs, c = torch.ones(20, 3, dtype=D), torch.ones(4, dtype=D)
    base = fd.scan(f, c, xs)
    for unroll in (2, True):
        out = fd.scan(f, c, xs, unroll=unroll)
        assert_close(out[0], base[0])
        assert_close(out[1], base[1])


def test_scan_xs_none():
    h, _ = fd.scan(lambda h, _: (h + 1, None), 0, length=20)
    assert h.item() == 20


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.float64])
def test_scan_init_weak_type(dtype):
    x = torch.ones(5, dtype=dtype)
    carry, result = fd.scan(lambda c, x: (c + x, x), 0, x)
    assert carry.item() == 5 and torch.equal(result, x)


def test_scan_hoisting_consts():
    a = torch.arange(4.0, dtype=D).reshape(2, 2)
    b = a + 1.0

    def f(scan):
        def g(x):
            def body(c, _):
                c1, c2, c3 = c
                return (a @ c1, b @ c2, torch.sin(b) @ c3), None

            init = (x * torch.ones(2, dtype=D),) * 3
            (c1, c2, c3), _ = scan(body, init, torch.zeros(3))
            return c1.sum() + c2.sum() + c3.sum()

        return g

    ref = torch.func.grad(f(lambda body, init, xs: _scan_reference(body, init, xs)))(_t(1.0, D))
    assert_close(fd.grad(f(fd.scan))(_t(1.0, D)), ref)
