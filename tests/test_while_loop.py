"""fd.while_loop and fori_while (fd.fori_loop with tensor bounds): equal to the Python
loop eager, under fd.vmap (JAX's batching rule), under fd.jit (torch's while_loop op)
and fd.jvp; reverse mode refused with JAX's rule."""

from __future__ import annotations

import functools

import pytest
import torch

import functd as fd
from functd._transforms._while import fori_while
from functd.testing import assert_close

D = torch.float64


def _collatz(n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps of the Collatz sequence from n to 1 (a data-dependent trip count)."""

    def cond(c):
        return c[0] != 1

    def body(c):
        x, k = c
        return torch.where(x % 2 == 0, x // 2, 3 * x + 1), k + 1

    return fd.while_loop(cond, body, (n, torch.zeros((), dtype=torch.int64)))


def _collatz_loop(n: int) -> int:
    k = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        k += 1
    return k


# ---------------------------------------------------------------------------- eager
def test_eager_loop_equals_the_python_loop():
    for n in (1, 6, 7, 27):
        x, k = _collatz(torch.tensor(n))
        assert x.item() == 1 and k.item() == _collatz_loop(n)


def test_false_condition_returns_init_without_calling_body():
    calls = []
    init = {"x": torch.ones(3, dtype=D)}

    def body(c):
        calls.append(1)
        return c

    out = fd.while_loop(lambda c: c["x"].sum() > 5, body, init)
    assert calls == [] and out["x"] is init["x"]


def test_tensordict_carry_and_closure_over_a_tensor():
    w = torch.tensor([0.5, 2.0], dtype=D)
    td = fd.TensorDict({"a": torch.ones(2, dtype=D), "n": {"k": torch.zeros(2, dtype=D)}}, [2])

    def body(t):
        return t.set("a", t["a"] * w + 1).set(("n", "k"), t["n", "k"] + 1)

    out = fd.while_loop(lambda t: t["a"].max() < 100, body, td)
    a, k = torch.ones(2, dtype=D), 0
    while a.max() < 100:
        a, k = a * w + 1, k + 1
    assert isinstance(out, fd.TensorDict) and out.batch_size == torch.Size([2])
    assert_close(out["a"], a)
    assert_close(out["n", "k"], torch.full((2,), float(k), dtype=D))
    assert_close(td["a"], torch.ones(2, dtype=D))  # the init is not modified


def test_python_scalars_in_init_take_the_dtype_body_gives_them():
    # JAX's weak types: 0 is an int64 counter, 0.0 and 0 grow into float64 sums
    x = torch.tensor(0.25, dtype=D)
    i, s, t = fd.while_loop(
        lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] + x, c[2] + x), (0, 0, 0.0)
    )
    assert i.dtype == torch.int64 and i.item() == 4
    assert s.dtype == D and t.dtype == D
    assert s.item() == 1.0 and t.item() == 1.0


def test_weak_scalar_init_follows_python_scalar_semantics():
    # body is probed with the Python scalar itself (JAX traces it weakly typed): 0 + an
    # int8 tensor is int8, 0.0 + an int8 tensor the default float; a bool is not weak
    inc = torch.tensor(1, dtype=torch.int8)
    for f in (lambda g: g, lambda g: fd.jit(g, backend="fx")):
        got = f(lambda i: fd.while_loop(lambda v: v < 5, lambda v: v + i, 0))(inc)
        assert got.dtype == torch.int8 and got.item() == 5
        got = f(lambda i: fd.while_loop(lambda v: v < 2.5, lambda v: v + i, 0.0))(inc)
        assert got.dtype == torch.get_default_dtype() and got.item() == 3.0
    flip = fd.while_loop(lambda c: c[1] < 3, lambda c: (~c[0], c[1] + 1), (True, 0))
    assert flip[0].dtype == torch.bool and flip[0].item() is False
    # a member's own dtype under fd.vmap, as the per-member loop
    incs = torch.tensor([1, 2, 3], dtype=torch.int8)
    got = fd.vmap(lambda i: fd.while_loop(lambda v: v < 6, lambda v: v + i, 0))(incs)
    ref = [fd.while_loop(lambda v, i=i: v < 6, lambda v, i=i: v + i, 0) for i in incs]
    assert got.dtype == torch.int8 and got.tolist() == [r.item() for r in ref] == [6, 6, 6]


def test_weak_scalar_probe_falls_back_to_tensors_for_tensor_methods():
    # v.add needs a tensor: the probe runs on the 0-d int64 init (torch's promotion)
    inc = torch.tensor(1, dtype=torch.int8)
    got = fd.while_loop(lambda v: v < 3, lambda v: v.add(inc), 0)
    assert got.dtype == torch.int64 and got.item() == 3
    # a Python scalar result of the probe: result_type(init's dtype, it)
    x = torch.tensor([2.0, 4.0], dtype=D)
    k, y = fd.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 0.5, c[1] / 2), (0, x))
    assert k.dtype == torch.get_default_dtype() and y.dtype == D
    ref_k, ref_y = 0.0, x
    while ref_k < 3:
        ref_k, ref_y = ref_k + 0.5, ref_y / 2
    assert k.item() == ref_k and torch.equal(y, ref_y)


def test_bad_inputs_get_errors_naming_the_argument():
    with pytest.raises(TypeError, match=r"fd.while_loop: cond must be a callable"):
        fd.while_loop(3, lambda c: c, torch.zeros(()))
    with pytest.raises(TypeError, match=r"fd.while_loop: body must be a callable"):
        fd.while_loop(lambda c: True, None, torch.zeros(()))
    with pytest.raises(TypeError, match=r"fd.while_loop: init\['k'\] is a str"):
        fd.while_loop(lambda c: False, lambda c: c, {"k": "no"})
    with pytest.raises(TypeError, match=r"cond must return a bool scalar .* float32\[2\] tensor"):
        fd.while_loop(lambda c: c, lambda c: c, torch.ones(2))
    with pytest.raises(TypeError, match=r"fd.while_loop: body changed the structure of the carry"):
        fd.while_loop(lambda c: True, lambda c: (c, c), torch.ones(2))
    with pytest.raises(
        TypeError, match=r"body changed the carry at carry\[1\]: init has int64\[\]"
    ):
        fd.while_loop(
            lambda c: c[1] < 2, lambda c: (c[0], c[1] + 0.5), (torch.ones(2), torch.tensor(0))
        )


# ---------------------------------------------------------------------------- vmap
def _grow(x):
    return fd.while_loop(lambda x: x < 3, lambda x: x + 2, x)


@pytest.mark.parametrize("vmap", [fd.vmap, torch.func.vmap], ids=["fd", "torch"])
def test_batched_predicate_runs_each_member_until_its_own_cond_fails(vmap):
    xs = torch.tensor([0, 1, 2, 3, -4])
    expected = torch.stack([_grow(x) for x in xs])  # one loop per member
    assert torch.equal(expected, torch.tensor([4, 3, 4, 3, 4]))
    assert torch.equal(vmap(_grow)(xs), expected)


def test_batched_body_with_unbatched_predicate_is_the_plain_loop():
    def f(x):
        i, y = fd.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2), (torch.tensor(0), x)
        )
        return i, y

    xs = torch.arange(4.0, dtype=D)
    i, y = fd.vmap(f)(xs)
    assert torch.equal(i, torch.full((4,), 3)) and torch.equal(y, xs * 8)


def test_nested_vmaps_and_batched_closure():
    limits = torch.tensor([[1, 5], [9, 2]])

    def f(x, n):
        return fd.while_loop(lambda c: c < n, lambda c: c + 3, x)

    out = fd.vmap(fd.vmap(f, in_dims=(None, 0)), in_dims=(None, 0))(torch.tensor(0), limits)
    ref = torch.tensor([[f(torch.tensor(0), n) for n in row] for row in limits])
    assert torch.equal(out, ref) and torch.equal(out, torch.tensor([[3, 6], [9, 3]]))


def _power(w, x, n):
    """x @ w n times; w rides in the carry unchanged (JAX's readonly carry)."""
    _, x, w = fd.while_loop(lambda v: v[0] < n, lambda v: (v[0] + 1, v[1] @ v[2], v[2]), (0, x, w))
    return w, x


def _power_loop(w, xs, ns):
    return torch.stack([torch.linalg.matrix_power(w, int(n)).T @ x for x, n in zip(xs, ns)])


def test_readonly_carry_stays_unbatched_eager_and_under_jit():
    w = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=D)
    xs, ns = torch.randn(4, 2, dtype=D), torch.tensor([0, 3, 1, 2])
    f = fd.vmap(_power, in_dims=(None, 0, 0), out_dims=(None, 0))
    for g in (f, fd.jit(f, backend="fx")):
        w_, x_ = g(w, xs, ns)  # out_dims=None: w comes back unbatched
        assert torch.equal(w_, w)
        assert_close(x_, _power_loop(w, xs, ns))
    graph = fd.jit(f, backend="fx").lower(w, xs, ns).graph
    assert graph.count("higher_order.while_loop(") == 1
    # nested vmaps: w unbatched at both levels
    xss, nss = torch.randn(3, 4, 2, dtype=D), torch.tensor([[0, 1, 2, 3]] * 3)
    inner = fd.vmap(_power, in_dims=(None, 0, 0), out_dims=(None, 0))
    w_, x_ = fd.vmap(inner, in_dims=(None, 0, 0), out_dims=(None, 0))(w, xss, nss)
    assert torch.equal(w_, w)
    assert_close(x_, torch.stack([_power_loop(w, a, b) for a, b in zip(xss, nss)]))


def test_unbatched_carry_that_body_changes_is_batched():
    # a, unbatched, is doubled by body: the loop restarts with it batched (per member)
    def f(a, x, n):
        return fd.while_loop(
            lambda v: v[0] < n, lambda v: (v[0] + 1, v[1] * 2, v[2] + v[1]), (0, a, x)
        )

    a, xs, ns = torch.ones(3, dtype=D), torch.randn(4, 3, dtype=D), torch.tensor([0, 1, 2, 3])
    for g in (
        fd.vmap(f, in_dims=(None, 0, 0)),
        fd.jit(fd.vmap(f, in_dims=(None, 0, 0)), backend="fx"),
    ):
        got = g(a, xs, ns)
        ref = [f(a, x, n) for x, n in zip(xs, ns)]
        for k in range(3):
            assert_close(got[k], torch.stack([r[k] for r in ref]))
    graph = fd.jit(fd.vmap(f, in_dims=(None, 0, 0)), backend="fx").lower(a, xs, ns).graph
    assert graph.count("higher_order.while_loop(") == 1  # the first try (a kept) left nothing
    # the counter (0-d) is batched from the start: body runs once per step and once for
    # the weak type of 0, no restart for the counter; w is kept (out_dims 0: expanded)
    calls = []

    def power(w, x, n):
        def body(v):
            calls.append(1)
            return v[0] + 1, v[1] @ v[2], v[2]

        return fd.while_loop(lambda v: v[0] < n, body, (0, x, w))[1:]

    w = torch.ones(2, 2, dtype=D)
    x_, w_ = fd.vmap(power, in_dims=(None, 0, 0))(w, xs[:, :2], ns)
    assert len(calls) == 1 + 3 and w_.shape == (4, 2, 2)
    assert_close(x_, _power_loop(w, xs[:, :2], ns))


# ---------------------------------------------------------------------------- fd.jit
def test_jit_is_one_graph_for_every_trip_count_and_closure_value():
    w = torch.tensor([0.5, 2.0], dtype=D)

    def f(x, w, limit):
        return fd.while_loop(
            lambda c: c[1].sum() < limit, lambda c: (c[0] + 1, c[1] * w + 1), (torch.tensor(0), x)
        )

    j = fd.jit(f, backend="fx")
    for lim in (0.0, 10.0, 1000.0):
        args = (torch.ones(2, dtype=D), w, torch.tensor(lim, dtype=D))
        k, x = j(*args)
        k0, x0 = f(*args)
        assert k.item() == k0.item() and (lim == 0.0 or k.item() > 0)
        assert_close(x, x0)
    k, x = j(torch.ones(2, dtype=D), w * 0.5, torch.tensor(50.0, dtype=D))  # another closure value
    assert_close(x, f(torch.ones(2, dtype=D), w * 0.5, torch.tensor(50.0, dtype=D))[1])
    assert j.cache_size() == 1


def test_jit_of_nested_loops_closing_over_an_outer_tensor():
    def outer(num, w):
        def inner(i, count):
            c = fd.while_loop(
                lambda s: s[1] <= s[0],
                lambda s: (s[0], s[1] + 1, s[2] + w),
                (i, torch.tensor(0), count),
            )
            return c[2]

        return fd.while_loop(
            lambda s: s[1] < s[0],
            lambda s: (s[0], s[1] + 1, inner(s[1], s[2])),
            (num, torch.tensor(0), torch.tensor(0.0, dtype=D)),
        )

    j = fd.jit(outer, backend="fx")
    for n, w in ((3, 1.5), (4, 0.5)):
        got = j(torch.tensor(n), torch.tensor(w, dtype=D))
        ref = outer(torch.tensor(n), torch.tensor(w, dtype=D))
        assert got[2].item() == ref[2].item() == w * n * (n + 1) / 2
    assert j.cache_size() == 1


def test_jit_of_vmap_equals_eager_vmap():
    xs = torch.tensor([0, 1, 2, 3, -4])
    assert torch.equal(fd.jit(fd.vmap(_grow), backend="fx")(xs), fd.vmap(_grow)(xs))
    td = fd.TensorDict({"x": xs, "k": torch.zeros(5, dtype=torch.int64)}, [5])

    def g(t):
        return fd.while_loop(
            lambda t: t["x"] < 3, lambda t: t.set("x", t["x"] + 2).set("k", t["k"] + 1), t
        )

    got, ref = fd.jit(fd.vmap(g), backend="fx")(td), fd.vmap(g)(td)
    assert torch.equal(got["x"], ref["x"]) and torch.equal(got["k"], torch.tensor([2, 1, 1, 0, 4]))


def test_jit_of_vmap_with_mapped_closures_equals_the_eager_vmap():
    """cond and body closing over tensors fd.vmap maps: one while op under fd.jit (the
    tensors ride in the carry), each member stopping at its own count, as eager."""

    def g(x, n, w):
        return fd.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 2, c[1] * w), x)

    f = fd.vmap(g, in_dims=(None, 0, 0))
    args = (
        (torch.tensor(0), torch.ones(3)),
        torch.tensor([2, 3, 7]),
        torch.tensor([0.5, 2.0, 3.0]),
    )
    got, ref = fd.jit(f, backend="fx")(*args), f(*args)
    assert torch.equal(ref[0], torch.tensor([2, 4, 8]))
    assert_close(got, ref)
    assert args[1].shape == (3,)  # the closures hold the caller's tensors again


def test_jit_of_vmap_refuses_a_mapped_partial_argument_with_the_fix():
    def cond(n, c):
        return c < n

    f = fd.vmap(
        lambda x, n: fd.while_loop(functools.partial(cond, n), lambda c: c + 2, x),
        in_dims=(None, 0),
    )
    assert torch.equal(f(torch.tensor(0), torch.tensor([2, 3])), torch.tensor([2, 4]))
    with pytest.raises(fd.TransformError, match=r"closes over 'argument'.*functools.partial"):
        fd.jit(f, backend="fx")(torch.tensor(0), torch.tensor([2, 3]))


@pytest.mark.compile
def test_inductor_compiles_the_loop_on_cpu():
    def f(x, w, limit):
        return fd.while_loop(
            lambda c: c[0] < limit, lambda c: (c[0] + 1, torch.tanh(c[1] @ w)), (torch.tensor(0), x)
        )

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 3, generator=g), torch.randn(3, 3, generator=g)
    j = fd.jit(f)
    for lim in (0, 7):
        k, y = j(x, w, torch.tensor(lim))
        _, y0 = f(x, w, torch.tensor(lim))
        assert k.item() == lim
        assert_close(y, y0, rtol=1e-5, atol=1e-6)
    assert j.cache_size() == 1


# ---------------------------------------------------------------------------- autodiff
def _cube_loop(x):
    return fd.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x), (torch.tensor(0), torch.ones_like(x))
    )[1]


def test_jvp_works_eagerly():
    x, t = torch.tensor(1.1, dtype=D), torch.tensor(1.0, dtype=D)
    out, tangent = fd.jvp(_cube_loop, (x,), (t,))
    ref_out, ref_tangent = torch.func.jvp(lambda x: x**3, (x,), (t,))
    assert_close(out, ref_out)
    assert_close(tangent, ref_tangent)


REVERSE = r"fd.while_loop: reverse-mode differentiation .* not supported.*fd.scan"


def test_reverse_mode_is_refused_with_jax_rule():
    x = torch.tensor(1.1, dtype=D)
    with pytest.raises(RuntimeError, match=REVERSE):
        fd.grad(_cube_loop)(x)
    with pytest.raises(RuntimeError, match=REVERSE):
        fd.vjp(_cube_loop, x)
    with pytest.raises(RuntimeError, match=REVERSE):
        fd.jit(fd.grad(_cube_loop), backend="fx")(x)
    xr = x.clone().requires_grad_(True)
    y = _cube_loop(xr)  # the forward result is usable ...
    assert_close(y.detach(), x**3)
    with pytest.raises(RuntimeError, match=REVERSE):
        y.backward()  # ... its backward pass is refused


def test_grad_of_a_function_whose_loop_is_not_differentiated_works():
    # as in JAX: the loop only counts, the loss does not flow through it
    def loss(x):
        k = fd.while_loop(lambda k: k < 4, lambda k: k + 1, torch.tensor(0))
        return (x * x).sum() * k

    x = torch.arange(3.0, dtype=D)
    assert_close(fd.grad(loss)(x), 8 * x)


def test_jvp_inside_jit_is_a_clear_error():
    with pytest.raises(fd.TransformError, match=r"forward-mode .* inside fd.jit .* outside fd.jit"):
        fd.jit(lambda x, t: fd.jvp(_cube_loop, (x,), (t,)), backend="fx")(
            torch.tensor(1.0, dtype=D), torch.tensor(1.0, dtype=D)
        )


# ---------------------------------------------------------------------------- fori_while
def _sum_first(arr, n):
    def body(i, total):
        return total + arr.index_select(0, i.reshape(1))[0]

    return fori_while(0, n, body, torch.zeros((), dtype=arr.dtype))


def test_fori_while_equals_range_loop():
    arr = torch.arange(1.0, 11.0, dtype=D)
    for n in (0, 3, 10):
        assert _sum_first(arr, torch.tensor(n)).item() == arr[:n].sum().item()
    assert fori_while(5, torch.tensor(2), lambda i, c: c + 1, torch.zeros(())).item() == 0
    assert fori_while(torch.tensor(2), 5, lambda i, c: c + i, torch.zeros(())).item() == 9


def test_fori_while_under_jit_and_vmap():
    arr = torch.arange(1.0, 11.0, dtype=D)
    j = fd.jit(_sum_first, backend="fx")
    for n in (0, 4, 10):
        assert j(arr, torch.tensor(n)).item() == arr[:n].sum().item()
    assert j.cache_size() == 1
    ns = torch.tensor([0, 2, 7])
    ref = torch.stack([arr[:n].sum() for n in ns])
    assert_close(fd.vmap(_sum_first, in_dims=(None, 0))(arr, ns), ref)
    tri = fd.vmap(lambda n: fori_while(0, n, lambda i, c: c + i, torch.zeros((), dtype=D)))
    assert_close(fd.jit(tri, backend="fx")(ns), torch.tensor([0.0, 1.0, 21.0], dtype=D))


def test_fori_while_errors_name_fori_loop():
    with pytest.raises(
        TypeError,
        match=r"fd.fori_loop: upper must be an int or a 0-d integer tensor; got float32\[\]",
    ):
        fori_while(0, torch.tensor(2.0), lambda i, c: c, torch.zeros(()))
    with pytest.raises(TypeError, match=r"fd.fori_loop: lower must be an int .* got str"):
        fori_while("0", torch.tensor(2), lambda i, c: c, torch.zeros(()))
    with pytest.raises(RuntimeError, match=r"fd.fori_loop: reverse-mode differentiation"):
        fd.grad(lambda x: fori_while(0, torch.tensor(3), lambda i, c: c * x, x))(torch.tensor(2.0))
