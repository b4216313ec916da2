/* functd._td._alloc_ext: a TensorDict built in one C call.

Every write, every pytree unflatten and every module call makes a new TensorDict
without validation (``_tensordict.from_parts``): allocate the instance, set its four
slots. From Python that is five calls through the slot descriptors (~0.27 us on a
2-core EPYC); here it is one. The slots are found by their member descriptors once
(``bind``), so the C code knows nothing of the class but their names.

    bind(cls)              remember cls and the offsets of its four slots
    new(data, batch_size)  a cls with _data, _batch_size set, _spec and
                           _check_cache None
    init(td, data, batch_size)  the same four writes into an allocated td

Built with the package (setup.py, optional): without it ``_tensordict.py`` uses the
slot descriptors, with the same result.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyTypeObject *td_type = NULL;
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

static PyObject *py_bind(PyObject *self, PyObject *cls) {
  if (!PyType_Check(cls)) {
    PyErr_SetString(PyExc_TypeError, "bind(cls): a class");
    return NULL;
  }
  if (offset_of(cls, "_data", &off_data) || offset_of(cls, "_batch_size", &off_bs) ||
      offset_of(cls, "_spec", &off_spec) || offset_of(cls, "_check_cache", &off_check))
    return NULL;
  Py_INCREF(cls);
  Py_XSETREF(td_type, (PyTypeObject *)cls);
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

static PyMethodDef methods[] = {
  {"bind", (PyCFunction)py_bind, METH_O, "bind(cls): the class whose slots new/init set"},
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
