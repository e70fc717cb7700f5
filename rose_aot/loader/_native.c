/* rose_aot.loader._native: a kernel handle's hot path in C.
 *
 * The loader generates, per argument spec, Python checks that accept exactly the well-formed
 * calls and read what the kernel parameters carry (data pointers, dynamic extents and
 * strides, scalars: the "atoms"; rose_aot/loader/args.py, ArgBinder._generate_checks). This
 * module runs the same checks from the same spec as data, looks up the launcher resolved for
 * (device, sizes), writes the atoms into that launcher's parameter buffers and calls
 * cuLaunchKernelEx: one C call per launch from Python, no interpreted checks or packing, no
 * ctypes or cuda.bindings argument conversion, no lock object.
 *
 *   go = _native.plan(cuLaunchKernelEx_address, fail, natoms, launches)   # a Launcher
 *   go(stream, *atoms)                        # pack + launch; None, or raises
 *   checker = _native.checker(spec, tensor_types)
 *   _native.bind(checker, values)             # (device, sizes, atoms) or None: fast_bind's twin
 *   _native.fast(checker, launchers, stream_of, values)   # True if launched, else False
 *
 * Threads: a Launcher owns its buffers, and a launch holds the GIL from the first field it
 * writes to its last driver call, running no Python code in between (atoms must be exact ints
 * or floats), so two threads never interleave on one Launcher. The loader falls back to its
 * generated Python where this module is missing (built per CPython version by
 * `pip install`; no CUDA headers needed: the driver entry point comes as an address).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The CUDA driver's launch structures (cuda.h, stable since CUDA 12.0), declared here so that
 * building needs no CUDA headers. */
typedef struct {
    unsigned int id;
    char pad[4];
    unsigned int value[16]; /* CUlaunchAttributeValue: a 64-byte union */
} LaunchAttribute;

typedef struct {
    unsigned int grid[3], block[3], shared_mem;
    void *stream;
    LaunchAttribute *attrs;
    unsigned int num_attrs;
} LaunchConfig;

typedef int (*LaunchKernelEx)(const LaunchConfig *, void *, void **, void **);

enum { F_U64, F_I64, F_I32, F_U32, F_F32, F_F64 };

typedef struct {
    uint32_t offset; /* in the launch's buffer */
    uint8_t kind;
    int32_t atom; /* index into the call's atoms */
} Field;

typedef struct {
    LaunchConfig config;
    void *function;
    void **params;  /* kernelParams: one pointer per parameter, into buffer */
    char *buffer;
    Py_ssize_t buffer_size;
    Field *fields;  /* the fields that come from atoms (constants are written once) */
    Py_ssize_t nfields;
} Launch;

typedef struct {
    LaunchKernelEx launch_ex;
    PyObject *fail; /* fail(code, launch index): raises the loader's DeviceError */
    Py_ssize_t natoms;
    Py_ssize_t nlaunches;
    Launch launches[];
} Plan;

/* A resolved plan as a callable: go(stream, *atoms). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Plan *plan;
} Launcher;

static PyTypeObject LauncherType;

/* A launcher and its `fail` (a method of the handle that holds the launcher) form a cycle:
 * the launcher takes part in garbage collection so that a dropped handle is freed. */
static int launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    if (self->plan != NULL) Py_VISIT(self->plan->fail);
    return 0;
}

static int launcher_clear(Launcher *self) {
    if (self->plan != NULL) Py_CLEAR(self->plan->fail);
    return 0;
}

static void launcher_dealloc(Launcher *self) {
    PyObject_GC_UnTrack(self);
    launcher_clear(self);
    PyMem_Free(self->plan);
    PyObject_GC_Del(self);
}

static int field_kind(PyObject *fmt) {
    const char *s = PyUnicode_AsUTF8AndSize(fmt, NULL);
    if (s == NULL) return -1;
    if (strlen(s) == 1) {
        switch (s[0]) {
            case 'Q': return F_U64;
            case 'q': return F_I64;
            case 'i': return F_I32;
            case 'I': return F_U32;
            case 'f': return F_F32;
            case 'd': return F_F64;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown parameter field format %R (Q, q, i, I, f or d)", fmt);
    return -1;
}

static size_t field_size(int kind) {
    return (kind == F_I32 || kind == F_U32 || kind == F_F32) ? 4 : 8;
}

/* Write `value` as field `kind` at `at`. -1 with OverflowError/TypeError when it does not fit
 * (struct.pack's rules), nothing else touched. Exact ints and floats only: anything else could
 * run Python code (__index__, __float__) and so let another thread in mid-launch. */
static int write_field(char *at, int kind, PyObject *value) {
    if (kind == F_F32 || kind == F_F64) {
        double x;
        if (PyFloat_CheckExact(value)) {
            x = PyFloat_AsDouble(value);
        } else if (PyLong_CheckExact(value)) {
            x = PyLong_AsDouble(value);
            if (x == -1.0 && PyErr_Occurred()) return -1;
        } else {
            PyErr_SetString(PyExc_TypeError, "a float parameter takes a float or an int");
            return -1;
        }
        if (kind == F_F64) {
            memcpy(at, &x, 8);
            return 0;
        }
        float y = (float)x;
        if (isinf(y) && !isinf(x)) {
            PyErr_SetString(PyExc_OverflowError, "float too large to pack as float32");
            return -1;
        }
        memcpy(at, &y, 4);
        return 0;
    }
    if (!PyLong_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "an integer parameter takes an int");
        return -1;
    }
    if (kind == F_U64) {
        unsigned long long v = PyLong_AsUnsignedLongLong(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        memcpy(at, &v, 8);
        return 0;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (kind == F_I64) {
        memcpy(at, &v, 8);
    } else if (kind == F_I32) {
        if (v < INT32_MIN || v > INT32_MAX) goto overflow;
        int32_t w = (int32_t)v;
        memcpy(at, &w, 4);
    } else {
        if (v < 0 || v > (long long)UINT32_MAX) goto overflow;
        uint32_t w = (uint32_t)v;
        memcpy(at, &w, 4);
    }
    return 0;
overflow:
    PyErr_Format(PyExc_OverflowError, "%lld does not fit a %s parameter field", v,
                 kind == F_I32 ? "int32" : "uint32");
    return -1;
}

static int as_uint(PyObject *seq, Py_ssize_t i, unsigned int *out) {
    PyObject *item = PySequence_GetItem(seq, i);
    if (item == NULL) return -1;
    unsigned long v = PyLong_AsUnsignedLong(item);
    Py_DECREF(item);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a launch dimension does not fit 32 bits");
        return -1;
    }
    *out = (unsigned int)v;
    return 0;
}

static int uint_triple(PyObject *seq, unsigned int out[3], const char *what) {
    if (!PySequence_Check(seq) || PySequence_Size(seq) != 3) {
        PyErr_Format(PyExc_ValueError, "%s must be 3 integers", what);
        return -1;
    }
    for (Py_ssize_t i = 0; i < 3; i++)
        if (as_uint(seq, i, &out[i])) return -1;
    return 0;
}

/* One launch's description, checked; sizes of what it needs in the plan's block. */
typedef struct {
    PyObject *function, *grid, *block, *smem, *attrs, *buffer_size, *param_offsets, *fields;
    Py_ssize_t nattrs, nparams, nfields, natom_fields;
    size_t buffer_bytes;
} Desc;

static int describe(PyObject *item, Py_ssize_t natoms, Desc *d) {
    if (!PyTuple_Check(item) || PyTuple_Size(item) != 8) {
        PyErr_SetString(PyExc_ValueError,
                        "a launch is (function, grid, block, smem, attrs, buffer_size, "
                        "param_offsets, fields)");
        return -1;
    }
    PyObject **slots[8] = {&d->function, &d->grid, &d->block, &d->smem, &d->attrs,
                           &d->buffer_size, &d->param_offsets, &d->fields};
    for (Py_ssize_t i = 0; i < 8; i++) *slots[i] = PyTuple_GetItem(item, i);
    if (!PyTuple_Check(d->attrs) || !PyTuple_Check(d->param_offsets) ||
        !PyTuple_Check(d->fields)) {
        PyErr_SetString(PyExc_ValueError, "attrs, param_offsets and fields must be tuples");
        return -1;
    }
    d->nattrs = PyTuple_Size(d->attrs);
    d->nparams = PyTuple_Size(d->param_offsets);
    d->nfields = PyTuple_Size(d->fields);
    if (d->nattrs > 8) {
        PyErr_SetString(PyExc_ValueError, "at most 8 launch attributes");
        return -1;
    }
    Py_ssize_t size = PyLong_AsSsize_t(d->buffer_size);
    if (size == -1 && PyErr_Occurred()) return -1;
    if (size < 8 || size > (1 << 16)) {
        PyErr_Format(PyExc_ValueError, "parameter buffer of %zd bytes (8 to 65536)", size);
        return -1;
    }
    d->buffer_bytes = ((size_t)size + 15) & ~(size_t)15;
    for (Py_ssize_t p = 0; p < d->nparams; p++) {
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GetItem(d->param_offsets, p));
        if (off == -1 && PyErr_Occurred()) return -1;
        if (off < 0 || off >= size) {
            PyErr_Format(PyExc_ValueError, "parameter offset %zd outside the %zd-byte buffer",
                         off, size);
            return -1;
        }
    }
    d->natom_fields = 0;
    for (Py_ssize_t f = 0; f < d->nfields; f++) {
        PyObject *field = PyTuple_GetItem(d->fields, f);
        if (!PyTuple_Check(field) || PyTuple_Size(field) != 4) {
            PyErr_SetString(PyExc_ValueError, "a field is (offset, format, atom, constant)");
            return -1;
        }
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GetItem(field, 0));
        if (off == -1 && PyErr_Occurred()) return -1;
        int kind = field_kind(PyTuple_GetItem(field, 1));
        if (kind < 0) return -1;
        if (off < 0 || (size_t)off + field_size(kind) > (size_t)size ||
            off % (Py_ssize_t)field_size(kind)) {
            PyErr_Format(PyExc_ValueError,
                         "field at offset %zd does not lie aligned inside the %zd-byte buffer",
                         off, size);
            return -1;
        }
        Py_ssize_t atom = PyLong_AsSsize_t(PyTuple_GetItem(field, 2));
        if (atom == -1 && PyErr_Occurred()) return -1;
        if (atom < -1 || atom >= natoms) {
            PyErr_Format(PyExc_ValueError, "field atom %zd outside the call's %zd atoms", atom,
                         natoms);
            return -1;
        }
        if (atom >= 0) d->natom_fields++;
    }
    return 0;
}

static PyObject *launcher_call(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames);

static PyObject *make_plan(PyObject *module, PyObject *args) {
    PyObject *address, *fail, *launches;
    Py_ssize_t natoms;
    if (!PyArg_ParseTuple(args, "OOnO:plan", &address, &fail, &natoms, &launches)) return NULL;
    void *launch_ex = PyLong_AsVoidPtr(address);
    if (launch_ex == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "the cuLaunchKernelEx address is NULL");
        return NULL;
    }
    if (!PyCallable_Check(fail)) {
        PyErr_SetString(PyExc_TypeError, "fail must be callable");
        return NULL;
    }
    /* 0 launches: the plan of an empty batch (no tokens), a launcher that launches nothing */
    if (natoms < 0 || !PyTuple_Check(launches) || PyTuple_Size(launches) > 16) {
        PyErr_SetString(PyExc_ValueError, "a plan has 0 to 16 launches (a tuple)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_Size(launches);
    Desc descs[16];
    /* One block: the plan, then per launch its attributes, kernelParams, atom fields, buffer. */
    size_t bytes = sizeof(Plan) + (size_t)n * sizeof(Launch);
    for (Py_ssize_t j = 0; j < n; j++) {
        if (describe(PyTuple_GetItem(launches, j), natoms, &descs[j])) return NULL;
        bytes = (bytes + 15) & ~(size_t)15;
        bytes += (size_t)descs[j].nattrs * sizeof(LaunchAttribute) +
                 (size_t)(descs[j].nparams > 0 ? descs[j].nparams : 1) * sizeof(void *) +
                 (size_t)descs[j].natom_fields * sizeof(Field);
        bytes = (bytes + 15) & ~(size_t)15;
        bytes += descs[j].buffer_bytes;
    }
    Plan *plan = (Plan *)PyMem_Calloc(1, bytes);
    if (plan == NULL) return PyErr_NoMemory();
    plan->launch_ex = (LaunchKernelEx)launch_ex;
    plan->natoms = natoms;
    plan->nlaunches = n;
    char *cursor = (char *)&plan->launches[n];
    for (Py_ssize_t j = 0; j < n; j++) {
        Desc *d = &descs[j];
        Launch *L = &plan->launches[j];
        cursor = (char *)(((uintptr_t)cursor + 15) & ~(uintptr_t)15);
        L->config.attrs = (LaunchAttribute *)cursor;
        cursor += d->nattrs * sizeof(LaunchAttribute);
        L->params = (void **)cursor;
        cursor += (d->nparams > 0 ? d->nparams : 1) * sizeof(void *);
        L->fields = (Field *)cursor;
        cursor += d->natom_fields * sizeof(Field);
        cursor = (char *)(((uintptr_t)cursor + 15) & ~(uintptr_t)15);
        L->buffer = cursor;
        L->buffer_size = PyLong_AsSsize_t(d->buffer_size);
        cursor += d->buffer_bytes;

        L->function = PyLong_AsVoidPtr(d->function);
        if (L->function == NULL && PyErr_Occurred()) goto error;
        if (uint_triple(d->grid, L->config.grid, "grid") ||
            uint_triple(d->block, L->config.block, "block"))
            goto error;
        unsigned long smem = PyLong_AsUnsignedLong(d->smem);
        if (smem == (unsigned long)-1 && PyErr_Occurred()) goto error;
        L->config.shared_mem = (unsigned int)smem;
        L->config.num_attrs = (unsigned int)d->nattrs;
        for (Py_ssize_t a = 0; a < d->nattrs; a++) {
            PyObject *attr = PyTuple_GetItem(d->attrs, a);  /* (id, (values...)) */
            PyObject *values = PyTuple_Check(attr) && PyTuple_Size(attr) == 2
                                   ? PyTuple_GetItem(attr, 1) : NULL;
            if (values == NULL || !PyTuple_Check(values) || PyTuple_Size(values) > 16) {
                PyErr_SetString(PyExc_ValueError, "an attribute is (id, (up to 16 values))");
                goto error;
            }
            if (as_uint(attr, 0, &L->config.attrs[a].id)) goto error;
            for (Py_ssize_t k = 0; k < PyTuple_Size(values); k++)
                if (as_uint(values, k, &L->config.attrs[a].value[k])) goto error;
        }
        for (Py_ssize_t p = 0; p < d->nparams; p++)
            L->params[p] = L->buffer + PyLong_AsSsize_t(PyTuple_GetItem(d->param_offsets, p));
        for (Py_ssize_t f = 0; f < d->nfields; f++) {
            PyObject *field = PyTuple_GetItem(d->fields, f);
            Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GetItem(field, 0));
            int kind = field_kind(PyTuple_GetItem(field, 1));
            Py_ssize_t atom = PyLong_AsSsize_t(PyTuple_GetItem(field, 2));
            if (atom < 0) {  /* a constant of the record: written once, here */
                if (write_field(L->buffer + off, kind, PyTuple_GetItem(field, 3))) goto error;
            } else {
                Field *slot = &L->fields[L->nfields++];
                slot->offset = (uint32_t)off;
                slot->kind = (uint8_t)kind;
                slot->atom = (int32_t)atom;
            }
        }
    }
    Launcher *go = PyObject_GC_New(Launcher, &LauncherType);
    if (go == NULL) goto error;
    go->vectorcall = launcher_call;
    Py_INCREF(fail);
    plan->fail = fail;
    go->plan = plan;
    PyObject_GC_Track(go);
    return (PyObject *)go;
error:
    PyMem_Free(plan);
    return NULL;
}

/* Write the atoms into every launch's buffer. Every buffer is written before the first driver
 * call, so a value that does not fit its field launches nothing. */
static int pack_atoms(Plan *plan, PyObject *const *atoms) {
    for (Py_ssize_t j = 0; j < plan->nlaunches; j++) {
        Launch *L = &plan->launches[j];
        for (Py_ssize_t f = 0; f < L->nfields; f++) {
            Field *field = &L->fields[f];
            if (write_field(L->buffer + field->offset, field->kind, atoms[field->atom]))
                return -1;
        }
    }
    return 0;
}

/* Pack, then cuLaunchKernelEx each launch on `stream` (an exact int). */
static PyObject *run_plan(Plan *plan, PyObject *stream_obj, PyObject *const *atoms) {
    if (!PyLong_CheckExact(stream_obj)) {
        PyErr_SetString(PyExc_TypeError, "the stream is an int (a raw CUstream)");
        return NULL;
    }
    void *stream = (void *)(uintptr_t)PyLong_AsUnsignedLongLong(stream_obj);
    if (stream == (void *)(uintptr_t)-1 && PyErr_Occurred()) return NULL;
    if (pack_atoms(plan, atoms)) return NULL;
    for (Py_ssize_t j = 0; j < plan->nlaunches; j++) {
        Launch *L = &plan->launches[j];
        L->config.stream = stream;
        int code = plan->launch_ex(&L->config, L->function, L->params, NULL);
        if (code != 0) {
            if (plan->fail != NULL) {
                PyObject *r = PyObject_CallFunction(plan->fail, "in", code, j);
                if (r == NULL) return NULL;
                Py_DECREF(r);
            }
            PyErr_Format(PyExc_RuntimeError, "launch %zd failed with CUresult %d", j, code);
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *launcher_call(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Plan *plan = ((Launcher *)self)->plan;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "a launcher takes no keyword arguments");
        return NULL;
    }
    if (nargs != plan->natoms + 1) {
        PyErr_Format(PyExc_TypeError, "launcher(stream, *atoms) takes %zd atoms, got %zd",
                     plan->natoms, nargs - 1);
        return NULL;
    }
    return run_plan(plan, args[0], args + 1);
}

static Launcher *as_launcher(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &LauncherType)) {
        PyErr_SetString(PyExc_TypeError, "not a rose_aot launcher (made by _native.plan)");
        return NULL;
    }
    return (Launcher *)obj;
}

/* pack(go, *atoms): the buffers as a launch would write them, without launching. */
static PyObject *pack(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Launcher *go = nargs >= 1 ? as_launcher(args[0]) : NULL;
    if (go == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "pack(launcher, *atoms)");
        return NULL;
    }
    if (nargs - 1 != go->plan->natoms) {
        PyErr_Format(PyExc_TypeError, "the plan takes %zd atoms, got %zd", go->plan->natoms,
                     nargs - 1);
        return NULL;
    }
    if (pack_atoms(go->plan, args + 1)) return NULL;
    Py_RETURN_NONE;
}

/* buffer(go, j): the bytes of launch j's parameter buffer (tests compare them with the Python
 * packer's). */
static PyObject *plan_buffer(PyObject *module, PyObject *args) {
    PyObject *obj;
    Py_ssize_t j;
    if (!PyArg_ParseTuple(args, "On:buffer", &obj, &j)) return NULL;
    Launcher *go = as_launcher(obj);
    if (go == NULL) return NULL;
    if (j < 0 || j >= go->plan->nlaunches) {
        PyErr_Format(PyExc_IndexError, "the plan has %zd launches", go->plan->nlaunches);
        return NULL;
    }
    Launch *L = &go->plan->launches[j];
    return PyBytes_FromStringAndSize(L->buffer, L->buffer_size);
}

/* ---- the checks ----------------------------------------------------------------------------
 * The spec (ArgBinder.native_spec): (args, sizes, natoms, min_device) with per argument
 *   ("tensor", ptr atom, dtype, static contiguous shape or None, rank,
 *              extents ((atom, first use's atom) or (-1, value), ...),
 *              strides ((atom, first use's atom, divisibility) or (-1, value, 1), ...), align)
 *   ("scalar", atom, exact types, low or None, high or None)
 * and per plan size (atom, 0) or (-1, value). */

#define MAX_RANK 8
#define MAX_ATOMS 64
#define MAX_SIZES 8

typedef struct {
    int32_t atom; /* -1: the constant `value` */
    int32_t ref;  /* the atom this one must equal (itself at its first use) */
    long long value;
    long long divisibility;
} Rule;

typedef struct {
    int tensor;
    int32_t atom;    /* data pointer / scalar value */
    PyObject *dtype; /* tensors */
    int contiguous;  /* static shape, contiguous: compared whole, then is_contiguous() */
    int rank;
    Rule extents[MAX_RANK], strides[MAX_RANK];
    unsigned long long align;
    PyObject *types;   /* scalars: a tuple of exact types */
    int bounded;
    long long low, high;
} ArgRule;

typedef struct {
    PyObject_HEAD
    PyObject *tensor_type, *param_type;
    Py_ssize_t nargs, natoms, nsizes;
    int has_tensor;
    long min_device;
    Rule sizes[MAX_SIZES];
    ArgRule *args;
} Checker;

static PyTypeObject CheckerType;

static void checker_dealloc(Checker *self) {
    if (self->args != NULL) {
        for (Py_ssize_t i = 0; i < self->nargs; i++) {
            Py_XDECREF(self->args[i].dtype);
            Py_XDECREF(self->args[i].types);
        }
        PyMem_Free(self->args);
    }
    Py_XDECREF(self->tensor_type);
    Py_XDECREF(self->param_type);
    PyObject_Free(self);
}

static int get_ll(PyObject *tuple, Py_ssize_t i, long long *out) {
    PyObject *item = PyTuple_GetItem(tuple, i);
    if (item == NULL) return -1;
    *out = PyLong_AsLongLong(item);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int parse_rules(PyObject *rules, Rule *out, int rank, int strides, Py_ssize_t natoms) {
    if (!PyTuple_Check(rules) || PyTuple_GET_SIZE(rules) != rank) {
        PyErr_SetString(PyExc_ValueError, "one extent and one stride rule per mode");
        return -1;
    }
    for (int m = 0; m < rank; m++) {
        PyObject *r = PyTuple_GET_ITEM(rules, m);
        long long atom, second, div = 1;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != (strides ? 3 : 2) ||
            get_ll(r, 0, &atom) || get_ll(r, 1, &second) || (strides && get_ll(r, 2, &div)))
            goto bad;
        if (atom < -1 || atom >= natoms || div < 1) goto bad;
        out[m].atom = (int32_t)atom;
        out[m].divisibility = div;
        if (atom < 0) {
            out[m].value = second;
            out[m].ref = -1;
        } else {
            if (second < 0 || second > atom) goto bad;
            out[m].ref = (int32_t)second;
        }
    }
    return 0;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a malformed extent/stride rule");
    return -1;
}

static int parse_arg(PyObject *a, ArgRule *out, Py_ssize_t natoms) {
    if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) < 5) goto bad;
    PyObject *kind = PyTuple_GET_ITEM(a, 0);
    long long atom;
    if (get_ll(a, 1, &atom)) return -1;
    if (atom < 0 || atom >= natoms) goto bad;
    out->atom = (int32_t)atom;
    if (PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "scalar") == 0) {
        PyObject *types = PyTuple_GET_ITEM(a, 2), *low = PyTuple_GET_ITEM(a, 3),
                 *high = PyTuple_GET_ITEM(a, 4);
        if (!PyTuple_Check(types) || (low == Py_None) != (high == Py_None)) goto bad;
        out->types = Py_NewRef(types);
        out->bounded = low != Py_None;
        if (out->bounded && (get_ll(a, 3, &out->low) || get_ll(a, 4, &out->high))) return -1;
        return 0;
    }
    if (!PyUnicode_Check(kind) || PyUnicode_CompareWithASCIIString(kind, "tensor") != 0 ||
        PyTuple_GET_SIZE(a) != 8)
        goto bad;
    out->tensor = 1;
    out->dtype = Py_NewRef(PyTuple_GET_ITEM(a, 2));
    PyObject *shape = PyTuple_GET_ITEM(a, 3);
    long long rank, align;
    if (get_ll(a, 4, &rank) || get_ll(a, 7, &align)) return -1;
    if (rank < 0 || rank > MAX_RANK || align < 1) goto bad;
    out->rank = (int)rank;
    out->align = (unsigned long long)align;
    if (shape != Py_None) {
        if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != rank) goto bad;
        out->contiguous = 1;
        for (int m = 0; m < rank; m++) {
            out->extents[m].atom = -1;
            if (get_ll(shape, m, &out->extents[m].value)) return -1;
        }
        return 0;
    }
    if (parse_rules(PyTuple_GET_ITEM(a, 5), out->extents, out->rank, 0, natoms) ||
        parse_rules(PyTuple_GET_ITEM(a, 6), out->strides, out->rank, 1, natoms))
        return -1;
    return 0;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a malformed argument rule");
    return -1;
}

/* checker(spec, (Tensor, Parameter)) */
static PyObject *make_checker(PyObject *module, PyObject *args) {
    PyObject *spec, *types;
    if (!PyArg_ParseTuple(args, "O!O!:checker", &PyTuple_Type, &spec, &PyTuple_Type, &types))
        return NULL;
    PyObject *rules, *sizes;
    Py_ssize_t natoms;
    long min_device;
    if (!PyArg_ParseTuple(spec, "O!O!nl", &PyTuple_Type, &rules, &PyTuple_Type, &sizes,
                          &natoms, &min_device))
        return NULL;
    if (PyTuple_GET_SIZE(types) != 2 || natoms < 0 || natoms > MAX_ATOMS ||
        PyTuple_GET_SIZE(sizes) > MAX_SIZES) {
        PyErr_Format(PyExc_ValueError, "a checker takes 2 tensor types, up to %d atoms and %d "
                     "sizes", MAX_ATOMS, MAX_SIZES);
        return NULL;
    }
    Checker *c = PyObject_New(Checker, &CheckerType);
    if (c == NULL) return NULL;
    c->tensor_type = Py_NewRef(PyTuple_GET_ITEM(types, 0));
    c->param_type = Py_NewRef(PyTuple_GET_ITEM(types, 1));
    c->nargs = PyTuple_GET_SIZE(rules);
    c->natoms = natoms;
    c->nsizes = PyTuple_GET_SIZE(sizes);
    c->min_device = min_device;
    c->has_tensor = 0;
    c->args = PyMem_Calloc(c->nargs > 0 ? c->nargs : 1, sizeof(ArgRule));
    if (c->args == NULL) {
        c->nargs = 0;
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < c->nargs; i++) {
        if (parse_arg(PyTuple_GET_ITEM(rules, i), &c->args[i], natoms)) {
            Py_DECREF(c);
            return NULL;
        }
        c->has_tensor |= c->args[i].tensor;
    }
    for (Py_ssize_t k = 0; k < c->nsizes; k++) {
        PyObject *r = PyTuple_GET_ITEM(sizes, k);
        long long atom, value;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2 || get_ll(r, 0, &atom) ||
            get_ll(r, 1, &value) || atom < -1 || atom >= natoms) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a malformed size rule");
            Py_DECREF(c);
            return NULL;
        }
        c->sizes[k].atom = (int32_t)atom;
        c->sizes[k].value = value;
    }
    return (PyObject *)c;
}

static PyObject *str_dtype, *str_shape, *str_stride, *str_data_ptr, *str_get_device,
    *str_is_contiguous;

static PyObject *call_method(PyObject *obj, PyObject *name) {
    return PyObject_VectorcallMethod(name, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* The item of an int tuple (torch.Size, a stride tuple) as a C value. */
static int tuple_ll(PyObject *tuple, Py_ssize_t i, long long *out) {
    *out = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* The extents (or strides) of one tensor, `rank` ints of `tuple`, against their rules: a
 * constant equals its value; a dynamic one divides by its divisibility (1 for extents) and
 * equals its first use, and becomes an atom. 1: all pass; 0: one does not; -1: an exception. */
static int check_modes(PyObject *tuple, Rule *rules, int rank, PyObject **atoms,
                       long long *values) {
    for (int m = 0; m < rank; m++) {
        Rule *rule = &rules[m];
        long long x;
        if (tuple_ll(tuple, m, &x)) return -1;
        if (rule->atom < 0) {
            if (x != rule->value) return 0;
            continue;
        }
        if (x % rule->divisibility || (rule->ref != rule->atom && x != values[rule->ref]))
            return 0;
        values[rule->atom] = x;
        atoms[rule->atom] = Py_NewRef(PyTuple_GET_ITEM(tuple, m));
    }
    return 1;
}

/* The checks of one call, exactly those of ArgBinder._generate_checks. 1: accepted, with
 * `atoms` (new references), `values` (their C values, for the integer atoms) and the device of
 * the first tensor; 0: refused (nothing held); -1: an exception. `min_device_rule`: refuse a
 * first device below the spec's min_device (fast_bind's rule; the hot path instead finds no
 * launcher for a CPU tensor's device -1). */
static int run_checks(Checker *c, PyObject *args, PyObject **atoms, long long *values,
                      long *device, int min_device_rule) {
    if (!c->has_tensor || !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != c->nargs) return 0;
    for (Py_ssize_t k = 0; k < c->natoms; k++) atoms[k] = NULL;
    long dev = 0;
    int seen = 0;
    for (Py_ssize_t i = 0; i < c->nargs; i++) {
        ArgRule *r = &c->args[i];
        PyObject *v = PyTuple_GET_ITEM(args, i);
        if (!r->tensor) {
            PyTypeObject *t = Py_TYPE(v);
            int match = 0;
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(r->types); k++)
                match |= (PyObject *)t == PyTuple_GET_ITEM(r->types, k);
            if (!match) goto refuse;
            if (r->bounded) {
                int overflow;
                long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
                if (x == -1 && PyErr_Occurred()) goto error;
                if (overflow || x < r->low || x > r->high) goto refuse;
                values[r->atom] = x;
            }
            atoms[r->atom] = Py_NewRef(v);
            continue;
        }
        if ((PyObject *)Py_TYPE(v) != c->tensor_type && (PyObject *)Py_TYPE(v) != c->param_type)
            goto refuse;
        PyObject *dtype = PyObject_GetAttr(v, str_dtype);
        if (dtype == NULL) goto error;
        Py_DECREF(dtype);  /* torch keeps every dtype object alive; only identity is compared */
        if (dtype != r->dtype) goto refuse;
        PyObject *d = call_method(v, str_get_device);
        if (d == NULL) goto error;
        long this_dev = PyLong_AsLong(d);
        Py_DECREF(d);
        if (this_dev == -1 && PyErr_Occurred()) goto error;
        if (!seen) {
            dev = this_dev;
            seen = 1;
            if (min_device_rule && dev < c->min_device) goto refuse;
        } else if (this_dev != dev) {
            goto refuse;
        }
        PyObject *shape = PyObject_GetAttr(v, str_shape);
        if (shape == NULL) goto error;
        if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != r->rank) {
            Py_DECREF(shape);
            goto refuse;
        }
        int got = check_modes(shape, r->extents, r->rank, atoms, values);
        Py_DECREF(shape);
        if (got <= 0) {
            if (got < 0) goto error;
            goto refuse;
        }
        if (r->contiguous) {
            PyObject *cont = call_method(v, str_is_contiguous);
            if (cont == NULL) goto error;
            int is = PyObject_IsTrue(cont);
            Py_DECREF(cont);
            if (is < 0) goto error;
            if (!is) goto refuse;
        } else {
            PyObject *strides = call_method(v, str_stride);
            if (strides == NULL) goto error;
            got = PyTuple_Check(strides) && PyTuple_GET_SIZE(strides) == r->rank
                      ? check_modes(strides, r->strides, r->rank, atoms, values) : 0;
            Py_DECREF(strides);
            if (got <= 0) {
                if (got < 0) goto error;
                goto refuse;
            }
        }
        PyObject *ptr = call_method(v, str_data_ptr);
        if (ptr == NULL) goto error;
        unsigned long long p = PyLong_AsUnsignedLongLong(ptr);
        if (p == (unsigned long long)-1 && PyErr_Occurred()) { Py_DECREF(ptr); goto error; }
        if (p % r->align) { Py_DECREF(ptr); goto refuse; }
        atoms[r->atom] = ptr;
    }
    *device = dev;
    return 1;
refuse:
    for (Py_ssize_t k = 0; k < c->natoms; k++) Py_CLEAR(atoms[k]);
    return 0;
error:
    for (Py_ssize_t k = 0; k < c->natoms; k++) Py_CLEAR(atoms[k]);
    return -1;
}

static Checker *as_checker(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &CheckerType)) {
        PyErr_SetString(PyExc_TypeError, "not a rose_aot checker (made by _native.checker)");
        return NULL;
    }
    return (Checker *)obj;
}

/* The (device, *sizes) key of an accepted call. */
static PyObject *size_key(Checker *c, long dev, PyObject **atoms) {
    PyObject *key = PyTuple_New(1 + c->nsizes);
    if (key == NULL) return NULL;
    PyObject *d = PyLong_FromLong(dev);
    if (d == NULL) { Py_DECREF(key); return NULL; }
    PyTuple_SET_ITEM(key, 0, d);
    for (Py_ssize_t k = 0; k < c->nsizes; k++) {
        PyObject *x = c->sizes[k].atom >= 0 ? Py_NewRef(atoms[c->sizes[k].atom])
                                            : PyLong_FromLongLong(c->sizes[k].value);
        if (x == NULL) { Py_DECREF(key); return NULL; }
        PyTuple_SET_ITEM(key, 1 + k, x);
    }
    return key;
}

/* bind(checker, values) -> (device, sizes, atoms) or None: what ArgBinder.fast_bind returns. */
static PyObject *bind(PyObject *module, PyObject *args) {
    PyObject *obj, *values;
    if (!PyArg_ParseTuple(args, "OO:bind", &obj, &values)) return NULL;
    Checker *c = as_checker(obj);
    if (c == NULL) return NULL;
    PyObject *atoms[MAX_ATOMS];
    long long ints[MAX_ATOMS];
    long dev;
    int got = run_checks(c, values, atoms, ints, &dev, 1);
    if (got < 0) return NULL;
    if (got == 0) Py_RETURN_NONE;
    PyObject *key = size_key(c, dev, atoms);
    PyObject *tuple = key == NULL ? NULL : PyTuple_New(c->natoms);
    PyObject *out = NULL;
    if (tuple != NULL) {
        for (Py_ssize_t k = 0; k < c->natoms; k++) PyTuple_SET_ITEM(tuple, k, atoms[k]);
        PyObject *sizes = PyTuple_GetSlice(key, 1, 1 + c->nsizes);
        if (sizes != NULL) out = Py_BuildValue("(ONN)", PyTuple_GET_ITEM(key, 0), sizes, tuple);
        else Py_DECREF(tuple);
    } else {
        for (Py_ssize_t k = 0; k < c->natoms; k++) Py_DECREF(atoms[k]);
    }
    Py_XDECREF(key);
    return out;
}

/* fast(checker, launchers, stream_of, values) -> bool: the hot path of a handle's call. The
 * checks, then the launcher resolved for (device, *sizes) in `launchers`, run on
 * stream_of(device). False, having launched nothing, when a check refuses or no launcher is
 * resolved (the caller takes its checked path). */
static PyObject *fast(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "fast(checker, launchers (a dict), stream_of, values)");
        return NULL;
    }
    Checker *c = as_checker(args[0]);
    if (c == NULL) return NULL;
    PyObject *atoms[MAX_ATOMS + 1];  /* [0]: the stream, for go(stream, *atoms) */
    long long ints[MAX_ATOMS];
    long dev;
    int got = run_checks(c, args[3], atoms + 1, ints, &dev, 0);
    if (got <= 0) {
        if (got < 0) return NULL;
        Py_RETURN_FALSE;
    }
    PyObject *result = NULL;
    PyObject *key = size_key(c, dev, atoms + 1);
    if (key == NULL) goto done;
    PyObject *go = PyDict_GetItemWithError(args[1], key); /* borrowed */
    if (go == NULL) {
        if (!PyErr_Occurred()) result = Py_NewRef(Py_False);
        goto done;
    }
    Py_INCREF(go);
    PyObject *stream = PyObject_CallOneArg(args[2], PyTuple_GET_ITEM(key, 0));
    if (stream != NULL) {
        PyObject *r;
        if (Py_IS_TYPE(go, &LauncherType)) {
            r = run_plan(((Launcher *)go)->plan, stream, atoms + 1);
        } else {
            atoms[0] = stream;  /* go(stream, *atoms) */
            r = PyObject_Vectorcall(go, atoms, (size_t)(1 + c->natoms), NULL);
        }
        if (r != NULL) {
            Py_DECREF(r);
            result = Py_NewRef(Py_True);
        }
        Py_DECREF(stream);
    }
    Py_DECREF(go);
done:
    Py_XDECREF(key);
    for (Py_ssize_t k = 1; k <= c->natoms; k++) Py_DECREF(atoms[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"plan", make_plan, METH_VARARGS,
     "plan(cuLaunchKernelEx_address, fail, natoms, launches) -> launcher go(stream, *atoms)\n\n"
     "launches: per launch (function, grid, block, smem, attrs ((id, values), ...),\n"
     "buffer_size, param_offsets, fields ((offset, format, atom or -1, constant), ...))."},
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(launcher, *atoms): write the atoms as a launch would, without launching."},
    {"buffer", plan_buffer, METH_VARARGS, "buffer(launcher, j) -> launch j's parameter bytes"},
    {"checker", make_checker, METH_VARARGS,
     "checker(spec, (Tensor, Parameter)) -> the checks of ArgBinder.native_spec"},
    {"bind", bind, METH_VARARGS,
     "bind(checker, values) -> (device, sizes, atoms) or None (ArgBinder.fast_bind's twin)"},
    {"fast", (PyCFunction)(void (*)(void))fast, METH_FASTCALL,
     "fast(checker, launchers, stream_of, values) -> True if launched, else False"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "A kernel handle's hot path in C (see _native.c).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    LauncherType.tp_name = "rose_aot.loader._native.Launcher";
    LauncherType.tp_basicsize = sizeof(Launcher);
    LauncherType.tp_dealloc = (destructor)launcher_dealloc;
    LauncherType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;
    LauncherType.tp_traverse = (traverseproc)launcher_traverse;
    LauncherType.tp_clear = (inquiry)launcher_clear;
    LauncherType.tp_vectorcall_offset = offsetof(Launcher, vectorcall);
    LauncherType.tp_call = PyVectorcall_Call;
    LauncherType.tp_doc = "go(stream, *atoms): pack and launch a resolved plan";
    CheckerType.tp_name = "rose_aot.loader._native.Checker";
    CheckerType.tp_basicsize = sizeof(Checker);
    CheckerType.tp_dealloc = (destructor)checker_dealloc;
    CheckerType.tp_flags = Py_TPFLAGS_DEFAULT;
    CheckerType.tp_doc = "the argument checks of one argument spec";
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&CheckerType) < 0) return NULL;
    struct { PyObject **slot; const char *text; } names[] = {
        {&str_dtype, "dtype"}, {&str_shape, "shape"}, {&str_stride, "stride"},
        {&str_data_ptr, "data_ptr"}, {&str_get_device, "get_device"},
        {&str_is_contiguous, "is_contiguous"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL) return NULL;
    }
    return PyModule_Create(&module);
}
