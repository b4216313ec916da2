"""fd.jit: signatures, caching, loud errors, composition, donation, CUDA graphs.

Most tests trace with ``backend="fx"`` (the traced graph run as it is: the trace,
its checks and the signature cache are the same as with inductor, without the C++
compile); the few that compile with inductor are marked ``compile``. The registry
sweeps (every entry, values and gradients) are in test_conformance.py.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from test_cuda_graph import FakeRecorder

import functd as fd
from functd.testing import assert_close, assert_max_compiles, count_compiles

FX = {"backend": "fx"}


def _block():
    return fd.Sequential(
        fd.Module(nn.Linear(3, 8), ["x"], ["h"]),
        fd.Module(torch.relu, ["h"], ["a"]),
        fd.Module(nn.Linear(8, 3), ["a"], ["z"]),
        fd.Module(lambda x, z: x + z, ["x", "z"], ["y"]),
        selected_out_keys=["y"],
    )


BLOCK = _block()


def _td(n=4, **extra):
    return fd.TensorDict({"x": torch.randn(n, 3), **extra}, [n])


def _policy():
    return fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(4, 8), ["input", "hidden"], ["hidden"]),
        fd.Module(fd.NormalParamExtractor(), ["hidden"], ["loc", "scale"]),
        fd.Probabilistic(
            ["loc", "scale"], ["action"], torch.distributions.Normal, return_log_prob=True
        ),
    )


def _policy_td(n=5):
    return fd.TensorDict({"input": torch.randn(n, 4), "hidden": torch.randn(n, 8)}, [n])


# ---------------------------------------------------------------- the wrapper
def test_keeps_name_doc_and_options():
    def step(p, td):
        """Docs of the step."""
        return BLOCK(p, td)

    j = fd.jit(step, static_argnums=2, cache_size=3, **FX)
    assert j.__wrapped__ is step and j.__name__ == "step" and j.__doc__ == "Docs of the step."
    assert "static_argnums=(2,)" in repr(j) and "cache_size=3" in repr(j)
    deco = fd.jit(dynamic=False, **FX)(step)
    assert deco.__wrapped__ is step and "dynamic=False" in repr(deco)


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"cache_size": 0}, ValueError, "cache_size must be an int >= 1"),
        ({"dynamic": "yes"}, ValueError, "dynamic must be None, True or False"),
        ({"backend": "xla"}, ValueError, r"backend must be one of \('inductor', 'fx'\)"),
        ({"static_argnums": -1}, TypeError, "static_argnums must be non-negative ints"),
        ({"static_argnums": 1, "donate_argnums": 1}, ValueError, "both static and donated"),
    ],
)
def test_bad_options(kwargs, err, match):
    with pytest.raises(err, match=match):
        fd.jit(BLOCK, **kwargs)


def test_not_callable():
    with pytest.raises(TypeError, match=r"fd.jit\(f\) takes a function, got a int"):
        fd.jit(3)


# ---------------------------------------------------------------- values
def test_equals_eager_and_passes_inputs_through():
    j = fd.jit(BLOCK, **FX)
    params, td = BLOCK.init(0), _td()
    before = [(id(v), v.clone()) for v in fd.tree.leaves((params, td))]
    out = j(params, td)
    assert_close(out, BLOCK(params, td))
    assert out["x"] is td["x"]  # an input passed through is the caller's tensor, as eager
    assert list(out.keys()) == list(BLOCK(params, td).keys())
    for (i, v), w in zip(before, fd.tree.leaves((params, td))):
        assert i == id(w) and torch.equal(v, w)  # nothing written, nothing swapped
    td2 = _td()
    out2 = j(BLOCK.init(1), td2)  # new values, same signature: the compiled code
    assert_close(out2, BLOCK(BLOCK.init(1), td2))
    assert j.cache_info().compiles == 1 and j.cache_info().calls == 2


def test_outputs_of_every_kind():
    def f(x, td):
        return {"s": x.sum(), "td": td.set("y", td["x"] * 2)}, [x + 1, None, 3, "tag"], x.t()

    j = fd.jit(f, **FX)
    x, td = torch.randn(2, 3), _td(2)
    out = j(x, td)
    assert_close(out, f(x, td))
    assert out[1][2:] == [3, "tag"] and out[1][1] is None
    assert out[2].data_ptr() == x.data_ptr()  # a view of an input stays a view, as in eager


def test_keeps_no_data_alive_past_the_latest_call_that_described_it():
    j = fd.jit(BLOCK, **FX)
    params, td = BLOCK.init(0), _td()
    alive = weakref.ref(td["x"])
    j(params, td)
    j(params, _td())  # the same signature: checked without describing it
    j(params, _td(5))  # a new one: described (the wrapper keeps this one)
    del td
    gc.collect()
    assert alive() is None


def test_random_policy_with_key_equals_eager():
    pol = _policy()
    params, td = fd.from_module(pol), _policy_td()
    j = fd.jit(pol, **FX)
    for seed in (0, 1):  # the key is an input: a new key draws anew, no new compile
        key = fd.random.key(seed)
        got = j(params, td, key=key, interaction=fd.InteractionType.RANDOM)
        want = pol(params, td, key=key, interaction=fd.InteractionType.RANDOM)
        # the same draws (a different one would differ by O(1)); not bitwise: the traced
        # graph's decomposed softplus differs from ATen's AVX-512 kernel by 1 ulp
        assert_close(got["action"], want["action"], rtol=1e-6, atol=1e-6)
        assert_close(got["action_log_prob"], want["action_log_prob"], rtol=1e-6, atol=1e-6)
    assert j.cache_info().compiles == 1


def test_interaction_type_context_is_part_of_the_signature():
    pol = _policy()
    params, td, key = fd.from_module(pol), _policy_td(), fd.random.key(0)
    j = fd.jit(pol, **FX)
    det = j(params, td, key=key)
    assert torch.equal(det["action"], det["loc"])
    with fd.set_interaction_type("random"):
        rnd = j(params, td, key=key)
        assert_close(rnd, pol(params, td, key=key))
    assert not torch.equal(rnd["action"], rnd["loc"])
    assert torch.equal(j(params, td, key=key)["action"], det["loc"])  # back: deterministic
    assert j.cache_size() == 2


def test_train_step_equals_eager_and_donation_writes_in_place():
    net = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 3))
    m = fd.Module(net, ["x"], ["y"])

    def loss(p, batch, key):
        return ((m(p, batch)["y"] - batch["t"]) ** 2).mean()

    opt = fd.optim.adam(1e-2)
    step = fd.train_step(loss, opt)
    batch = fd.TensorDict({"x": torch.randn(8, 3), "t": torch.randn(8, 3)}, [8])
    p0 = fd.from_module(m)
    jstep = fd.jit(step, **FX)
    jdon = fd.jit(step, donate_argnums=(0, 1), **FX)
    pe, se = p0, opt.init(p0)
    pj, sj = p0, opt.init(p0)
    pd, sd = p0.clone(), opt.init(p0)
    for _ in range(3):
        pe, se, me = step(pe, se, batch, None)
        pj, sj, mj = jstep(pj, sj, batch, None)
        old = pd
        pd, sd, _ = jdon(pd, sd, batch, None)
        assert pd["0", "weight"] is old["0", "weight"]  # donated: written in place
    for got in (pj, pd):
        assert_close(got, pe, rtol=0, atol=1e-6)
    assert_close(mj, me, rtol=0, atol=1e-6)
    assert jstep.cache_info().compiles == 1 and jdon.cache_info().compiles == 1


def test_donated_input_sharing_memory_is_refused():
    f = fd.jit(lambda a, b: (a + b, b * 2), donate_argnums=0, **FX)
    x = torch.randn(3)
    f(x.clone(), x)
    with pytest.raises(ValueError, match="a donated input shares its memory with another input"):
        f(x, x)


# ---------------------------------------------------------------- signatures
def test_batch_sizes_compile_at_most_twice_and_a_new_key_set_once():
    j = fd.jit(BLOCK, **FX)
    params = BLOCK.init(0)
    with assert_max_compiles(2):
        for n in range(1, 25):
            td = _td(n)
            assert_close(j(params, td), BLOCK(params, td))
    with count_compiles() as c:
        td = _td(5, extra=torch.zeros(5))
        assert_close(j(params, td), BLOCK(params, td))
        j(params, _td(7, extra=torch.zeros(7)))
    assert c.jit == 1
    lowered = j.lower(params, _td(9))
    assert lowered.dynamic  # the batch dim is symbolic
    assert "addmm" in lowered.graph and lowered.source is None  # fx: no generated code


def test_dynamic_false_compiles_each_batch_and_true_compiles_once():
    params = BLOCK.init(0)
    static = fd.jit(BLOCK, dynamic=False, **FX)
    dyn = fd.jit(BLOCK, dynamic=True, **FX)
    for n in (2, 3, 4):
        static(params, _td(n))
        dyn(params, _td(n))
    assert static.cache_info().compiles == 3
    assert dyn.cache_info().compiles == 1


def test_new_signatures_compile_and_same_ones_do_not():
    j = fd.jit(lambda td, scale: td["x"] * scale, **FX)
    td = _td()
    with count_compiles() as c:
        j(td, 2.0)
        j(_td(), 2.0)  # new values
        j(td.double(), 2.0)  # dtype
        j(td, 3.0)  # a static value
        j(td, 3)  # its type
        j(fd.TensorDict({"x": torch.randn(3, 4)[:, :3]}, [3]), 3)  # strides (and size)
    assert c.jit == 5


def test_static_argnums_close_over_values():
    def f(x, n, table):
        return x * n + table[1]

    j = fd.jit(f, static_argnums=(1, 2), **FX)
    x = torch.ones(2)
    assert torch.equal(j(x, 2, (0, 5)), torch.full((2,), 7.0))
    assert torch.equal(j(x, 3, (0, 5)), torch.full((2,), 8.0))
    assert torch.equal(j(x, 3.0, (0, 5)), torch.full((2,), 8.0))  # 3.0 is not 3
    assert j.cache_size() == 3
    t = torch.ones(2)  # a tensor as a static argument: a constant, known by identity
    assert torch.equal(j(x, 1, t), x + 1) and j.cache_size() == 4
    j(x, 1, t)
    assert j.cache_size() == 4
    with pytest.raises(TypeError, match=r"static argument args\[2\] \(a list\) is not hashable"):
        j(x, 2, [0, 5])
    with pytest.raises(TypeError, match=r"static_argnums=\(1, 2\) names argument 2, but"):
        j(x, 2)


def test_unhashable_non_tensor_input():
    j = fd.jit(lambda x, opts: x * len(opts), **FX)
    with pytest.raises(TypeError, match=r"non-tensor input args\[1\] is not hashable"):
        j(torch.zeros(2), bytearray(b"ab"))


def test_cache_bound_evicts_and_warns_once_naming_the_change():
    j = fd.jit(lambda td: td["x"].sum(), cache_size=2, dynamic=False, **FX)
    j(_td(2))
    j(_td(3))
    with pytest.warns(
        fd.JitWarning, match=r"more than cache_size=2.*args\[0\]: batch size \[3\] -> \[4\]"
    ):
        j(_td(4))
    assert j.cache_size() == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        j(_td(5))  # once per wrapper
        j(_td(2))  # evicted: compiles again
    assert j.cache_info().compiles == 5
    j.cache_clear()
    assert j.cache_size() == 0


def test_warning_names_a_key_set_change():
    j = fd.jit(lambda td: td["x"].sum(), cache_size=1, **FX)
    j(_td())
    with pytest.warns(fd.JitWarning, match=r"args\[0\]: key set gained 'extra', lost none"):
        j(_td(extra=torch.zeros(4)))


# ---------------------------------------------------------------- loud errors
def _branchy(x):
    if x.sum() > 0:
        return x
    return -x


@pytest.mark.parametrize(
    ("f", "match"),
    [
        (_branchy, r"(?s)fd.jit\(_branchy\): the function cannot be traced purely.*torch.where"),
        (lambda x: x * int(x.sum()), r"(?s)cannot be traced purely.*static argument"),
        (lambda x: x + torch.randn(3), r"draws from torch's global generator \(aten.randn"),
        (lambda x: x.add_(1), r"writes into its input args\[0\] \(an in-place op"),
    ],
)
def test_untraceable_functions_raise_naming_the_function_and_fix(f, match):
    j = fd.jit(f, **FX)
    with pytest.raises(fd.TransformError, match=match):
        j(torch.ones(3))
    assert j.cache_size() == 0


def test_data_dependent_error_points_at_the_users_line():
    with pytest.raises(fd.TransformError, match=r"test_jit.py:\d+ \(`if x.sum\(\) > 0:`\)"):
        fd.jit(_branchy, **FX)(torch.ones(3))


def test_writing_a_closed_over_tensor_is_refused():
    g = torch.zeros(3)

    def f(x):
        g.add_(1)
        return x + g

    with pytest.raises(fd.TransformError, match="writes into a tensor it closes over"):
        fd.jit(f, **FX)(torch.ones(3))


def test_writing_an_input_td_leaf_names_its_path():
    def f(td):
        td["x"].mul_(2)
        return td

    with pytest.raises(fd.TransformError, match=r"writes into its input args\[0\]\['x'\]"):
        fd.jit(f, **FX)(_td())


def test_a_distribution_output_is_refused():
    pol = _policy()
    j = fd.jit(pol.get_dist, **FX)
    with pytest.raises(TypeError, match=r"output is a Normal distribution.*Return its parameters"):
        j(fd.from_module(pol), _policy_td())


def test_inputs_requiring_grad_name_the_jit_of_grad_fix():
    params = BLOCK.init(0).apply(lambda v: v.requires_grad_())
    j = fd.jit(BLOCK, **FX)
    with pytest.raises(fd.TransformError, match=r"args\[0\]\['0'\]\['weight'\].*fd.jit\(fd.grad"):
        j(params, _td())
    td = _td(2)
    with torch.no_grad():  # no autograd graph would be built eagerly either
        assert_close(j(params, td), BLOCK(BLOCK.init(0), td))
        j(params, td)
    with pytest.raises(fd.TransformError, match="require grad"):
        j(params, td)  # grad mode on again: refused, also for a signature already run


def test_errors_of_f_itself_are_kept_with_a_note():
    with pytest.raises(ValueError, match=r"params entry 'weight' has shape \[5, 3\]") as info:
        fd.jit(BLOCK, **FX)(fd.Sequential(fd.Module(nn.Linear(3, 5), ["x"], ["h"])).init(0), _td())
    assert any("traced the function on tensors without values" in n for n in info.value.__notes__)


@torch.library.custom_op("functd_test::twice_without_fake", mutates_args=())
def _twice_without_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_an_op_without_a_fake_kernel_keeps_torchs_message_with_a_note():
    with pytest.raises(RuntimeError, match="no fake impl registered") as info:
        fd.jit(lambda x: _twice_without_fake(x) + 1, **FX)(torch.ones(3))
    assert any("fd.jit(<lambda>) traced the function" in n for n in info.value.__notes__)


# ---------------------------------------------------------------- composition
def test_jit_of_vmap_and_of_grad():
    params, td = BLOCK.init(0), _td()
    ens = fd.stack([params, BLOCK.init(1)])
    vm = fd.vmap(BLOCK, in_dims=(0, None))
    assert_close(fd.jit(vm, **FX)(ens, td), vm(ens, td))

    def loss(p, td):
        return BLOCK(p, td)["y"].pow(2).sum()

    assert_close(fd.jit(fd.grad(loss), **FX)(params, td), fd.grad(loss)(params, td))


def test_a_jitted_function_called_inside_a_transform_runs_f_and_names_the_compiled_form():
    j = fd.jit(BLOCK, **FX)
    params, td = BLOCK.init(0), _td()
    ens = fd.stack([params, params])
    with pytest.warns(fd.JitWarning, match=r"inside fd.vmap.*fd.vmap\(jitted\)"):
        out = fd.vmap(lambda p: j(p, td)["y"] * 2)(ens)
    assert_close(out, fd.vmap(lambda p: BLOCK(p, td)["y"] * 2)(ens))
    j2 = fd.jit(BLOCK, **FX)
    with pytest.warns(fd.JitWarning, match=r"inside fd.grad.*fd.grad\(jitted\)"):
        g = fd.grad(lambda p: j2(p, td)["y"].sum())(params)
    assert_close(g, fd.grad(lambda p: BLOCK(p, td)["y"].sum())(params))
    assert j.cache_size() == 0 and j2.cache_size() == 0  # nothing compiled for them


def test_jit_inside_jit_is_inlined():
    inner = fd.jit(BLOCK, **FX)
    outer = fd.jit(lambda p, td: inner(p, td)["y"] * 2, **FX)
    params, td = BLOCK.init(0), _td()
    assert_close(outer(params, td), BLOCK(params, td)["y"] * 2)
    assert inner.cache_size() == 0  # traced as part of the outer function


@pytest.mark.compile
def test_torch_compile_of_a_jitted_function_traces_f():
    j = fd.jit(BLOCK, **FX)
    params, td = BLOCK.init(0), _td()
    with count_compiles() as c:
        out = torch.compile(j, backend="eager", fullgraph=True)(params, td)
    assert_close(out, BLOCK(params, td))
    assert c.torch == 1 and c.jit == 0


# ---------------------------------------------------------------- cuda_graph=True
def _graphed(f, **kw):
    j = fd.jit(f, cuda_graph=True, **FX, **kw)
    j._graphed._recorder = FakeRecorder()
    return j


def test_cuda_graph_without_cuda_warns_and_runs_compiled():
    j = fd.jit(BLOCK, cuda_graph=True, **FX)
    params, td = BLOCK.init(0), _td()
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the fallback is not taken")
    with pytest.warns(fd.CudaGraphWarning, match=r"jit\(Sequential, cuda_graph=True\).*without"):
        out = j(params, td)
    assert_close(out, BLOCK(params, td))
    assert j.cache_info().compiles == 1 and "cuda_graph=True" in repr(j)


def test_cuda_graph_records_the_compiled_function_per_signature():
    j = _graphed(BLOCK)
    rec = j._graphed._recorder
    params = BLOCK.init(0)
    for n in (4, 4, 4, 4, 6, 6, 6, 6):  # 2 warm-ups, record, replay; then a new signature
        td = _td(n)
        assert_close(j(params, td), BLOCK(params, td))
    info = j._graphed.cache_info()
    assert (info.recordings, info.replays, rec.warm_calls) == (2, 2, 4)
    assert j.cache_info().compiles == 2  # the jitted code, compiled once per signature


# ---------------------------------------------------------------- CUDA
@pytest.mark.cuda
def test_cuda_jit_equals_eager():
    params = BLOCK.init(0).to("cuda")
    j = fd.jit(BLOCK)
    with assert_max_compiles(2):
        for n in (4, 9, 17):
            td = _td(n).to("cuda")
            assert_close(j(params, td), BLOCK(params, td), rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_cuda_jit_with_cuda_graph_replays():
    params = BLOCK.init(0).to("cuda")
    j = fd.jit(BLOCK, cuda_graph=True)
    for _ in range(4):
        td = _td().to("cuda")
        assert_close(j(params, td), BLOCK(params, td), rtol=1e-5, atol=1e-6)
    assert j._graphed.cache_info().replays >= 1


# ---------------------------------------------------------------- inductor
@pytest.mark.compile
def test_inductor_block_dynamic_batch_and_key_set():
    j = fd.jit(BLOCK)
    params = BLOCK.init(0)
    with assert_max_compiles(2):
        for n in (1, 2, 3, 17):
            td = _td(n)
            assert_close(j(params, td), BLOCK(params, td), rtol=1e-5, atol=1e-6)
    assert "inductor_entry" in (j.lower(params, _td(5)).source or "")


@pytest.mark.compile
def test_inductor_train_step_with_donation_matches_eager():
    # inductor writes the new params and optimizer state into the donated buffers
    m = fd.Module(nn.Linear(3, 4), ["x"], ["y"])

    def loss(p, batch, key):
        return ((m(p, batch)["y"] - batch["t"]) ** 2).mean()

    opt = fd.optim.adam(1e-2)
    step = fd.train_step(loss, opt)
    batch = fd.TensorDict({"x": torch.randn(8, 3), "t": torch.randn(8, 4)}, [8])
    pe, se = fd.from_module(m), opt.init(fd.from_module(m))
    pd, sd = pe.clone(), se.clone()
    jstep = fd.jit(step, donate_argnums=(0, 1))
    for _ in range(3):
        pe, se, _ = step(pe, se, batch, None)
        w = pd["weight"]
        pd, sd, _ = jstep(pd, sd, batch, None)
        assert pd["weight"] is w
    assert_close(pd, pe, rtol=0, atol=1e-6)
    assert_close(sd, se, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- the signature walk
@settings(max_examples=25)
@given(td=fd.testing.tensordicts(max_depth=3, min_keys=1))
def test_signature_walk_rebuilds_and_keys_like_optree(td):
    from functd._transforms._signature import Desc

    d = Desc(td)
    assert sorted(map(id, d.leaves)) == sorted(map(id, fd.tree.leaves(td)))
    assert_close(d.rebuild(d.leaves), td)
    assert len(d.paths()) == len(d.leaves)
    for p, v in zip(d.paths(), d.leaves):
        assert td[p] is v
    again = td.apply(lambda v: v + 1)  # same layout, new values: the same key
    assert Desc(again).key == d.key


def test_signature_key_order_and_change_descriptions():
    from functd._transforms._signature import Flat, describe_change

    a = fd.TensorDict({"x": torch.zeros(4, 3), "y": torch.zeros(4)}, [4])
    b = fd.TensorDict({"y": torch.zeros(4), "x": torch.zeros(4, 3)}, [4])

    def sig(*args, **kw):
        return Flat(args, kw, {}).sig

    assert sig(a) != sig(b)  # insertion order is part of it (no sort per call)
    assert "insertion order" in describe_change(sig(a), sig(b))
    assert (
        describe_change(sig(a), sig(a.double()))
        == "args[0]['x']: dtype torch.float32 -> torch.float64"
    )
    assert describe_change(sig(a, 1), sig(a, 2)) == "args[1]: 1 -> 2"
    c = fd.TensorDict({"x": torch.zeros(3, 4).t(), "y": torch.zeros(4)}, [4])
    assert describe_change(sig(a), sig(c)) == "args[0]['x']: stride (3, 1) -> (1, 4)"


def test_row_major_bmm_pass_keeps_values_and_a_vmapped_loop_equals_eager():
    """fd.jit's post-grad pass (_jit_passes.RowMajorBmm) routes each operand of a
    batched matmul through inductor's row-major stride requirement: the values stay, and a
    matmul vmapped inside fd.scan (its carries stored batch-last) equals eager."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from functd._transforms._jit_passes import RowMajorBmm

    a, b = torch.randn(5, 3, 4).permute(1, 0, 2), torch.randn(3, 4, 2)  # a: batch not outer
    gm = make_fx(torch.bmm, tracing_mode="fake")(a, b)
    RowMajorBmm()(gm.graph)
    gm.recompile()
    (mm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.bmm.default]
    # a: copied row-major; b: an input already row-major, left as it is given
    assert mm.args[0].target is torch.ops.prims.inductor_force_stride_order.default
    assert mm.args[1].op == "placeholder"
    torch.testing.assert_close(gm(a, b), torch.bmm(a, b))

    torch.manual_seed(0)
    w, h0, xs = torch.randn(8, 5, 5), torch.randn(8, 3, 5), torch.randn(8, 6, 3, 5)

    def run(w, h0, xs):
        def step(c, x):  # the weights ride in the carry, as PPO's params do
            h, w = c
            h = torch.tanh(h @ w + x)
            return (h, w), h.sum()

        return fd.scan(step, (h0, w), xs)

    f = fd.vmap(run)
    assert_close(fd.jit(f)(w, h0, xs), f(w, h0, xs), rtol=1e-5, atol=1e-5)


def test_bmm_pass_keeps_a_transposed_operand_a_view_and_skips_its_copy():
    """_jit_passes.RowMajorBmm leaves a batch-outer transposed operand (x @ W.T) as it
    is stored, also through a row-major copy of it (a loop body's permute_copy): MKL
    reads it with a transpose flag, where a row-major copy transposed every weight in
    every loop step (PPO at 256 agents). A view of an input gets no requirement at all
    (inductor copied a loop body's input to meet one). The values stay."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from functd._transforms._jit_passes import RowMajorBmm

    aten, force = torch.ops.aten, torch.ops.prims.inductor_force_stride_order.default

    def f(x, w):
        v = w * 2  # computed: inductor lays it out, the pass states how
        return (
            torch.bmm(x, w.transpose(1, 2)),
            torch.bmm(x, w.transpose(1, 2).clone()),
            torch.bmm(x, v.transpose(1, 2)),
            torch.bmm(x, v.transpose(1, 2).clone()),
        )

    x, w = torch.randn(5, 3, 4), torch.randn(5, 6, 4)
    gm = make_fx(f, tracing_mode="fake")(x, w)
    RowMajorBmm()(gm.graph)
    gm.recompile()
    operands = [n.args[1] for n in gm.graph.nodes if n.target is aten.bmm.default]
    assert [n.target for n in operands] == [aten.transpose.int] * 2 + [force] * 2
    for n in operands[2:]:  # w * 2, transposed as stored (no clone in between)
        assert tuple(n.args[1]) == (24, 1, 4) and n.args[0].target is aten.transpose.int
    for got, want in zip(gm(x, w), f(x, w), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)

    def run(w, h0, xs):  # under fd.vmap in fd.scan, as PPO's rollout: compiled == eager
        def step(c, x):
            h, w = c
            h = torch.tanh(h @ w.T + x)
            return (h, w), h

        return fd.scan(step, (h0, w), xs)

    torch.manual_seed(0)
    g = fd.vmap(run)
    args = torch.randn(8, 5, 5), torch.randn(8, 3, 5), torch.randn(8, 6, 3, 5)
    assert_close(fd.jit(g)(*args), g(*args), rtol=1e-5, atol=1e-5)


def test_copy_views_pass_leaves_no_copying_view_and_keeps_values():
    """_jit_passes.FuseCopyViews: select_copy / slice_copy / detach_copy (what a
    loop body of torch's scan op reaches inductor with, and which inductor ran as a
    fallback call each step) become the view and a clone: no copying view left, the
    same values and strides."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from functd._transforms._jit_passes import FuseCopyViews

    aten = torch.ops.aten

    def f(x):
        a = aten.select_copy.int(x, 1, 2)
        b = aten.slice_copy.Tensor(x, 0, 1, 3)
        c = aten.detach_copy.default(x.t())
        return a, b, c

    x = torch.randn(4, 5).t()  # not row-major
    gm = make_fx(f, tracing_mode="fake")(x)
    FuseCopyViews()(gm.graph)
    gm.recompile()
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert not targets & {aten.select_copy.int, aten.slice_copy.Tensor, aten.detach_copy.default}
    for got, want in zip(gm(x), f(x), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got.stride() == want.stride()


def test_batch_one_bmm_pass_turns_many_rows_into_mm_and_keeps_few():
    """_jit_passes.BatchOneBmm: a batch-one bmm of MM_ROWS rows or more becomes an mm
    (inductor's decompose_mm_pass took it apart into scalar loops), fewer rows stay a
    bmm (decomposed: faster than a BLAS call); the values stay."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from functd._transforms._jit_passes import MM_ROWS, BatchOneBmm

    for rows, expect in ((MM_ROWS, torch.ops.aten.mm.default), (4, torch.ops.aten.bmm.default)):
        a, b = torch.randn(1, rows, 4), torch.randn(1, 4, 8)
        gm = make_fx(torch.bmm, tracing_mode="fake")(a, b)
        BatchOneBmm()(gm.graph)
        gm.recompile()
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert expect in targets
        torch.testing.assert_close(gm(a, b), torch.bmm(a, b))
    a, b = torch.randn(2, 32, 4), torch.randn(2, 4, 8)  # a batch of two: untouched
    gm = make_fx(torch.bmm, tracing_mode="fake")(a, b)
    BatchOneBmm()(gm.graph)
    assert torch.ops.aten.mm.default not in [n.target for n in gm.graph.nodes]
