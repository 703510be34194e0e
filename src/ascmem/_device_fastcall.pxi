# Device.malloc and Device.free as nearly every caller calls them: one or
# two positional arguments and no keywords.  Cython's wrapper of a def parses
# every parameter and takes a reference to each default it fills in: malloc
# has four (size, policy, stream, tag), and parsing them cost ~75
# instructions of a ~1,250-instruction Python Device pair at 64 B, where
# Pool.alloc's two cost ~50.  At import each method's descriptor is replaced
# by one whose C function takes that call straight to the method's body and
# hands every other call (keywords, more arguments, a wrong count) to
# Cython's wrapper, kept as it was: its argument errors, docstring and
# signature are the method's own.  Included by _core.pyx after _device.pxi.

from cpython.object cimport PyObject, PyTypeObject

cdef extern from *:
    """
    /* The body of a method for one or two positional arguments: a new
     * reference, or NULL with an exception set. */
    typedef PyObject *(*ascm_common_call)(PyObject *self, PyObject *first, PyObject *second);

    typedef struct {
        PyMethodDef def;                      /* the replacement's: Cython's, but ml_meth */
        _PyCFunctionFastWithKeywords general; /* Cython's wrapper: every other call */
        ascm_common_call common;
        PyObject *second;                     /* the second argument's default (owned) */
        Py_ssize_t most;                      /* 1 or 2: the positional counts common takes */
    } ascm_fast_method;

    static ascm_fast_method ascm_fast_methods[2];

    #define ASCM_FAST_ENTRY(i)                                                              \\
        static PyObject *ascm_fast_entry_##i(PyObject *self, PyObject *const *args,          \\
                                             Py_ssize_t nargs, PyObject *kwnames) {         \\
            const ascm_fast_method *m = &ascm_fast_methods[i];                              \\
            if (kwnames == NULL && nargs >= 1 && nargs <= m->most)                          \\
                return m->common(self, args[0], nargs == 2 ? args[1] : m->second);          \\
            return m->general(self, args, nargs, kwnames);                                  \\
        }
    ASCM_FAST_ENTRY(0)
    ASCM_FAST_ENTRY(1)
    static _PyCFunctionFastWithKeywords ascm_fast_entries[2] = {ascm_fast_entry_0, ascm_fast_entry_1};

    /* Puts fast method i in place of type's method `name`, which must be a
     * method descriptor taking METH_FASTCALL | METH_KEYWORDS (Cython's, with
     * binding=False).  0, or -1 with an exception set (nothing replaced). */
    static int ascm_install_fast_method(PyTypeObject *type, int i, const char *name, void *common,
                                        PyObject *second, Py_ssize_t most) {
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
        m->def.ml_meth = (PyCFunction)(void (*)(void))ascm_fast_entries[i];
        m->general = (_PyCFunctionFastWithKeywords)(void (*)(void))def->ml_meth;
        m->common = (ascm_common_call)common;
        Py_XINCREF(second);
        m->second = second;
        m->most = most;
        PyObject *fresh = PyDescr_NewMethod(type, &m->def);
        if (fresh == NULL) return -1;
        int st = PyDict_SetItemString(type->tp_dict, name, fresh);
        Py_DECREF(fresh);
        PyType_Modified(type);
        return st;
    }
    """
    int ascm_install_fast_method(PyTypeObject *type, int i, const char *name, void *common,
                                 PyObject *second, Py_ssize_t most) except -1


cdef object _malloc_positional(object self, object size, object policy):
    """Device.malloc(size[, policy])."""
    return _malloc(<Device>self, size, policy, None, None, ASCM_SIZE_MALLOC)


cdef object _free_positional(object self, object ptr, object unused):
    """Device.free(ptr)."""
    _device_free(<Device>self, ptr, _DEVICE_MASK, None, "free")
    return None


cdef object _malloc_policy_default = 0  # malloc(size): policy=0, as its signature
ascm_install_fast_method(<PyTypeObject *>Device, 0, "malloc", <void *>_malloc_positional,
                         <PyObject *>_malloc_policy_default, 2)
ascm_install_fast_method(<PyTypeObject *>Device, 1, "free", <void *>_free_positional, NULL, 1)
