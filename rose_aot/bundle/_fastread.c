/* rose_aot.bundle._fastread: the bundle reader's two per-open loops in C.
 *
 * A serving process reads one bundle index (a few hundred JSON objects) and checks every
 * cubin it loads against its record at each start; in Python these two loops were about a
 * fifth of DeepSeek-V3's open + preload. Both functions here are fast paths of a Python
 * reference that stays the definition (rose_aot/bundle/format.py, rose_aot/bundle/cubin.py):
 * they accept a subset of what the reference accepts, return exactly what it returns, and
 * otherwise decline, so that the caller runs the reference, which raises its own precise
 * error (or, for the rare shapes declined below, reads the input itself). The tests compare
 * both on every shipped cubin and on thousands of damaged ones.
 *
 *   _fastread.sorted_object(pairs)  -> dict, or ValueError when the keys do not strictly
 *                                      increase (json.loads' object_pairs_hook)
 *   _fastread.cubin_facts(data)     -> {entry: (reqntid, maxntid, params, param_bytes,
 *                                      registers, static_smem)}, or None: run read_cubin's
 *                                      Python reader
 *
 * Every offset and size of the ELF is checked against the file before it is used, in 64-bit
 * arithmetic that cannot wrap (each operand is first bounded by the file size).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ sorted_object */

static PyObject *sorted_object(PyObject *module, PyObject *pairs) {
    if (!PyList_CheckExact(pairs)) {
        PyErr_SetString(PyExc_TypeError, "sorted_object: pairs must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    PyObject *obj = PyDict_New();
    if (obj == NULL) return NULL;
    PyObject *previous = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_ValueError, "sorted_object: not a (str, value) pair");
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(pair, 0);
        /* Strictly increasing code points: sorted, and no key twice. */
        if (previous != NULL) {
            int order = PyUnicode_Compare(previous, key);
            if (order == -1 && PyErr_Occurred()) goto fail;
            if (order >= 0) {
                PyErr_SetString(PyExc_ValueError, "keys do not strictly increase");
                goto fail;
            }
        }
        if (PyDict_SetItem(obj, key, PyTuple_GET_ITEM(pair, 1)) < 0) goto fail;
        previous = key;
    }
    return obj;
fail:
    Py_DECREF(obj);
    return NULL;
}

/* ------------------------------------------------------------------ cubin_facts */

/* Declined (the Python reader decides): more entries than this (its dicts scale, a linear
 * lookup here would not), section header entries of another size, symbol entries of another
 * size, and names with bytes outside ASCII (Python decodes them with replacement characters,
 * which can make two names equal). Real cubins have a few entries and none of these. */
#define MAX_ENTRIES 64

enum {
    EIFMT_SVAL = 0x04,
    EIATTR_MAX_THREADS = 0x05,
    EIATTR_REQNTID = 0x10,
    EIATTR_KPARAM_INFO = 0x17,
    EIATTR_CBANK_PARAM_SIZE = 0x19,
    EIATTR_REGCOUNT = 0x2F,
    SHT_SYMTAB = 2,
    SHT_NOBITS = 8,
    SHDR_SIZE = 64,
    SYM_SIZE = 24,
};

enum { DECLINE = 0, OK = 1 };

typedef struct {
    const unsigned char *name;
    size_t len;
    int has_reqntid, has_maxntid, has_param_bytes, has_registers;
    uint32_t reqntid[3], maxntid[3];
    uint32_t param_bytes, registers;
    uint64_t static_smem;
    PyObject *params; /* list of (ordinal, offset, size), built as the records are read */
} Entry;

typedef struct {
    const unsigned char *data;
    uint64_t size;
    int64_t last_nul; /* -1: none */
    Entry entries[MAX_ENTRIES];
    int nentries;
} Cubin;

static uint16_t u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t u64(const unsigned char *p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

/* The C string at `offset` (< last_nul, so terminated in the file); DECLINE if not ASCII. */
static int cstring(const Cubin *c, uint64_t offset, const unsigned char **name, size_t *len) {
    const unsigned char *s = c->data + offset;
    size_t n = strlen((const char *)s);
    for (size_t i = 0; i < n; i++)
        if (s[i] & 0x80) return DECLINE;
    *name = s;
    *len = n;
    return OK;
}

static Entry *find(Cubin *c, const unsigned char *name, size_t len) {
    for (int i = 0; i < c->nentries; i++)
        if (c->entries[i].len == len && memcmp(c->entries[i].name, name, len) == 0)
            return &c->entries[i];
    return NULL;
}

static int starts(const Cubin *c, uint64_t offset, const char *prefix) {
    size_t n = strlen(prefix);
    return offset + n <= c->size && memcmp(c->data + offset, prefix, n) == 0;
}

/* A section's file bytes (none for SHT_NOBITS); DECLINE where they pass the end of the file. */
static int section_bytes(const Cubin *c, const unsigned char *sec, const unsigned char **body,
                         uint64_t *len) {
    if (u32(sec + 4) == SHT_NOBITS) {
        *body = c->data;
        *len = 0;
        return OK;
    }
    uint64_t offset = u64(sec + 24), size = u64(sec + 32);
    if (offset > c->size || size > c->size - offset) return DECLINE;
    *body = c->data + offset;
    *len = size;
    return OK;
}

/* An entry's .nv.info section: block size, parameters, parameter bytes. -1: a Python error. */
static int entry_info(const unsigned char *body, uint64_t end, Entry *owner) {
    uint64_t pos = 0;
    while (pos + 4 <= end) {
        unsigned fmt = body[pos], attr = body[pos + 1], value = u16(body + pos + 2);
        pos += 4;
        if (fmt != EIFMT_SVAL) {
            if (attr == EIATTR_CBANK_PARAM_SIZE) {
                owner->has_param_bytes = 1;
                owner->param_bytes = value;
            }
            continue;
        }
        const unsigned char *payload = body + pos;
        pos += value;
        if (pos > end) return DECLINE;
        if (value < 12) continue;
        if (attr == EIATTR_KPARAM_INFO) {
            PyObject *param = Py_BuildValue("(III)", (unsigned)u16(payload + 4),
                                            (unsigned)u16(payload + 6), u32(payload + 8) >> 18);
            if (param == NULL) return -1;
            int failed = PyList_Append(owner->params, param);
            Py_DECREF(param);
            if (failed) return -1;
        } else if (attr == EIATTR_REQNTID || attr == EIATTR_MAX_THREADS) {
            uint32_t *dims = attr == EIATTR_REQNTID ? owner->reqntid : owner->maxntid;
            *(attr == EIATTR_REQNTID ? &owner->has_reqntid : &owner->has_maxntid) = 1;
            for (int k = 0; k < 3; k++) dims[k] = u32(payload + 4 * k);
        }
    }
    return OK;
}

/* The global .nv.info section: the REGCOUNT of each entry, by its symbol's name. */
static int global_info(Cubin *c, const unsigned char *body, uint64_t end, const uint64_t *symbols,
                       uint64_t nsymbols) {
    uint64_t pos = 0;
    while (pos + 4 <= end) {
        unsigned fmt = body[pos], attr = body[pos + 1], value = u16(body + pos + 2);
        pos += 4;
        if (fmt != EIFMT_SVAL) continue;
        const unsigned char *payload = body + pos;
        pos += value;
        if (pos > end) return DECLINE;
        if (attr == EIATTR_REGCOUNT && value >= 8) {
            uint32_t symbol = u32(payload), count = u32(payload + 4);
            if (symbol >= nsymbols) continue;
            const unsigned char *name = c->data + symbols[symbol]; /* <= last_nul: terminated */
            Entry *entry = find(c, name, strlen((const char *)name));
            if (entry != NULL) {
                entry->has_registers = 1;
                entry->registers = count;
            }
        }
    }
    return OK;
}

static PyObject *dims_or_none(int has, const uint32_t dims[3]) {
    if (!has) Py_RETURN_NONE;
    return Py_BuildValue("(III)", dims[0], dims[1], dims[2]);
}

static PyObject *uint_or_none(int has, uint32_t value) {
    if (!has) Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(value);
}

/* The walk of read_cubin (cubin.py), pass for pass: section names, symbol tables, then the
 * shared memory sizes and .nv.info sections in file order. OK, DECLINE, or -1 (Python error).
 */
static int read_sections(Cubin *c, uint64_t **symbols_out, uint64_t *nsymbols_out) {
    const unsigned char *data = c->data;
    uint64_t size = c->size;
    if (size < 64 || memcmp(data, "\x7f" "ELF", 4) != 0 || data[4] != 2 || data[5] != 1)
        return DECLINE;
    uint64_t shoff = u64(data + 0x28);
    unsigned shentsize = u16(data + 0x3A), shnum = u16(data + 0x3C), shstrndx = u16(data + 0x3E);
    if (shentsize != SHDR_SIZE || shnum == 0 || shstrndx >= shnum) return DECLINE;
    if (shoff > size || (uint64_t)shnum * SHDR_SIZE > size - shoff) return DECLINE;
    const unsigned char *table = data + shoff;
#define SECTION(i) (table + (uint64_t)(i) * SHDR_SIZE)
    uint64_t str_offset = u64(SECTION(shstrndx) + 24);
    if (c->last_nul < 0 || str_offset > (uint64_t)c->last_nul) return DECLINE; /* every name bad */

    /* Pass 1: entries from .text.<entry>; every name must be a string of the file. */
    for (unsigned i = 0; i < shnum; i++) {
        uint64_t offset = str_offset + u32(SECTION(i)); /* both < 2^63: no wrap */
        if (offset > (uint64_t)c->last_nul) return DECLINE;
        if (offset == (uint64_t)c->last_nul || !starts(c, offset, ".text.")) continue;
        const unsigned char *name;
        size_t len;
        if (!cstring(c, offset + 6, &name, &len)) return DECLINE;
        if (find(c, name, len) != NULL) continue; /* a dict keeps the first position */
        if (c->nentries == MAX_ENTRIES) return DECLINE;
        Entry *e = &c->entries[c->nentries];
        memset(e, 0, sizeof *e);
        e->name = name;
        e->len = len;
        if ((e->params = PyList_New(0)) == NULL) return -1;
        c->nentries++;
    }

    /* Pass 2: symbol tables (by type), whose names the global .nv.info refers to. */
    uint64_t nsymbols = 0, capacity = 0;
    uint64_t *symbols = NULL;
    for (unsigned i = 0; i < shnum; i++) {
        const unsigned char *sec = SECTION(i);
        if (u32(sec + 4) != SHT_SYMTAB) continue;
        uint32_t link = u32(sec + 40);
        uint64_t entsize = u64(sec + 56);
        if (link >= shnum || entsize != SYM_SIZE) goto decline;
        uint64_t strtab = u64(SECTION(link) + 24);
        const unsigned char *body;
        uint64_t len;
        if (!section_bytes(c, sec, &body, &len)) goto decline;
        uint64_t count = len / SYM_SIZE;
        if (count && strtab > (uint64_t)c->last_nul) goto decline;
        if (nsymbols + count > capacity) {
            capacity = 2 * (nsymbols + count);
            uint64_t *grown = PyMem_Realloc(symbols, capacity * sizeof *symbols);
            if (grown == NULL) {
                PyMem_Free(symbols);
                PyErr_NoMemory();
                return -1;
            }
            symbols = grown;
        }
        for (uint64_t j = 0; j < count; j++) {
            uint64_t name = strtab + u32(body + j * SYM_SIZE);
            if (name > (uint64_t)c->last_nul) goto decline;
            symbols[nsymbols++] = name;
        }
    }

    /* Pass 3: shared memory sizes and .nv.info sections, in file order. */
    for (unsigned i = 0; i < shnum; i++) {
        const unsigned char *sec = SECTION(i);
        uint64_t offset = str_offset + u32(sec);
        if (offset == (uint64_t)c->last_nul) continue;
        const unsigned char *name, *body;
        size_t len;
        uint64_t body_len;
        int status = OK;
        if (starts(c, offset, ".nv.shared.")) {
            if (!cstring(c, offset + 11, &name, &len)) goto decline;
            Entry *e = find(c, name, len);
            if (e != NULL) e->static_smem = u64(sec + 32);
        } else if (starts(c, offset, ".nv.info")) {
            unsigned char next = data[offset + 8]; /* <= last_nul: ".nv.info" has no NUL */
            if (next == 0) {
                if (!section_bytes(c, sec, &body, &body_len)) goto decline;
                status = global_info(c, body, body_len, symbols, nsymbols);
            } else if (next == '.') {
                if (!cstring(c, offset + 9, &name, &len)) goto decline;
                Entry *e = find(c, name, len);
                if (e != NULL) {
                    if (!section_bytes(c, sec, &body, &body_len)) goto decline;
                    status = entry_info(body, body_len, e);
                }
            }
        }
        if (status != OK) {
            PyMem_Free(symbols);
            return status;
        }
    }
#undef SECTION
    *symbols_out = symbols;
    *nsymbols_out = nsymbols;
    return OK;
decline:
    PyMem_Free(symbols);
    return DECLINE;
}

static PyObject *cubin_facts(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        /* Not one contiguous buffer (a str, a strided memoryview): the Python reader takes
         * bytes(data) or raises its own TypeError. */
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_BufferError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Cubin *c = PyMem_Calloc(1, sizeof *c);
    if (c == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    c->data = view.buf;
    c->size = (uint64_t)view.len;
    c->last_nul = -1;
    for (Py_ssize_t i = view.len; i-- > 0;)
        if (c->data[i] == 0) {
            c->last_nul = i;
            break;
        }
    uint64_t *symbols = NULL, nsymbols = 0;
    PyObject *result = NULL;
    int status = read_sections(c, &symbols, &nsymbols);
    PyMem_Free(symbols);
    if (status == DECLINE) {
        result = Py_NewRef(Py_None);
    } else if (status == OK) {
        result = PyDict_New();
        for (int i = 0; result != NULL && i < c->nentries; i++) {
            Entry *e = &c->entries[i];
            PyObject *name = PyUnicode_DecodeASCII((const char *)e->name, (Py_ssize_t)e->len, NULL);
            PyObject *facts = NULL;
            if (name != NULL)
                facts = Py_BuildValue("(NNONNK)", dims_or_none(e->has_reqntid, e->reqntid),
                                      dims_or_none(e->has_maxntid, e->maxntid), e->params,
                                      uint_or_none(e->has_param_bytes, e->param_bytes),
                                      uint_or_none(e->has_registers, e->registers),
                                      (unsigned long long)e->static_smem);
            if (facts == NULL || PyDict_SetItem(result, name, facts) < 0) Py_CLEAR(result);
            Py_XDECREF(name);
            Py_XDECREF(facts);
        }
    }
    for (int i = 0; i < c->nentries; i++) Py_XDECREF(c->entries[i].params);
    PyMem_Free(c);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"sorted_object", sorted_object, METH_O,
     "sorted_object(pairs) -> dict of the (str, value) pairs, whose keys must strictly\n"
     "increase (else ValueError): json.loads' object_pairs_hook for a bundle index."},
    {"cubin_facts", cubin_facts, METH_O,
     "cubin_facts(data) -> {entry: (reqntid, maxntid, params, param_bytes, registers,\n"
     "static_smem)} as rose_aot.bundle.cubin.read_cubin reads them, or None where that reader\n"
     "must decide (a damaged file, or a shape this one does not read)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastread",
    "The bundle reader's per-open loops in C (see _fastread.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastread(void) { return PyModule_Create(&module); }
