/* functd._fused_ext: the fused eager CPU kernels behind functd.random (see _fused.py).
 *
 * A CPython extension module built when the package is built or installed (setup.py),
 * plain C against the Python C API: no libtorch, tensors pass as data addresses.
 *
 * run(op, keys, total, n, first, out[, out2, a, b]) -> int: threefry2x32 of the
 * row-major counters first..first+n-1 under each of total/n keys (jax's partitionable
 * layout: counter i hashes (i >> 32, i & 0xffffffff), the same hash as
 * _threefry.threefry2x32), written as raw words or turned into floats by the exact bit
 * tricks of functd.random._unit; the MODE_ERFINV_* steps finish XLA's float32 erf_inv
 * around torch's log1p and sqrt (their bits). Integer hashing and the mantissa trick
 * are exact anywhere; the float steps are single IEEE operations in the pure path's
 * order, built with -ffp-contract=off (no FMA contraction) and without -ffast-math, so
 * every variant below gives the same bits.
 *
 * Vector width: the kernels are compiled once per instruction set (baseline, AVX2,
 * AVX-512F on x86-64 with GCC or Clang) and the widest one the CPU runs is chosen once
 * at import (__builtin_cpu_supports); VARIANT names it. Draws of 32768+ elements
 * release the GIL and are shared by op >> 8 threads (no OpenMP: a second runtime next
 * to torch's), started detached by CPython's PyThread_start_new_thread: the stable ABI
 * has it, and the module then needs no pthread_create, whose glibc 2.34 symbol version
 * would raise the wheel's manylinux floor above torch's (2_28).
 *
 * CPython's limited API only (abi3, Py_LIMITED_API from setup.py): one build serves
 * every supported Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#if !defined(_WIN32) && (defined(__GNUC__) || defined(__clang__))
#include <sched.h>
#ifdef __linux__
#include <sys/mman.h>
#endif
#define FD_THREADS 1 /* threads and the __atomic builtins */
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FD_X86 1
#define FD_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define FD_INLINE static __forceinline
#else
#define FD_INLINE static inline
#endif
#if defined(__GNUC__) || defined(__clang__)
#define FD_RESTRICT __restrict__
#else
#define FD_RESTRICT
#endif

/* The calling convention's version: _fused.py refuses a build of another one (stale). */
#define FD_KERNEL_VERSION 4

enum { MODE_PAIRS, MODE_BITS32, MODE_BITS64, MODE_UNIT32, MODE_NORMAL_PRE,
       MODE_AFFINE32, MODE_NEG32, MODE_UNIT64, MODE_ERFINV_LT, MODE_RANGE32, MODE_FOLD,
       MODE_ERFINV_GATHER, MODE_ERFINV_GT };

typedef struct {
  int mode;
  const uint32_t *keys; /* nkeys pairs of words; MODE_ERFINV_LT/GATHER: the log1p values */
  int64_t n;            /* counters per key; MODE_ERFINV_LT: the room of its lists */
  int64_t first;        /* the first counter; MODE_ERFINV_*: the address of the indices */
  void *out, *out2;     /* MODE_FOLD: out2 holds one uint32 counter per key */
  double a, b;
} job_t;

#define ROTL(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
#define RND(r) x0 += x1; x1 = ROTL(x1, r) ^ x0;
#define HASH(k0, k1, k2, c0, c1)                                   \
  uint32_t x0 = (c0) + (k0), x1 = (c1) + (k1);                     \
  RND(13) RND(15) RND(26) RND(6)  x0 += (k1); x1 += (k2) + 1u;    \
  RND(17) RND(29) RND(16) RND(24) x0 += (k2); x1 += (k0) + 2u;    \
  RND(13) RND(15) RND(26) RND(6)  x0 += (k0); x1 += (k1) + 3u;    \
  RND(17) RND(29) RND(16) RND(24) x0 += (k1); x1 += (k2) + 4u;    \
  RND(13) RND(15) RND(26) RND(6)  x0 += (k2); x1 += (k0) + 5u;

FD_INLINE uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
FD_INLINE float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

FD_INLINE float unit32(uint32_t bits) {
  union { uint32_t u; float f; } v;
  v.u = (bits >> 9) | 0x3F800000u;
  return v.f - 1.0f;
}

/* Four hashes at once: one threefry is a chain of 20 dependent rounds, so a vector of
   it waits on latency; four independent chains keep the vector units busy (2x on AVX2
   and on SSE2). The streams are elements t, t + q, t + 2q, t + 3q of the run. */
#define R4(r)                                                                      \
  a0 += a1; a1 = ROTL(a1, r) ^ a0; b0 += b1; b1 = ROTL(b1, r) ^ b0;                \
  e0 += e1; e1 = ROTL(e1, r) ^ e0; f0 += f1; f1 = ROTL(f1, r) ^ f0;
#define I4(p, q_, c)                                                               \
  a0 += (p); a1 += (q_) + c; b0 += (p); b1 += (q_) + c;                            \
  e0 += (p); e1 += (q_) + c; f0 += (p); f1 += (q_) + c;

/* len counters (hi, lo0 + t), t < len, lo0 + len <= 2**32: EMIT(t, x0, x1) each. */
#define STREAMS(EMIT)                                                              \
  {                                                                                \
    const int64_t q = len / 4;                                                     \
    const uint32_t uq = (uint32_t)q, h0 = hi + k0;                                 \
    for (int64_t t = 0; t < q; t++) {                                              \
      const uint32_t c = lo0 + (uint32_t)t + k1;                                   \
      uint32_t a0 = h0, a1 = c, b0 = h0, b1 = c + uq;                              \
      uint32_t e0 = h0, e1 = c + 2u * uq, f0 = h0, f1 = c + 3u * uq;               \
      R4(13) R4(15) R4(26) R4(6)  I4(k1, k2, 1u)                                   \
      R4(17) R4(29) R4(16) R4(24) I4(k2, k0, 2u)                                   \
      R4(13) R4(15) R4(26) R4(6)  I4(k0, k1, 3u)                                   \
      R4(17) R4(29) R4(16) R4(24) I4(k1, k2, 4u)                                   \
      R4(13) R4(15) R4(26) R4(6)  I4(k2, k0, 5u)                                   \
      EMIT(t, a0, a1) EMIT(t + q, b0, b1) EMIT(t + 2 * q, e0, e1) EMIT(t + 3 * q, f0, f1) \
    }                                                                              \
    for (int64_t t = 4 * q; t < len; t++) {                                        \
      HASH(k0, k1, k2, hi, lo0 + (uint32_t)t)                                      \
      EMIT(t, x0, x1)                                                              \
    }                                                                              \
  }

#define EMIT_PAIRS(i, x0, x1) o[2 * (i)] = (x0); o[2 * (i) + 1] = (x1);
#define EMIT_BITS32(i, x0, x1) o[i] = (x0) ^ (x1);
#define EMIT_BITS64(i, x0, x1) o[i] = ((uint64_t)(x0) << 32) | (x1);
#define EMIT_UNIT32(i, x0, x1) o[i] = unit32((x0) ^ (x1));
#define EMIT_NEG32(i, x0, x1) o[i] = -unit32((x0) ^ (x1));
/* max(b, u * a + b), two roundings */
#define EMIT_AFFINE32(i, x0, x1)                                                   \
  { float v = unit32((x0) ^ (x1)) * a; v = v + b; o[i] = v < b ? b : v; }
/* max(lo, float(double(u) * a + b)): _scaled's float64 path (u * a is exact) */
#define EMIT_RANGE32(i, x0, x1)                                                    \
  { double d = (double)unit32((x0) ^ (x1)) * da; d = d + db; float v = (float)d;   \
    o[i] = v < lo ? lo : v; }
#define EMIT_UNIT64(i, x0, x1)                                                     \
  { union { uint64_t u; double d; } v;                                             \
    v.u = ((((uint64_t)(x0) << 32) | (x1)) >> 12) | 0x3FF0000000000000ull;         \
    o[i] = v.d - 1.0; }

/* len counters (hi, lo0 + t), t < len, lo0 + len <= 2**32; outputs start at element off. */
FD_INLINE void hash_body(const job_t *J, uint32_t k0, uint32_t k1, uint32_t hi, uint32_t lo0,
                         int64_t len, int64_t off) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  switch (J->mode) {
  case MODE_PAIRS: { uint32_t *FD_RESTRICT o = (uint32_t *)J->out + 2 * off; STREAMS(EMIT_PAIRS) break; }
  case MODE_BITS32: { uint32_t *FD_RESTRICT o = (uint32_t *)J->out + off; STREAMS(EMIT_BITS32) break; }
  case MODE_BITS64: { uint64_t *FD_RESTRICT o = (uint64_t *)J->out + off; STREAMS(EMIT_BITS64) break; }
  case MODE_UNIT32: { float *FD_RESTRICT o = (float *)J->out + off; STREAMS(EMIT_UNIT32) break; }
  case MODE_NEG32: { float *FD_RESTRICT o = (float *)J->out + off; STREAMS(EMIT_NEG32) break; }
  case MODE_NORMAL_PRE: { /* x = max(a, 2u + a), then out2 = -(x * x) */
    float *FD_RESTRICT o = (float *)J->out + off, *FD_RESTRICT o2 = (float *)J->out2 + off;
    const float a = 2.0f, b = (float)J->a;
    STREAMS(EMIT_AFFINE32) /* (with a second output the 4-stream loop is not vectorised) */
    for (int64_t t = 0; t < len; t++) o2[t] = -(o[t] * o[t]);
    break; }
  case MODE_AFFINE32: {
    float *FD_RESTRICT o = (float *)J->out + off;
    const float a = (float)J->a, b = (float)J->b;
    STREAMS(EMIT_AFFINE32)
    break; }
  case MODE_RANGE32: {
    float *FD_RESTRICT o = (float *)J->out + off;
    const double da = J->a, db = J->b;
    const float lo = (float)J->b;
    STREAMS(EMIT_RANGE32)
    break; }
  case MODE_UNIT64: { double *FD_RESTRICT o = (double *)J->out + off; STREAMS(EMIT_UNIT64) break; }
  }
}

/* The end of float32 normal: XLA's erf_inv polynomials (Giles'), both evaluated, as
   in the pure path. keys: l = log1p(-x*x) (torch's log1p: its bits), so w = -l in
   [+0, +inf]; out: x, overwritten with sqrt2 * erfinv(x). The second polynomial needs
   torch's sqrt(w) (its float32 sqrt is not always correctly rounded), wanted only
   where w >= 5 (|x| > 0.9966, ~1 in 300). MODE_ERFINV_LT finishes every other element
   and lists those, in order: their w in out2 and their index in the int64 buffer at
   address `first`, both of room n (it returns their count, which may exceed n; then
   MODE_ERFINV_GATHER lists them again into larger buffers). Torch takes the sqrt of
   the short list (its sqrt gives the same bits at any position of any buffer) and
   MODE_ERFINV_GT finishes the listed elements (total: their count) from it (out2). */
#define LT_POLY(pl, wl)                                                          \
  float pl = 2.81022636e-08f;                                                    \
  pl = pl * wl; pl = pl + 3.43273939e-07f;  pl = pl * wl; pl = pl + -3.5233877e-06f; \
  pl = pl * wl; pl = pl + -4.39150654e-06f; pl = pl * wl; pl = pl + 0.00021858087f;  \
  pl = pl * wl; pl = pl + -0.00125372503f;  pl = pl * wl; pl = pl + -0.00417768164f; \
  pl = pl * wl; pl = pl + 0.246640727f;     pl = pl * wl; pl = pl + 1.50140941f;
#define GT_POLY(pg, wg)                                                          \
  float pg = -0.000200214257f;                                                   \
  pg = pg * wg; pg = pg + 0.000100950558f;  pg = pg * wg; pg = pg + 0.00134934322f;  \
  pg = pg * wg; pg = pg + -0.00367342844f;  pg = pg * wg; pg = pg + 0.00573950773f;  \
  pg = pg * wg; pg = pg + -0.0076224613f;   pg = pg * wg; pg = pg + 0.00943887047f;  \
  pg = pg * wg; pg = pg + 1.00167406f;      pg = pg * wg; pg = pg + 2.83297682f;

/* w >= 5 and finite, as bits (w is never NaN or negative): 5.0f <= w < inf */
#define IS_GT(wb) ((wb) >= 0x40A00000u && (wb) != 0x7F800000u)

/* Blocks of 64: a vector loop finishes the block; where it met a w >= 5 (~1 block in
   5), a scalar pass lists those. */
FD_INLINE int64_t erfinv_lt(const job_t *J, int64_t total) {
  const float *FD_RESTRICT l = (const float *)J->keys;
  float *FD_RESTRICT o = (float *)J->out;
  float *FD_RESTRICT g = (float *)J->out2;
  int64_t *FD_RESTRICT idx = (int64_t *)(intptr_t)J->first;
  const int64_t room = J->n;
  const float sqrt2 = (float)J->a;
  int64_t count = 0;
  for (int64_t start = 0; start < total; start += 64) {
    const int64_t stop = start + 64 < total ? start + 64 : total;
    uint32_t found = 0;
    for (int64_t i = start; i < stop; i++) {
      float w = -l[i], wl = w - 2.5f;
      LT_POLY(pl, wl)
      /* the selects are masks: gcc would sink a ?: operand into a branch and then,
         under -ftrapping-math, not vectorize the loop */
      uint32_t wb = f2u(w), inf = -(uint32_t)(wb == 0x7F800000u);
      uint32_t keep = -(uint32_t)IS_GT(wb); /* listed for MODE_ERFINV_GT */
      float p = u2f((0x7F800000u & inf) | (f2u(pl) & ~inf)) * o[i];
      o[i] = u2f((f2u(o[i]) & keep) | (f2u(p * sqrt2) & ~keep));
      found |= keep;
    }
    if (!found) continue;
    for (int64_t i = start; i < stop; i++) {
      float w = -l[i];
      if (!IS_GT(f2u(w))) continue;
      if (count < room) { g[count] = w; idx[count] = i; }
      count++;
    }
  }
  return count;
}

static void erfinv_gather(const job_t *J, int64_t total) {
  const float *l = (const float *)J->keys;
  float *g = (float *)J->out2;
  int64_t *idx = (int64_t *)(intptr_t)J->first;
  for (int64_t i = 0, j = 0; i < total; i++) {
    float w = -l[i];
    if (IS_GT(f2u(w))) { g[j] = w; idx[j] = i; j++; }
  }
}

static void erfinv_gt(const job_t *J, int64_t count) {
  const int64_t *idx = (const int64_t *)(intptr_t)J->first;
  const float *s = (const float *)J->out2;
  float *o = (float *)J->out;
  const float sqrt2 = (float)J->a;
  for (int64_t j = 0; j < count; j++) {
    float wg = s[j] - 3.0f;
    GT_POLY(pg, wg)
    float p = pg * o[idx[j]];
    o[idx[j]] = p * sqrt2;
  }
}

/* Elements [start, stop) of a draw (MODE_ERFINV_LT: all of them, start = 0). */
FD_INLINE int64_t range_body(const job_t *J, int64_t start, int64_t stop) {
  if (J->mode == MODE_ERFINV_LT) return erfinv_lt(J, stop);
  const int64_t n = J->n;
  int64_t j = start;
  if (J->mode == MODE_FOLD) { /* one counter (0, data[k]) per key, written as pairs */
    const uint32_t *FD_RESTRICT d = (const uint32_t *)J->out2;
    uint32_t *FD_RESTRICT o = (uint32_t *)J->out;
    for (; j < stop; j++) {
      const uint32_t k0 = J->keys[2 * j], k1 = J->keys[2 * j + 1], k2 = k0 ^ k1 ^ 0x1BD11BDAu;
      HASH(k0, k1, k2, 0u, d[j]) o[2 * j] = x0; o[2 * j + 1] = x1;
    }
    return 0;
  }
  while (j < stop) {
    int64_t kb = j / n, i = j - kb * n;
    uint64_t c = (uint64_t)(i + J->first);
    int64_t end = n - i < stop - j ? n - i : stop - j;
    uint32_t k0 = J->keys[2 * kb], k1 = J->keys[2 * kb + 1];
    while (end > 0) { /* split where the low counter word would wrap */
      uint32_t lo = (uint32_t)c;
      int64_t room = (int64_t)1 << 32;
      room -= lo;
      int64_t len = end < room ? end : room;
      hash_body(J, k0, k1, (uint32_t)(c >> 32), lo, len, j);
      c += (uint64_t)len; j += len; end -= len;
    }
  }
  return 0;
}

/* One copy of the kernels per instruction set; the widest the CPU has serves. */
typedef int64_t (*range_fn)(const job_t *, int64_t, int64_t);
static int64_t range_base(const job_t *J, int64_t start, int64_t stop) {
  return range_body(J, start, stop);
}
#ifdef FD_X86
__attribute__((target("avx2"))) static int64_t range_avx2(const job_t *J, int64_t start,
                                                          int64_t stop) {
  return range_body(J, start, stop);
}
__attribute__((target("avx512f"))) static int64_t range_avx512(const job_t *J, int64_t start,
                                                               int64_t stop) {
  return range_body(J, start, stop);
}
#endif
static range_fn run_range = range_base;
static const char *variant = "baseline";

static void pick_variant(void) {
#ifdef FD_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) { run_range = range_avx512; variant = "avx512f"; }
  else if (__builtin_cpu_supports("avx2")) { run_range = range_avx2; variant = "avx2"; }
#endif
}

/* Threads share a draw by taking CHUNK elements at a time from one counter (work
   stealing), and the caller waits only for chunks taken: a thread the scheduler holds
   back on a busy machine neither delays the draw by a fixed share nor is waited for.
   The shared state is on the heap (a copy of the job), freed by its last user: a late
   thread finds no chunk left and touches nothing else. */
#ifdef FD_THREADS
#define CHUNK 16384
typedef struct {
  job_t J;
  int64_t total, next, done, count;
  int refs;
} work_t;

static void work(work_t *W) {
  for (;;) {
    int64_t start = __atomic_fetch_add(&W->next, CHUNK, __ATOMIC_RELAXED);
    if (start >= W->total) return;
    int64_t stop = start + CHUNK < W->total ? start + CHUNK : W->total;
    int64_t count = run_range(&W->J, start, stop);
    if (count) __atomic_fetch_add(&W->count, count, __ATOMIC_RELAXED);
    __atomic_fetch_add(&W->done, stop - start, __ATOMIC_RELEASE);
  }
}

static void release(work_t *W) {
  if (__atomic_sub_fetch(&W->refs, 1, __ATOMIC_ACQ_REL) == 0) free(W);
}

static void work_main(void *arg) {
  work((work_t *)arg);
  release((work_t *)arg);
}

static int64_t run_threaded(const job_t *J, int64_t total, int nthreads) {
  work_t *W = (work_t *)malloc(sizeof(work_t));
  int64_t count;
  if (W == NULL) return run_range(J, 0, total);
  W->J = *J; W->total = total; W->next = 0; W->done = 0; W->count = 0; W->refs = 1;
  for (int t = 1; t < nthreads; t++) { /* detached threads; no GIL needed to start them */
    __atomic_fetch_add(&W->refs, 1, __ATOMIC_RELAXED);
    if (PyThread_start_new_thread(work_main, W) == (unsigned long)-1 /* failed */) {
      __atomic_fetch_sub(&W->refs, 1, __ATOMIC_RELAXED);
      break;
    }
  }
  work(W); /* this thread works too, until every chunk is taken */
  while (__atomic_load_n(&W->done, __ATOMIC_ACQUIRE) < total) sched_yield();
  count = __atomic_load_n(&W->count, __ATOMIC_RELAXED);
  release(W);
  return count;
}
#endif

/* A fresh output of 4 MB or more is first touched here: page faults of 4 KB pages (and
   their zeroing) cost about as much as the hash. Where the kernel offers transparent
   huge pages on request (madvise mode), ask for them on the buffer's whole 2 MB pages:
   a hint about memory nothing else uses yet, which changes no value. */
static void huge_pages(void *buf, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t page = (uintptr_t)1 << 21;
  uintptr_t start = ((uintptr_t)buf + page - 1) & ~(page - 1);
  uintptr_t stop = ((uintptr_t)buf + (uintptr_t)bytes) & ~(page - 1);
  if (bytes >= ((int64_t)4 << 20) && stop > start) madvise((void *)start, stop - start, MADV_HUGEPAGE);
#else
  (void)buf; (void)bytes;
#endif
}

/* Elements [0, total) over up to op >> 8 threads (this one included); mode op & 255.
   Returns MODE_ERFINV_LT's count (else 0). */
static int64_t fd_run(int op, const void *keys, int64_t total, int64_t n, int64_t first,
                      void *out, void *out2, double a, double b) {
  job_t J;
  int nthreads = op >> 8;
  J.mode = op & 255; J.keys = (const uint32_t *)keys; J.n = n; J.first = first;
  J.out = out; J.out2 = out2; J.a = a; J.b = b;
  if (total <= 0) return 0;
  if (J.mode == MODE_ERFINV_GATHER) { erfinv_gather(&J, total); return 0; }
  if (J.mode == MODE_ERFINV_GT) { erfinv_gt(&J, total); return 0; }
  if (J.mode == MODE_ERFINV_LT) return run_range(&J, 0, total); /* one pass, in order */
  {
    int64_t size = J.mode == MODE_PAIRS || J.mode == MODE_FOLD || J.mode == MODE_BITS64 ||
                   J.mode == MODE_UNIT64 ? 8 : 4;
    huge_pages(out, total * size);
    if (J.mode == MODE_NORMAL_PRE) huge_pages(out2, total * size);
  }
#ifdef FD_THREADS
  if (nthreads > 64) nthreads = 64;
  if (nthreads > (total + CHUNK - 1) / CHUNK) nthreads = (int)((total + CHUNK - 1) / CHUNK);
  if (nthreads > 1) return run_threaded(&J, total, nthreads);
#endif
  (void)nthreads;
  return run_range(&J, 0, total);
}

/* run(op, keys, total, n, first, out[, out2, a, b]) with addresses as ints (~0.1 us). */
static PyObject *py_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  long long v[7] = {0, 0, 0, 0, 0, 0, 0};
  double f[2] = {0.0, 0.0};
  int64_t count;
  (void)self;
  if (nargs != 6 && nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "run(op, keys, total, n, first, out[, out2, a, b])");
    return NULL;
  }
  for (Py_ssize_t i = 0; i < nargs && i < 7; i++) v[i] = PyLong_AsLongLong(args[i]);
  if (nargs == 9) { f[0] = PyFloat_AsDouble(args[7]); f[1] = PyFloat_AsDouble(args[8]); }
  if (PyErr_Occurred()) return NULL;
  if (v[2] >= 32768) {
    Py_BEGIN_ALLOW_THREADS
    count = fd_run((int)v[0], (const void *)(intptr_t)v[1], v[2], v[3], v[4],
                   (void *)(intptr_t)v[5], (void *)(intptr_t)v[6], f[0], f[1]);
    Py_END_ALLOW_THREADS
  } else {
    count = fd_run((int)v[0], (const void *)(intptr_t)v[1], v[2], v[3], v[4],
                   (void *)(intptr_t)v[5], (void *)(intptr_t)v[6], f[0], f[1]);
  }
  return PyLong_FromLongLong(count);
}

static PyMethodDef methods[] = {
  {"run", (PyCFunction)(void (*)(void))py_run, METH_FASTCALL,
   "run(op, keys, total, n, first, out[, out2, a, b]): one fused draw (see _fused.py)"},
  {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
  PyModuleDef_HEAD_INIT, "functd._fused_ext",
  "threefry2x32 draws for functd.random (see functd/_fused.py)", -1, methods,
  NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fused_ext(void) {
  PyObject *m;
  pick_variant();
  m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  if (PyModule_AddStringConstant(m, "VARIANT", variant) < 0 ||
      PyModule_AddIntConstant(m, "VERSION", FD_KERNEL_VERSION) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
