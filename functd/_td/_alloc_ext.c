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

CPython's limited API (abi3, Py_LIMITED_API from setup.py): one build serves every
supported Python. The class's type object is opaque there, so ``bind`` finds a slot's
offset by writing a fresh marker object through the slot's descriptor into a probe
instance and finding the one pointer-sized word of the instance that holds it; the
allocator is read once with PyType_GetSlot.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Py_XSETREF is not in the limited API */
#define FD_XSETREF(dst, src)         \
  do {                               \
    PyObject *fd_old_ = (PyObject *)(dst); \
    (dst) = (src);                   \
    Py_XDECREF(fd_old_);             \
  } while (0)

static PyTypeObject *td_type = NULL;
static allocfunc td_alloc = NULL;   /* td_type's tp_alloc */
static PyObject *leaf_types = NULL; /* frozenset of types */
static PyObject *sizes = NULL;      /* dict: int -> torch.Size([n]) */
static PyObject *make_size = NULL;  /* n -> torch.Size([n]) */
static PyObject *shape_name = NULL; /* "shape", interned */
static Py_ssize_t off_data, off_bs, off_spec, off_check;

/* types.MemberDescriptorType (a __slots__ entry's descriptor), new reference */
static PyObject *member_descriptor_type(void) {
  PyObject *types = PyImport_ImportModule("types");
  if (types == NULL) return NULL;
  PyObject *t = PyObject_GetAttrString(types, "MemberDescriptorType");
  Py_DECREF(types);
  return t;
}

/* The descriptor ``cls.__dict__[name]`` when it is a slot's (a member descriptor of a
   class made by a class statement), new reference; NULL with TypeError otherwise. */
static PyObject *slot_descriptor(PyObject *cls, const char *name) {
  int heap = (PyType_GetFlags((PyTypeObject *)cls) & Py_TPFLAGS_HEAPTYPE) != 0;
  PyObject *ns = heap ? PyObject_GetAttrString(cls, "__dict__") : NULL;
  PyObject *d = ns == NULL ? NULL : PyMapping_GetItemString(ns, name);
  Py_XDECREF(ns);
  PyObject *member = d == NULL ? NULL : member_descriptor_type();
  if (member == NULL || Py_TYPE(d) != (PyTypeObject *)member) {
    Py_XDECREF(member);
    Py_XDECREF(d);
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "bind: %s is not a slot of the class", name);
    return NULL;
  }
  Py_DECREF(member);
  return d;
}

/* The offset of the slot of descriptor d in the instances of a class: a fresh marker
   object written through d into probe (a new instance: its words are the object header,
   NULL, or what was written) is found in exactly one pointer-sized word. */
static int offset_of(PyObject *d, PyObject *probe, Py_ssize_t basicsize, const char *name,
                     Py_ssize_t *off) {
  PyObject *marker = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  PyObject *r = marker == NULL ? NULL : PyObject_CallMethod(d, "__set__", "OO", probe, marker);
  Py_ssize_t found = -1, hits = 0;
  if (r != NULL) {
    Py_DECREF(r);
    const Py_ssize_t word = (Py_ssize_t)sizeof(PyObject *);
    for (Py_ssize_t o = (Py_ssize_t)sizeof(PyObject); o + word <= basicsize; o += word) {
      if (*(PyObject **)((char *)probe + o) == marker) found = o, hits++;
    }
  }
  Py_XDECREF(marker); /* probe's slot holds it while probe lives */
  if (hits != 1) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "bind: %s is not a writable object slot", name);
    return -1;
  }
  *off = found;
  return 0;
}

static const char *const SLOTS[4] = {"_data", "_batch_size", "_spec", "_check_cache"};

/* The offsets of the four slots of cls (a class made by a class statement), or -1 with
   an error. */
static int find_offsets(PyObject *cls, Py_ssize_t off[4], allocfunc *alloc) {
  PyObject *desc[4] = {NULL, NULL, NULL, NULL}, *probe = NULL, *size_obj = NULL;
  Py_ssize_t basicsize = -1;
  int ok = 0, i;
  for (i = 0; i < 4; i++)
    if ((desc[i] = slot_descriptor(cls, SLOTS[i])) == NULL) goto done;
  if ((size_obj = PyObject_GetAttrString(cls, "__basicsize__")) == NULL) goto done;
  basicsize = PyLong_AsSsize_t(size_obj);
  Py_DECREF(size_obj);
  if (basicsize < 0) goto done;
  *alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)cls, Py_tp_alloc);
  if (*alloc == NULL || (probe = (*alloc)((PyTypeObject *)cls, 0)) == NULL) goto done;
  for (i = 0; i < 4; i++)
    if (offset_of(desc[i], probe, basicsize, SLOTS[i], &off[i]) < 0) goto done;
  ok = 1;
done:
  Py_XDECREF(probe);
  for (i = 0; i < 4; i++) Py_XDECREF(desc[i]);
  if (!ok && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "bind: the class has no tp_alloc");
  return ok ? 0 : -1;
}

static PyObject *py_bind(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 4 || !PyType_Check(args[0]) || !PyFrozenSet_CheckExact(args[1]) ||
      !PyDict_CheckExact(args[2]) || !PyCallable_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "bind(cls, leaf_types: frozenset, sizes: dict, make_size)");
    return NULL;
  }
  PyObject *cls = args[0];
  Py_ssize_t off[4]; /* all four found before any is kept */
  allocfunc alloc = NULL;
  if (find_offsets(cls, off, &alloc) < 0) return NULL;
  if (shape_name == NULL && (shape_name = PyUnicode_InternFromString("shape")) == NULL)
    return NULL;
  off_data = off[0], off_bs = off[1], off_spec = off[2], off_check = off[3];
  td_alloc = alloc;
  Py_INCREF(cls);
  FD_XSETREF(td_type, (PyTypeObject *)cls);
  Py_INCREF(args[1]);
  FD_XSETREF(leaf_types, args[1]);
  Py_INCREF(args[2]);
  FD_XSETREF(sizes, args[2]);
  Py_INCREF(args[3]);
  FD_XSETREF(make_size, args[3]);
  Py_RETURN_NONE;
}

static inline void put(PyObject *obj, Py_ssize_t off, PyObject *v) {
  PyObject **slot = (PyObject **)((char *)obj + off);
  Py_INCREF(v);
  FD_XSETREF(*slot, v);
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
  PyObject *obj = td_alloc(td_type, 0);
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
  /* One call, no separate PyTuple_Check (a call too in the limited API, which has no
     PyTuple_GET_ITEM): NULL for () (IndexError) or a shape that is not a tuple. */
  PyObject *d0 = PyTuple_GetItem(shape, 0); /* borrowed */
  if (d0 == NULL) PyErr_Clear();
  else if (PyLong_CheckExact(d0)) r = PyObject_RichCompareBool(d0, b0, Py_EQ);
  Py_DECREF(shape);
  return r;
}

static PyObject *py_init_batch1(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 3 || td_type == NULL || !PyObject_TypeCheck(args[0], td_type)) {
    PyErr_SetString(PyExc_TypeError, "init_batch1(td, source, batch_size): td of the bound class");
    return NULL;
  }
  PyObject *source = args[1], *bs = args[2];
  if (!PyDict_CheckExact(source) || !PyList_CheckExact(bs) || PyList_Size(bs) != 1)
    Py_RETURN_FALSE;
  PyObject *b = PyList_GetItem(bs, 0); /* borrowed */
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
    if ((size = PyObject_CallFunctionObjArgs(make_size, b, NULL)) == NULL) return NULL;
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
