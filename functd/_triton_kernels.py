"""The Triton kernels behind ``functd.random``'s draws on CUDA: threefry2x32 and the
samplers of ``_fused_ext.c``, one launch per draw (launched by ``_triton_draws.py``).

Every element hashes its counter under its key exactly as ``_fused_ext.c`` and the
pure path (``_threefry.threefry2x32``) do, then turns the two words into the draw with
the same single IEEE operations in the same order (the launcher turns off FMA
contraction: ``enable_fp_fusion=False``). ``MODE_NORMAL32`` runs XLA's float32
``erf_inv`` with libdevice's ``log1pf`` and ``fsqrt_rn``: the functions torch's own
CUDA ``log1p`` and ``sqrt`` compute (so its bits are the pure path's on the same GPU).

Importing this module imports triton; with ``TRITON_INTERPRET=1`` set before the
import, the kernels run on CPU tensors through Triton's interpreter (the tests). They use
Triton's builtins only, none of the ``@jit`` helpers of ``triton.language.standard``
(``tl.zeros_like``...): those are decorated when triton is imported, and so would not
run in an interpreter switched on after that.

Example:
    >>> draw_kernel[(1,)](keys, out, 4, 4, 0, 0.0, 0.0, MODE=MODE_UNIT32, ONE_KEY=True,
    ...                   WIDE=False, BLOCK=1024)
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice  # NVIDIA: _fused serves no ROCm key

# The modes: those of _fused_ext.c keep its numbers; the rest exist here only.
MODE_PAIRS = tl.constexpr(0)
MODE_BITS32 = tl.constexpr(1)
MODE_BITS64 = tl.constexpr(2)
MODE_UNIT32 = tl.constexpr(3)
MODE_AFFINE32 = tl.constexpr(5)
MODE_NEG32 = tl.constexpr(6)
MODE_UNIT64 = tl.constexpr(7)
MODE_RANGE32 = tl.constexpr(9)
MODE_NORMAL32 = tl.constexpr(100)  # the whole float32 normal: hash, erf_inv, * sqrt(2)
MODE_UNIT16 = tl.constexpr(101)  # float16 uniforms in [0, 1): 10 of 16 random bits
MODE_UNITBF16 = tl.constexpr(102)  # bfloat16 uniforms in [0, 1): 7 of 8 random bits
_INF = tl.constexpr(float("inf"))


@triton.jit
def _rounds(x0, x1, R0: tl.constexpr, R1: tl.constexpr, R2: tl.constexpr, R3: tl.constexpr):
    """Four threefry rounds: ``x0 += x1; x1 = rotl(x1, r) ^ x0`` (uint32, wrapping)."""
    x0 = x0 + x1
    x1 = ((x1 << R0) | (x1 >> (32 - R0))) ^ x0
    x0 = x0 + x1
    x1 = ((x1 << R1) | (x1 >> (32 - R1))) ^ x0
    x0 = x0 + x1
    x1 = ((x1 << R2) | (x1 >> (32 - R2))) ^ x0
    x0 = x0 + x1
    x1 = ((x1 << R3) | (x1 >> (32 - R3))) ^ x0
    return x0, x1


@triton.jit
def threefry2x32(k0, k1, c0, c1):
    """threefry2x32 of the uint32 counter ``(c0, c1)`` under the uint32 key ``(k0, k1)``."""
    k2 = k0 ^ k1 ^ 0x1BD11BDA
    x0 = c0 + k0
    x1 = c1 + k1
    x0, x1 = _rounds(x0, x1, 13, 15, 26, 6)
    x0 = x0 + k1
    x1 = x1 + k2 + 1
    x0, x1 = _rounds(x0, x1, 17, 29, 16, 24)
    x0 = x0 + k2
    x1 = x1 + k0 + 2
    x0, x1 = _rounds(x0, x1, 13, 15, 26, 6)
    x0 = x0 + k0
    x1 = x1 + k1 + 3
    x0, x1 = _rounds(x0, x1, 17, 29, 16, 24)
    x0 = x0 + k1
    x1 = x1 + k2 + 4
    x0, x1 = _rounds(x0, x1, 13, 15, 26, 6)
    x0 = x0 + k2
    x1 = x1 + k0 + 5
    return x0, x1


@triton.jit
def _unit32(bits):
    """jax's float32 in [0, 1): 23 random mantissa bits under 1.0's exponent, minus 1."""
    return ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 1.0


@triton.jit
def _erfinv_sqrt2(x, sqrt2):
    """``sqrt2 * erf_inv(x)`` as ``_erfinv.erfinv32`` computes it: XLA's two float32
    polynomials in w = -log1p(-(x * x)), selected at w < 5 (w = inf: inf), times x."""
    w = -libdevice.log1p(-(x * x))
    wl = w - 2.5
    pl = 2.81022636e-08 * wl + 3.43273939e-07  # (fp fusion is off: two roundings)
    pl = pl * wl + -3.5233877e-06
    pl = pl * wl + -4.39150654e-06
    pl = pl * wl + 0.00021858087
    pl = pl * wl + -0.00125372503
    pl = pl * wl + -0.00417768164
    pl = pl * wl + 0.246640727
    pl = pl * wl + 1.50140941
    wg = libdevice.sqrt_rn(w) - 3.0
    pg = -0.000200214257 * wg + 0.000100950558
    pg = pg * wg + 0.00134934322
    pg = pg * wg + -0.00367342844
    pg = pg * wg + 0.00573950773
    pg = pg * wg + -0.0076224613
    pg = pg * wg + 0.00943887047
    pg = pg * wg + 1.00167406
    pg = pg * wg + 2.83297682
    p = tl.where(w < 5.0, pl, pg)
    p = tl.where(w == _INF, _INF, p)
    return (p * x) * sqrt2


@triton.jit(do_not_specialize=["first"])  # (a fold_in's datum: one compile for all)
def draw_kernel(
    keys, out, n, total, first, a, b,
    MODE: tl.constexpr, ONE_KEY: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Element ``j < total`` of a draw of ``n`` counters ``first + i`` under each key:
    key ``j // n``, counter ``first + j % n`` hashed as ``(c >> 32, c & 0xffffffff)``.

    ``ONE_KEY``: one key for every element (read once); ``WIDE``: 64-bit indices and
    counters (a draw of 2**31 elements or counters past 2**31). ``a``/``b``: the float32
    constants of the affine modes (``RANGE32``: scale and lower bound, exact in float64;
    ``NORMAL32``: nextafter(-1, 0) and sqrt(2))."""
    pid = tl.program_id(0)
    if WIDE:
        j = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        j = pid * BLOCK + tl.arange(0, BLOCK)
    live = j < total
    if ONE_KEY:
        k0 = tl.load(keys).to(tl.uint32, bitcast=True)
        k1 = tl.load(keys + 1).to(tl.uint32, bitcast=True)
        i = j
    else:
        kb = j // n
        i = j - kb * n
        k0 = tl.load(keys + 2 * kb, mask=live, other=0).to(tl.uint32, bitcast=True)
        k1 = tl.load(keys + 2 * kb + 1, mask=live, other=0).to(tl.uint32, bitcast=True)
    if WIDE:
        c = i.to(tl.int64) + first  # (no first.to: triton passes a first of 1 as a constexpr)
        x0, x1 = threefry2x32(k0, k1, (c >> 32).to(tl.uint32), (c & 0xFFFFFFFF).to(tl.uint32))
    else:
        x0, x1 = threefry2x32(k0, k1, 0, (i + first).to(tl.uint32))
    _emit(out, j, live, x0, x1, a, b, MODE)


@triton.jit
def _emit(out, j, live, x0, x1, a, b, MODE: tl.constexpr):
    """Element ``j`` of the draw from the two words, as ``_fused_ext.c``'s EMIT_* do."""
    if MODE == MODE_PAIRS:
        tl.store(out + 2 * j, x0.to(tl.int32, bitcast=True), mask=live)
        tl.store(out + 2 * j + 1, x1.to(tl.int32, bitcast=True), mask=live)
    elif MODE == MODE_BITS32:
        tl.store(out + j, (x0 ^ x1).to(tl.int32, bitcast=True), mask=live)
    elif MODE == MODE_BITS64:
        w = (x0.to(tl.uint64) << 32) | x1.to(tl.uint64)
        tl.store(out + j, w.to(tl.int64, bitcast=True), mask=live)
    elif MODE == MODE_UNIT32:
        tl.store(out + j, _unit32(x0 ^ x1), mask=live)
    elif MODE == MODE_NEG32:
        tl.store(out + j, -_unit32(x0 ^ x1), mask=live)
    elif MODE == MODE_AFFINE32:  # max(b, u * a + b), two roundings
        v = _unit32(x0 ^ x1) * a
        v = v + b
        tl.store(out + j, tl.where(v < b, b, v), mask=live)
    elif MODE == MODE_RANGE32:  # max(lo, float(double(u) * scale + lo)): u * scale is exact
        d = _unit32(x0 ^ x1).to(tl.float64) * a  # (float32 a and b: exact in float64)
        d = d + b
        v = d.to(tl.float32)
        tl.store(out + j, tl.where(v < b, b, v), mask=live)
    elif MODE == MODE_UNIT64:
        w = (x0.to(tl.uint64) << 32) | x1.to(tl.uint64)
        u = ((w >> 12) | 0x3FF0000000000000).to(tl.float64, bitcast=True) - 1.0
        tl.store(out + j, u, mask=live)
    elif MODE == MODE_UNIT16:  # (bits & 0xffff) >> 6, times 2**-10: exact
        m = ((x0 ^ x1) & 0xFFFF) >> 6
        tl.store(out + j, (m.to(tl.float32) * 0.0009765625).to(tl.float16), mask=live)
    elif MODE == MODE_UNITBF16:  # (bits & 0xff) >> 1, times 2**-7: exact
        m = ((x0 ^ x1) & 0xFF) >> 1
        tl.store(out + j, (m.to(tl.float32) * 0.0078125).to(tl.bfloat16), mask=live)
    else:  # MODE_NORMAL32: x = max(a, 2u + a), then sqrt(2) * erf_inv(x)
        v = _unit32(x0 ^ x1) * 2.0
        v = v + a
        x = tl.where(v < a, a, v)
        tl.store(out + j, _erfinv_sqrt2(x, b), mask=live)


@triton.jit
def fold_kernel(keys, data, out, total, KEY_STEP: tl.constexpr, DATA_STEP: tl.constexpr,
                BLOCK: tl.constexpr):  # fmt: skip
    """``fold_in``: key ``j * KEY_STEP`` hashes the counter ``(0, data[j * DATA_STEP])``
    (steps 0 or 1: one key or one datum broadcast, else one each), written as pairs."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = j < total
    kj = j * KEY_STEP
    k0 = tl.load(keys + 2 * kj, mask=live, other=0).to(tl.uint32, bitcast=True)
    k1 = tl.load(keys + 2 * kj + 1, mask=live, other=0).to(tl.uint32, bitcast=True)
    d = tl.load(data + j * DATA_STEP, mask=live, other=0).to(tl.uint32, bitcast=True)
    x0, x1 = threefry2x32(k0, k1, 0, d)
    tl.store(out + 2 * j, x0.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 2 * j + 1, x1.to(tl.int32, bitcast=True), mask=live)
