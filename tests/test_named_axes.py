"""Named axes under fd.vmap: fd.psum / fd.pmean / fd.axis_size, as jax.vmap(axis_name=).

References are computed by hand (the sum over members, broadcast to each) and by
loops over members with torch.autograd; jax semantics: psum over a vmapped axis
is the sum over members given to every member, and its transpose is psum, so the
gradient reaching a member is the sum of the cotangents of all members.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import functd as fd

D = torch.float64


def test_psum_is_the_sum_broadcast_to_every_member():
    x = torch.randn(4, 3, dtype=D)
    out = fd.vmap(lambda v: fd.psum(v, "m"), axis_name="m")(x)
    assert torch.equal(out, x.sum(0, keepdim=True).expand(4, 3))


def test_pmean_centres_and_axis_size():
    x = torch.tensor([1.0, 2.0, 6.0])
    out = fd.vmap(lambda v: v - fd.pmean(v, "m") + 0 * fd.axis_size("m"), axis_name="m")(x)
    assert out.tolist() == [-2.0, -1.0, 3.0]
    n = fd.vmap(lambda v: v * 0 + fd.axis_size("m"), axis_name="m")(x)
    assert n.tolist() == [3.0, 3.0, 3.0]


@given(m=st.integers(1, 5), n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_psum_value_matches_loop(m, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, dtype=D, generator=g)
    w = torch.randn(m, n, dtype=D, generator=g)
    out = fd.vmap(lambda a, b: b * fd.psum(a * a, "m"), axis_name="m")(x, w)
    ref = torch.stack([w[i] * sum(x[j] * x[j] for j in range(m)) for i in range(m)])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def _member_loss(x, w):
    return (w * fd.psum(x * x, "m")).sum() + fd.pmean(x, "m").sum()


def _loop_total(x, w):
    m = x.shape[0]
    s = sum(x[j] * x[j] for j in range(m))
    mean = sum(x[j] for j in range(m)) / m
    return sum((w[i] * s).sum() + mean.sum() for i in range(m))


def test_grad_outside_vmap_matches_loop():
    x, w = torch.randn(4, 3, dtype=D), torch.randn(4, 3, dtype=D)
    g = fd.grad(lambda x: fd.vmap(_member_loss, axis_name="m")(x, w).sum())(x)
    xr = x.clone().requires_grad_()
    (ref,) = torch.autograd.grad(_loop_total(xr, w), xr)
    torch.testing.assert_close(g, ref, rtol=1e-12, atol=1e-12)


def test_backward_through_vmap_matches_loop():
    x, w = torch.randn(4, 3, dtype=D), torch.randn(4, 3, dtype=D)
    xb = x.clone().requires_grad_()
    fd.vmap(_member_loss, axis_name="m")(xb, w).sum().backward()
    xr = x.clone().requires_grad_()
    (ref,) = torch.autograd.grad(_loop_total(xr, w), xr)
    torch.testing.assert_close(xb.grad, ref, rtol=1e-12, atol=1e-12)


def test_grad_inside_vmap_is_the_transpose_of_psum():
    # jax: vmap(grad(f), axis_name="m") with f = sum(w * psum(x*x)) + sum(pmean(x))
    # gives, for member i, 2 x_i * sum_j w_j + 1 (the cotangents summed over members)
    x, w = torch.randn(4, 3, dtype=D), torch.randn(4, 3, dtype=D)
    g = fd.vmap(fd.grad(_member_loss), axis_name="m")(x, w)
    torch.testing.assert_close(g, 2 * x * w.sum(0) + 1.0, rtol=1e-12, atol=1e-12)


def test_nested_names():
    y = torch.randn(2, 5, 3, dtype=D)

    def f(v):
        return fd.psum(v, "inner") + 10 * fd.psum(v, "outer") + 100 * fd.psum(v, ("inner", "outer"))

    out = fd.vmap(fd.vmap(f, axis_name="inner"), axis_name="outer")(y)
    ref = (
        y.sum(1, keepdim=True).expand_as(y)
        + 10 * y.sum(0, keepdim=True).expand_as(y)
        + 100 * y.sum((0, 1), keepdim=True).expand_as(y)
    )
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_nested_grad_matches_loop():
    y = torch.randn(2, 3, 4, dtype=D)

    def total(y):
        inner = fd.vmap(lambda v: (fd.psum(v, "i") * fd.pmean(v, "o")).sum(), axis_name="i")
        return fd.vmap(inner, axis_name="o")(y).sum()

    def loop(y):
        return sum((y[o].sum(0) * (y[:, i].sum(0) / 2)).sum() for o in range(2) for i in range(3))

    yr = y.clone().requires_grad_()
    (ref,) = torch.autograd.grad(loop(yr), yr)
    torch.testing.assert_close(fd.grad(total)(y), ref, rtol=1e-12, atol=1e-12)


def test_value_constant_over_the_axis_is_multiplied_by_its_size():
    out = fd.vmap(lambda a, c: a + fd.psum(c, "m"), in_dims=(0, None), axis_name="m")(
        torch.zeros(3), torch.tensor(2.0)
    )
    assert out.tolist() == [6.0, 6.0, 6.0]


def test_outer_axis_from_an_inner_vmap():
    z = torch.randn(5, dtype=D)
    out = fd.vmap(
        lambda c: fd.vmap(lambda v: fd.psum(v * c, "outer"), axis_name="inner")(z),
        axis_name="outer",
    )(torch.tensor([1.0, 2.0], dtype=D))
    torch.testing.assert_close(out, (3 * z).expand(2, 5))


def test_psum_of_a_tensordict():
    td = fd.TensorDict({"a": torch.ones(3, 2), "b": {"c": torch.arange(3.0)}}, [3])
    out = fd.vmap(lambda t: fd.psum(t, "m"), axis_name="m")(td)
    assert isinstance(out, fd.TensorDict)
    assert torch.equal(out["a"], torch.full((3, 2), 3.0))
    assert out["b", "c"].tolist() == [3.0, 3.0, 3.0]
    assert td["a"].tolist() == [[1.0, 1.0]] * 3  # input unchanged


def test_unknown_axis_name_lists_the_known_names():
    x = torch.ones(2)
    with pytest.raises(
        NameError,
        match=r"fd\.psum: unknown axis name 'nope'; the axes in scope are \['inner', 'outer'\]",
    ):
        fd.vmap(fd.vmap(lambda v: fd.psum(v, "nope"), axis_name="inner"), axis_name="outer")(
            torch.ones(2, 2)
        )
    with pytest.raises(
        NameError, match=r"fd\.pmean: unknown axis name 'm'; the axes in scope are \(none\)"
    ):
        fd.pmean(x, "m")


def test_bad_axis_name_and_chunk_size():
    with pytest.raises(TypeError, match=r"an axis name is a non-empty str; got 3"):
        fd.vmap(lambda v: v, axis_name=3)
    with pytest.raises(ValueError, match=r"axis_name='m' needs all elements at once"):
        fd.vmap(lambda v: v, axis_name="m", chunk_size=2)


def test_name_leaves_scope_after_the_call():
    fd.vmap(lambda v: fd.psum(v, "m"), axis_name="m")(torch.ones(2))
    with pytest.raises(NameError, match="unknown axis name 'm'"):
        fd.psum(torch.ones(2), "m")


def test_axis_over_ranks_needs_a_process_group():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group is running")
    ctx = fd.distributed.axis("ranks")
    with pytest.raises(RuntimeError, match=r"no process group is initialised.*torchrun"):
        ctx.__enter__()


def test_member_slice_blocks_and_uneven_error():
    assert fd.distributed.member_slice(8, rank=1, world=2) == slice(4, 8)
    assert [fd.distributed.member_slice(6, r, 3) for r in range(3)] == [
        slice(0, 2),
        slice(2, 4),
        slice(4, 6),
    ]
    with pytest.raises(ValueError, match=r"5 members do not split evenly over 2 ranks"):
        fd.distributed.member_slice(5, rank=0, world=2)
    with pytest.raises(ValueError, match=r"rank 2 is not in \[0, 2\)"):
        fd.distributed.member_slice(4, rank=2, world=2)


@pytest.mark.compile
def test_compiled_psum_runs_eagerly_and_equals_eager():
    # psum is torch.compiler.disable'd: dynamo would trace the autograd.Function's
    # forward and drop its vmap rule (a silently wrong sum, already with backend="eager");
    # a graph break is correct
    def h(x):
        return fd.vmap(lambda v: v - fd.pmean(v, "m"), axis_name="m")(x * 2) + 1

    x = torch.arange(4.0)
    torch.testing.assert_close(torch.compile(h, backend="eager")(x), h(x))
    assert h(x).tolist() == [-2.0, 0.0, 2.0, 4.0]


def test_forward_mode_jvp_and_jacfwd_equal_reverse():
    x, t = torch.randn(4, 3, dtype=D), torch.randn(4, 3, dtype=D)
    f = fd.vmap(lambda v: fd.psum(v * v, "m"), axis_name="m")
    _, tangent = torch.func.jvp(f, (x,), (t,))
    torch.testing.assert_close(tangent, (2 * x * t).sum(0).expand(4, 3))
    torch.testing.assert_close(fd.jacfwd(f)(x), fd.jacrev(f)(x))
