/* The two loops of a prefix-aware routing decision, in C (benchmarks/decision_speed.py: a decision on an
 * 8k-token prompt may take 50 us, and these two took about 45 in numpy and Python):
 *
 * - chain: routing/block_hash.py's chained block hashes.
 * - walk: routing/prefix_index.py's match, the walk over a prompt's blocks in the index's holders.
 *
 * chain:
 * The hash is the polynomial S_t = S_(t-1) x Q + token_t mod 2^64, and block j's hash is S at its last token.
 * Per block that is h_j = h_(j-1) x Q^B + local_j, with local_j the block's own tokens in Horner's form: the
 * blocks' local sums do not depend on each other, so the processor overlaps them, and only the short chain
 * of h_j is sequential.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define Q 0xD6E8FEB86659FD93ULL /* the chain's base, odd; block_hash.py names it too */

/* A buffer of 8-byte unsigned machine integers in native order: array("Q"), numpy's uint64. */
static int
is_u64(const Py_buffer *view)
{
    const char *f = view->format;
    if (view->itemsize != 8 || view->ndim != 1 || f == NULL) {
        return 0;
    }
    if (*f == '@' || *f == '=' || *f == '<') { /* the machines calroute runs on are little-endian */
        f++;
    }
    return (strcmp(f, "Q") == 0 || strcmp(f, "L") == 0);
}

PyDoc_STRVAR(chain_doc,
             "chain(tokens, start, block_tokens, n_blocks, parent) -> list[int]\n\n"
             "The hashes of n_blocks full blocks of block_tokens tokens from token start on, chained from\n"
             "parent. tokens: a contiguous buffer of uint64 (array('Q'), numpy uint64).");

static PyObject *
chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "chain() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t block_tokens = PyLong_AsSsize_t(args[2]);
    Py_ssize_t n = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    uint64_t h = (uint64_t)PyLong_AsUnsignedLongLongMask(args[4]);
    if (h == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (start < 0 || block_tokens < 1 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "start and n_blocks must be >= 0, block_tokens >= 1");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    if (!is_u64(&view)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "tokens must be a contiguous buffer of uint64");
        return NULL;
    }
    Py_ssize_t len = view.len / 8;
    if (start > len || n > (len - start) / block_tokens) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the blocks run past the end of tokens");
        return NULL;
    }
    uint64_t *hashes = PyMem_Malloc(n > 0 ? (size_t)n * sizeof(uint64_t) : 1);
    if (hashes == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    uint64_t q_b = 1;
    for (Py_ssize_t k = 0; k < block_tokens; k++) {
        q_b *= Q;
    }
    const uint64_t *t = (const uint64_t *)view.buf + start;
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t local = 0;
        for (Py_ssize_t k = 0; k < block_tokens; k++) {
            local = local * Q + t[k];
        }
        t += block_tokens;
        h = h * q_b + local;
        hashes[j] = h;
    }
    PyBuffer_Release(&view);
    PyObject *out = PyList_New(n);
    if (out != NULL) {
        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *v = PyLong_FromUnsignedLongLong(hashes[j]);
            if (v == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, j, v);
        }
    }
    PyMem_Free(hashes);
    return out;
}

/* walk: the running set of engines as a machine word while it fits (up to 64 engines), else as Python ints. */

/* holders[blocks[i]], borrowed, or NULL (an error set, or none: not held). The block is held during the lookup,
 * and the list's length read again each step: a block that is not an int could run Python code (its __eq__)
 * and change the list. */
static PyObject *
lookup(PyObject *holders, PyObject *blocks, Py_ssize_t i)
{
    PyObject *key = Py_NewRef(PyList_GET_ITEM(blocks, i));
    PyObject *held = PyDict_GetItemWithError(holders, key);
    Py_DECREF(key);
    return held;
}

static PyObject *
drop_entry(Py_ssize_t i, PyObject *dropped)
{
    return Py_BuildValue("(nO)", i, dropped);
}

PyDoc_STRVAR(walk_doc,
             "walk(holders, blocks, running) -> (walked, drops, running, ended)\n\n"
             "Walk blocks (a list of ints) through holders (block -> bitmask of the engines holding it) while\n"
             "some engine of running holds every block so far. walked: the blocks walked; drops: (i, mask) for\n"
             "each place where engines left the running set, i the blocks walked before it; running: the\n"
             "engines that hold all walked blocks; ended: the walk stopped before the end of blocks (a block\n"
             "nobody holds, or nobody left running).");

static PyObject *
walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "walk() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *holders = args[0];
    if (!PyDict_Check(holders) || !PyList_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "walk(dict, list, int)");
        return NULL;
    }
    PyObject *blocks = args[1];
    PyObject *drops = PyList_New(0);
    if (drops == NULL) {
        return NULL;
    }
    Py_ssize_t i = 0;
    int ended = 0;
    int overflow = 0;
    unsigned long long word = PyLong_AsUnsignedLongLong(args[2]);
    if (word == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            goto fail;
        }
        PyErr_Clear();
        overflow = 1;
    }
    PyObject *running = NULL; /* the running set, a new reference */
    PyObject *last = NULL;    /* wide pools: the last block's holders, held (a key's __eq__ may change the dict) */
    if (!overflow) {
        ended = word == 0;
        for (; i < PyList_GET_SIZE(blocks) && !ended; i++) {
            PyObject *held = lookup(holders, blocks, i);
            if (held == NULL) {
                if (PyErr_Occurred()) {
                    goto fail;
                }
                ended = 1;
                break;
            }
            /* the low word is enough: running fits in it (holders of a wide pool may not) */
            unsigned long long h = PyLong_AsUnsignedLongLongMask(held);
            if (h == (unsigned long long)-1 && PyErr_Occurred()) {
                goto fail;
            }
            unsigned long long dropped = word & ~h;
            if (dropped) {
                PyObject *d = PyLong_FromUnsignedLongLong(dropped);
                PyObject *e = d == NULL ? NULL : drop_entry(i, d);
                Py_XDECREF(d);
                if (e == NULL || PyList_Append(drops, e) < 0) {
                    Py_XDECREF(e);
                    goto fail;
                }
                Py_DECREF(e);
                word &= h;
                if (word == 0) { /* nobody holds all blocks so far: none of the rest can hit */
                    ended = 1;
                    break;
                }
            }
        }
        running = PyLong_FromUnsignedLongLong(word);
    } else {
        /* Wide pools: Python ints, recomputed only where a block's holders differ from the last block's. */
        running = Py_NewRef(args[2]);
        int empty = PyObject_Not(running);
        if (empty < 0) {
            goto fail_running;
        }
        ended = empty;
        for (; i < PyList_GET_SIZE(blocks) && !ended; i++) {
            PyObject *held = lookup(holders, blocks, i);
            if (held == NULL) {
                if (PyErr_Occurred()) {
                    goto fail_running;
                }
                ended = 1;
                break;
            }
            if (last != NULL) {
                /* the same holders as the last block's: running, already within them, keeps everyone */
                int same = held == last ? 1 : PyObject_RichCompareBool(held, last, Py_EQ);
                if (same < 0) {
                    goto fail_running;
                }
                if (same) {
                    continue;
                }
            }
            Py_XSETREF(last, Py_NewRef(held));
            PyObject *kept = PyNumber_And(running, held);
            if (kept == NULL) {
                goto fail_running;
            }
            PyObject *dropped = PyNumber_Xor(running, kept);
            if (dropped == NULL) {
                Py_DECREF(kept);
                goto fail_running;
            }
            Py_SETREF(running, kept);
            int any = PyObject_IsTrue(dropped);
            if (any > 0) {
                PyObject *e = drop_entry(i, dropped);
                if (e == NULL || PyList_Append(drops, e) < 0) {
                    Py_XDECREF(e);
                    Py_DECREF(dropped);
                    goto fail_running;
                }
                Py_DECREF(e);
            }
            Py_DECREF(dropped);
            if (any < 0) {
                goto fail_running;
            }
            int gone = PyObject_Not(running);
            if (gone < 0) {
                goto fail_running;
            }
            if (gone) {
                ended = 1;
                break;
            }
        }
    }
    Py_XDECREF(last);
    if (running == NULL) {
        goto fail;
    }
    PyObject *out = Py_BuildValue("(nOOO)", i, drops, running, ended ? Py_True : Py_False);
    Py_DECREF(running);
    Py_DECREF(drops);
    return out;
fail_running:
    Py_DECREF(running);
    Py_XDECREF(last);
fail:
    Py_DECREF(drops);
    return NULL;
}

static PyMethodDef methods[] = {
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL, chain_doc},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The prefix-aware decision's two loops in C (routing/block_hash.py, routing/prefix_index.py).", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModule_Create(&module);
}
