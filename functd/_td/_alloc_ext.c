/* functd._td._alloc_ext: a TensorDict built in one C call.

Every write, every pytree unflatten and every module call makes a new TensorDict
without validation (``_tensordict.from_parts``): allocate the instance, set its four
slots. From Python that is five calls through the slot descriptors (~0.27 us on a
2-core EPYC); here it is one. The slots are found by their member descriptors once
(``bind``), so the C code knows nothing of the class but their names.

    bind(cls, leaf_types, sizes, make_size)  remember cls, the offsets of its four
                           slots, the leaf types (a frozenset), the batch sizes made
                           once (a dict int -> torch.Size([n])) and the function that
                           makes one (and keeps it in ``sizes`` when it is small)
    new(data, batch_size)  a cls with _data, _batch_size set, _spec and
                           _check_cache None
    init(td, data, batch_size)  the same four writes into an allocated td
    init_batch1(td, source, batch_size) -> bool  the constructor's common case,
                           ``TensorDict({str: tensor}, [n])``: True when every key
                           is a str, every value a leaf type whose shape starts
                           with n >= 0 (then td holds a copy of source and the
                           size); False, with nothing written, otherwise

Built with the package (setup.py, optional): without it ``_tensordict.py`` uses the
slot descriptors, with the same result.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyTypeObject *td_type = NULL;
static PyObject *leaf_types = NULL; /* frozenset of types */
static PyObject *sizes = NULL;      /* dict: int -> torch.Size([n]) */
static PyObject *make_size = NULL;  /* n -> torch.Size([n]) */
static PyObject *shape_name = NULL; /* "shape", interned */
static Py_ssize_t off_data, off_bs, off_spec, off_check;

static int offset_of(PyObject *cls, const char *name, Py_ssize_t *off) {
  PyObject *d = PyDict_GetItemString(((PyTypeObject *)cls)->tp_dict, name);
  if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type) {
    PyErr_Format(PyExc_TypeError, "bind: %s is not a slot of the class", name);
    return -1;
  }
  PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
  if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
    PyErr_Format(PyExc_TypeError, "bind: %s is not a writable object slot", name);
    return -1;
  }
  *off = m->offset;
  return 0;
}

static PyObject *py_bind(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 4 || !PyType_Check(args[0]) || !PyFrozenSet_CheckExact(args[1]) ||
      !PyDict_CheckExact(args[2]) || !PyCallable_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "bind(cls, leaf_types: frozenset, sizes: dict, make_size)");
    return NULL;
  }
  PyObject *cls = args[0];
  Py_ssize_t d, b, s, c; /* all four found before any is kept */
  if (offset_of(cls, "_data", &d) || offset_of(cls, "_batch_size", &b) ||
      offset_of(cls, "_spec", &s) || offset_of(cls, "_check_cache", &c))
    return NULL;
  off_data = d, off_bs = b, off_spec = s, off_check = c;
  if (shape_name == NULL && (shape_name = PyUnicode_InternFromString("shape")) == NULL)
    return NULL;
  Py_INCREF(cls);
  Py_XSETREF(td_type, (PyTypeObject *)cls);
  Py_INCREF(args[1]);
  Py_XSETREF(leaf_types, args[1]);
  Py_INCREF(args[2]);
  Py_XSETREF(sizes, args[2]);
  Py_INCREF(args[3]);
  Py_XSETREF(make_size, args[3]);
  Py_RETURN_NONE;
}

static inline void put(PyObject *obj, Py_ssize_t off, PyObject *v) {
  PyObject **slot = (PyObject **)((char *)obj + off);
  Py_INCREF(v);
  Py_XSETREF(*slot, v);
}

static inline void fill(PyObject *obj, PyObject *data, PyObject *bs) {
  put(obj, off_data, data);
  put(obj, off_bs, bs);
  put(obj, off_spec, Py_None);
  put(obj, off_check, Py_None);
}

static PyObject *py_new(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 2 || td_type == NULL) {
    PyErr_SetString(PyExc_TypeError, "new(data, batch_size), after bind(cls)");
    return NULL;
  }
  PyObject *obj = td_type->tp_alloc(td_type, 0);
  if (obj == NULL) return NULL;
  fill(obj, args[0], args[1]);
  return obj;
}

static PyObject *py_init(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 3 || td_type == NULL || !PyObject_TypeCheck(args[0], td_type)) {
    PyErr_SetString(PyExc_TypeError, "init(td, data, batch_size): td of the bound class");
    return NULL;
  }
  fill(args[0], args[1], args[2]);
  Py_RETURN_NONE;
}

/* 1: the leaf passes (a leaf type, shape[0] == b0); 0: it does not; -1: an error */
static int leaf_ok(PyObject *v, PyObject *b0) {
  int r = PySet_Contains(leaf_types, (PyObject *)Py_TYPE(v));
  if (r <= 0) return r;
  PyObject *shape = PyObject_GetAttr(v, shape_name);
  if (shape == NULL) return -1;
  r = 0;
  if (PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) >= 1) {
    PyObject *d0 = PyTuple_GET_ITEM(shape, 0);
    if (PyLong_CheckExact(d0)) r = PyObject_RichCompareBool(d0, b0, Py_EQ);
  }
  Py_DECREF(shape);
  return r;
}

static PyObject *py_init_batch1(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 3 || td_type == NULL || !PyObject_TypeCheck(args[0], td_type)) {
    PyErr_SetString(PyExc_TypeError, "init_batch1(td, source, batch_size): td of the bound class");
    return NULL;
  }
  PyObject *source = args[1], *bs = args[2];
  if (!PyDict_CheckExact(source) || !PyList_CheckExact(bs) || PyList_GET_SIZE(bs) != 1)
    Py_RETURN_FALSE;
  PyObject *b = PyList_GET_ITEM(bs, 0);
  if (!PyLong_CheckExact(b)) Py_RETURN_FALSE;
  int overflow;
  long long b0 = PyLong_AsLongLongAndOverflow(b, &overflow);
  if (b0 == -1 && PyErr_Occurred()) return NULL;
  if (overflow || b0 < 0) Py_RETURN_FALSE; /* a dim past 2**63 - 1: the general path refuses it */
  Py_ssize_t pos = 0;
  PyObject *k, *v;
  while (PyDict_Next(source, &pos, &k, &v)) {
    if (!PyUnicode_CheckExact(k)) Py_RETURN_FALSE;
    int r = leaf_ok(v, b);
    if (r < 0) return NULL;
    if (r == 0) Py_RETURN_FALSE;
  }
  PyObject *size = PyDict_GetItemWithError(sizes, b); /* borrowed */
  if (size != NULL) {
    Py_INCREF(size);
  } else {
    if (PyErr_Occurred()) return NULL;
    if ((size = PyObject_CallOneArg(make_size, b)) == NULL) return NULL;
  }
  PyObject *data = PyDict_Copy(source);
  if (data == NULL) {
    Py_DECREF(size);
    return NULL;
  }
  fill(args[0], data, size);
  Py_DECREF(data);
  Py_DECREF(size);
  Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
  {"bind", (PyCFunction)(void (*)(void))py_bind, METH_FASTCALL,
   "bind(cls, leaf_types, sizes): the class whose slots new/init set, its leaf types and "
   "its made-once batch sizes"},
  {"init_batch1", (PyCFunction)(void (*)(void))py_init_batch1, METH_FASTCALL,
   "init_batch1(td, source, batch_size) -> bool: the constructor's common case"},
  {"new", (PyCFunction)(void (*)(void))py_new, METH_FASTCALL,
   "new(data, batch_size) -> a TensorDict with those slots (no validation)"},
  {"init", (PyCFunction)(void (*)(void))py_init, METH_FASTCALL,
   "init(td, data, batch_size): set the four slots of an allocated TensorDict"},
  {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
  PyModuleDef_HEAD_INIT, "functd._td._alloc_ext",
  "TensorDict construction in one call (see functd/_td/_alloc_ext.c)", -1, methods,
  NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__alloc_ext(void) { return PyModule_Create(&module); }
