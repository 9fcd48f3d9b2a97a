/* The pytest records' sealer: an audit hook written in C that holds the key and signs.
 *
 * Built by `make setup` (wharf/tasks/tools/build_seal.sh) next to pytest_report.py, which installs it
 * before collection. Its Python face is one function, install(key, fd, decide, ctx), that works
 * once: after it the key, the records descriptor and the sequence number live only in this
 * file's static memory. No Python object holds them or a function that signs: a record is
 * written only by the hook below, only with what decide(ctx, state, event, args, frame)
 * (pytest_decide.py) found at pytest's own call site, and the state decide keeps (the session,
 * its items, pytest's classes) is kept here and handed back read-only.
 *
 * While decide runs, gc is off and signals are blocked in its thread (the handlers already due
 * run first, outside it). What Python code still runs inside it (a handler tripped through
 * another thread, a __eq__ of a hostile dict key) finds no signer: only decide's read-only tables.
 * Native code in the tests' process (an extension it builds in the workspace) can read this
 * memory: docs/judges.md says so. From the session's start on it also looks, at every event
 * it watches, for what no audit event announces: a signal handler installed, an interval timer
 * armed, a shared object loaded from /tmp, /dev or a memfd (`tampering`): a tamper record.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* ---- SHA-256 (FIPS 180-4), enough for HMAC of short lines ---- */
typedef struct { uint32_t h[8]; uint64_t bits; unsigned char buf[64]; size_t n; } sha256_t;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(sha256_t *s, const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h;
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3]; e = s->h[4]; f = s->h[5]; g = s->h[6]; h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void sha_init(sha256_t *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->bits = 0;
    s->n = 0;
}

static void sha_update(sha256_t *s, const unsigned char *p, size_t len) {
    s->bits += (uint64_t)len * 8;
    while (len--) {
        s->buf[s->n++] = *p++;
        if (s->n == 64) {
            sha_block(s, s->buf);
            s->n = 0;
        }
    }
}

static void sha_final(sha256_t *s, unsigned char out[32]) {
    uint64_t bits = s->bits;
    unsigned char pad = 0x80, zero = 0, len[8];
    sha_update(s, &pad, 1);
    while (s->n != 56)
        sha_update(s, &zero, 1);
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_update(s, len, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = s->h[i] >> 24; out[4 * i + 1] = s->h[i] >> 16; out[4 * i + 2] = s->h[i] >> 8; out[4 * i + 3] = s->h[i];
    }
}

/* ---- the sealer's state: static, in no Python object ---- */
static sha256_t inner0, outer0;  /* HMAC's two hash states after the padded key */
static int records_fd = -1;
static long long seq = 0;
static PyObject *decide = NULL, *ctx = NULL, *state = NULL;

/* The events decide looks at: the record requests and the introspection it may refuse (the
 * same names as pytest_decide.REFUSED, checked by tests/test_pytest_grade.py). */
static const char *const EVENTS[] = {
    "wharf.record", "open", "ctypes.dlsym", "object.__setattr__", "ctypes.dlopen", "import",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys.monitoring.register_callback", "ctypes.PyObj_FromPtr", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.cdata", "sys.addaudithook", "ctypes.call_function", "ctypes.dlsym/handle",
    "ctypes.cdata/buffer", NULL};

/* ---- tampering no audit event announces, looked for at every watched event once the session
 * started (the first record: pytest's own handlers, faulthandler's, are in place by then) ---- */
#define MAX_PREFIXES 16
static int watching = 0, flagged = 0;
static struct sigaction sig_then[NSIG];
static int sig_known[NSIG];
static struct itimerval timer_then[3];
static const int TIMERS[3] = {ITIMER_REAL, ITIMER_VIRTUAL, ITIMER_PROF};
static char *bad_prefix[MAX_PREFIXES], *ok_prefix[MAX_PREFIXES];  /* where native code may not come from */

static void watch_start(void) {
    for (int s = 1; s < NSIG; s++)
        sig_known[s] = sigaction(s, NULL, &sig_then[s]) == 0;
    for (int i = 0; i < 3; i++)
        getitimer(TIMERS[i], &timer_then[i]);
    watching = 1;
}

static int starts(const char *s, char *const *prefixes) {
    for (int i = 0; i < MAX_PREFIXES && prefixes[i] != NULL; i++)
        if (strncmp(s, prefixes[i], strlen(prefixes[i])) == 0)
            return 1;
    return 0;
}

/* ctypes' and cffi's native halves: with either loaded, Python code reads and writes raw memory
 * and calls C without an audit event (ctypes.memmove raises none). */
static const char *const LOADERS[] = {"/_ctypes.", "/_cffi_backend.", NULL};

static int foreign_object(struct dl_phdr_info *info, size_t size, void *found) {
    const char *name = info->dlpi_name;
    for (const char *const *l = LOADERS; name != NULL && *l != NULL; l++)
        if (strstr(name, *l) != NULL) {
            *(const char **)found = name;
            return 1;
        }
    if (name != NULL && name[0] != 0 && starts(name, bad_prefix) && !starts(name, ok_prefix)) {
        *(const char **)found = name;
        return 1;
    }
    return 0;
}

static int same_timer(const struct itimerval *a, const struct itimerval *b) {
    return (a->it_value.tv_sec == 0 && a->it_value.tv_usec == 0 && a->it_interval.tv_sec == 0 &&
            a->it_interval.tv_usec == 0) || memcmp(a, b, sizeof *a) == 0;
}

/* Why the process is not as the session started (a handler the code under test installed, a
 * timer it armed, native code loaded from where the agent can write), or NULL. */
static const char *tampering(void) {
    struct sigaction now;
    for (int s = 1; s < NSIG; s++) {
        if (!sig_known[s] || sigaction(s, NULL, &now) != 0)
            continue;
        if (now.sa_handler != sig_then[s].sa_handler || (now.sa_flags & SA_SIGINFO) != (sig_then[s].sa_flags & SA_SIGINFO))
            return "a signal handler installed while the tests ran";
    }
    for (int i = 0; i < 3; i++) {
        struct itimerval t;
        if (getitimer(TIMERS[i], &t) == 0 && !same_timer(&t, &timer_then[i]))
            return "an interval timer armed while the tests ran";
    }
    const char *found = NULL;
    dl_iterate_phdr(foreign_object, &found);
    return found != NULL ? "native code loaded: ctypes, cffi, or a shared object from a place the code under test can write"
                         : NULL;
}

static void hmac_hex(const char *msg, size_t len, char out[65]) {
    sha256_t s = inner0;
    unsigned char d[32];
    sha_update(&s, (const unsigned char *)msg, len);
    sha_final(&s, d);
    s = outer0;
    sha_update(&s, d, 32);
    sha_final(&s, d);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* One record: "SEQ KIND FIELD_HEX... MAC\n" (report_records.py), written whole or not at all. */
static int send_record(PyObject *rec) {
    Py_ssize_t n = PyTuple_GET_SIZE(rec), cap = 64;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyTuple_GET_ITEM(rec, i);
        if (!PyUnicode_CheckExact(f))
            return -1;
        Py_ssize_t size;
        if (PyUnicode_AsUTF8AndSize(f, &size) == NULL)
            return -1;
        cap += 2 * size + 2;
    }
    char *line = PyMem_Malloc(cap + 66), *p = line;
    if (line == NULL)
        return -1;
    p += sprintf(p, "%lld %s", seq, PyUnicode_AsUTF8(PyTuple_GET_ITEM(rec, 0)));
    for (Py_ssize_t i = 1; i < n; i++) {
        Py_ssize_t size;
        const unsigned char *u = (const unsigned char *)PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(rec, i), &size);
        *p++ = ' ';
        if (size == 0)
            *p++ = '-';
        for (Py_ssize_t j = 0; j < size; j++)
            p += sprintf(p, "%02x", u[j]);
    }
    char mac[65];
    hmac_hex(line, p - line, mac);
    p += sprintf(p, " %s\n", mac);
    seq++;
    for (char *w = line; w < p;) {
        ssize_t k = write(records_fd, w, p - w);
        if (k <= 0)
            break;  /* the grader is gone or the descriptor closed: records missing, a failure */
        w += k;
    }
    PyMem_Free(line);
    return 0;
}

static void send_tamper(const char *why) {
    PyObject *rec = Py_BuildValue("(ss)", "tamper", why);
    if (rec == NULL || send_record(rec) < 0)
        PyErr_Clear();
    Py_XDECREF(rec);
}

static PyObject *import_word = NULL;  /* "import ", made at install */

/* decide's answer: None, or (new_state or None, record tuple or None, refusal str or None). */
static int apply(PyObject *got) {
    if (got == Py_None)
        return 0;
    if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 3) {
        send_tamper("the guard gave no verdict");
        return 0;
    }
    PyObject *new_state = PyTuple_GET_ITEM(got, 0), *rec = PyTuple_GET_ITEM(got, 1), *why = PyTuple_GET_ITEM(got, 2);
    if (new_state != Py_None) {
        Py_INCREF(new_state);
        Py_SETREF(state, new_state);
    }
    if (rec != Py_None && (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) < 2 || send_record(rec) < 0)) {
        PyErr_Clear();
        send_tamper("the guard gave a malformed record");
    }
    if (why != Py_None && PyUnicode_CheckExact(why)) {  /* an import refused reads as a module not there */
        PyObject *kind = PyUnicode_Tailmatch(why, import_word, 0, 7, -1) == 1 ? PyExc_ImportError : PyExc_RuntimeError;
        PyErr_Format(kind, "wharf: %U is refused while the tests are graded", why);
        return -1;
    }
    return 0;
}

static int hook(const char *event, PyObject *args, void *unused) {
    int watched = 0;
    for (const char *const *e = EVENTS; *e != NULL; e++)
        if (strcmp(event, *e) == 0) {
            watched = 1;
            break;
        }
    if (!watched || decide == NULL)
        return 0;
    if (!watching && strcmp(event, "wharf.record") == 0)
        watch_start();
    else if (watching && !flagged) {
        const char *why = tampering();
        if (why != NULL) {
            flagged = 1;
            send_tamper(why);
        }
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    if (PyErr_CheckSignals() < 0) {  /* handlers already tripped run now, outside decide */
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return -1;
    }
    int gc_was = PyGC_Disable();
    PyObject *frame = (PyObject *)PyEval_GetFrame();
    PyObject *got = PyObject_CallFunction(decide, "OOsOO", ctx, state, event, args, frame ? frame : Py_None);
    if (gc_was)
        PyGC_Enable();
    int rc = 0;
    if (got == NULL) {
        PyErr_Clear();
        send_tamper("the guard raised while it checked a record");
    } else {
        rc = apply(got);
        Py_DECREF(got);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* (bad, ok): two tuples of str, the path prefixes native code may not be loaded from, and the
 * exceptions (the interpreter's own prefixes). */
static int keep_prefixes(PyObject *pair) {
    char **into[2] = {bad_prefix, ok_prefix};
    if (PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_ValueError, "wharf_seal: prefixes are (bad, ok)");
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *t = PyTuple_GET_ITEM(pair, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) >= MAX_PREFIXES) {
            PyErr_SetString(PyExc_ValueError, "wharf_seal: a tuple of at most 15 prefixes");
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
            const char *p = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, i));
            if (p == NULL || (into[k][i] = strdup(p)) == NULL)
                return -1;
        }
    }
    return 0;
}

static PyObject *install(PyObject *self, PyObject *a) {
    Py_buffer key;
    int fd;
    PyObject *fn, *c, *s0;
    if (decide != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "wharf_seal: installed already");
        return NULL;
    }
    PyObject *prefixes = NULL;
    if (!PyArg_ParseTuple(a, "y*iOOO|O!", &key, &fd, &fn, &c, &s0, &PyTuple_Type, &prefixes))
        return NULL;
    if (prefixes != NULL && keep_prefixes(prefixes) < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    unsigned char block[64] = {0}, pad[64];
    if (key.len > 64) {
        sha256_t s;
        sha_init(&s);
        sha_update(&s, key.buf, key.len);
        sha_final(&s, block);
    } else {
        memcpy(block, key.buf, key.len);
    }
    PyBuffer_Release(&key);
    sha_init(&inner0);
    sha_init(&outer0);
    for (int i = 0; i < 64; i++)
        pad[i] = block[i] ^ 0x36;
    sha_update(&inner0, pad, 64);
    for (int i = 0; i < 64; i++)
        pad[i] = block[i] ^ 0x5c;
    sha_update(&outer0, pad, 64);
    memset(block, 0, sizeof block);
    records_fd = fd;
    if ((import_word = PyUnicode_FromString("import ")) == NULL)
        return NULL;
    Py_INCREF(fn);
    Py_INCREF(c);
    Py_INCREF(s0);
    decide = fn;
    ctx = c;
    state = s0;
    if (PySys_AddAuditHook(hook, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *events(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (const char *const *e = EVENTS; out != NULL && *e != NULL; e++) {
        PyObject *s = PyUnicode_FromString(*e);
        if (s == NULL || PyList_Append(out, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(s);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS, "install(key, fd, decide, ctx, state[, (bad, ok) prefixes]): seal the records (once)"},
    {"events", events, METH_NOARGS, "the audit events handed to decide"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wharf_seal", NULL, -1, methods};

PyMODINIT_FUNC PyInit_wharf_seal(void) { return PyModule_Create(&module); }
