"""fd.scan / fd.fori_loop in every form that runs eagerly, also under fd.jit, fd.vmap
and fd.grad (issue 35, item 3): ys that are None, steps closing over outer tensors
(xs too), indexing with the loop index, Python and numpy scalars as carries and
bounds (JAX's weak types), length 0, unroll=, TensorDict batch sizes, tensor bounds.
Each compiled form is compared with the eager Python loop; most under
``backend="fx"`` (the trace is what is tested), a few under inductor."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import functd as fd
from functd.testing import assert_close

D = torch.float64
_HAS_WHILE = importlib.util.find_spec("functd._transforms._while") is not None


def _fx(f, *args):
    return fd.jit(f, backend="fx")(*args)


def _scan_ops(f, *args) -> int:
    return fd.jit(f, backend="fx").lower(*args).graph.count("higher_order.scan(")


# -------------------------------------------------- 1. ys None, one output
def test_fori_loop_and_scan_without_ys_trace_to_one_op_equal_to_eager():
    def fori(c0):
        return fd.fori_loop(0, 5, lambda i, c: c + i, c0)

    def no_ys(c0):
        return fd.scan(lambda c, x: (c * 2 + x, None), c0, torch.arange(4.0, dtype=D))

    c0 = torch.randn((), dtype=D)
    assert_close(_fx(fori, c0), c0 + 10, rtol=0, atol=1e-12)
    carry, ys = _fx(no_ys, c0)
    assert ys is None
    ref = c0
    for x in range(4):
        ref = ref * 2 + x
    assert_close(carry, ref, rtol=1e-12, atol=1e-12)
    assert _scan_ops(fori, c0) == 1 and _scan_ops(no_ys, c0) == 1


def test_vmapped_loop_without_ys_under_jit_equals_per_member_loop():
    def member(c0):
        return fd.scan(lambda c, x: (torch.sin(c) + x, None), c0, torch.arange(3.0, dtype=D))[0]

    cb = torch.randn(4, 2, dtype=D)
    got = _fx(fd.vmap(member), cb)
    assert_close(got, torch.stack([member(c) for c in cb]), rtol=1e-12, atol=1e-12)


# ------------------------------------------- 2./3. closures and the loop index
def _index_forms(c0, xs, td):
    """The loop index used on tensors the step closes over (xs itself, a
    TensorDict): ``xs[i]``, negative indices, ``select``, slices/``...``/None around it."""

    def body(i, c):
        row = xs[i] + xs[-1 - i] + xs.select(0, i) + torch.select(xs, 0, i)
        col = xs[:, i % 3].sum() + xs[..., i % 3].sum() + xs[None, i][0].sum()
        return c + row * td[i]["a"] + col

    return fd.fori_loop(0, xs.shape[0], body, c0)


def _index_forms_loop(c0, xs, td):
    c = c0
    for i in range(xs.shape[0]):
        row = xs[i] + xs[-1 - i] + xs[i] + xs[i]
        col = xs[:, i % 3].sum() + xs[:, i % 3].sum() + xs[i].sum()
        c = c + row * td["a"][i] + col
    return c


def _data(n=5):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(n, 3, dtype=D, generator=g)
    td = fd.TensorDict({"a": torch.randn(n, 3, dtype=D, generator=g)}, [n])
    return torch.randn(3, dtype=D, generator=g), xs, td


def test_loop_index_indexes_closed_over_tensors_and_tensordicts_under_jit():
    c0, xs, td = _data()
    ref = _index_forms_loop(c0, xs, td)
    assert_close(_index_forms(c0, xs, td), ref, rtol=1e-12, atol=1e-12)  # eager
    assert_close(_fx(_index_forms, c0, xs, td), ref, rtol=1e-12, atol=1e-12)
    assert _scan_ops(_index_forms, c0, xs, td) == 1


def test_scan_step_closing_over_its_own_xs_and_a_global_under_jit():
    c0, xs, _ = _data()

    def f(c0, xs):  # a scan over step numbers reading xs by index, and a global
        return fd.scan(lambda c, i: (c + xs[i] * _G[i], c.sum()), c0, torch.arange(5))

    ref_c, ref_ys = c0, []
    for i in range(5):
        ref_ys.append(ref_c.sum())
        ref_c = ref_c + xs[i] * _G[i]
    want = (ref_c, torch.stack(ref_ys))
    assert_close(f(c0, xs), want, rtol=1e-12, atol=1e-12)
    assert_close(_fx(f, c0, xs), want, rtol=1e-12, atol=1e-12)


_G = torch.randn(5, 3, dtype=D)


def test_loop_index_under_vmap_and_grad_inside_jit():
    c0, xs, td = _data()
    cb = torch.randn(3, 3, dtype=D)
    vm = fd.vmap(_index_forms, in_dims=(0, None, None))
    want = torch.stack([_index_forms_loop(c, xs, td) for c in cb])
    assert_close(_fx(vm, cb, xs, td), want, rtol=1e-12, atol=1e-12)

    def loss(xs):  # grad through the index: the loop unrolls (LoopWarning)
        return _index_forms(c0, xs, td).sum()

    want_g = torch.func.grad(lambda xs: _index_forms_loop(c0, xs, td).sum())(xs)
    with pytest.warns(fd.LoopWarning):
        assert_close(_fx(fd.grad(loss), xs), want_g, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------ 4. scalars (weak types)
def test_python_scalar_carries_are_weakly_typed_as_in_jax():
    c, ys = fd.scan(lambda c, x: (c + 1, c), 0, None, length=3)
    assert c.dtype == torch.int64 and c.item() == 3
    assert ys.tolist() == [0, 1, 2]
    # a float carry has torch's default dtype
    assert fd.fori_loop(0, 3, lambda i, c: c * 2, 1.0).dtype == torch.get_default_dtype()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert fd.fori_loop(0, 3, lambda i, c: c * 2, 1.0).dtype == torch.float64
    finally:
        torch.set_default_dtype(prev)
    # int carry + a float: the carry becomes a float carry (JAX promotes weak carries)
    out = fd.fori_loop(0, 3, lambda i, c: c + 0.5, 0)
    assert out.dtype == torch.get_default_dtype() and out.item() == 1.5
    # int carry + int32 steps: torch's promotion of two 0-d tensors, int64 (JAX: int32;
    # torch has no weak tensors, the weak type only decides the carry's first dtype)
    c, _ = fd.scan(lambda c, x: (c + x, None), 0, torch.arange(4, dtype=torch.int32))
    assert c.dtype == torch.int64 and c.item() == 6
    # numpy scalars keep their dtype (not weak); a tree of scalars
    c = fd.fori_loop(
        0, 3, lambda i, c: {"n": c["n"] + 1, "x": c["x"] * 2}, {"n": np.int16(1), "x": 1.0}
    )
    assert c["n"].dtype == torch.int16 and c["n"].item() == 4 and c["x"].item() == 8.0


def test_numpy_and_tensor_bounds_are_ints_and_scalars_work_under_jit_vmap_grad():
    body = lambda i, c: c + i  # noqa: E731
    assert fd.fori_loop(np.int16(1), np.int64(4), body, 0).item() == 6
    assert fd.fori_loop(torch.tensor(1), torch.tensor(4), body, 0).item() == 6  # eager: a value
    assert fd.fori_loop(5, 5, body, 0.0).dtype == torch.get_default_dtype()  # no step: init

    def f(w):  # weak float carry, promoted int carry, both under the transforms
        a = fd.fori_loop(0, 3, lambda i, c: c + w.sum() * i, 0.0)
        b = fd.scan(lambda c, x: (c + x * w.sum(), None), 0, torch.arange(3.0, dtype=D))[0]
        return a + b

    w = torch.randn(2, dtype=D)
    ref = 6 * w.sum()
    assert_close(f(w), ref, rtol=1e-12, atol=1e-12)
    assert_close(_fx(f, w), ref, rtol=1e-12, atol=1e-12)
    assert_close(fd.grad(f)(w), torch.full((2,), 6.0, dtype=D), rtol=1e-12, atol=1e-12)

    def g(xs):  # a weak int carry over mapped float steps: a float carry per member
        return fd.scan(lambda c, x: (c + x, c), 0, xs)

    xb = torch.randn(3, 4, dtype=D)
    want = [g(x) for x in xb]
    got = _fx(fd.vmap(g), xb)
    assert_close(got[0], torch.stack([w[0] for w in want]), rtol=1e-12, atol=1e-12)
    assert_close(got[1], torch.stack([w[1] for w in want]), rtol=1e-12, atol=1e-12)
    assert got[0].dtype == D


def test_python_scalars_returned_in_the_carry_as_jax_fixpoint_under_vmap_and_jit():
    # JAX's test_scan_vmap_fixpoint: scalars shift through the carry; under vmap a
    # mapped carry flows into unmapped slots and a scalar into a mapped one
    def f(ci):
        return fd.scan(
            lambda c, x: ((c[1], c[2], c[3], 0.0), None), (0.0, 1.0, 2.0, ci), torch.zeros(2)
        )[0]

    ci = torch.tensor([3.0, 4.0, 5.0])
    want = (torch.full((3,), 2.0), ci, torch.zeros(3), torch.zeros(3))
    assert_close(fd.vmap(f)(ci), want, rtol=0, atol=0)
    assert_close(_fx(fd.vmap(f), ci), want, rtol=0, atol=0)
    assert_close(
        _fx(lambda c: fd.fori_loop(0, 3, lambda i, c: 1, c), torch.zeros(())), torch.ones(())
    )
    with pytest.raises(
        TypeError,
        match=r"changed the carry at carry: init has int64\[\] and f returned float32\[\]",
    ):
        fd.fori_loop(0, 3, lambda i, c: 1.5, torch.zeros((), dtype=torch.int64))


def test_error_bounds_that_are_not_integers():
    body = lambda i, c: c  # noqa: E731
    with pytest.raises(TypeError, match=r"fd.fori_loop: upper must be an integer .* got float 2.5"):
        fd.fori_loop(0, 2.5, body, 0)
    with pytest.raises(TypeError, match=r"fd.fori_loop: lower must be an integer .* got bool True"):
        fd.fori_loop(True, 2, body, 0)
    with pytest.raises(TypeError, match=r"upper must be an integer .* a float32\[\] tensor"):
        fd.fori_loop(0, torch.tensor(2.0), body, 0)
    with pytest.raises(
        TypeError, match=r"init\['s'\] is a str; the carry's leaves must be tensors"
    ):
        fd.scan(lambda c, x: (c, None), {"s": "a"}, length=2)


# ---------------------------------------------------------------- 5. length 0
def _len0(c0, xs):
    def step(c, x):
        h = c + x
        return h, {"h": h, "td": fd.TensorDict({"n": h.sum(-1)}, h.shape[:-1]), "i": x.long()}

    return fd.scan(step, c0, xs)


def test_length_zero_returns_init_and_ys_with_zero_rows_shaped_by_the_step():
    c0, xs = torch.randn(2, 3, dtype=D), torch.randn(0, 2, 3, dtype=D)
    calls = []

    def step(c, x):
        calls.append(type(x).__name__)
        return c, c.sum()

    for out in (_len0(c0, xs), _fx(_len0, c0, xs)):
        carry, ys = out
        assert_close(carry, c0, rtol=0, atol=0)
        assert ys["h"].shape == (0, 2, 3) and ys["h"].dtype == D
        assert ys["td"].batch_size == torch.Size([0, 2]) and ys["i"].dtype == torch.int64
    carry, ys = fd.scan(step, c0, None, length=0)
    assert calls == ["NoneType"] and ys.shape == (0,)  # one abstract call, on fake tensors
    c, ys = fd.scan(lambda c, x: (c + 0.5, c), 0, None, length=0)  # weak carry promoted
    assert c.dtype == torch.get_default_dtype() and ys.dtype == c.dtype and ys.shape == (0,)

    def branchy(c, x):  # reads a value: fake tensors cannot run it, real zeros do
        return (c + 1 if bool(c.sum() >= 0) else c - 1), c.long()

    c, ys = fd.scan(branchy, c0, None, length=0)
    assert c is c0 and ys.shape == (0, 2, 3) and ys.dtype == torch.int64


def test_length_zero_under_vmap_and_grad():
    c0, xs = torch.randn(4, 3, dtype=D), torch.randn(0, 3, dtype=D)
    carry, ys = fd.vmap(_len0, in_dims=(0, None))(c0, xs)
    assert_close(carry, c0, rtol=0, atol=0)
    assert ys["h"].shape == (4, 0, 3)
    g = fd.grad(lambda c: _len0(c, xs)[0].sum())(c0[0])
    assert_close(g, torch.ones(3, dtype=D), rtol=0, atol=0)
    with pytest.raises(TypeError, match="changed the carry at carry"):
        fd.scan(lambda c, x: (c[None], c), c0, None, length=0)  # still checked


# ------------------------------------------------------------------- 6. unroll
def _rnn(c0, xs, reverse=False, unroll=1):
    def step(c, x):
        h = torch.tanh(c + x)
        return h, {"h": h, "s": c.sum()}

    return fd.scan(step, c0, xs, reverse=reverse, unroll=unroll)


@pytest.mark.parametrize("unroll", [2, 3, 5, 8, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_unroll_equals_the_loop_and_puts_k_steps_in_the_compiled_body(unroll, reverse, monkeypatch):
    import functd._transforms._jit as jit_module

    traced = []
    real = jit_module.trace
    monkeypatch.setattr(
        jit_module, "trace", lambda *a, **k: traced.append(real(*a, **k)) or traced[-1]
    )
    c0, xs = torch.randn(3, dtype=D), torch.randn(5, 3, dtype=D)
    ref = _rnn(c0, xs, reverse)
    assert_close(_rnn(c0, xs, reverse, unroll), ref, rtol=0, atol=0)  # eager: unchanged

    def f(c0, xs):
        return _rnn(c0, xs, reverse, unroll)

    assert_close(_fx(f, c0, xs), ref, rtol=1e-12, atol=1e-12)
    gm = traced[0].gm
    tanh = torch.ops.aten.tanh.default
    outside = len(gm.graph.find_nodes(op="call_function", target=tanh))
    ops = gm.graph.find_nodes(op="call_function", target=torch.ops.higher_order.scan)
    if unroll is True or unroll >= 5:
        assert not ops and outside == 5
    else:  # k steps in the op's body, the n % k left unrolled after the op
        (op,) = ops
        body = getattr(gm, op.args[0].target)
        assert len(body.graph.find_nodes(op="call_function", target=tanh)) == unroll
        assert outside == 5 % unroll


def test_fori_loop_unroll_and_errors():
    def f(c0):
        return fd.fori_loop(0, 7, lambda i, c: c * 0.5 + i, c0, unroll=3)

    c0 = torch.randn(2, dtype=D)
    ref = fd.fori_loop(0, 7, lambda i, c: c * 0.5 + i, c0)
    assert_close(_fx(f, c0), ref, rtol=1e-12, atol=1e-12)
    assert_close(f(c0), ref, rtol=0, atol=0)
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(
            ValueError, match=r"fd.scan: unroll must be a bool or a Python int >= 1"
        ):
            fd.scan(lambda c, x: (c, None), c0, None, length=2, unroll=bad)
    with pytest.raises(ValueError, match=r"fd.fori_loop: unroll must be .* got int 0"):
        fd.fori_loop(0, 2, lambda i, c: c, c0, unroll=0)


# ---------------------------------------------------- 7. TensorDict batch size
def test_error_tensordict_carry_whose_batch_size_changes_names_path_and_sizes():
    init = {"td": fd.TensorDict({"a": torch.zeros(3, 2)}, [3])}

    def step(c, x):
        return {"td": fd.TensorDict({"a": c["td"]["a"]}, [])}, None

    match = r"batch size of the TensorDict at carry\['td'\]: init has batch size \[3\] and f returned \[\]"
    with pytest.raises(TypeError, match=match):
        fd.scan(step, init, None, length=2)
    with pytest.raises(TypeError, match=match):
        _fx(lambda init: fd.scan(step, init, None, length=2), init)


# ------------------------------------------------------------ 8. tensor bounds
def test_python_int_bound_under_jit_is_static():
    def f(x, n):
        return fd.fori_loop(0, n, lambda i, c: c + i * x, torch.zeros((), dtype=D))

    x = torch.tensor(2.0, dtype=D)
    assert_close(_fx(f, x, 4), x * 6, rtol=0, atol=0)
    assert_close(_fx(f, x, 3), x * 3, rtol=0, atol=0)


@pytest.mark.skipif(_HAS_WHILE, reason="fd.while_loop present: tested below")
def test_traced_tensor_bound_without_while_loop_says_what_to_do():
    with pytest.raises(
        TypeError, match=r"fd.fori_loop: upper is a tensor whose value is not known"
    ):
        _fx(lambda n: fd.fori_loop(0, n, lambda i, c: c + i, torch.zeros(())), torch.tensor(3))


@pytest.mark.skipif(not _HAS_WHILE, reason="needs fd.while_loop (functd._transforms._while)")
def test_traced_tensor_bound_is_a_while_loop_equal_to_eager():
    def f(n, c0):
        return fd.fori_loop(0, n, lambda i, c: c * 0.5 + i, c0)

    c0 = torch.randn(3, dtype=D)
    for n in (0, 1, 4):
        ref = fd.fori_loop(0, n, lambda i, c: c * 0.5 + i, c0)
        assert_close(_fx(f, torch.tensor(n), c0), ref, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------- compiled by inductor
def _member(c0, xs):
    return fd.scan(lambda c, x: (torch.sin(c) + x, None), c0, xs)[0]


_LO, _HI = np.int16(0), np.int16(5)


def _forms(c0, xs, td, cb, lo=_LO, hi=_HI):
    """One program holding a case of each row above (one inductor compile): one
    output (a carry, no ys), closures indexed by the loop index, numpy bounds and a
    weak int carry, length 0, unroll with a remainder, a vmapped loop without ys."""

    def body(i, c):
        return c + (xs[i] * td[-1 - i]["a"]).sum() + i

    return {
        "fori": fd.fori_loop(lo, hi, body, 0),
        "len0": _len0(c0[None], xs[:0, None]),
        "unroll": _rnn(c0, xs, reverse=True, unroll=2),
        "vmap": fd.vmap(_member, in_dims=(0, None))(cb, xs),
    }


@pytest.mark.compile
def test_jit_inductor_compiles_every_loop_form_equal_to_eager():
    c0, xs, td = _data()
    cb = torch.randn(2, 3, dtype=D)
    got = fd.jit(_forms)(c0, xs, td, cb)
    assert_close(got, _forms(c0, xs, td, cb), rtol=1e-10, atol=1e-10)
    assert got["fori"].dtype == D  # the weak int carry promoted by xs's float64


@pytest.mark.compile
def test_jit_inductor_loop_in_a_function_without_tensor_inputs():
    # a Python int bound and no tensor input: inductor lowered the op in a fake mode of
    # its own, where the loop's index was data-dependent (DataDependentOutputException)
    def count(n):
        return fd.fori_loop(0, n, lambda i, c: c + i, torch.zeros(()))

    assert fd.jit(count)(4).item() == 6.0


def test_jit_unrolls_the_loops_when_the_compiler_fails_on_the_loop_op(monkeypatch):
    """Where inductor cannot compile torch's scan op, fd.jit traces the function again
    with its loops unrolled (one LoopWarning naming the error), never a raw compiler
    error. The compiler's failure is simulated: it refuses any graph holding the op."""
    import functd._transforms._jit as jit_module

    real = jit_module.compile_graph

    def failing(t, backend):
        if t.gm.graph.find_nodes(op="call_function", target=torch.ops.higher_order.scan):
            raise RuntimeError("the op does not lower")
        return real(t, backend)

    monkeypatch.setattr(jit_module, "compile_graph", failing)
    c0, xs, td = _data()
    j = fd.jit(_index_forms, backend="fx")
    with pytest.warns(fd.LoopWarning, match=r"RuntimeError: the op does not lower.*unrolled"):
        got = j(c0, xs, td)
    assert_close(got, _index_forms_loop(c0, xs, td), rtol=1e-12, atol=1e-12)
    assert "higher_order.scan" not in j.lower(c0, xs, td).graph

    def broken(t, backend):
        raise ValueError("the compiler failed")

    monkeypatch.setattr(jit_module, "compile_graph", broken)
    with pytest.raises(ValueError, match="the compiler failed"):  # no loop: as it is
        fd.jit(lambda x: x * 2, backend="fx")(c0)


@pytest.mark.compile
def test_torch_compile_traces_every_loop_form_in_one_graph():
    # dynamo's path (torch's scan function): the same forms, one frame, no graph break
    # (Python int bounds: dynamo traces numpy scalars as tensors, whose value it lacks)
    import torch._dynamo.testing

    def forms(c0, xs, td, cb):
        return _forms(c0, xs, td, cb, 0, 5)

    c0, xs, td = _data()
    cb = torch.randn(2, 3, dtype=D)
    torch._dynamo.reset()
    cnt = torch._dynamo.testing.CompileCounter()
    got = torch.compile(forms, backend=cnt, fullgraph=True)(c0, xs, td, cb)
    assert cnt.frame_count == 1
    assert_close(got, forms(c0, xs, td, cb), rtol=1e-10, atol=1e-10)
