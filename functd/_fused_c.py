"""C source of the fused eager CPU kernels behind ``functd.random`` (see ``_fused.py``).

``fd_run(op, ...)`` (``fd_draw``: the same in fewer arguments; with
``-DFD_PYTHON`` also a CPython extension, whose calls cost far less than ctypes'): threefry2x32 of the row-major counters
``first..first+n-1`` under each of ``nkeys`` keys (jax's partitionable layout, the same
hash as ``_threefry._threefry2x32``), written as raw words or turned into floats
by the exact bit tricks of ``functd.random._unit``; ``MODE_ERFINV`` finishes
XLA's float32 ``erf_inv`` after torch computed its ``log1p`` and ``sqrt`` (torch's
own kernels, so the bits equal the pure-op path's: its float32 sqrt is not always
correctly rounded). Integer hashing and the mantissa trick are exact anywhere;
the float steps are single IEEE operations, built with ``-ffp-contract=off`` (no
FMA) and without ``-ffast-math``, in the same order as the pure path.

Example:
    >>> "fd_run" in SOURCE
    True
"""

SOURCE = r"""
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

enum { MODE_PAIRS, MODE_BITS32, MODE_BITS64, MODE_UNIT32, MODE_NORMAL_PRE,
       MODE_AFFINE32, MODE_NEG32, MODE_UNIT64, MODE_ERFINV };

typedef struct {
  int mode;
  const uint32_t *keys; /* nkeys pairs of words; MODE_ERFINV: the x values */
  int64_t n;            /* counters per key */
  int64_t first;        /* the first counter */
  void *out, *out2;
  float a, b;
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

static inline float unit32(uint32_t bits) {
  union { uint32_t u; float f; } v;
  v.u = (bits >> 9) | 0x3F800000u;
  return v.f - 1.0f;
}

/* len counters (hi, lo0 + t), t < len, lo0 + len <= 2**32; out already offset. */
static void hash_run(const job_t *J, uint32_t k0, uint32_t k1, uint32_t hi, uint32_t lo0,
                     int64_t len, int64_t off) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  const float a = J->a, b = J->b;
  switch (J->mode) {
  case MODE_PAIRS: {
    uint32_t *o = (uint32_t *)J->out + 2 * off;
    for (int64_t t = 0; t < len; t++) { HASH(k0, k1, k2, hi, lo0 + (uint32_t)t) o[2 * t] = x0; o[2 * t + 1] = x1; }
    break; }
  case MODE_BITS32: {
    uint32_t *o = (uint32_t *)J->out + off;
    for (int64_t t = 0; t < len; t++) { HASH(k0, k1, k2, hi, lo0 + (uint32_t)t) o[t] = x0 ^ x1; }
    break; }
  case MODE_BITS64: {
    uint64_t *o = (uint64_t *)J->out + off;
    for (int64_t t = 0; t < len; t++) { HASH(k0, k1, k2, hi, lo0 + (uint32_t)t) o[t] = ((uint64_t)x0 << 32) | x1; }
    break; }
  case MODE_UNIT32: {
    float *o = (float *)J->out + off;
    for (int64_t t = 0; t < len; t++) { HASH(k0, k1, k2, hi, lo0 + (uint32_t)t) o[t] = unit32(x0 ^ x1); }
    break; }
  case MODE_NORMAL_PRE: { /* x = max(a, 2u + a); out2 = -(x * x) */
    float *o = (float *)J->out + off, *o2 = (float *)J->out2 + off;
    for (int64_t t = 0; t < len; t++) {
      HASH(k0, k1, k2, hi, lo0 + (uint32_t)t)
      float v = unit32(x0 ^ x1) * 2.0f;
      v = v + a;
      v = v < a ? a : v;
      o[t] = v;
      o2[t] = -(v * v);
    }
    break; }
  case MODE_AFFINE32: { /* max(b, u * a + b), two roundings */
    float *o = (float *)J->out + off;
    for (int64_t t = 0; t < len; t++) {
      HASH(k0, k1, k2, hi, lo0 + (uint32_t)t)
      float v = unit32(x0 ^ x1) * a;
      v = v + b;
      o[t] = v < b ? b : v;
    }
    break; }
  case MODE_NEG32: {
    float *o = (float *)J->out + off;
    for (int64_t t = 0; t < len; t++) { HASH(k0, k1, k2, hi, lo0 + (uint32_t)t) o[t] = -unit32(x0 ^ x1); }
    break; }
  case MODE_UNIT64: {
    double *o = (double *)J->out + off;
    for (int64_t t = 0; t < len; t++) {
      HASH(k0, k1, k2, hi, lo0 + (uint32_t)t)
      union { uint64_t u; double d; } v;
      v.u = ((((uint64_t)x0 << 32) | x1) >> 12) | 0x3FF0000000000000ull;
      o[t] = v.d - 1.0;
    }
    break; }
  }
}

static const float ERFINV_LT[9] = {2.81022636e-08f, 3.43273939e-07f, -3.5233877e-06f,
  -4.39150654e-06f, 0.00021858087f, -0.00125372503f, -0.00417768164f, 0.246640727f, 1.50140941f};
static const float ERFINV_GT[9] = {-0.000200214257f, 0.000100950558f, 0.00134934322f,
  -0.00367342844f, 0.00573950773f, -0.0076224613f, 0.00943887047f, 1.00167406f, 2.83297682f};

/* out[i] (holding w = -log1p(-x*x)) <- sqrt2 * erfinv(x[i]), XLA's float32 polynomials;
   out2 holds torch's sqrt(w) (torch's float32 sqrt is not always correctly rounded). */
static void erfinv_run(const job_t *J, int64_t start, int64_t stop) {
  const float *x = (const float *)J->keys, *s = (const float *)J->out2;
  float *o = (float *)J->out;
  const float sqrt2 = J->a;
  for (int64_t i = start; i < stop; i++) {
    float w = o[i];
    float wl = w - 2.5f, wg = s[i] - 3.0f;
    float pl = ERFINV_LT[0], pg = ERFINV_GT[0];
    for (int c = 1; c < 9; c++) {
      pl = pl * wl; pl = pl + ERFINV_LT[c];
      pg = pg * wg; pg = pg + ERFINV_GT[c];
    }
    float p = w < 5.0f ? pl : pg;
    p = isinf(w) ? INFINITY : p;
    p = p * x[i];
    o[i] = p * sqrt2;
  }
}

static void run_range(const job_t *J, int64_t start, int64_t stop) {
  if (J->mode == MODE_ERFINV) { erfinv_run(J, start, stop); return; }
  const int64_t n = J->n;
  int64_t j = start;
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
      hash_run(J, k0, k1, (uint32_t)(c >> 32), lo, len, j);
      c += (uint64_t)len; j += len; end -= len;
    }
  }
}

typedef struct { const job_t *J; int64_t start, stop; } part_t;

static void *part_main(void *arg) {
  part_t *p = (part_t *)arg;
  run_range(p->J, p->start, p->stop);
  return NULL;
}

/* Elements [0, total) split over up to op >> 8 threads (this one included); mode op & 255. */
int fd_run(int op, const void *keys, int64_t total, int64_t n, int64_t first, void *out,
           void *out2, double a, double b) {
  job_t J;
  int nthreads = op >> 8;
  J.mode = op & 255; J.keys = (const uint32_t *)keys; J.n = n; J.first = first;
  J.out = out; J.out2 = out2;
  J.a = (float)a; J.b = (float)b;
  if (total <= 0) return 0;
  if (nthreads > 64) nthreads = 64;
  if (nthreads <= 1 || total < 32768) { run_range(&J, 0, total); return 0; }
  pthread_t tid[64];
  part_t parts[64];
  int64_t chunk = ((total + nthreads - 1) / nthreads + 63) & ~(int64_t)63;
  char created[64] = {0};
  for (int t = 0; t < nthreads; t++) {
    parts[t].J = &J;
    parts[t].start = t * chunk < total ? t * chunk : total;
    parts[t].stop = (t + 1) * chunk < total ? (t + 1) * chunk : total;
  }
  for (int t = 1; t < nthreads; t++) {
    if (parts[t].start >= parts[t].stop) continue;
    if (pthread_create(&tid[t], NULL, part_main, &parts[t]) == 0) created[t] = 1;
    else part_main(&parts[t]); /* no thread: run this part here */
  }
  run_range(&J, parts[0].start, parts[0].stop);
  for (int t = 1; t < nthreads; t++)
    if (created[t]) pthread_join(tid[t], NULL);
  return 0;
}

/* fd_run without float parameters, in fewer arguments (ctypes costs ~0.13 us each). */
int fd_draw(int op, const void *keys, int64_t total, int64_t n, int64_t first, void *out) {
  return fd_run(op, keys, total, n, first, out, NULL, 0.0, 0.0);
}

#ifdef FD_PYTHON
/* The same as a CPython extension (~0.1 us a call against ctypes' ~1.5 us):
   run(op, keys, total, n, first, out[, out2, a, b]) with addresses as ints. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *py_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  long long v[7] = {0, 0, 0, 0, 0, 0, 0};
  double f[2] = {0.0, 0.0};
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
    fd_run((int)v[0], (const void *)v[1], v[2], v[3], v[4], (void *)v[5], (void *)v[6], f[0], f[1]);
    Py_END_ALLOW_THREADS
  } else {
    fd_run((int)v[0], (const void *)v[1], v[2], v[3], v[4], (void *)v[5], (void *)v[6], f[0], f[1]);
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
  {"run", (PyCFunction)(void (*)(void))py_run, METH_FASTCALL, "fd_run"},
  {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_functd_threefry", NULL, -1, methods};
PyMODINIT_FUNC PyInit__functd_threefry(void) { return PyModule_Create(&module); }
#endif
"""
