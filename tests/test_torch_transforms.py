"""TensorDicts under the plain torch transforms: torch.func, torch.compile, torch.export.

No functd wrapper here: the pytree registration alone must make these work. And the
other way round: functd's eager fast paths (gated by ``functd._eager.plain``) step aside
under every torch.func level and while torch.compile traces.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters
from torch.func import grad, jacrev, jvp, vmap

import functd as fd
from functd.testing import assert_close, example_tensordicts, tensordicts


def make(bs=(4, 5)):
    g = torch.Generator().manual_seed(0)
    return fd.TensorDict(
        {"x": torch.randn(*bs, 3, generator=g), "obs": {"pos": torch.randn(*bs, 2, generator=g)}},
        list(bs),
    )


def along(dim, i):
    return (slice(None),) * dim + (i,)


# ------------------------------------------------------------------ vmap
@pytest.mark.parametrize("in_dim", [0, 1])
def test_vmap_batch_size_inside_and_out(in_dim):
    td = make()
    seen = []

    def f(t):
        seen.append(t.batch_size)
        return t.set("z", torch.zeros(t.batch_size) + t["x"].sum(-1))

    out = vmap(f, in_dims=in_dim)(td)
    expected_inside = torch.Size([5]) if in_dim == 0 else torch.Size([4])
    assert seen == [expected_inside]
    mapped = td.batch_size[in_dim]
    assert out.batch_size == torch.Size([mapped, *expected_inside])
    assert out["obs"].batch_size == out.batch_size
    loop = fd.stack([f(td[along(in_dim, i)]) for i in range(mapped)])
    assert_close(out, loop)


def test_vmap_out_dims():
    td = make()
    out = vmap(lambda t: t.apply(torch.cos), in_dims=1, out_dims=1)(td)
    assert out.batch_size == td.batch_size
    assert_close(out, td.apply(torch.cos))
    out = vmap(lambda t: t.apply(torch.cos), in_dims=0, out_dims=1)(td)
    assert out.batch_size == torch.Size([5, 4])
    assert torch.equal(out["x"], td["x"].cos().transpose(0, 1))


def test_vmap_out_dims_per_output():
    td = make()
    a, b = vmap(lambda t: (t, t["x"]), out_dims=(1, 0))(td)
    assert a.batch_size == torch.Size([5, 4])
    assert b.shape == (4, 5, 3)


def test_nested_vmap():
    td = make()
    seen = []

    def f(t):
        seen.append(t.batch_size)
        return t.set("n", torch.ones(t.batch_size) * t["x"].mean(-1))

    out = vmap(vmap(f))(td)
    assert seen == [torch.Size([])]
    assert out.batch_size == torch.Size([4, 5])
    assert torch.allclose(out["n"], td["x"].mean(-1))
    out2 = vmap(vmap(f, in_dims=0), in_dims=1)(td)
    assert out2.batch_size == torch.Size([5, 4])


def test_vmap_chunk_size():
    td = make((7, 2))
    f = lambda t: t.apply(lambda x: x * 3).set("z", torch.zeros(t.batch_size))  # noqa: E731
    out = vmap(f, chunk_size=3)(td)
    assert out.batch_size == torch.Size([7, 2])
    assert_close(out, vmap(f)(td))


def test_vmap_with_tensordict_and_tensor_in_dims():
    td = make()
    w = torch.randn(3)
    out = vmap(lambda t, w: t["x"] @ w, in_dims=(0, None))(td, w)
    assert torch.allclose(out, td["x"] @ w)


def test_vmap_with_empty_nested_tensordict():
    td = fd.TensorDict({"x": torch.randn(4, 3), "e": {}}, [4])
    seen = []

    def f(t):
        seen.append((t.batch_size, t["e"].batch_size))
        return t.set("z", torch.zeros(t.batch_size))

    out = vmap(f)(td)
    assert seen == [(torch.Size([]), torch.Size([]))]
    assert out.batch_size == torch.Size([4]) and out["e"].batch_size == torch.Size([4])


def test_vmap_over_nested_longer_batch():
    td = example_tensordicts()["longer_child"]  # [3] holding a [3, 2] child
    out = vmap(lambda t: t.apply(torch.neg))(td)
    assert out["c"].batch_size == torch.Size([3, 2])
    assert_close(out, td.apply(torch.neg))


VMAP_TDS = tensordicts(
    batch_shape=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
    max_depth=2,
    min_keys=1,
)


def leafwise(t):
    return t.apply(lambda x: x.sin() * 2 + 1)


def batch_aware(t):
    # uses t.batch_size: fails (or gives wrong shapes) if it includes the mapped dim
    z = torch.zeros(t.batch_size)
    first = t.values(True, True)[0]
    z = z + first.reshape(*t.batch_size, -1).sum(-1)
    return t.reshape(-1).set("z", z.reshape(-1)).reshape(t.batch_size)


@settings(max_examples=15)
@given(VMAP_TDS, st.data(), st.sampled_from([leafwise, batch_aware]))
def test_vmap_equals_loop(td, data, f):
    dim = data.draw(st.integers(0, td.batch_dims - 1))
    out = vmap(f, in_dims=dim)(td)
    loop = fd.stack([f(td[along(dim, i)]) for i in range(td.batch_size[dim])])
    assert_close(out, loop, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ autodiff
def test_grad_of_sum_is_ones():
    td = make()

    def loss(t):
        return sum(v.sum() for v in t.values(True, True))

    g = grad(loss)(td)
    assert isinstance(g, fd.TensorDict)
    assert g.batch_size == td.batch_size and g.keys(True) == td.keys(True)
    assert_close(g, td.apply(torch.ones_like))


def test_grad_matches_autograd_and_has_aux():
    td = make()

    def loss(t):
        out = (t["x"].pow(2).sum() + (t["obs", "pos"] * 3).sum(), t.set("y", t["x"] * 2))
        return out

    g, aux = grad(loss, has_aux=True)(td)
    assert isinstance(aux, fd.TensorDict) and "y" in aux
    assert_close(aux["y"], td["x"] * 2)
    assert_close(g["x"], 2 * td["x"])
    assert_close(g["obs", "pos"], torch.full_like(td["obs", "pos"], 3.0))
    leaves = td.apply(lambda x: x.detach().requires_grad_())
    loss(leaves)[0].backward()
    assert_close(g, leaves.apply(lambda x: x.grad))


def test_grad_argnums_with_tensor():
    td = make()
    w = torch.randn(3)
    gw, gtd = grad(lambda w, t: (t["x"] @ w).sum(), argnums=(0, 1))(w, td)
    assert_close(gw, td["x"].sum((0, 1)))
    assert_close(gtd["x"], w.expand(4, 5, 3))
    assert_close(gtd["obs", "pos"], torch.zeros(4, 5, 2))


def test_jacrev_tensordict_in_and_out():
    x = torch.randn(3)
    j = jacrev(lambda x: fd.TensorDict({"a": x * 2, "b": {"c": x.sin()}}, [3]))(x)
    assert isinstance(j, fd.TensorDict)
    assert_close(j["a"], 2 * torch.eye(3))
    assert_close(j["b", "c"], torch.diag(x.cos()))
    td = fd.TensorDict({"u": torch.randn(2), "v": torch.randn(2)}, [2])
    jt = jacrev(lambda t: t["u"] * t["v"])(td)
    assert isinstance(jt, fd.TensorDict)
    assert_close(jt["u"], torch.diag(td["v"]))
    assert_close(jt["v"], torch.diag(td["u"]))


def test_jvp_tensordict():
    td = make()
    tangent = td.apply(torch.ones_like)
    primal, tan = jvp(lambda t: t.apply(torch.sin), (td,), (tangent,))
    assert isinstance(primal, fd.TensorDict) and isinstance(tan, fd.TensorDict)
    assert_close(primal, td.apply(torch.sin))
    assert_close(tan, td.apply(torch.cos))


def test_vmap_of_grad():
    td = make()
    g = vmap(grad(lambda t: (t["x"] ** 2).sum()))(td)
    assert g.batch_size == td.batch_size
    assert_close(g["x"], 2 * td["x"])


# ------------------------------------------------------------------ compile
def fresh():
    torch._dynamo.reset()
    counters.clear()


def graphs():
    return counters["stats"]["unique_graphs"]


def step(td):
    y = td["x"] * 2 + td["obs", "pos"].sum(-1, keepdim=True)
    out = td.set("y", y).set(("obs", "z"), torch.zeros(td.batch_size))
    return out.exclude("x").update({"w": td["x"].sin()})


@pytest.mark.compile
def test_compile_fullgraph_no_break_equals_eager_no_recompile():
    fresh()
    cstep = torch.compile(step, fullgraph=True, backend="eager")
    td = make()
    assert_close(cstep(td), step(td))
    assert not counters["graph_break"]
    assert graphs() == 1
    td2 = td.apply(lambda x: x * 3 + 1)
    fd.tree.flatten(td2)  # a cached tree spec on the input must not matter
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = cstep(td2)
    assert_close(out, step(td2))
    assert graphs() == 1


@pytest.mark.compile
def test_compile_inductor_builds_and_returns_tensordicts():
    fresh()

    def build(x):
        t = fd.TensorDict({"a": x, "b": {"c": x.cos() * 2}}, [x.shape[0]])
        s = fd.stack([t, t.apply(torch.neg)])
        return s[:, 1:], t["b", "c"].sum()

    x = torch.randn(4, 3)
    out, total = torch.compile(build, fullgraph=True)(x)
    ref, ref_total = build(x)
    assert isinstance(out, fd.TensorDict) and out.batch_size == torch.Size([2, 3])
    assert_close(out, ref)
    assert_close(total, ref_total)
    assert not counters["graph_break"]


@pytest.mark.compile
def test_compile_dynamic_batch_size_no_recompile():
    fresh()
    cstep = torch.compile(step, fullgraph=True, backend="eager", dynamic=True)
    for n in (5, 7, 11):  # not 3 or 2: duck sizing would tie them to feature dims
        td = make((n, 2))
        out = cstep(td)
        assert out.batch_size == torch.Size([n, 2])
        assert_close(out, step(td))
    assert graphs() == 1
    assert not counters["graph_break"]


@pytest.mark.compile
def test_compile_of_vmap_and_grad():
    fresh()
    f = vmap(grad(lambda t: (t["x"] ** 2).sum() + t["obs", "pos"].sum()))
    td = make()
    out = torch.compile(f, fullgraph=True, backend="eager")(td)
    assert_close(out, f(td))
    assert not counters["graph_break"]


# ------------------------------------------------------------------ export
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)

    def forward(self, td):
        h = self.lin(td["x"])
        return td.set("h", h).set(("obs", "s"), td["obs", "pos"].sum(-1))


@pytest.mark.compile
def test_export_save_load(tmp_path):
    net = Net()
    td = make((5,))
    ep = torch.export.export(net, (td,))
    assert_close(ep.module()(td), net(td))
    path = tmp_path / "net.pt2"
    torch.export.save(ep, path)
    loaded = torch.export.load(path)
    other = td.apply(lambda x: x + 1)
    out = loaded.module()(other)
    assert isinstance(out, fd.TensorDict)
    assert out.batch_size == torch.Size([5])
    assert_close(out, net(other))


# ------------------------------------------------------------------ functd's eager paths step aside
# functd._eager.plain gates every eager fast path (foreach optimizers, in-place PRNG,
# train_step's autograd.grad): True on plain tensors only, False under torch.func's
# levels (the reference: torch's own is_functorch_wrapped_tensor on the same values)
def test_plain_is_false_under_every_torch_func_level():
    from functd._eager import plain

    x = torch.zeros(3)
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    assert plain([x]) and plain([]) and plain([x, torch.nn.Parameter(x)])
    seen = []

    def probe(t):
        seen.append((plain([t]), plain([x, t]), wrapped(t)))
        return t.sum()

    torch.func.vmap(probe)(torch.zeros(2, 3))
    torch.func.grad(probe)(x)
    torch.func.jvp(probe, (x,), (x,))
    assert seen == [(False, False, True)] * 3


def test_plain_is_false_while_compiling():
    from functd._eager import plain

    @torch.compile(backend="eager", fullgraph=True)
    def f(t):
        return t + 1 if plain([t]) else t - 1

    assert f(torch.zeros(2)).tolist() == [-1.0, -1.0]  # traced: the general path
    assert plain([torch.zeros(2)])  # eager again afterwards
