"""functd.random's Triton kernels (functd/_triton_kernels.py, the CUDA draws), run on
CPU tensors by Triton's interpreter against the CPU kernel (functd._fused_ext) and the
pure path: every mode, shape class, dtype, single and batched keys, under fd.vmap, and
the dispatch that picks them for CUDA keys.

The interpreter has no libdevice: where the kernel calls libdevice's ``log1p`` and
``sqrt_rn`` (on CUDA: the functions torch's CUDA ``log1p``/``sqrt`` compute), these
tests give it torch's CPU ``log1p``/``sqrt``, the ones the CPU kernel uses, so the
normal's formula and op order are checked bit for bit here; the CUDA-marked test checks
the libdevice pair against torch's CUDA ops on a GPU.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import functd
import functd as fd
import functd.random as fr
from functd import _fused
from tests._support import random_cases

pytest.importorskip("triton", reason="triton is not installed (the `gpu` extra installs it)")

_MODULES = ("functd._triton_kernels", "functd._triton_draws")


def _torch_libdevice():
    """libdevice's ``log1p``/``sqrt_rn`` for the interpreter, as torch's CPU ops."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def lift(op):
        def fn(x, _semantic=None):
            y = op(torch.from_numpy(np.ascontiguousarray(x.handle.data))).numpy()
            return tl.core.tensor(TensorHandle(y, x.handle.dtype), x.type)

        return fn

    return types.SimpleNamespace(log1p=lift(torch.log1p), sqrt_rn=lift(torch.sqrt))


@pytest.fixture(scope="module")
def td():
    """``functd._triton_draws`` with its kernels imported under ``TRITON_INTERPRET=1``
    (Triton reads it when a kernel is decorated), 128-element blocks (several programs
    and a tail on small draws); the modules are put back afterwards."""
    saved = {m: sys.modules.pop(m) for m in _MODULES if m in sys.modules}
    attrs = {m: getattr(functd, m.rpartition(".")[2], None) for m in _MODULES}
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    try:
        draws = importlib.import_module("functd._triton_draws")
        assert draws.available() is None
        from triton.runtime.interpreter import InterpretedFunction

        assert isinstance(draws._kernels.draw_kernel, InterpretedFunction)
        mp.setattr(draws._kernels, "libdevice", _torch_libdevice())
        mp.setattr(draws, "BLOCK", 128)
        yield draws
    finally:
        mp.undo()
        for m in _MODULES:  # (the package's attributes too: `from . import` reads them)
            sys.modules.pop(m, None)
            name = m.rpartition(".")[2]
            if attrs[m] is None:
                vars(functd).pop(name, None)
            else:
                setattr(functd, name, attrs[m])
        sys.modules.update(saved)


SIGNED = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_bitwise(a: torch.Tensor, b: torch.Tensor):
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype.is_floating_point or a.dtype in (torch.uint16, torch.uint32, torch.uint64):
        a, b = a.view(SIGNED[a.itemsize]), b.view(SIGNED[b.itemsize])  # (NaN, -0.0, uint64)
    assert torch.equal(a, b)


TINY = torch.finfo(torch.float32).tiny
# name -> (mode, dtype, a, b, the CPU draw it must equal)
MODES = {
    "bits32": ("BITS32", torch.int32, 0.0, 0.0, lambda k, s: fr.bits(k, s)),
    "bits64": ("BITS64", torch.int64, 0.0, 0.0, lambda k, s: fr.bits(k, s, torch.int64)),
    "uniform32": ("UNIT32", torch.float32, 0.0, 0.0, lambda k, s: fr.uniform(k, s)),
    "uniform64": ("UNIT64", torch.float64, 0.0, 0.0, lambda k, s: fr.uniform(k, s, torch.float64)),
    "uniform16": ("UNIT16", torch.float16, 0.0, 0.0, lambda k, s: fr.uniform(k, s, torch.float16)),
    "uniform_bf16": (
        "UNITBF16", torch.bfloat16, 0.0, 0.0, lambda k, s: fr.uniform(k, s, torch.bfloat16)
    ),
    "uniform_range": (
        "RANGE32", torch.float32, 5.0, -2.0, lambda k, s: fr.uniform(k, s, minval=-2.0, maxval=3.0)
    ),
    "affine32": (
        "AFFINE32", torch.float32, 1.0, TINY,
        lambda k, s: _fused.run(_fused.MODE_AFFINE32, k, s, torch.float32, 1.0, TINY),
    ),
    "neg32": ("NEG32", torch.float32, 0.0, 0.0,
              lambda k, s: _fused.run(_fused.MODE_NEG32, k, s, torch.float32)),
    "normal32": ("NORMAL32", torch.float32, 0.0, 0.0, lambda k, s: fr.normal(k, s)),
    "split": ("PAIRS", torch.int32, 0.0, 0.0, lambda k, s: fr.split(k, s)),
}  # fmt: skip
# (key batch, shape): a scalar, past one 128-element block with a tail, batched keys, a
# 2-d batch of a 2-d shape, an empty draw
CLASSES = [((), ()), ((), (129,)), ((3,), (5,)), ((2, 2), (3, 7)), ((3,), (0,))]


def keys_of(batch: tuple[int, ...], seed: int = 7) -> torch.Tensor:
    return fr.split(fr.key(seed), batch) if batch else fr.key(seed)


@pytest.mark.parametrize("name", sorted(MODES))
def test_every_mode_equals_the_cpu_kernel_on_every_shape_class(td, name):
    mode, dtype, a, b, cpu = MODES[name]
    for batch, shape in CLASSES:
        k = keys_of(batch, seed=len(shape) + 3 * len(batch))
        got = td.run(k, getattr(td, f"MODE_{mode}"), shape, dtype, a, b)
        assert_bitwise(got, cpu(k, shape))


def test_large_draws_equal_the_cpu_kernel(td, monkeypatch):
    # 1e5 values (the normal's second polynomial serves ~330 of them), in one block: the
    # interpreter's cost is per program
    monkeypatch.setattr(td, "BLOCK", 2**17)
    z = td.run(fr.key(3), td.MODE_NORMAL32, (100_000,), torch.float32)
    assert_bitwise(z, fr.normal(fr.key(3), (100_000,)))
    assert (z.abs() > 2.9).sum() > 100  # (|x| > 0.9966: XLA's second polynomial)
    keys = fr.split(fr.key(4), 2)
    got = td.run(keys, td.MODE_BITS64, (50_001,), torch.int64)
    assert_bitwise(got, fr.bits(keys, (50_001,), torch.int64))


def test_fold_in_equals_the_cpu_kernel(td):
    # an int datum (counters past 2**31: the 64-bit path) and tensor data broadcast
    for k in (fr.key(1), fr.split(fr.key(2), 3)):
        for data in (5, 2**32 - 1):
            got = td.run(k, td.MODE_PAIRS, (), torch.int32, first=data)
            assert_bitwise(got, fr.fold_in(k, data))
    cases = [
        (fr.key(1), torch.arange(5, dtype=torch.int32)),  # one key, many data
        (fr.split(fr.key(2), 3), torch.tensor(9, dtype=torch.int32)),  # many keys, one datum
        (fr.split(fr.key(3), 3), torch.tensor([7, -1, 2**31 - 1], dtype=torch.int32)),
        (fr.split(fr.key(4), (3, 1)), torch.arange(4, dtype=torch.int32)),  # (3, 4)
        (fr.key(5), torch.zeros(0, dtype=torch.int32)),
    ]
    for k, data in cases:
        assert_bitwise(td.fold(k, data), fr.fold_in(k, data))


@pytest.mark.parametrize("first", [2**32 - 5, 2**31 - 2])
def test_counters_across_the_word_boundaries(td, first):
    # element i hashes (i >> 32, i & 0xffffffff): across the low word's wrap, and across
    # 2**31 (the kernel's 32-bit index path ends there)
    keys = fr.split(fr.key(9), 2)
    got = td.run(keys, td.MODE_BITS32, (200,), torch.int32, first=first)
    assert_bitwise(got, _fused.run(_fused.MODE_BITS32, keys, (200,), torch.int32, first=first))


def test_the_64_bit_index_path_gives_the_same_bits(td, monkeypatch):
    monkeypatch.setattr(td, "_WIDE", 0)  # every draw takes it (else from 2**31 elements)
    for name in ("bits32", "normal32", "split", "uniform64"):
        mode, dtype, a, b, cpu = MODES[name]
        k = fr.split(fr.key(5), 3)
        assert_bitwise(td.run(k, getattr(td, f"MODE_{mode}"), (130,), dtype, a, b), cpu(k, (130,)))
    for data in (1, 2**32 - 1):  # (fold_in: an int datum)
        assert_bitwise(td.run(k, td.MODE_PAIRS, (), torch.int32, first=data), fr.fold_in(k, data))


# -- the dispatch: CUDA keys take the kernels ---------------------------------------------


@pytest.fixture
def routed(td, monkeypatch):
    """Plain and vmapped CPU keys routed as CUDA keys are (to the Triton launchers, run
    by the interpreter); the launches counted as ``(name, key shape)``, the modes of
    ``run``'s in ``modes_run``."""
    serves = _fused._serves
    monkeypatch.setattr(
        _fused, "_serves", lambda k: how + 2 if (how := serves(k)) and _fused._TRITON else how
    )
    launches = []
    modes_run.clear()
    counted = types.SimpleNamespace(
        run=lambda key, mode, *a: (
            (launches.append(("run", tuple(key.shape))) or modes_run.append(mode))
            or td.run(key, mode, *a)
        ),
        fold=lambda key, *a: launches.append(("fold", tuple(key.shape))) or td.fold(key, *a),
    )
    monkeypatch.setattr(_fused, "_TRITON", counted)
    return launches


modes_run: list[int] = []
ONE_LAUNCH = ["bits", "bits64", "uniform", "uniform_range", "normal", "split", "fold_in"]
SAMPLERS = {**random_cases.SAMPLERS, **random_cases.FUSED_EXTRA}
# sampler -> the mode of its one launch (gumbel/exponential: then torch's log ops)
SAMPLER_MODES = {
    "bits": "BITS32", "bits64": "BITS64", "uniform": "UNIT32", "uniform_range": "RANGE32",
    "normal": "NORMAL32", "split": "PAIRS", "fold_in": "PAIRS", "gumbel": "AFFINE32",
    "exponential": "NEG32", "uniform64": "UNIT64", "bits_u8": "BITS32",
}  # fmt: skip


def test_mode_numbers_agree(td):
    # the launchers', the kernels' and _fused's; the Triton-only ones are no C mode
    kernels = td._kernels
    for name in {*SAMPLER_MODES.values(), "UNIT16", "UNITBF16"}:
        assert getattr(kernels, f"MODE_{name}").value == getattr(td, f"MODE_{name}")
        assert getattr(_fused, f"MODE_{name}", getattr(td, f"MODE_{name}")) == getattr(
            td, f"MODE_{name}"
        )
    triton_only = (_fused.TRITON_NORMAL32, _fused.TRITON_UNIT16, _fused.TRITON_UNITBF16)
    assert triton_only == (td.MODE_NORMAL32, td.MODE_UNIT16, td.MODE_UNITBF16)
    c_modes = {v for n, v in vars(_fused).items() if n.startswith("MODE_")}
    assert not c_modes & set(triton_only)


@pytest.mark.parametrize("name", sorted(SAMPLER_MODES))
def test_samplers_on_the_triton_path_equal_the_cpu_kernel(td, routed, name):
    f = SAMPLERS[name]
    k = fr.key(11) if name in ("split", "fold_in") else fr.split(fr.key(12), 3)
    saved, _fused._TRITON = _fused._TRITON, None  # (the CPU kernel: not routed)
    try:
        want = f(k, (3, 5))
    finally:
        _fused._TRITON = saved
    routed.clear()  # (the split above was routed too)
    modes_run.clear()
    got = f(k, (3, 5))
    assert_bitwise(got, want)
    assert routed == [("run", tuple(k.shape))], routed
    assert modes_run == [getattr(td, f"MODE_{SAMPLER_MODES[name]}")]


@pytest.mark.parametrize(
    ("dtype", "mode"),
    [(torch.float16, _fused.TRITON_UNIT16), (torch.bfloat16, _fused.TRITON_UNITBF16)],
)
def test_16_bit_uniforms_of_cuda_keys_take_their_own_launch(monkeypatch, dtype, mode):
    # (CPU keys keep the 32-bit kernel and torch's ops: a meta key stands for a CUDA one)
    from functd import _bits_to_numbers

    calls = []
    drawn = torch.zeros(3, dtype=dtype)
    monkeypatch.setattr(_fused, "run", lambda *a: calls.append(a) or drawn)
    key = fr.key(0).to("meta")
    assert _bits_to_numbers._unit(key, (3,), dtype) is drawn
    assert calls == [(mode, key, (3,), dtype)]


def test_vmap_over_keys_is_one_launch_over_all_keys(routed):
    keys = fr.split(fr.key(13), 4)
    for name in ONE_LAUNCH:
        f = SAMPLERS[name]
        want = torch.stack([f(k, (6,)) for k in keys])
        routed.clear()
        got = fd.vmap(lambda k, f=f: f(k, (6,)))(keys)
        assert_bitwise(got, want)
        assert routed == [("run", (4, 2))], (name, routed)
    # fold_in over batched data with a captured key, and nested vmap with in_dims=1
    data = torch.arange(5, dtype=torch.int32)
    want = fr.fold_in(keys[0], data)
    routed.clear()
    got = torch.func.vmap(lambda d: fr.fold_in(keys[0], d))(data)
    assert_bitwise(got, want)
    assert routed == [("fold", (1, 2))]  # (the captured key: a size-1 level dim)
    grid = fr.split(fr.key(14), (3, 2))  # vmapped at in_dims=1, then 0: (2, 3) draws
    want = fr.normal(grid.movedim(1, 0), (4,))
    routed.clear()
    got = torch.func.vmap(torch.func.vmap(lambda k: fr.normal(k, (4,))), in_dims=1)(grid)
    assert_bitwise(got, want)
    assert routed == [("run", (2, 3, 2))]


def test_a_cuda_key_is_served_by_triton_outside_compile_and_grad(monkeypatch):
    # no CUDA here: a meta key stands for one, with the device test answering yes
    key = fr.key(0).to("meta")
    assert _fused._serves(key) == _fused.PURE  # (not a CUDA key)
    monkeypatch.setattr(_fused, "_cuda_key", lambda k: True)
    assert _fused._serves(key) == _fused.CUDA_EAGER
    seen = []
    torch.func.vmap(lambda k: seen.append(_fused._serves(k)) or k)(torch.stack([key, key]))
    torch.func.grad(lambda x: seen.append(_fused._serves(key)) or x.sum())(torch.ones(2))
    assert seen == [_fused.CUDA_UNDER_VMAP, _fused.PURE]
    assert _fused._serves(fr.key(0)) == _fused.EAGER  # CPU keys keep the CPU kernel


def test_without_triton_cuda_keys_stay_pure(td, monkeypatch):
    monkeypatch.setattr(td, "_kernels", None)
    monkeypatch.setitem(sys.modules, "functd._triton_kernels", None)  # an import fails
    why = td.available()
    assert why is not None and why.startswith("triton does not import")


def test_a_failed_launch_warns_once_and_draws_stay_pure(routed, monkeypatch):
    def fail(*args):
        raise RuntimeError("no kernel image for this GPU")

    want = fr.uniform(fr.key(1), (4,))
    monkeypatch.setattr(_fused._TRITON, "run", fail)
    with pytest.warns(RuntimeWarning, match="Triton kernel for CUDA draws failed.*no kernel"):
        assert_bitwise(fr.uniform(fr.key(1), (4,)), want)
    assert _fused._TRITON is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_bitwise(fr.uniform(fr.key(1), (4,)), want)  # the pure path, silently


def test_time_draws_times_each_kernel_and_torch(td):
    out = td.time_draws(8, keys=2, device="cpu", reps=1)
    assert set(out) == {"normal", "uniform", "bits", "split", "fold_in", "torch.randn",
                        "torch.rand"}  # fmt: skip
    assert all(v > 0 for v in out.values())


def _triton_draws_why() -> str | None:
    from functd import _triton_draws

    return _triton_draws.available()


@pytest.mark.cuda
def test_cuda_draws_equal_the_cpu_kernel_and_the_pure_path_on_the_gpu():
    # the real kernels (not the interpreter) against the CPU kernel, and the normal
    # against the pure ops on the same GPU (torch's CUDA log1p/sqrt: libdevice's)
    keys = fr.split(fr.key(21), 3)
    assert _fused._serves(keys.cuda()) == _fused.CUDA_EAGER, _triton_draws_why()
    for name, f in SAMPLERS.items():
        if name.startswith(("normal", "truncated", "gumbel", "exponential", "categorical")):
            continue  # (torch's CUDA transcendentals: checked against the pure path below)
        assert_bitwise(f(keys.cuda(), (1000,)).cpu(), f(keys, (1000,)))
    saved, _fused._TRITON = _fused._TRITON, False
    try:
        pure = fr.normal(keys.cuda(), (2**20,))
    finally:
        _fused._TRITON = saved
    assert_bitwise(fr.normal(keys.cuda(), (2**20,)), pure)


def test_the_compiled_normal_kernel_rounds_every_step(tmp_path, monkeypatch):
    # no GPU needed: the kernel compiled for sm_90 (PTX) has no fused multiply-add of its
    # own (fp fusion off), only libdevice's log1pf's; a step fused into an FMA would round
    # once where torch's eager ops round twice
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.language.extra.cuda import libdevice

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (the td fixture's)
    spec = importlib.util.spec_from_file_location("_compiled_kernels", _fused.__file__.replace(
        "_fused.py", "_triton_kernels.py"))  # fmt: skip
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)  # (a copy outside the interpreter)

    @triton.jit
    def log1p_only(x, y, BLOCK: tl.constexpr):
        j = tl.arange(0, BLOCK)
        tl.store(y + j, libdevice.log1p(tl.load(x + j)))

    def ptx(fn, signature, constexprs):
        src = ASTSource(fn, signature, constexprs=constexprs)
        options = {"enable_fp_fusion": False, "enable_reflect_ftz": False}
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]

    sig = {"keys": "*i32", "out": "*fp32", "n": "i32", "total": "i32", "first": "i32",
           "a": "fp32", "b": "fp32", "MODE": "constexpr", "ONE_KEY": "constexpr",
           "WIDE": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
    flags = {"ONE_KEY": True, "WIDE": False, "BLOCK": 256}
    normal = ptx(kernels.draw_kernel, sig, {"MODE": 100, **flags})
    alone = ptx(log1p_only, {"x": "*fp32", "y": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 256})
    # (the polynomials' steps, each rounded)
    assert normal.count("mul.rn.f32") >= 16 and normal.count("add.rn.f32") >= 16
    assert normal.count("fma.rn.f32") == alone.count("fma.rn.f32") > 0
