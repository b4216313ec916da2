"""fd.jit's dispatch: which compiled entry a call runs, and that it runs the right one.

- Non-tensor floats are part of a signature by their bits: 0.0 and -0.0 are two
  signatures (eager divides by each differently), nan is one signature (nan != nan
  would compile once per call).
- Threads making the first call at once compile once and all get eager's answer.
- Arguments an op refuses to combine (dtypes, shapes, devices) get a functd error at
  the first call naming the argument paths, before any compiled code runs, where
  eager PyTorch raises too.

Tests trace with ``backend="fx"`` (the trace, its checks and the cache are the same
as with inductor); the few that compile with inductor say so.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.nn.functional as F

import functd as fd

FX = {"backend": "fx"}
NAN = float("nan")


# ------------------------------------------------------------------ floats by bits
def test_negative_zero_argument_is_its_own_signature_and_matches_eager():
    x = torch.tensor([1.0, -2.0, 0.0])
    j = fd.jit(lambda x, s: x / s, **FX)
    for s in (0.0, -0.0, 0.0, -0.0):  # the second round goes through the fast path
        torch.testing.assert_close(j(x, s), x / s, equal_nan=True)
    assert j(x, -0.0)[0].item() == -math.inf
    assert j.cache_info().compiles == 2


def test_nan_argument_compiles_once():
    x = torch.ones(3)
    j = fd.jit(lambda x, s: x + s, **FX)
    for _ in range(4):
        assert j(x, float("nan")).isnan().all()  # a new nan object each call
    assert j.cache_info().compiles == 1


def test_nan_payloads_with_other_bits_are_other_signatures():
    x = torch.ones(1)
    other = -NAN  # same value class, sign bit set: not the same bits
    j = fd.jit(lambda x, s: x + s, **FX)
    j(x, NAN)
    j(x, other)
    j(x, NAN)
    assert j.cache_info().compiles == 2


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda s: (1, s), id="tuple"),
        pytest.param(lambda s: {"a": [s]}, id="dict-of-list"),
        pytest.param(lambda s: complex(1.0, s), id="complex"),
    ],
)
def test_floats_nested_in_arguments_compare_by_bits(wrap):
    def f(x, arg):
        if isinstance(arg, complex):
            return x / arg.imag
        s = arg[1] if isinstance(arg, tuple) else arg["a"][0]
        return x / s

    x = torch.tensor([1.0, -1.0])
    j = fd.jit(f, **FX)
    for s in (0.0, -0.0, 0.0, -0.0, NAN, NAN):
        torch.testing.assert_close(j(x, wrap(s)), f(x, wrap(s)), equal_nan=True)
    assert j.cache_info().compiles == 3


def test_static_float_argument_compares_by_bits():
    x = torch.tensor([1.0, -1.0])

    def f(x, s):
        return x / s[0] if isinstance(s, tuple) else x / s

    j = fd.jit(f, static_argnums=1, **FX)
    for s in (0.0, -0.0, (0.0,), (-0.0,), 0.0, -0.0):
        torch.testing.assert_close(j(x, s), f(x, s))
    for _ in range(3):
        j(x, float("nan"))
    assert j.cache_info().compiles == 5  # 0.0, -0.0, (0.0,), (-0.0,), nan


def test_numpy_float_scalars_compare_by_bits():
    np = pytest.importorskip("numpy")
    x = torch.tensor([1.0, -1.0])
    j = fd.jit(lambda x, s: x / float(s), **FX)
    for s in (np.float32(0.0), np.float32(-0.0), np.float64(0.0), np.float64(-0.0)):
        torch.testing.assert_close(j(x, s), x / float(s))
    for _ in range(3):
        j(x, np.float32("nan"))
    assert j.cache_info().compiles == 5


def test_signature_change_names_the_float_values():
    x = torch.ones(1)
    j = fd.jit(lambda x, s: x * s, cache_size=1, **FX)
    j(x, 0.0)
    with pytest.warns(fd.JitWarning, match=r"latest change: args\[1\]: 0\.0 -> -0\.0"):
        j(x, -0.0)
    sig = fd.jit(lambda x, s: x * s[0], **FX).lower(x, (-0.0, 1j, NAN)).signature
    assert sig.endswith("args[1]: PyTreeSpec((*, *, *)) (-0.0, 1j, nan)")


# ------------------------------------------------------------------ threads
def _in_threads(n, call):
    """Run ``call(i)`` in ``n`` threads released at once; results and errors by thread."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = call(i)
        except Exception as e:  # collected, asserted below
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results, errors


def test_concurrent_first_calls_compile_once_and_match_eager():
    def f(x, td):
        return td.set("y", (td["x"] * x).sin())

    x = torch.randn(3)
    td = fd.TensorDict({"x": torch.randn(4, 3)}, [4])
    j = fd.jit(f, **FX)
    results, errors = _in_threads(8, lambda i: j(x, td))
    assert errors == [None] * 8
    for r in results:
        torch.testing.assert_close(r["y"], f(x, td)["y"])
    assert j.cache_info().compiles == 1
    assert j.cache_info().calls == 8


def test_two_jitted_functions_compile_concurrently():
    x = torch.randn(5)
    fs = [lambda x: x.cos() * 2, lambda x: (x + 1).exp()]
    js = [fd.jit(f, **FX) for f in fs]
    results, errors = _in_threads(8, lambda i: js[i % 2](x))
    assert errors == [None] * 8
    for i, r in enumerate(results):
        torch.testing.assert_close(r, fs[i % 2](x))
    assert [j.cache_info().compiles for j in js] == [1, 1]
    assert not torch.compiler.is_compiling()  # the trace's flag is restored


def test_concurrent_first_calls_compile_once_with_inductor():  # compiles once with inductor
    x = torch.randn(4, 3)
    j = fd.jit(lambda x: torch.tanh(x) @ x.T)
    results, errors = _in_threads(4, lambda i: j(x))
    assert errors == [None] * 4
    for r in results:
        torch.testing.assert_close(r, torch.tanh(x) @ x.T)
    assert j.cache_info().compiles == 1


def test_a_trace_in_one_thread_does_not_inline_jitted_calls_of_another():
    """While thread A traces, torch's compiling flag is set process-wide; thread B's
    call of a jitted function must still run its compiled code (not f eagerly)."""
    g_calls = []

    def g(x):
        g_calls.append(1)  # runs only when g is traced or called eagerly
        return x * 3

    jg = fd.jit(g, **FX)
    x = torch.randn(3)
    jg(x)  # compiled
    in_trace, done = threading.Event(), threading.Event()

    def f(x):
        in_trace.set()
        assert done.wait(timeout=60)
        return x + 1

    def b():
        assert in_trace.wait(timeout=60)
        try:
            return jg(x)
        finally:
            done.set()

    out = {}
    ta = threading.Thread(target=lambda: out.setdefault("a", fd.jit(f, **FX)(x)))
    tb = threading.Thread(target=lambda: out.setdefault("b", b()))
    ta.start()
    tb.start()
    ta.join(timeout=60)
    tb.join(timeout=60)
    torch.testing.assert_close(out["a"], x + 1)
    torch.testing.assert_close(out["b"], x * 3)
    assert len(g_calls) == 1  # the trace only: thread B ran the compiled code
    assert jg.cache_info().calls == 2


# ------------------------------------------------------------------ operands an op refuses
def _refuses_like_eager(f, args, match, **kw):
    """f(*args) raises in eager PyTorch; fd.jit(f) raises a TransformError matching
    ``match`` at the first call, having compiled nothing."""
    with pytest.raises(RuntimeError):
        f(*args)
    j = fd.jit(f, **(kw or FX))
    with pytest.raises(fd.TransformError, match=match):
        j(*args)
    assert j.cache_info().compiles == 0


def test_matmul_of_float32_and_float64_arguments_names_both_before_running():
    """The issue's row: inductor's code failed at run time with `aoti_torch_cpu_mm_out
    (...) API call failed`; the trace now refuses, naming both arguments."""
    p, x = torch.randn(3, 2), torch.randn(4, 3, dtype=torch.float64)
    _refuses_like_eager(
        lambda p, x: x @ p,
        (p, x),
        r"aten\.mm\.default refuses its operands self: float64\[4, 3\] \(from args\[1\]\), "
        r"mat2: float32\[3, 2\] \(from args\[0\]\) at .*test_jit_dispatch\.py:\d+ \(`lambda p, x"
        r".*they have different dtypes and this op does not promote.*Convert one of them",
        backend="inductor",  # refused by the trace: nothing is compiled
    )


def test_mixed_dtype_operand_named_by_its_path_in_a_tensordict():
    p = torch.randn(3, 2)
    td = fd.TensorDict({"obs": fd.TensorDict({"x": torch.randn(3, 4).double()}, [])}, [])
    _refuses_like_eager(
        lambda p, td: td["obs", "x"].T @ p,  # through a view
        (p, td),
        r"self: float64\[4, 3\] \(from args\[1\]\['obs'\]\['x'\]\), mat2: float32\[3, 2\] "
        r"\(from args\[0\]\)",
    )


def test_mixed_dtype_operand_made_by_a_conversion_is_named_as_computed():
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    _refuses_like_eager(
        lambda x, w: F.linear(x, w, w[:, 0].double()),
        (x, w),
        r"aten\.addmm\.default refuses its operands self: float64\[4\] \(computed in the "
        r"function\), mat1: float32\[2, 3\] \(from args\[0\]\)",
    )


F32, F64 = torch.randn(3, 3), torch.randn(3, 3, dtype=torch.float64)
V32, V64 = torch.randn(3), torch.randn(3, dtype=torch.float64)
_IDX = torch.tensor([0])


@pytest.mark.parametrize(
    ("f", "args", "op"),
    [
        pytest.param(lambda a, v: a @ v, (F32, V64), "mv", id="mv"),  # decomposed silently
        pytest.param(lambda a, v: v @ a[0], (F32, V64), "dot", id="dot"),
        pytest.param(lambda a, b: torch.bmm(a[None], b[None]), (F32, F64), "bmm", id="bmm"),
        pytest.param(lambda a, b: torch.einsum("ij,jk->ik", a, b), (F32, F64), "bmm", id="einsum"),
        pytest.param(
            lambda a, b: torch.baddbmm(a[None], a[None], b[None]),
            (F32, F64),
            "baddbmm",
            id="baddbmm",
        ),
        pytest.param(lambda a, b, v: torch.addmv(v, a, b[0]), (F32, F64, V32), "addmv", id="addmv"),
        pytest.param(lambda a, b: F.linear(a, b), (F32, F64), "mm", id="linear"),
        pytest.param(
            lambda a, b: F.conv1d(a[None], b[:, :, None]), (F32, F64), "convolution", id="conv1d"
        ),
        pytest.param(lambda a, b: torch.lerp(a, b, 0.5), (F32, F64), "lerp", id="lerp"),
        pytest.param(lambda a, b: torch.lerp(a, a, b), (F32, F64), "lerp", id="lerp-weight"),
        pytest.param(lambda a, b: torch.linalg.cross(a, b), (V32, V64), "linalg_cross", id="cross"),
        pytest.param(lambda a, v: a.index_put((_IDX,), v), (F32, V64), "index_put", id="index_put"),
        pytest.param(
            lambda a, b: a.scatter(0, torch.zeros(3, 3, dtype=torch.long), b),
            (F32, F64),
            "scatter",
            id="scatter",  # refused by its fake kernel: the same error
        ),
    ],
)
def test_ops_eager_refuses_on_mixed_dtypes_are_refused_at_the_first_call(f, args, op):
    _refuses_like_eager(f, args, rf"aten\.{op}\.\w+ refuses its operands .*different dtypes")


@pytest.mark.parametrize(
    ("f", "args"),
    [
        pytest.param(lambda p, x: x * p, (F32, F64), id="promoting-mul"),
        pytest.param(lambda p, x: torch.where(p > 0, p, x), (F32, F64), id="where"),
        pytest.param(lambda p, x: x @ p, (F64, F64), id="matmul-one-dtype"),
        pytest.param(lambda p, x: p @ x.float(), (F32, F64), id="matmul-after-cast"),
        pytest.param(lambda p, x: torch.lerp(p, p, x[0, 0]), (F32, F64), id="lerp-0dim-weight"),
    ],
)
def test_mixed_dtypes_eager_accepts_still_compile_and_match_eager(f, args):
    torch.testing.assert_close(fd.jit(f, **FX)(*args), f(*args))


def test_index_assignment_of_a_python_float_into_float64_compiles():
    def f(x):
        x = x.clone()
        x[_IDX] = 2.0
        return x

    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(fd.jit(f, **FX)(x), f(x))


def test_matmul_shape_mismatch_names_the_arguments_and_their_shapes():
    _refuses_like_eager(
        lambda p, x: x @ p,
        (torch.randn(4, 5), torch.randn(4, 3)),
        r"aten\.mm\.default refuses its operands self: float32\[4, 3\] \(from args\[1\]\), "
        r"mat2: float32\[4, 5\] \(from args\[0\]\) at .*: a and b must have same reduction "
        r"dim, but got \[4, 3\] X \[4, 5\]\. .*Check the shapes of these arguments",
    )


def test_device_mismatch_names_the_arguments_and_their_devices():
    _refuses_like_eager(
        lambda a, b: a + b,
        (torch.zeros(3), torch.zeros(3, device="meta")),
        r"aten\.add\.Tensor refuses its operands self: float32\[3\] on cpu \(from args\[0\]\), "
        r"other: float32\[3\] on meta \(from args\[1\]\).*different devices.*one device",
    )


def test_operands_refused_inside_a_loop_body_name_the_op():
    """An op in fd.scan's step is traced apart from the arguments: the error names the
    op and its operands, without argument paths."""

    def f(w, c0, xs):
        return fd.scan(lambda c, x: (c @ w + x, x), c0, xs)

    _refuses_like_eager(
        f,
        (torch.randn(3, 3), torch.zeros(2, 4), torch.randn(5, 3)),
        r"aten\.mm\.default refuses its operands self: float32\[2, 4\], mat2: float32\[3, 3\]",
    )


def test_a_runtime_error_raised_by_the_function_itself_is_not_rewritten():
    def f(x):
        if x.shape[0] == 3:
            raise RuntimeError("my own check")
        return x

    with pytest.raises(RuntimeError, match=r"^my own check") as info:
        fd.jit(f, **FX)(torch.ones(3))
    assert type(info.value) is RuntimeError
