"""fd.scan and fd.fori_loop: equal to the Python loop, under fd.vmap and fd.grad, and
one graph under fd.jit / torch.compile (torch's scan op)."""

from __future__ import annotations

import functools
import warnings

import hypothesis.strategies as st
import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
from hypothesis import given

import functd as fd
from functd.testing import assert_close

D = torch.float64


def _params(seed: int = 0) -> fd.TensorDict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(3, 3, dtype=D, generator=g) * 0.5
    return fd.TensorDict({"w": w, "b": torch.randn(3, dtype=D, generator=g)})


def _rollout(p, h0, xs, reverse=False):
    """A recurrent step closing over params: TensorDicts in the carry, xs and ys."""

    def step(c, x):
        h = torch.tanh(c["h"] @ p["w"] + p["b"] + x["x"])
        y = {"h": h, "td": fd.TensorDict({"sq": h * h}, batch_size=h.shape[:-1])}
        return c.set("h", h).set("n", c["n"] + 1), y

    init = fd.TensorDict({"h": h0, "n": torch.zeros((), dtype=torch.int64)})
    return fd.scan(step, init, fd.TensorDict({"x": xs}, batch_size=xs.shape[:1]), reverse=reverse)


def _rollout_loop(p, h0, xs, reverse=False):
    """The same, written as a Python loop (the reference)."""
    h, n, hs = h0, torch.zeros((), dtype=torch.int64), {}
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for i in order:
        h = torch.tanh(h @ p["w"] + p["b"] + xs[i])
        n = n + 1
        hs[i] = h
    stacked = torch.stack([hs[i] for i in range(xs.shape[0])])
    td = fd.TensorDict({"sq": stacked * stacked}, batch_size=[xs.shape[0]])
    return fd.TensorDict({"h": h, "n": n}), {"h": stacked, "td": td}


def _loss(p, h0, xs):
    c, ys = _rollout(p, h0, xs)
    return c["h"].sum() + ys["td"]["sq"].sum()


def _loss_loop(p, h0, xs):
    c, ys = _rollout_loop(p, h0, xs)
    return c["h"].sum() + ys["td"]["sq"].sum()


# ------------------------------------------------------------------------- eager
@given(n=st.integers(1, 6), reverse=st.booleans(), seed=st.integers(0, 5))
def test_scan_equals_python_loop(n, reverse, seed):
    g = torch.Generator().manual_seed(seed)
    p, h0, xs = _params(seed), torch.randn(3, dtype=D, generator=g), torch.randn(n, 3, dtype=D)
    c, ys = _rollout(p, h0, xs, reverse)
    assert c["n"].item() == n
    assert ys["td"].batch_size == torch.Size([n])
    assert_close((c, ys), _rollout_loop(p, h0, xs, reverse), rtol=0, atol=0)


def test_scan_ys_tensordict_stacked_batch_size():
    xs = fd.TensorDict({"a": torch.randn(4, 2, 5)}, batch_size=[4, 2])

    def step(c, x):
        assert x.batch_size == torch.Size([2])
        return c + x["a"].sum(), x.set("b", x["a"] * 2)

    c, ys = fd.scan(step, torch.zeros(()), xs)
    assert ys.batch_size == torch.Size([4, 2])
    assert_close(ys["b"], xs["a"] * 2)
    assert_close(c, xs["a"].sum())


def test_scan_length_without_xs_and_none_ys():
    c, ys = fd.scan(lambda c, x: (c * 2, None), torch.ones(2), length=5)
    assert ys is None
    assert_close(c, torch.full((2,), 32.0))
    c, ys = fd.scan(lambda c, x: (c + 1, (c, {"sq": c * c})), torch.zeros(()), length=3)
    assert_close(ys, (torch.tensor([0.0, 1, 2]), {"sq": torch.tensor([0.0, 1, 4])}))


def test_scan_does_not_modify_inputs():
    init, xs = torch.zeros(3), torch.ones(4, 3)
    before = (init.clone(), xs.clone())
    fd.scan(lambda c, x: (c + x, c), init, xs)
    assert_close((init, xs), before, rtol=0, atol=0)


@given(lo=st.integers(-3, 3), hi=st.integers(-3, 6))
def test_fori_loop_equals_python_loop(lo, hi):
    def body(i, c):
        assert i.dtype == torch.int64 and i.ndim == 0
        return {"s": c["s"] + i, "p": c["p"] * 2}

    init = {"s": torch.zeros((), dtype=torch.int64), "p": torch.ones(2)}
    ref = dict(init)
    for i in range(lo, hi):
        ref = {"s": ref["s"] + i, "p": ref["p"] * 2}
    assert_close(fd.fori_loop(lo, hi, body, init), ref, rtol=0, atol=0)


# ------------------------------------------------------------------ vmap and grad
def test_scan_under_vmap_equals_loop_over_batch():
    p = _params()
    hb, xb = torch.randn(4, 3, dtype=D), torch.randn(4, 6, 3, dtype=D)
    out = fd.vmap(_rollout, in_dims=(None, 0, 0))(p, hb, xb)
    ref = fd.stack([_rollout_loop(p, hb[i], xb[i])[0] for i in range(4)])
    assert_close(out[0], ref)
    assert out[1]["td"].batch_size == torch.Size([4, 6])


def test_scan_under_grad_equals_grad_of_unrolled_loop():
    p, h0, xs = _params(), torch.randn(3, dtype=D), torch.randn(7, 3, dtype=D)
    g = fd.grad(_loss)(p, h0, xs)
    ref = torch.func.grad(_loss_loop)(p, h0, xs)
    assert_close(g, ref, rtol=1e-6, atol=1e-6)
    gx = fd.grad(_loss, argnums=2)(p, h0, xs)
    assert_close(gx, torch.func.grad(_loss_loop, argnums=2)(p, h0, xs), rtol=1e-6, atol=1e-6)


def test_fori_loop_under_vmap_and_grad():
    def f(w, x):
        return fd.fori_loop(0, 5, lambda i, c: torch.sin(c * w + i), x).sum()

    def f_loop(w, x):
        for i in range(5):
            x = torch.sin(x * w + i)
        return x.sum()

    w, xb = torch.randn(3, dtype=D), torch.randn(4, 3, dtype=D)
    out = fd.vmap(fd.grad(f), in_dims=(None, 0))(w, xb)
    ref = torch.func.vmap(torch.func.grad(f_loop), in_dims=(None, 0))(w, xb)
    assert_close(out, ref, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------ errors
def test_error_carry_dtype_changed_names_path():
    init = fd.TensorDict({"h": torch.zeros(3), "n": torch.zeros(())})
    with pytest.raises(
        TypeError, match=r"changed the carry at carry\['h'\]: .*float32\[3\].*float64\[3\]"
    ):
        fd.scan(lambda c, x: (c.set("h", c["h"].double()), None), init, length=2)


def test_error_carry_shape_and_structure_changed():
    with pytest.raises(TypeError, match=r"carry\[1\].*float32\[2\].*float32\[1, 2\]"):
        fd.scan(lambda c, x: ((c[0], c[1][None]), None), (torch.zeros(1), torch.zeros(2)), length=2)
    init = fd.TensorDict({"h": torch.zeros(3)})
    with pytest.raises(TypeError, match="changed the structure of the carry"):
        fd.scan(lambda c, x: (c.set("extra", c["h"]), None), init, length=2)


def test_error_xs_and_length():
    with pytest.raises(ValueError, match="Pass length=n"):
        fd.scan(lambda c, x: (c, None), torch.zeros(1))
    with pytest.raises(ValueError, match=r"xs\['a'\] has 3 .* xs\['b'\] has 4"):
        fd.scan(lambda c, x: (c, None), torch.zeros(1), {"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(ValueError, match="length=2 but xs"):
        fd.scan(lambda c, x: (c, None), torch.zeros(1), torch.zeros(3), length=2)
    with pytest.raises(ValueError, match="length must be a Python int >= 0; got -1"):
        fd.scan(lambda c, x: (c, None), torch.zeros(1), length=-1)
    with pytest.raises(ValueError, match=r"TensorDict at xs\['td'\] has batch size \[\]"):
        fd.scan(
            lambda c, x: (c, None), torch.zeros(1), {"td": fd.TensorDict({"a": torch.zeros(3)})}
        )
    with pytest.raises(TypeError, match=r"xs\[0\] is a 0-d tensor"):
        fd.scan(lambda c, x: (c, None), torch.zeros(1), (torch.zeros(()),))


def test_error_f_result_and_y_leaves():
    with pytest.raises(TypeError, match=r"must return a pair \(carry, y\); it returned a Tensor"):
        fd.scan(lambda c, x: c, torch.zeros(1), length=2)
    with pytest.raises(TypeError, match=r"returned a int at y\['k'\]"):
        fd.scan(lambda c, x: (c, {"k": 3}), torch.zeros(1), length=2)
    with pytest.raises(TypeError, match=r"fori_loop: upper must be an integer .* got float 3\.0"):
        fd.fori_loop(0, 3.0, lambda i, c: c, torch.zeros(1))


# ----------------------------------------------------------------------- compiled
def _graph(jitted, *args) -> str:
    return jitted.lower(*args).graph


def test_jit_fx_one_scan_op_closures_lifted_and_equal_eager():
    p, h0 = _params(), torch.randn(3, dtype=D)
    j = fd.jit(_rollout, backend="fx")
    for n in (16, 256):
        xs = torch.randn(n, 3, dtype=D)
        assert_close(j(p, h0, xs), _rollout_loop(p, h0, xs), rtol=1e-12, atol=1e-12)
        g = _graph(j, p, h0, xs)
        assert g.count("higher_order.scan") == 1
        assert "tanh" not in g  # the step is in the op's subgraph, not unrolled


def test_jit_fx_nested_scan_and_vmap():
    p = _params()

    def outer(p, h0, xss):  # a scan of scans, the inner one closing over params
        def step(h, xs):
            c, _ = _rollout(p, h, xs)
            return c["h"], c["h"].sum()

        return fd.scan(step, h0, xss)

    h0, xss = torch.randn(3, dtype=D), torch.randn(4, 5, 3, dtype=D)
    ref = outer(p, h0, xss)
    assert_close(fd.jit(outer, backend="fx")(p, h0, xss), ref, rtol=1e-12, atol=1e-12)
    hb, xb = torch.randn(2, 3, dtype=D), torch.randn(2, 4, 5, 3, dtype=D)
    vm = fd.vmap(outer, in_dims=(None, 0, 0))
    assert_close(fd.jit(vm, backend="fx")(p, hb, xb), vm(p, hb, xb), rtol=1e-12, atol=1e-12)


def test_jit_fx_grad_unrolls_with_warning_and_equals_loop():
    p, h0, xs = _params(), torch.randn(3, dtype=D), torch.randn(5, 3, dtype=D)
    with pytest.warns(fd.LoopWarning, match="inside fd.grad"):
        g = fd.jit(fd.grad(_loss), backend="fx")(p, h0, xs)
    assert_close(g, torch.func.grad(_loss_loop)(p, h0, xs), rtol=1e-6, atol=1e-6)


def test_jit_fx_grad_inside_step_keeps_one_op():
    def train(w, xs):  # gradient steps inside the loop (the PPO epoch shape)
        def step(w, x):
            g = fd.grad(lambda w: ((x @ w) ** 2).sum())(w)
            return w - 0.1 * g, None

        return fd.scan(step, w, xs)[0]

    w, xs = torch.randn(3, dtype=D), torch.randn(6, 3, dtype=D)
    j = fd.jit(train, backend="fx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(j(w, xs), train(w, xs), rtol=1e-12, atol=1e-12)
    assert _graph(j, w, xs).count("higher_order.scan") == 1


def test_jit_fx_fori_loop_with_keys():
    def draws(key):
        def body(i, c):
            k = fd.random.fold_in(c["key"], i)
            return {"key": c["key"], "s": c["s"] + fd.random.normal(k, (2,), dtype=D)}

        return fd.fori_loop(0, 8, body, {"key": key, "s": torch.zeros(2, dtype=D)})["s"]

    key = fd.random.key(3)
    j = fd.jit(draws, backend="fx")
    assert_close(j(key), draws(key), rtol=0, atol=0)
    assert _graph(j, key).count("higher_order.scan") == 1


@pytest.mark.compile
def test_jit_inductor_compiles_once_per_length_and_equals_eager():
    p, h0 = _params(), torch.randn(3, dtype=D)
    j = fd.jit(_rollout)
    for n in (16, 256):
        xs = torch.randn(n, 3, dtype=D)
        with fd.testing.assert_max_compiles(1):
            out = j(p, h0, xs)
        assert_close(out, _rollout_loop(p, h0, xs), rtol=1e-10, atol=1e-10)


@pytest.mark.compile
def test_torch_compile_one_graph_and_equal_eager():
    p, h0 = _params(), torch.randn(3, dtype=D)
    for n in (16, 256):
        xs = torch.randn(n, 3, dtype=D)
        torch._dynamo.reset()
        cnt = torch._dynamo.testing.CompileCounter()
        out = torch.compile(_rollout, backend=cnt, fullgraph=True)(p, h0, xs)
        assert cnt.frame_count == 1
        assert cnt.op_count < 40  # one scan op, not n unrolled steps
        assert_close(out, _rollout_loop(p, h0, xs), rtol=1e-12, atol=1e-12)
    vm = fd.vmap(_rollout, in_dims=(None, 0, 0))
    hb, xb = torch.randn(2, 3, dtype=D), torch.randn(2, 8, 3, dtype=D)
    out = torch.compile(vm, backend="aot_eager", fullgraph=True)(p, hb, xb)
    assert_close(out, vm(p, hb, xb), rtol=1e-12, atol=1e-12)
    g = torch.compile(fd.grad(_loss), backend="aot_eager", fullgraph=True)(p, h0, xs[:8])
    assert_close(g, torch.func.grad(_loss_loop)(p, h0, xs[:8]), rtol=1e-6, atol=1e-6)


@pytest.mark.compile
def test_tree_structure_comparison_under_dynamo_equals_optrees():
    """fd.scan's structure checks, traced by dynamo (which compares its own spec objects,
    not optree's), agree with optree's ``==`` of the same trees."""
    import optree

    from functd._td._tree import NAMESPACE
    from functd._transforms._loop_checks import same_structure

    x = torch.ones(2)
    td = fd.TensorDict({"a": x, "b": fd.TensorDict({"c": x})})
    pairs = [
        (td, fd.TensorDict({"a": 2 * x, "b": fd.TensorDict({"c": x})})),  # equal
        (td, fd.TensorDict({"a": x, "b": fd.TensorDict({"d": x})})),  # a nested key
        (td, fd.TensorDict({"a": x, "c": x})),  # other keys
        (td, {"a": x, "b": {"c": x}}),
        ((x, [x, None]), (x, [x, None])),
        ((x, [x, None]), (x, (x, None))),
        (x, x),
        (x, td),
    ]

    def spec(t):
        return optree.tree_structure(t, namespace=NAMESPACE)

    def same_all(pairs):  # one trace: every pair's comparison in one graph
        return torch.tensor([same_structure(spec(u), spec(v)) for u, v in pairs])

    torch._dynamo.reset()
    got = torch.compile(same_all, backend="eager", fullgraph=True)(pairs)
    assert got.tolist() == [spec(a) == spec(b) for a, b in pairs]
    assert got.tolist() == [True] + [False] * 3 + [True, False, True, False]


def test_jit_fx_carry_holding_one_tensor_twice_and_size_one_dims_under_vmap():
    # a tree may hold one tensor twice (torch's op refuses aliasing inputs), and a
    # vmapped carry with a size-1 dim has odd strides (the op compares them in and out)
    def run(c0, xs):
        def step(c, x):
            a, b, m = c
            return (a + x, b * 2, m + x.unsqueeze(0)), a.sum()

        return fd.scan(step, (c0, c0, c0.reshape(1, -1)), xs)

    c0, xs = torch.randn(3, dtype=D), torch.randn(5, 3, dtype=D)
    ref = run(c0, xs)
    assert_close(fd.jit(run, backend="fx")(c0, xs), ref, rtol=1e-12, atol=1e-12)
    cb, xb = torch.randn(2, 3, dtype=D), torch.randn(2, 5, 3, dtype=D)
    vm = fd.vmap(run)
    assert_close(fd.jit(vm, backend="fx")(cb, xb), vm(cb, xb), rtol=1e-12, atol=1e-12)


@pytest.mark.compile
def test_jit_inductor_and_torch_compile_scan_without_carry():
    # torch 2.13's op with an empty carry fails to compile (inductor: "getitem is not an
    # OpOverload"; dynamo refuses it): fd.scan gives it a token carry. PPO's per-epoch
    # shuffles are such a loop.
    def doubles(xs):
        return fd.scan(lambda c, x: (c, x * 2), None, xs)

    xs = torch.randn(5, 3, dtype=D)
    out = fd.jit(doubles)(xs)
    assert out[0] is None
    assert_close(out[1], xs * 2, rtol=0, atol=0)
    torch._dynamo.reset()
    cnt = torch._dynamo.testing.CompileCounter()
    out = torch.compile(doubles, backend=cnt, fullgraph=True)(xs)
    assert cnt.frame_count == 1 and out[0] is None
    assert_close(out[1], xs * 2, rtol=0, atol=0)


def test_jit_fx_tensordict_indexed_by_the_loop_index():
    # under a trace, td[i] with the loop's 0-d index tensor gathers (v[i] would read i's
    # value: data-dependent); negative indices wrap, slices before it keep their dims
    td = fd.TensorDict(
        {"a": torch.randn(4, 3, dtype=D), "n": {"b": torch.randn(4, 3, 2, dtype=D)}}, [4]
    )

    def f(td):
        def body(i, acc):
            row = td[i]
            back = td[i - 4]  # negative: the same row
            return acc + row["a"] + back["n", "b"].sum(-1)

        return fd.fori_loop(0, 4, body, torch.zeros(3, dtype=D))

    def g(td):
        m = fd.TensorDict({"a": td["a"].T}, [3, 4])

        def body(i, acc):
            return acc + m[:, i]["a"]

        return fd.fori_loop(0, 4, body, torch.zeros(3, dtype=D))

    for fn in (f, g):
        j = fd.jit(fn, backend="fx")
        assert_close(j(td), fn(td), rtol=1e-12, atol=1e-12)


_W = torch.randn(3, 3, dtype=D)


@pytest.mark.compile
def test_jit_inductor_closure_over_a_plain_tensor_outside_and_inside_the_loop():
    # a tensor the function closes over is a constant of the graph: inductor's C++ shim
    # passes constants after the inputs (fd.jit's direct entry skipped that: a crash),
    # and a constant inside a loop body does not compile (fd.scan lifts it to an input)
    def roll(h0, xs):
        def step(h, x):
            h = torch.tanh(h @ _W + x)
            return h, h.sum()

        h, ys = fd.scan(step, h0 @ _W, xs)
        return h, ys

    h0, xs = torch.randn(3, dtype=D), torch.randn(6, 3, dtype=D)
    assert_close(fd.jit(roll)(h0, xs), roll(h0, xs), rtol=1e-10, atol=1e-10)


def _carries(graph: str) -> list[int]:
    """The number of carries of each scan op in a traced graph's code."""
    return [
        line.split("[", 1)[1].split("]", 1)[0].count(",") + 1
        for line in graph.splitlines()
        if "higher_order.scan(" in line
    ]


def _invariant_loop(w, h0, xs):
    def step(c, x):  # w rides in the carry unchanged (PPO's rollout carries its params)
        h, w = c
        h = torch.tanh(h @ w + x)
        return (h, w), h.sum()

    return fd.scan(step, (h0, w), xs)


def test_jit_fx_invariant_carry_becomes_an_input_of_the_op_and_values_stay():
    """A carry the step returns unchanged and that comes from an input of the graph
    leaves the op's carry (an additional input; its output is the value that went in);
    one computed inside the graph stays a carry. Both under vmap too."""
    w, h0, xs = (
        torch.randn(5, 5, dtype=D),
        torch.randn(3, 5, dtype=D),
        torch.randn(6, 3, 5, dtype=D),
    )
    j = fd.jit(_invariant_loop, backend="fx")
    assert_close(j(w, h0, xs), _invariant_loop(w, h0, xs), rtol=1e-12, atol=1e-12)
    assert _carries(_graph(j, w, h0, xs)) == [1]

    def doubled(w, h0, xs):  # the invariant carry is computed in the graph: kept
        return _invariant_loop(w * 2, h0, xs)

    jd = fd.jit(doubled, backend="fx")
    assert_close(jd(w, h0, xs), doubled(w, h0, xs), rtol=1e-12, atol=1e-12)
    assert _carries(_graph(jd, w, h0, xs)) == [2]

    wb, hb, xb = (
        torch.randn(4, 5, 5, dtype=D),
        torch.randn(4, 3, 5, dtype=D),
        torch.randn(4, 6, 3, 5, dtype=D),
    )
    vm = fd.vmap(_invariant_loop)
    jv = fd.jit(vm, backend="fx")
    assert_close(jv(wb, hb, xb), vm(wb, hb, xb), rtol=1e-12, atol=1e-12)
    assert _carries(_graph(jv, wb, hb, xb)) == [1]


def test_jit_fx_nested_loop_invariant_carries_and_a_loop_whose_carry_is_all_invariant():
    w, h0, xss = (
        torch.randn(5, 5, dtype=D),
        torch.randn(3, 5, dtype=D),
        torch.randn(2, 6, 3, 5, dtype=D),
    )

    def outer(w, h0, xss):
        def step(c, xs):  # the inner loop's w is the outer body's input, unchanged
            (h, w), ys = _invariant_loop(c[1], c[0], xs)
            return (h, w), ys.sum()

        return fd.scan(step, (h0, w), xss)

    j = fd.jit(outer, backend="fx")
    assert_close(j(w, h0, xss), outer(w, h0, xss), rtol=1e-12, atol=1e-12)

    def constant(w, xs):  # every carry invariant: the op keeps one
        return fd.scan(lambda c, x: (c, (c * x).sum()), w, xs)

    jc = fd.jit(constant, backend="fx")
    out = jc(w, xss[0, :, 0])
    assert_close(out, constant(w, xss[0, :, 0]), rtol=1e-12, atol=1e-12)
    assert _carries(_graph(jc, w, xss[0, :, 0])) == [1]


@pytest.mark.compile
def test_jit_inductor_hoisted_and_kept_invariant_carries_run_many_steps():
    # inductor's C++ loop freed the handle of an intermediate buffer passed as an
    # additional input after the first step (a crash): only graph inputs are hoisted
    w, h0, xs = torch.randn(4, 5, 5), torch.randn(4, 3, 5), torch.randn(4, 9, 3, 5)
    vm = fd.vmap(_invariant_loop)
    assert_close(fd.jit(vm)(w, h0, xs), vm(w, h0, xs), rtol=1e-5, atol=1e-5)

    def doubled(w, h0, xs):
        return _invariant_loop(w * 2, h0, xs)

    vd = fd.vmap(doubled)
    assert_close(fd.jit(vd)(w, h0, xs), vd(w, h0, xs), rtol=1e-5, atol=1e-5)


def test_jit_vmapped_scan_keeps_the_batch_dim_first_in_memory(monkeypatch):
    """Under fd.vmap the op's carries keep the batch dim outermost in memory (torch's
    own rule for the op puts it last), so a batched matmul of the step reads them in
    place: at 64 PPO agents a third of an update was transposing copies. Values equal
    the per-member loop, carries and stacked outputs."""
    import functd._transforms._jit as jit_module

    traced = []
    real = jit_module.trace
    monkeypatch.setattr(
        jit_module, "trace", lambda *a, **k: traced.append(real(*a, **k)) or traced[-1]
    )

    def member(w, h0, xs):
        def step(c, x):  # w in the carry: a closure over a mapped tensor (notes/transforms.md)
            h, m, w = c
            h = torch.tanh(h @ w + x)
            return (h, 0.9 * m + h, w), h.sum(-1)

        return fd.scan(step, (h0, torch.zeros_like(h0), w), xs)

    w, h0, xs = (
        torch.randn(6, 5, 5, dtype=D),
        torch.randn(6, 3, 5, dtype=D),
        torch.randn(6, 4, 3, 5, dtype=D),
    )
    got = fd.jit(fd.vmap(member), backend="fx")(w, h0, xs)
    want = [member(w[i], h0[i], xs[i]) for i in range(6)]
    assert_close(
        got, torch.utils._pytree.tree_map(lambda *t: torch.stack(t), *want), rtol=1e-12, atol=1e-12
    )
    (node,) = traced[0].gm.graph.find_nodes(op="call_function", target=torch.ops.higher_order.scan)
    carries = node.args[1]  # (w, hoisted out of the carry: an input of the op)
    assert len(carries) == 2
    for carry in carries:
        val = carry.meta["val"]
        assert val.shape[0] == 6 and val.is_contiguous(), (val.shape, val.stride())


def _mixed(h0, xs, c):
    """A loop whose carry mixes a mapped h0 with an unmapped constant start (c), with
    a y that does not depend on the member (the step count)."""

    def step(carry, x):
        h, k = carry
        h = torch.tanh(h * 0.5 + x + c)
        return (h, k + 1.0), {"h": h, "k": k}

    return fd.scan(step, (h0, torch.zeros(())), xs)


@pytest.mark.parametrize(
    "case",
    ["xs_dim1", "unmapped_init_and_y", "reverse", "fori_loop", "no_xs", "vmap_of_vmap"],
)
def test_jit_vmapped_loops_equal_eager_in_every_batching_pattern(case):
    """functd's vmap rule for the op (batch dim first) against the eager Python loop
    under fd.vmap, for the batching patterns the rule has to place: a mapped x at
    another dim, unmapped carries and ys (broadcast), reverse, fori_loop, a loop
    without xs, and two vmap levels."""
    h0, xs, c = torch.randn(4, 3, dtype=D), torch.randn(4, 5, 3, dtype=D), torch.randn(3, dtype=D)
    if case == "xs_dim1":
        f, args = fd.vmap(_mixed, in_dims=(0, 1, None)), (h0, xs.movedim(0, 1), c)
    elif case == "unmapped_init_and_y":
        f, args = fd.vmap(_mixed, in_dims=(None, 0, None)), (h0[0], xs, c)
    elif case == "reverse":

        def rev(h0, xs):
            return fd.scan(lambda h, x: (h * x + 1.0, h.sum()), h0, xs, reverse=True)

        f, args = fd.vmap(rev), (h0, xs)
    elif case == "fori_loop":

        def fl(h0):
            return fd.fori_loop(0, 6, lambda i, h: torch.sin(h) + i.to(h.dtype), h0)

        f, args = fd.vmap(fl), (h0,)
    elif case == "no_xs":

        def nx(h0):
            return fd.scan(lambda h, _: (h.flip(-1) * 0.9, h[0]), h0, None, length=7)

        f, args = fd.vmap(nx), (h0,)
    else:
        inner = fd.vmap(_mixed, in_dims=(0, 0, None))
        f = fd.vmap(inner, in_dims=(0, 0, None))
        shift = torch.arange(2, dtype=D)[:, None, None, None]
        args = (h0.expand(2, 4, 3).clone(), xs.expand(2, 4, 5, 3) + shift, c)
    assert_close(fd.jit(f, backend="fx")(*args), f(*args), rtol=1e-12, atol=1e-12)


def test_jit_vmapped_scan_closing_over_mapped_tensors_is_one_loop_equal_to_eager():
    """A step closing over tensors fd.vmap maps (a member's weights, directly, in a
    TensorDict, or through a function it calls) is one loop under fd.jit: functd carries
    them (hoisted back out: they are inputs) and rebinds the closure per step. The
    reference is the eager fd.vmap (a Python loop per member)."""
    cell = fd.Module(nn.GRUCell(3, 4), ["x", "h"], ["h"])
    ens = fd.vmap(cell.init)(fd.random.split(fd.random.key(0), 4))
    w, xs = torch.randn(4, 3, 3, dtype=D), torch.randn(4, 5, 3, dtype=D)
    h0 = torch.rand(2, 4)

    def member(w, xs):
        return fd.scan(lambda h, x: (torch.tanh(h @ w + x), h.sum()), xs[0], xs)

    def run(p, h):
        return cell(p, fd.TensorDict({"x": h[..., :3], "h": h}, [2]))["h"]

    def rollout(p, h0):
        return fd.scan(lambda h, _: (run(p, h), h.sum()), h0, None, length=6)

    jm = fd.jit(fd.vmap(member), backend="fx")
    assert_close(jm(w, xs), fd.vmap(member)(w, xs), rtol=1e-12, atol=1e-12)
    assert jm.lower(w, xs).graph.count("torch.ops.higher_order.scan") == 1
    jr = fd.jit(fd.vmap(rollout, in_dims=(0, None)), backend="fx")
    ref = fd.vmap(rollout, in_dims=(0, None))(ens, h0)
    assert_close(jr(ens, h0), ref)
    assert_close(fd.vmap(fd.jit(rollout, backend="fx"), in_dims=(0, None))(ens, h0), ref)
    assert w.shape == (4, 3, 3)  # the closures hold the caller's tensors again


def test_jit_vmapped_scan_with_a_mapped_partial_argument_says_what_to_do():
    def step(w, h, x):
        return torch.tanh(h @ w + x), None

    def member(w, xs):
        return fd.scan(functools.partial(step, w), xs[0], xs)[0]

    w, xs = torch.randn(4, 3, 3, dtype=D), torch.randn(4, 5, 3, dtype=D)
    with pytest.raises(TypeError, match=r"closes over 'argument'.*functools.partial.*lambda"):
        fd.jit(fd.vmap(member), backend="fx")(w, xs)
