# Pool.alloc/free and Device.malloc/free as nearly every caller calls them:
# one or two positional arguments and no keywords.  Cython's wrapper of a
# def parses every parameter by name and takes a reference to each default it
# fills in: for Device.malloc's four (size, policy, stream, tag) that cost
# ~75 instructions of a ~1,250-instruction Python Device pair at 64 B, for
# Pool.alloc's two and Pool.free's one ~35 of a ~1,075-instruction pair.
# At import each method's descriptor is replaced by one whose C function (its
# entry, written below) takes that call straight to the method's body, in
# line, and hands every other call (keywords, more arguments, a wrong count)
# to Cython's wrapper, kept as it was: its argument errors, docstring and
# signature are the method's own.  Included by _core.pyx after the classes.

from cpython.object cimport PyObject, PyTypeObject

cdef extern from *:
    """
    typedef struct {
        PyMethodDef def;                      /* the replacement's: Cython's, but ml_meth */
        _PyCFunctionFastWithKeywords general; /* Cython's wrapper: every other call */
    } ascm_fast_method;

    static ascm_fast_method ascm_fast_methods[6];

    /* Cython's wrapper of fast method i: a new reference, or NULL with an
     * exception set. */
    static PyObject *ascm_fast_general(int i, PyObject *self, PyObject **args, Py_ssize_t nargs,
                                       PyObject *kwnames) {
        return ascm_fast_methods[i].general(self, (PyObject *const *)args, nargs, kwnames);
    }

    /* Puts `entry` (a METH_FASTCALL | METH_KEYWORDS function) in place of
     * type's method `name` as fast method i; `name` must be a method
     * descriptor taking the same (Cython's, with binding=False).  0, or -1
     * with an exception set (nothing replaced). */
    static int ascm_install_fast_method(PyTypeObject *type, int i, const char *name, void *entry) {
        PyObject *old = PyDict_GetItemString(type->tp_dict, name); /* borrowed */
        if (old == NULL || !PyObject_TypeCheck(old, &PyMethodDescr_Type) ||
            ((PyMethodDescrObject *)old)->d_method->ml_flags != (METH_FASTCALL | METH_KEYWORDS)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a fast-call method descriptor",
                         type->tp_name, name);
            return -1;
        }
        const PyMethodDef *def = ((PyMethodDescrObject *)old)->d_method; /* static: Cython's table */
        ascm_fast_method *m = &ascm_fast_methods[i];
        m->def = *def;
        m->def.ml_meth = (PyCFunction)(void (*)(void))entry;
        m->general = (_PyCFunctionFastWithKeywords)(void (*)(void))def->ml_meth;
        PyObject *fresh = PyDescr_NewMethod(type, &m->def);
        if (fresh == NULL) return -1;
        int st = PyDict_SetItemString(type->tp_dict, name, fresh);
        Py_DECREF(fresh);
        PyType_Modified(type);
        return st;
    }
    """
    object ascm_fast_general(int i, object self, PyObject **args, Py_ssize_t nargs,
                             PyObject *kwnames)
    int ascm_install_fast_method(PyTypeObject *type, int i, const char *name,
                                 void *entry) except -1


# the slot of each replaced method in ascm_fast_methods
cdef enum:
    _POOL_ALLOC, _POOL_FREE, _DEVICE_MALLOC, _DEVICE_FREE, _NOOP_ALLOC, _NOOP_FREE


# ---- the entries: METH_FASTCALL | METH_KEYWORDS functions (self, args, nargs,
# kwnames -> a new reference or NULL); the method descriptor has checked
# self's type before any of them runs

cdef object _pool_alloc_entry(object self, PyObject **args, Py_ssize_t nargs, PyObject *kwnames):
    """Pool.alloc(nbytes[, align])."""
    if kwnames is NULL and (nargs == 1 or nargs == 2):
        return _pool_alloc(<Pool>self, <object>args[0],
                           64 if nargs == 1 else _align(<object>args[1]))
    return ascm_fast_general(_POOL_ALLOC, self, args, nargs, kwnames)


cdef object _pool_free_entry(object self, PyObject **args, Py_ssize_t nargs, PyObject *kwnames):
    """Pool.free(addr)."""
    if kwnames is NULL and nargs == 1:
        _pool_free(<Pool>self, <object>args[0])
        return None
    return ascm_fast_general(_POOL_FREE, self, args, nargs, kwnames)


cdef object _device_free_entry(object self, PyObject **args, Py_ssize_t nargs, PyObject *kwnames):
    """Device.free(ptr)."""
    if kwnames is NULL and nargs == 1:
        _device_free(<Device>self, <object>args[0], _DEVICE_MASK, None, "free")
        return None
    return ascm_fast_general(_DEVICE_FREE, self, args, nargs, kwnames)


cdef object _device_malloc_entry(object self, PyObject **args, Py_ssize_t nargs,
                                 PyObject *kwnames):
    """Device.malloc(size[, policy])."""
    # malloc(size) is _malloc written out: gcc called _malloc here rather
    # than putting it in line (9-20 instructions more per Device pair)
    cdef uint64_t addr = 0
    cdef int kind = -1, events = 0, st
    if kwnames is NULL and nargs == 1:
        st = _alloc_first_try(<Device>self, <object>args[0], 0, ASCM_SIZE_MALLOC, None, None,
                              &addr, &kind, &events)
        if st == ASCM_OK and not events:
            return addr
        return _alloc(<Device>self, <object>args[0], 0, ASCM_SIZE_MALLOC, None, None, "malloc",
                      st, addr, kind, events)
    if kwnames is NULL and nargs == 2:
        return _malloc(<Device>self, <object>args[0], <object>args[1], None, None,
                       ASCM_SIZE_MALLOC)
    return ascm_fast_general(_DEVICE_MALLOC, self, args, nargs, kwnames)


cdef object _noop_alloc_entry(object self, PyObject **args, Py_ssize_t nargs, PyObject *kwnames):
    """FastcallNoopPool.alloc(nbytes[, align]): NoopPool's work, the Pool's entry."""
    if kwnames is NULL and (nargs == 1 or nargs == 2):
        return _noop_alloc(<object>args[0])
    return ascm_fast_general(_NOOP_ALLOC, self, args, nargs, kwnames)


cdef object _noop_free_entry(object self, PyObject **args, Py_ssize_t nargs, PyObject *kwnames):
    """FastcallNoopPool.free(addr)."""
    if kwnames is NULL and nargs == 1:
        as_u64(<object>args[0], "address")
        return None
    return ascm_fast_general(_NOOP_FREE, self, args, nargs, kwnames)


ascm_install_fast_method(<PyTypeObject *>Pool, _POOL_ALLOC, "alloc", <void *>_pool_alloc_entry)
ascm_install_fast_method(<PyTypeObject *>Pool, _POOL_FREE, "free", <void *>_pool_free_entry)
ascm_install_fast_method(<PyTypeObject *>Device, _DEVICE_MALLOC, "malloc",
                         <void *>_device_malloc_entry)
ascm_install_fast_method(<PyTypeObject *>Device, _DEVICE_FREE, "free", <void *>_device_free_entry)
ascm_install_fast_method(<PyTypeObject *>FastcallNoopPool, _NOOP_ALLOC, "alloc",
                         <void *>_noop_alloc_entry)
ascm_install_fast_method(<PyTypeObject *>FastcallNoopPool, _NOOP_FREE, "free",
                         <void *>_noop_free_entry)
