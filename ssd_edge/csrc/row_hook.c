/* row_hook.c: the row hook (native.h's row_hook_fn) that calls back into Python from the steps' loop, for a
 * hook written in Python (structured/rows.py's AnswerRows: a grammar's mask, penalties, a bias). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "native.h"

/* The hook's user pointer is a Python callable (a borrowed reference the caller keeps alive), called as
 * callable(row address or 0, n_vocab, position, previous) -> int, with the interpreter's lock taken for the
 * call. What it raises, a KeyboardInterrupt that arrives as it starts included, stays set on the calling
 * thread and the hook returns -1: the loop stops and native.steps raises it (a ctypes callback would print
 * it as "Exception ignored" and go on). */
int32_t py_row_hook(void *user, float *row, int64_t n_vocab, int64_t position, int32_t previous) {
    PyGILState_STATE g = PyGILState_Ensure();
    int32_t out = -1;
    PyObject *r = PyObject_CallFunction((PyObject *)user, "KLLi", (unsigned long long)(uintptr_t)row,
                                        (long long)n_vocab, (long long)position, (int)previous);
    if (r != NULL) {
        const long v = PyLong_AsLong(r);
        Py_DECREF(r);
        out = v == -1 && PyErr_Occurred() ? -1 : (v == 1);
    }
    PyGILState_Release(g);
    return out;
}
