"""fd.grad, value_and_grad, jacrev, jacfwd, hessian, jvp, vjp against torch.autograd."""

import inspect

import pytest
import torch

import functd as fd
from functd.testing import assert_close


def make(bs=(4,), dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return fd.TensorDict(
        {
            "x": torch.randn(*bs, 3, generator=g, dtype=dtype),
            "obs": {"pos": torch.randn(*bs, 2, generator=g, dtype=dtype)},
        },
        list(bs),
    )


def loss(t, w):
    return ((t["x"] @ w).tanh().sum() + (t["obs", "pos"] ** 3).mean()) * w.sum()


def autograd(f, *args):
    """torch.autograd.grad of f wrt every leaf of every arg, packed like the args."""
    leaves, spec = torch.utils._pytree.tree_flatten(args)
    req = [x.detach().requires_grad_() for x in leaves]
    out = f(*torch.utils._pytree.tree_unflatten(req, spec))
    gs = torch.autograd.grad(out, req)
    return torch.utils._pytree.tree_unflatten(list(gs), spec), out.detach()


def is_valid(td):
    """Rebuilding through the validating constructor checks every batch size."""
    if isinstance(td, fd.TensorDict):
        fd.TensorDict(td.to_dict() if hasattr(td, "to_dict") else _plain(td), td.batch_size)
        for v in td.values():
            is_valid(v)


def _plain(td):
    return {k: (_plain(v) if isinstance(v, fd.TensorDict) else v) for k, v in td.items()}


# ------------------------------------------------------------------ grad
def test_grad_matches_autograd_shaped_like_inputs():
    td, w = make(), torch.randn(3, dtype=torch.float64)
    before = [v.clone() for v in fd.tree.leaves((td, w))]
    g_td = fd.grad(loss)(td, w)
    (ref_td, ref_w), _ = autograd(loss, td, w)
    assert isinstance(g_td, fd.TensorDict) and g_td.batch_size == td.batch_size
    assert_close(g_td, ref_td)
    g_td2, g_w = fd.grad(loss, argnums=(0, 1))(td, w)
    assert_close(g_td2, ref_td)
    assert_close(g_w, ref_w)
    assert_close(fd.grad(loss, argnums=-1)(td, w), ref_w)
    for a, b in zip(before, fd.tree.leaves((td, w))):
        assert torch.equal(a, b)


def test_grad_over_dict_and_tuple_pytrees():
    td = make()
    p = {"w": torch.randn(3, dtype=torch.float64), "pair": (torch.randn((), dtype=torch.float64),)}

    def f(p, t):
        return loss(t, p["w"]) * p["pair"][0]

    g = fd.grad(f)(p, td)
    (ref, _), _ = autograd(f, p, td)
    assert_close(g, ref)


def test_value_and_grad_order_and_has_aux():
    td, w = make(), torch.randn(3, dtype=torch.float64)
    value, g = fd.value_and_grad(loss)(td, w)
    (ref, _), ref_value = autograd(loss, td, w)
    assert_close(value, ref_value)
    assert_close(g, ref)

    def with_aux(t, w):
        out = t.set("y", t["x"] @ w)
        return loss(t, w), out

    (value, aux), g = fd.value_and_grad(with_aux, has_aux=True)(td, w)
    assert_close(value, ref_value)
    assert_close(aux["y"], td["x"] @ w)
    assert_close(g, ref)
    g2, aux2 = fd.grad(with_aux, has_aux=True)(td, w)
    assert_close(g2, ref)
    assert_close(aux2, aux)


def test_vmap_of_grad_is_per_example_gradients():
    td, w = make((5,)), torch.randn(3, dtype=torch.float64)
    per = fd.vmap(fd.grad(loss, argnums=1), in_dims=(0, None))(td, w)
    loop = torch.stack([autograd(loss, td[i], w)[0][1] for i in range(5)])
    assert_close(per, loop)


def test_wraps_keeps_name_doc_signature():
    for t in (fd.grad, fd.value_and_grad, fd.jacrev, fd.jacfwd, fd.hessian):
        g = t(loss)
        assert g.__wrapped__ is loss and g.__name__ == "loss"
        assert inspect.signature(g) == inspect.signature(loss)


# ------------------------------------------------------------------ Jacobians
def f_td(t):
    return fd.TensorDict({"a": t["x"].sin() * 2, "b": {"c": t["obs", "pos"].sum(-1)}}, t.batch_size)


@pytest.mark.parametrize("jac", [fd.jacrev, fd.jacfwd])
def test_jacobian_td_in_td_out_matches_torch_and_is_valid(jac):
    td = make((2,))
    j = jac(f_td)(td)
    ref = torch.func.jacrev(f_td)(td)  # same leaves; torch's batch sizes are not valid here
    assert_close(fd.tree.leaves(j), fd.tree.leaves(ref))
    assert j.batch_size == torch.Size([2])
    assert j["a"].batch_size == torch.Size([2, 3, 2])  # [*out shape, *in batch]
    assert j["a", "x"].shape == (2, 3, 2, 3)
    assert j["b", "c"].batch_size == torch.Size([2, 2])
    is_valid(j)


def test_jacobians_of_tensors_match_torch():
    x = torch.randn(3, dtype=torch.float64)
    y = torch.randn(2, 3, dtype=torch.float64)
    f = lambda x, y: (y @ x.sin(), x.exp().sum())  # noqa: E731
    for fd_t, t in ((fd.jacrev, torch.func.jacrev), (fd.jacfwd, torch.func.jacfwd)):
        assert_close(fd_t(f, argnums=(0, 1))(x, y), t(f, argnums=(0, 1))(x, y))
        assert_close(fd_t(f)(x, y), t(f)(x, y))


def test_jacrev_has_aux_and_chunk_size():
    td = make((2,))
    j, aux = fd.jacrev(lambda t: (f_td(t), t["x"].sum()), has_aux=True, chunk_size=2)(td)
    assert_close(j, fd.jacrev(f_td)(td))
    assert_close(aux, td["x"].sum())


def test_hessian_matches_autograd_functional():
    td = make((2,))

    def f(t):
        return (t["x"] ** 3).sum() + (t["x"][:, :2] * t["obs", "pos"]).sum()

    h = fd.hessian(f)(td)
    flat = torch.cat([td["obs", "pos"].flatten(), td["x"].flatten()])

    def f_flat(v):
        pos, x = v[:4].reshape(2, 2), v[4:].reshape(2, 3)
        return f(fd.TensorDict({"x": x, "obs": {"pos": pos}}, [2]))

    ref = torch.autograd.functional.hessian(f_flat, flat)
    assert_close(h["x", "x"].reshape(6, 6), ref[4:, 4:])
    assert_close(h["x", "obs", "pos"].reshape(6, 4), ref[4:, :4])
    assert_close(h["obs", "pos", "obs", "pos"].reshape(4, 4), ref[:4, :4])
    is_valid(h)


def test_jvp_and_vjp_match_torch():
    td = make()
    tangent = td.apply(torch.cos)
    f = lambda t: t.apply(torch.sin).set("s", t["x"].sum(-1))  # noqa: E731
    out, t_out = fd.jvp(f, (td,), (tangent,))
    r_out, r_t = torch.func.jvp(f, (td,), (tangent,))
    assert_close(out, r_out)
    assert_close(t_out, r_t)
    out, vjp_fn = fd.vjp(f, td)
    cot = out.apply(torch.ones_like)
    (g,) = vjp_fn(cot)
    assert_close(g, torch.func.vjp(f, td)[1](cot)[0])
    assert isinstance(g, fd.TensorDict) and g.batch_size == td.batch_size
    out, vjp_fn, aux = fd.vjp(lambda t: (f(t), t["x"].mean()), td, has_aux=True)
    assert_close(aux, td["x"].mean())


# ------------------------------------------------------------------ errors
def test_error_grad_of_tensordict_names_type_and_fix():
    td = make()
    with pytest.raises(
        TypeError,
        match=r"fd.grad\(f_td\): the function returned a TensorDict .*batch_size \[4\].*\.mean\(\).*has_aux=True.*fd.jacrev",
    ):
        fd.grad(f_td)(td)


def test_error_grad_of_non_scalar_names_shape():
    with pytest.raises(
        ValueError,
        match=r"returned a tensor of shape \[4, 3\], but grad needs a scalar \(shape \[\]\)\. Reduce it",
    ):
        fd.grad(lambda t: t["x"] * 2)(make())
    with pytest.raises(TypeError, match=r"returned a float but grad needs a scalar tensor"):
        fd.value_and_grad(lambda t: 1.0)(make())
    with pytest.raises(ValueError, match=r"fd.hessian\(<lambda>\).*shape \[4, 3\]"):
        fd.hessian(lambda t: t["x"] ** 2)(make())


def test_error_inputs_not_differentiable_name_the_path():
    td = make().set("count", torch.ones(4, dtype=torch.int64))
    with pytest.raises(
        TypeError, match=r"args\[0\]\['count'\] has dtype torch.int64.*Hold it out.*fd.partition"
    ):
        fd.grad(lambda t: t["x"].sum())(td)
    with pytest.raises(TypeError, match=r"args\[1\] is a str, not a tensor"):
        fd.grad(lambda t, s: t["x"].sum(), argnums=(0, 1))(make(), "hello")
    with pytest.raises(ValueError, match=r"argnums=2 but the function was called with 1"):
        fd.grad(lambda t: t["x"].sum(), argnums=2)(make())


def test_error_has_aux_without_pair():
    with pytest.raises(
        TypeError, match=r"has_aux=True, so the function must return a pair .* Tensor"
    ):
        fd.grad(lambda t: t["x"].sum(), has_aux=True)(make())


def test_error_tangents_and_cotangents_must_match():
    td = make()
    with pytest.raises(
        ValueError,
        match=r"tangents\[0\]\['x'\] has shape \[4, 2\].*primals\[0\]\['x'\] has shape \[4, 3\]",
    ):
        fd.jvp(f_td, (td,), (td.set("x", torch.zeros(4, 2, dtype=torch.float64)),))
    with pytest.raises(ValueError, match=r"only in the primals: \[\"\[0\]\['x'\]\"\]"):
        fd.jvp(f_td, (td,), (td.exclude("x"),))
    with pytest.raises(TypeError, match="primals must be a tuple"):
        fd.jvp(f_td, td, td)
    out, vjp_fn = fd.vjp(f_td, td)
    with pytest.raises(
        ValueError, match=r"cotangents\['a'\] has shape \[4\] .*output\['a'\] has shape \[4, 3\]"
    ):
        vjp_fn(out.set("a", torch.zeros(4, 3, dtype=torch.float64)[:, 0]))


def test_error_jacobian_of_td_output_wrt_tuple_argnums():
    td = make((2,))
    with pytest.raises(TypeError, match=r"fd.jacrev\(f\).*returns a TensorDict.*argnums=int"):

        def f(t, w):
            return f_td(t)

        fd.jacrev(f, argnums=(0, 1))(td, torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"output\['x'\] is a str"):
        fd.jacrev(lambda x: {"x": "no"})(torch.ones(2))


def test_grad_of_nested_params_with_closed_over_args_matches_torch_func():
    # fd.grad hands torch.func the flat leaves; the gradients, the value and aux must be
    # torch.func.grad_and_value's on the same (dict-shaped) inputs, for argnums tuples
    # with an empty TensorDict and tensors in non-differentiated args and kwargs
    torch.manual_seed(0)
    w, b, x, s = torch.randn(3, 2), torch.randn(3), torch.randn(5, 2), torch.randn(())
    params = fd.TensorDict({"lin": {"w": w, "b": b}}, [])
    empty = fd.TensorDict({}, [])

    def loss(p, e, x, scale=None):
        y = x @ p["lin", "w"].T + p["lin", "b"]
        return (y.pow(2).mean() * scale, y.detach())

    vg = fd.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    (v, aux), (g, ge) = vg(params, empty, x, scale=s)

    def ref_loss(w, b, x, scale):
        y = x @ w.T + b
        return (y.pow(2).mean() * scale, y.detach())

    (rw, rb), (rv, raux) = torch.func.grad_and_value(ref_loss, argnums=(0, 1), has_aux=True)(
        w, b, x, s
    )
    torch.testing.assert_close(g["lin", "w"], rw)
    torch.testing.assert_close(g["lin", "b"], rb)
    assert isinstance(ge, fd.TensorDict) and list(ge.keys()) == []
    torch.testing.assert_close(v, rv)
    torch.testing.assert_close(aux, raux)
