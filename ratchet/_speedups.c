/*
 * ratchet._speedups: C twins of the per-item loops of a history read, and of the
 * strict walk of a consumed Avro body (schemas/strict.py; section "an Avro body
 * against the spec" below).
 *
 * Why: a cold read of a 50-turn history spends ~1.2 ms of Python on its rows (decode
 * the items cells, hash every item, render the items array) against ~1.5 ms for the
 * read itself (docs/decisions.md, "Cold miss"). The work is per item and simple; in C
 * it costs a fraction of that.
 *
 * How it stays the same code: every function here has a Python twin that stays the
 * reference (named beside each function below) and that ratchet uses when this module
 * is not built or RATCHET_SPEEDUPS=0. tests/unit/test_speedups.py feeds both the same
 * inputs, valid and damaged, and requires the same result or the same kind of error.
 * Nothing here decides an outcome: it decodes, hashes, compares and writes bytes, and
 * what it is not sure of it hands to its Python twin.
 *
 * Hashing is OpenSSL's SHA-256 (libcrypto, the library Python's own hashlib uses),
 * called directly: hashlib's per-call set-up cost ~0.6 us per item, more than
 * hashing an item. No crypto of our own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <openssl/evp.h>
#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* ------------------------------------------------------------------ hashing */

static EVP_MD *sha256_md;  /* fetched once: the per-call fetch is OpenSSL 3's slow part */
static EVP_MD_CTX *sha256_ctx; /* reused; the GIL serialises every use */

/* sha256 hex (lowercase, 64 chars + NUL) of [data, data + n) into hex. */
static int
sha256_hex_into(const void *data, size_t n, char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!EVP_DigestInit_ex2(sha256_ctx, sha256_md, NULL) ||
        !EVP_DigestUpdate(sha256_ctx, data, n) || !EVP_DigestFinal_ex(sha256_ctx, md, &len) ||
        len != 32) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL SHA-256 failed");
        return -1;
    }
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = 0;
    return 0;
}

/* Does ``digest`` equal the sha256 hex ``hex``? 1, 0, -1 error. */
static int
hex_matches(const char hex[65], PyObject *digest)
{
    if (!PyUnicode_Check(digest))
        return 0; /* the twin compares a str with whatever is stored: not equal */
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(digest, &n);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear(); /* a str with a lone surrogate: never a hex digest */
        return 0;
    }
    return n == 64 && memcmp(s, hex, 64) == 0;
}

/* Does str ``digest`` equal the sha256 hex of the bytes-like ``data``? 1, 0, -1 error. */
static int
digest_matches(PyObject *data, PyObject *digest)
{
    Py_buffer view;
    char hex[65];
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = sha256_hex_into(view.buf, view.len, hex);
    PyBuffer_Release(&view);
    if (rc < 0)
        return -1;
    return hex_matches(hex, digest);
}

/* The two arguments of ``args`` as fast sequences (new references); -1 on error. */
static int
two_sequences(PyObject *args, const char *format, PyObject **first, PyObject **second)
{
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, format, &a, &b))
        return -1;
    if ((*first = PySequence_Fast(a, "expected a sequence")) == NULL)
        return -1;
    if ((*second = PySequence_Fast(b, "expected a sequence")) == NULL) {
        Py_DECREF(*first);
        return -1;
    }
    return 0;
}

/* first_digest_mismatch(contents, digests) -> int
 * Twin of first_digest_mismatch_py in ratchet/domain/history.py: the index of the
 * first content whose sha256 hex is not its digest, or -1. (A read checks its digests
 * with item_mismatches, below, in the same pass as the items' columns.) */
static PyObject *
first_digest_mismatch(PyObject *self, PyObject *args)
{
    PyObject *cs, *ds;
    if (two_sequences(args, "OO:first_digest_mismatch", &cs, &ds) < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(cs);
    Py_ssize_t found = -1;
    if (PySequence_Fast_GET_SIZE(ds) != n) {
        PyErr_SetString(PyExc_ValueError, "contents and digests differ in length");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int same = digest_matches(PySequence_Fast_GET_ITEM(cs, i), PySequence_Fast_GET_ITEM(ds, i));
        if (same < 0)
            goto fail;
        if (!same) {
            found = i;
            break;
        }
    }
    Py_DECREF(cs);
    Py_DECREF(ds);
    return PyLong_FromSsize_t(found);
fail:
    Py_DECREF(cs);
    Py_DECREF(ds);
    return NULL;
}

/* ------------------------------------------------------------ a byte buffer */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int
buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

#define PUT_LITERAL(b, s) buf_put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

/* ids_digest(ids, digests) -> str
 * Twin of ids_digest in ratchet/domain/history.py: sha256 hex of the UTF-8 bytes of
 * item_id + "\0" + content_digest + "\n" for each item, in order. */
static PyObject *
ids_digest(PyObject *self, PyObject *args)
{
    PyObject *is, *ds;
    if (two_sequences(args, "OO:ids_digest", &is, &ds) < 0)
        return NULL;
    PyObject *result = NULL;
    Buf b = {0};
    /* zip(): the shorter column decides, like the Python twin's map over both. */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(is);
    if (PySequence_Fast_GET_SIZE(ds) < n)
        n = PySequence_Fast_GET_SIZE(ds);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t li, ld;
        PyObject *id = PySequence_Fast_GET_ITEM(is, i), *d = PySequence_Fast_GET_ITEM(ds, i);
        if (!PyUnicode_Check(id) || !PyUnicode_Check(d)) {
            PyErr_SetString(PyExc_TypeError, "item ids and digests must be str");
            goto done;
        }
        const char *si = PyUnicode_AsUTF8AndSize(id, &li);
        if (si == NULL)
            goto done;
        const char *sd = PyUnicode_AsUTF8AndSize(d, &ld);
        if (sd == NULL)
            goto done;
        if (buf_put(&b, si, li) < 0 || buf_put(&b, "\0", 1) < 0 || buf_put(&b, sd, ld) < 0 ||
            buf_put(&b, "\n", 1) < 0)
            goto done;
    }
    char hex[65];
    if (sha256_hex_into(b.data ? b.data : "", b.len, hex) == 0)
        result = PyUnicode_FromStringAndSize(hex, 64);
done:
    PyMem_Free(b.data);
    Py_DECREF(is);
    Py_DECREF(ds);
    return result;
}

/* lineage_digest(parent, items_digest) -> str
 * Twin of lineage_digest in ratchet/domain/history.py: sha256 hex of the UTF-8 bytes of
 * parent + "\n" + items_digest, parent None counting as "". */
static PyObject *
lineage_digest(PyObject *self, PyObject *args)
{
    PyObject *parent, *digest;
    if (!PyArg_ParseTuple(args, "OU:lineage_digest", &parent, &digest))
        return NULL;
    Py_ssize_t lp = 0, ld;
    const char *sp = "";
    if (parent != Py_None) {
        if (!PyUnicode_Check(parent)) {
            PyErr_SetString(PyExc_TypeError, "a parent lineage digest must be str or None");
            return NULL;
        }
        if ((sp = PyUnicode_AsUTF8AndSize(parent, &lp)) == NULL)
            return NULL;
    }
    const char *sd = PyUnicode_AsUTF8AndSize(digest, &ld);
    if (sd == NULL)
        return NULL;
    Buf b = {0};
    char hex[65];
    PyObject *result = NULL;
    if (buf_put(&b, sp, lp) == 0 && buf_put(&b, "\n", 1) == 0 && buf_put(&b, sd, ld) == 0 &&
        sha256_hex_into(b.data, b.len, hex) == 0)
        result = PyUnicode_FromStringAndSize(hex, 64);
    PyMem_Free(b.data);
    return result;
}

/* -------------------------------------------------------- the items cell */

/* decode_items_cell(cell) -> {"seqs": ..., "ids": ..., "types": ..., "roles": ...,
 * "call_ids": ..., "contents": ..., "digests": ..., "formats": ...} (TurnItems' fields,
 * each a tuple), or None for a cell of no items.
 * Twin of decode_items_cell in services/store/rows.py (the encoding is documented
 * there): raises ValueError (UnicodeDecodeError for invalid UTF-8) wherever it does. */

#define RECORD_HEAD 36 /* struct ">qi6i" */
#define N_COLUMNS 8

static PyObject *column_names[N_COLUMNS]; /* TurnItems' field names, in record order */

static int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static int32_t
be32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static PyObject *
decode_items_cell(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *cell = view.buf;
    Py_ssize_t end = view.len, at = 1;
    PyObject *cols[N_COLUMNS] = {0};
    PyObject *result = NULL;
    if (end == 0 || cell[0] != 1) {
        PyErr_SetString(PyExc_ValueError, "items cell of an unknown encoding");
        goto done;
    }
    for (int c = 0; c < N_COLUMNS; c++)
        if ((cols[c] = PyList_New(0)) == NULL)
            goto done;
    while (at < end) {
        if (at + RECORD_HEAD > end) {
            PyErr_SetString(PyExc_ValueError, "items cell ends inside a record header");
            goto done;
        }
        const unsigned char *h = cell + at;
        int64_t seq = be64(h);
        int32_t format_version = be32(h + 8);
        int32_t lens[6];
        for (int k = 0; k < 6; k++)
            lens[k] = be32(h + 12 + 4 * k);
        /* id, type, role, call_id, content, digest */
        if (lens[0] < 0 || lens[1] < 0 || lens[4] < 0 || lens[5] < 0) {
            PyErr_SetString(PyExc_ValueError, "item without id, type, content or digest");
            goto done;
        }
        at += RECORD_HEAD;
        PyObject *fields[6];
        for (int k = 0; k < 6; k++) {
            if (lens[k] < 0) { /* role or call_id: null */
                fields[k] = Py_NewRef(Py_None);
                continue;
            }
            if (at + lens[k] > end) {
                PyErr_SetString(PyExc_ValueError, "items cell ends inside a field");
                fields[k] = NULL;
            }
            else if (k == 4) {
                fields[k] = PyBytes_FromStringAndSize((const char *)cell + at, lens[k]);
            }
            else {
                fields[k] = PyUnicode_DecodeUTF8((const char *)cell + at, lens[k], NULL);
            }
            if (fields[k] == NULL) {
                for (int j = 0; j < k; j++)
                    Py_DECREF(fields[j]);
                goto done;
            }
            at += lens[k];
        }
        PyObject *seq_obj = PyLong_FromLongLong(seq);
        PyObject *fmt_obj = PyLong_FromLong(format_version);
        int failed = seq_obj == NULL || fmt_obj == NULL;
        PyObject *row[N_COLUMNS] = {seq_obj, fields[0], fields[1], fields[2],
                                    fields[3], fields[4], fields[5], fmt_obj};
        for (int c = 0; c < N_COLUMNS; c++) {
            if (row[c] == NULL)
                continue;
            if (!failed && PyList_Append(cols[c], row[c]) < 0)
                failed = 1;
            Py_DECREF(row[c]);
        }
        if (failed)
            goto done;
    }
    if (PyList_GET_SIZE(cols[0]) == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyDict_New();
    if (result == NULL)
        goto done;
    for (int c = 0; c < N_COLUMNS; c++) {
        PyObject *t = PyList_AsTuple(cols[c]);
        if (t == NULL || PyDict_SetItem(result, column_names[c], t) < 0) {
            Py_XDECREF(t);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(t);
    }
done:
    for (int c = 0; c < N_COLUMNS; c++)
        Py_XDECREF(cols[c]);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------- a strict JSON checker */

/* Is [p, end) one JSON object (RFC 8259, UTF-8) and nothing else? 1 = yes for sure,
 * 0 = not sure. It accepts a subset of what pydantic's parser (the Python twin's
 * json_object) accepts: it answers 0 for numbers with an exponent, lone or unpaired
 * surrogate escapes, nesting deeper than MAX_DEPTH and anything else it does not
 * know, and the caller then asks the Python twin. So a content it accepts is one the
 * Python path accepts; what it doubts, Python decides. */

/* The parser's own bound is 200 levels (the item's object is level 1) and an empty
 * array or object at the 201st: up to 200 every content the parser takes is checked
 * here. At 64, content nested deeper went to the Python parser on every uncached read:
 * ~33 ms for an item of 131 072 arrays nested 150 deep (the API's event loop). */
#define MAX_DEPTH 200

typedef struct {
    const unsigned char *p, *end;
} Json;

static void
skip_ws(Json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int
hex4(const unsigned char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* One UTF-8 sequence starting at p (a byte >= 0x80), strictly: no overlong forms, no
 * surrogates, nothing above U+10FFFF. Its length, or 0. */
static int
utf8_seq(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    int n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    }
    else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    }
    else
        return 0;
    if (end - p < n)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* 1 for the bytes a string scan must look at: '"', '\\', controls, non-ASCII. */
static unsigned char string_special[256];

/* The first byte of [p, end) a string scan must look at (string_special), or end.
 * 16 bytes at a time with SSE2 (every x86-64): one signed compare finds the controls
 * and the non-ASCII bytes (both below 0x20 as signed chars), two more '"' and '\\'. */
static inline const unsigned char *
skip_plain(const unsigned char *p, const unsigned char *end)
{
#ifdef HAVE_SSE2
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i special = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
            _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(special);
        if (mask)
            return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && !string_special[*p])
        p++;
    return p;
}

static int
json_string(Json *j)
{
    j->p++; /* the opening quote */
    while (j->p < j->end) {
        j->p = skip_plain(j->p, j->end); /* plain ASCII */
        if (j->p >= j->end)
            return 0;
        unsigned char c = *j->p;
        if (c == '"') {
            j->p++;
            return 1;
        }
        if (c == '\\') {
            if (j->end - j->p < 2)
                return 0;
            unsigned char e = j->p[1];
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                e == 'r' || e == 't') {
                j->p += 2;
                continue;
            }
            unsigned u, low;
            if (e != 'u' || j->end - j->p < 6 || !hex4(j->p + 2, &u))
                return 0;
            j->p += 6;
            if (u >= 0xDC00 && u <= 0xDFFF)
                return 0; /* a low surrogate alone */
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
                    !hex4(j->p + 2, &low) || low < 0xDC00 || low > 0xDFFF)
                    return 0;
                j->p += 6;
            }
            continue;
        }
        if (c < 0x20)
            return 0;
        if (c < 0x80) {
            j->p++;
            continue;
        }
        int n = utf8_seq(j->p, j->end);
        if (n == 0)
            return 0;
        j->p += n;
    }
    return 0;
}

static int
json_digits(Json *j)
{
    const unsigned char *start = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > start;
}

/* Integer parts longer than this are "not sure": the twin's parser refuses an integer
 * of more than 4300 digits (Python's int limit) and a float beyond a double's range
 * (from ~309 integer digits; schemas/canonical.py parse_json). */
#define MAX_INTEGER_DIGITS 300

static int
json_number(Json *j)
{
    if (*j->p == '-')
        j->p++;
    if (j->p >= j->end)
        return 0;
    if (*j->p == '0')
        j->p++;
    else {
        const unsigned char *start = j->p;
        if (!json_digits(j) || j->p - start > MAX_INTEGER_DIGITS)
            return 0;
    }
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!json_digits(j))
            return 0;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E'))
        return 0; /* not sure how the twin rounds a huge exponent: let it decide */
    return 1;
}

static int
json_literal(Json *j, const char *word, Py_ssize_t n)
{
    if (j->end - j->p < n || memcmp(j->p, word, n) != 0)
        return 0;
    j->p += n;
    return 1;
}

static int json_value(Json *j, int depth);

static int
json_container(Json *j, int depth, unsigned char close)
{
    if (depth > MAX_DEPTH)
        return 0;
    j->p++; /* the opening bracket */
    skip_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 1;
    }
    for (;;) {
        if (close == '}') {
            if (j->p >= j->end || *j->p != '"' || !json_string(j))
                return 0;
            skip_ws(j);
            if (j->p >= j->end || *j->p != ':')
                return 0;
            j->p++;
            skip_ws(j);
        }
        if (!json_value(j, depth + 1))
            return 0;
        skip_ws(j);
        if (j->p >= j->end)
            return 0;
        if (*j->p == close) {
            j->p++;
            return 1;
        }
        if (*j->p != ',')
            return 0;
        j->p++;
        skip_ws(j);
    }
}

static int
json_value(Json *j, int depth)
{
    if (j->p >= j->end)
        return 0;
    switch (*j->p) {
    case '{':
        return json_container(j, depth, '}');
    case '[':
        return json_container(j, depth, ']');
    case '"':
        return json_string(j);
    case 't':
        return json_literal(j, "true", 4);
    case 'f':
        return json_literal(j, "false", 5);
    case 'n':
        return json_literal(j, "null", 4);
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))
            return json_number(j);
        return 0;
    }
}

static int
surely_json_object(const unsigned char *p, Py_ssize_t n)
{
    Json j = {p, p + n};
    skip_ws(&j);
    if (j.p >= j.end || *j.p != '{' || !json_container(&j, 1, '}'))
        return 0;
    skip_ws(&j);
    return j.p == j.end;
}

/* is_json_object(content) -> bool: the checker above, exposed for the tests. */
static PyObject *
is_json_object(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int ok = surely_json_object(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* ------------------------------------- an item's columns against its content */

/* A stored item's type, role and call_id columns are bound by no digest: they must say
 * what its content's top-level "type", "role" and "call_id" say (catalogue.py, the rule
 * validation promoted the item by: absent or null in the content = None in the column).
 * The checker above, scanning the top-level object, reads those three as it goes. */

enum { FIELD_ABSENT, FIELD_NULL, FIELD_STRING, FIELD_OTHER };
#define N_FIELDS 3 /* type, role, call_id: in the order of the columns */

typedef struct {
    int state;
    const unsigned char *s; /* FIELD_STRING: the UTF-8 bytes between the quotes */
    Py_ssize_t n;
} Field;

/* Which field the top-level key [s, s + n) (no escape in it) is: 0..2, or -1. */
static int
field_of(const unsigned char *s, Py_ssize_t n)
{
    if (n == 4 && memcmp(s, "type", 4) == 0)
        return 0;
    if (n == 4 && memcmp(s, "role", 4) == 0)
        return 1;
    if (n == 7 && memcmp(s, "call_id", 7) == 0)
        return 2;
    return -1;
}

/* surely_json_object, reading the top-level "type", "role" and "call_id" into
 * fields[] as it scans. 1 = surely a JSON object whose fields are surely those; 0 =
 * not sure: also when one of them occurs twice (which one a parser keeps is its
 * choice), when its string value holds an escape, or when any top-level key holds
 * one (it may spell one of them). The Python twin decides what it doubts. */
static int
object_fields(const unsigned char *p, Py_ssize_t n, Field fields[N_FIELDS])
{
    Json j = {p, p + n};
    for (int k = 0; k < N_FIELDS; k++)
        fields[k].state = FIELD_ABSENT;
    skip_ws(&j);
    if (j.p >= j.end || *j.p != '{')
        return 0;
    j.p++;
    skip_ws(&j);
    if (j.p < j.end && *j.p == '}')
        j.p++;
    else
        for (;;) { /* json_container's loop at depth 1, the keys read */
            if (j.p >= j.end || *j.p != '"')
                return 0;
            const unsigned char *key = j.p + 1;
            if (!json_string(&j))
                return 0;
            Py_ssize_t key_len = j.p - 1 - key;
            if (memchr(key, '\\', key_len) != NULL)
                return 0;
            int which = field_of(key, key_len);
            skip_ws(&j);
            if (j.p >= j.end || *j.p != ':')
                return 0;
            j.p++;
            skip_ws(&j);
            if (which < 0) {
                if (!json_value(&j, 2))
                    return 0;
            }
            else {
                Field *f = &fields[which];
                if (f->state != FIELD_ABSENT)
                    return 0; /* twice */
                const unsigned char *value = j.p;
                if (!json_value(&j, 2))
                    return 0;
                if (*value == '"') {
                    f->s = value + 1;
                    f->n = j.p - 1 - f->s;
                    if (memchr(f->s, '\\', f->n) != NULL)
                        return 0;
                    f->state = FIELD_STRING;
                }
                else
                    f->state = *value == 'n' ? FIELD_NULL : FIELD_OTHER;
            }
            skip_ws(&j);
            if (j.p >= j.end)
                return 0;
            if (*j.p == '}') {
                j.p++;
                break;
            }
            if (*j.p != ',')
                return 0;
            j.p++;
            skip_ws(&j);
        }
    skip_ws(&j);
    return j.p == j.end;
}

/* Does ``column`` (a str or None) say what ``f`` says? 1, 0, or -1 = not sure (a column
 * of another type, or a str without a UTF-8 form): the Python twin decides. */
static int
field_agrees(const Field *f, PyObject *column)
{
    if (column == Py_None)
        return f->state == FIELD_ABSENT || f->state == FIELD_NULL;
    if (!PyUnicode_CheckExact(column))
        return -1;
    if (f->state != FIELD_STRING)
        return 0;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(column, &n);
    if (s == NULL) {
        PyErr_Clear();
        return -1;
    }
    return n == f->n && memcmp(s, f->s, n) == 0;
}

/* Do an item's type, role and call_id columns say what its content says? 1, 0, or -1
 * = not sure (then ``agrees``, the Python twin, decides). */
static int
columns_agree_sure(const unsigned char *content, Py_ssize_t n, PyObject *const columns[N_FIELDS])
{
    Field fields[N_FIELDS];
    if (!object_fields(content, n, fields))
        return -1;
    int all = 1;
    for (int k = 0; k < N_FIELDS; k++) {
        int same = field_agrees(&fields[k], columns[k]);
        if (same < 0)
            return -1;
        all &= same;
    }
    return all;
}

/* The same with the Python twin deciding what C doubts: 1, 0, -1 error. */
static int
columns_agree(PyObject *content, const unsigned char *bytes, Py_ssize_t n,
              PyObject *const columns[N_FIELDS], PyObject *agrees)
{
    int sure = columns_agree_sure(bytes, n, columns);
    if (sure >= 0)
        return sure;
    PyObject *answer = PyObject_CallFunctionObjArgs(agrees, content, columns[0], columns[1],
                                                    columns[2], NULL);
    if (answer == NULL)
        return -1;
    int yes = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return yes;
}

/* columns_agree(content, type, role, call_id) -> True, False or None (not sure): the
 * fast path above alone, exposed for the tests. */
static PyObject *
columns_agree_fast(PyObject *self, PyObject *args)
{
    PyObject *content, *columns[N_FIELDS];
    if (!PyArg_ParseTuple(args, "OOOO:columns_agree", &content, &columns[0], &columns[1],
                          &columns[2]))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(content, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int sure = columns_agree_sure(view.buf, view.len, columns);
    PyBuffer_Release(&view);
    if (sure < 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(sure);
}

#define N_CHECKED 5 /* contents, digests, types, roles, call_ids */
static PyObject *checked_names[N_CHECKED]; /* TurnItems' field names of those columns */

/* item_mismatches(turns, agrees) -> (digest_bad, field_bad)
 * Twin of item_mismatches_py in ratchet/domain/history.py. ``turns``: TurnItems (any
 * objects with the columns contents, digests, types, roles, call_ids). A ValueError if
 * a turn's columns differ in length (every turn is looked at first). Then over all
 * their items, in order, in one pass: the first whose sha256 hex of its content is not
 * its digest stops it with (its index, -1); else (-1, the index of the first item
 * whose type, role and call_id columns do not say what its content does, or -1). */
static PyObject *
item_mismatches(PyObject *self, PyObject *args)
{
    PyObject *turns, *agrees;
    if (!PyArg_ParseTuple(args, "OO:item_mismatches", &turns, &agrees))
        return NULL;
    PyObject *ts = PySequence_Fast(turns, "turns must be a sequence");
    if (ts == NULL)
        return NULL;
    Py_ssize_t n_turns = PySequence_Fast_GET_SIZE(ts), n_cols = 0;
    PyObject **cols = PyMem_Calloc(n_turns ? n_turns * N_CHECKED : 1, sizeof(PyObject *));
    PyObject *result = NULL;
    Py_ssize_t digest_bad = -1, field_bad = -1, index = 0;
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t t = 0; t < n_turns; t++) {
        PyObject *turn = PySequence_Fast_GET_ITEM(ts, t);
        for (int c = 0; c < N_CHECKED; c++) {
            PyObject *column = PyObject_GetAttr(turn, checked_names[c]);
            if (column == NULL)
                goto done;
            /* A tuple as it is (TurnItems' columns), anything else copied: the twin
             * called back below cannot change what this loop walks. */
            cols[n_cols] = PySequence_Tuple(column);
            Py_DECREF(column);
            if (cols[n_cols] == NULL)
                goto done;
            n_cols++;
        }
        PyObject **turn_cols = cols + t * N_CHECKED;
        for (int c = 1; c < N_CHECKED; c++)
            if (PyTuple_GET_SIZE(turn_cols[c]) != PyTuple_GET_SIZE(turn_cols[0])) {
                PyErr_SetString(PyExc_ValueError, "the columns of a turn differ in length");
                goto done;
            }
    }
    for (Py_ssize_t t = 0; t < n_turns && digest_bad < 0; t++) {
        PyObject **turn_cols = cols + t * N_CHECKED;
        Py_ssize_t n = PyTuple_GET_SIZE(turn_cols[0]);
        for (Py_ssize_t i = 0; i < n; i++, index++) {
            PyObject *content = PyTuple_GET_ITEM(turn_cols[0], i);
            PyObject *columns[N_FIELDS] = {PyTuple_GET_ITEM(turn_cols[2], i),
                                           PyTuple_GET_ITEM(turn_cols[3], i),
                                           PyTuple_GET_ITEM(turn_cols[4], i)};
            Py_buffer view;
            char hex[65];
            if (PyObject_GetBuffer(content, &view, PyBUF_SIMPLE) < 0)
                goto done;
            int same = sha256_hex_into(view.buf, view.len, hex) < 0
                           ? -1
                           : hex_matches(hex, PyTuple_GET_ITEM(turn_cols[1], i));
            if (same == 1 && field_bad < 0) {
                int agree = columns_agree(content, view.buf, view.len, columns, agrees);
                if (agree < 0)
                    same = -1;
                else if (!agree)
                    field_bad = index;
            }
            PyBuffer_Release(&view);
            if (same < 0)
                goto done;
            if (!same) {
                digest_bad = index;
                field_bad = -1;
                break;
            }
        }
    }
    result = Py_BuildValue("(nn)", digest_bad, field_bad);
done:
    for (Py_ssize_t c = 0; c < n_cols; c++)
        Py_DECREF(cols[c]);
    PyMem_Free(cols);
    Py_DECREF(ts);
    return result;
}

/* ------------------------------------------------------- the items array */

/* UTF-8 bytes as a JSON string, escaped exactly as orjson (and pydantic) escape a
 * str: '"' and '\\' and the control characters (\b \t \n \f \r, else \u00xx);
 * everything else, non-ASCII included, as it is. */
/* 1 for the bytes a JSON string must escape: '"', '\\' and the controls. */
static unsigned char escaped[256];

static int
put_json_string(Buf *b, const unsigned char *s, Py_ssize_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (buf_reserve(b, n * 6 + 2) < 0)
        return -1;
    char *out = b->data + b->len;
    *out++ = '"';
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t run = i;
        while (run < n && !escaped[s[run]])
            run++;
        memcpy(out, s + i, run - i);
        out += run - i;
        if (run == n)
            break;
        unsigned char c = s[run];
        i = run + 1;
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\t': *out++ = 't'; break;
        case '\n': *out++ = 'n'; break;
        case '\f': *out++ = 'f'; break;
        case '\r': *out++ = 'r'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = hex[c >> 4];
            *out++ = hex[c & 15];
        }
    }
    *out++ = '"';
    b->len = out - b->data;
    return 0;
}

static int
put_str(Buf *b, PyObject *value)
{
    if (value == Py_None)
        return PUT_LITERAL(b, "null");
    if (!PyUnicode_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "item fields must be str or None");
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(value, &n);
    if (s == NULL)
        return -1;
    return put_json_string(b, (const unsigned char *)s, n);
}

/* The item's content as a JSON string: its bytes when the checker is sure they are a
 * UTF-8 JSON object, else what the Python twin content_text(item_id, content) returns
 * (or raises, unchanged). */
static int
put_content(Buf *b, PyObject *item_id, PyObject *content, PyObject *content_text)
{
    if (PyBytes_Check(content)) {
        const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(content);
        Py_ssize_t n = PyBytes_GET_SIZE(content);
        if (surely_json_object(s, n))
            return put_json_string(b, s, n);
    }
    PyObject *text = PyObject_CallFunctionObjArgs(content_text, item_id, content, NULL);
    if (text == NULL)
        return -1;
    int rc = put_str(b, text);
    Py_DECREF(text);
    return rc;
}

/* render_items(turns, content_text) -> bytes
 * Twin of items_json in services/api/render.py: the JSON array of every item of
 * ``turns`` (each a sequence of the columns ids, types, roles, call_ids, contents,
 * digests, formats), one object per item with HistoryItem's fields in order, byte for
 * byte what orjson.dumps writes for the same dicts. */
static PyObject *
render_items(PyObject *self, PyObject *args)
{
    PyObject *turns, *content_text;
    if (!PyArg_ParseTuple(args, "OO:render_items", &turns, &content_text))
        return NULL;
    PyObject *ts = PySequence_Fast(turns, "turns must be a sequence");
    if (ts == NULL)
        return NULL;
    PyObject *result = NULL;
    Buf b = {0};
    int first = 1;
    if (PUT_LITERAL(&b, "[") < 0)
        goto done;
    for (Py_ssize_t t = 0; t < PySequence_Fast_GET_SIZE(ts); t++) {
        PyObject *turn = PySequence_Fast(PySequence_Fast_GET_ITEM(ts, t),
                                         "a turn must be a sequence of 7 columns");
        if (turn == NULL)
            goto done;
        PyObject *cols[7];
        int ok = PySequence_Fast_GET_SIZE(turn) == 7;
        for (int c = 0; ok && c < 7; c++) {
            cols[c] = PySequence_Fast(PySequence_Fast_GET_ITEM(turn, c), "a column must be a sequence");
            if (cols[c] == NULL) {
                for (int k = 0; k < c; k++)
                    Py_DECREF(cols[k]);
                Py_DECREF(turn);
                goto done;
            }
        }
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "a turn must be a sequence of 7 columns");
            Py_DECREF(turn);
            goto done;
        }
        /* zip(..., strict=True) in the twin */
        Py_ssize_t n = PySequence_Fast_GET_SIZE(cols[0]);
        int failed = 0;
        for (int c = 1; c < 7; c++)
            if (PySequence_Fast_GET_SIZE(cols[c]) != n) {
                PyErr_SetString(PyExc_ValueError, "the columns of a turn differ in length");
                failed = 1;
            }
        for (Py_ssize_t i = 0; !failed && i < n; i++) {
#define COL(c) PySequence_Fast_GET_ITEM(cols[c], i)
            long long version = PyLong_AsLongLong(COL(6));
            if (version == -1 && PyErr_Occurred()) {
                failed = 1;
                break;
            }
            char num[32];
            int len = snprintf(num, sizeof num, "%lld", version);
            failed = (!first && PUT_LITERAL(&b, ",") < 0) ||
                     PUT_LITERAL(&b, "{\"item_id\":") < 0 || put_str(&b, COL(0)) < 0 ||
                     PUT_LITERAL(&b, ",\"type\":") < 0 || put_str(&b, COL(1)) < 0 ||
                     PUT_LITERAL(&b, ",\"role\":") < 0 || put_str(&b, COL(2)) < 0 ||
                     PUT_LITERAL(&b, ",\"call_id\":") < 0 || put_str(&b, COL(3)) < 0 ||
                     PUT_LITERAL(&b, ",\"content\":") < 0 ||
                     put_content(&b, COL(0), COL(4), content_text) < 0 ||
                     PUT_LITERAL(&b, ",\"content_digest\":") < 0 || put_str(&b, COL(5)) < 0 ||
                     PUT_LITERAL(&b, ",\"format_version\":") < 0 ||
                     buf_put(&b, num, len) < 0 || PUT_LITERAL(&b, "}") < 0;
            first = 0;
#undef COL
        }
        for (int c = 0; c < 7; c++)
            Py_DECREF(cols[c]);
        Py_DECREF(turn);
        if (failed)
            goto done;
    }
    if (PUT_LITERAL(&b, "]") < 0)
        goto done;
    result = PyBytes_FromStringAndSize(b.data, b.len);
done:
    PyMem_Free(b.data);
    Py_DECREF(ts);
    return result;
}

/* ------------------------------------------- an Avro body against the spec */

/* avro_conforms(plan, body) -> bool. Twin: strict_violation in schemas/strict.py.
 *
 * fastavro reads a negative enum or union index from the end of the list and any
 * boolean byte but 0 as true; schemas/strict.py explains why ratchet refuses both. This
 * walks the body over the writer schema's plan (schemas/strict.py, plan_of: a flat
 * int32 program, one node per schema node) and answers True only when the body keeps
 * to the spec: every enum and union index inside its list, every boolean 0 or 1, every
 * length inside the body, every block's byte size what its items took, and the record
 * ending where the body ends. False means "refused or not sure" (a varint wider than 64
 * bits, nesting deeper than MAX_AVRO_DEPTH, a block count beyond the bytes left, a node
 * the plan marks REFUSE): the Python walk then decides and says why. So this can only
 * let through what the Python walk lets through. avro_counted also bounds the
 * array items and map entries a body holds in all (a bound on what fastavro builds). */

enum {
    PLAN_NULL, PLAN_BOOLEAN, PLAN_VARINT, PLAN_FLOAT, PLAN_DOUBLE, PLAN_SIZED, PLAN_FIXED,
    PLAN_ENUM, PLAN_UNION, PLAN_RECORD, PLAN_ARRAY, PLAN_MAP, PLAN_REFUSE, PLAN_INT
};
#define MAX_AVRO_DEPTH 100

typedef struct {
    const unsigned char *p, *end;
    const int32_t *plan;
    Py_ssize_t plan_len; /* in int32s */
    /* Array items and map entries the body may still hold (-1: no bound); too_many is
     * set when it holds more and every byte before the first one too many conforms. */
    int64_t elements_left;
    int too_many;
    int ran_out;   /* the walk stopped because the body ended */
    int not_sure;  /* the walk stopped at what it does not take (depth, a REFUSE node) */
    int64_t nodes; /* schema nodes walked: what reading the body costs a reader */
} AvroWalk;

/* A zigzag varint of at most `most` bytes (Avro's long: 10; its int, and what Java reads
 * as one: an enum or union index, a length: 5) into *out; 0 if the body ends inside it,
 * it is longer, or its value does not fit 64 bits (not sure: the twin decides). */
static int
avro_varint_of(AvroWalk *w, int64_t *out, int most)
{
    uint64_t value = 0;
    for (int i = 0; i < most; i++) {
        if (w->p >= w->end) {
            w->ran_out = 1;
            return 0;
        }
        unsigned byte = *w->p++;
        if (i == 9 && (byte & 0x7E))
            return 0;
        value |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *out = (int64_t)((value >> 1) ^ (0 - (value & 1)));
            return 1;
        }
    }
    return 0;
}

static int
avro_varint(AvroWalk *w, int64_t *out) /* a long */
{
    return avro_varint_of(w, out, 10);
}

static int
avro_int(AvroWalk *w, int64_t *out)
{
    return avro_varint_of(w, out, 5);
}

/* Skip n bytes; 0 if n is negative or beyond the body. */
static int
avro_skip(AvroWalk *w, int64_t n)
{
    if (n < 0)
        return 0;
    if (n > w->end - w->p) {
        w->ran_out = 1;
        return 0;
    }
    w->p += n;
    return 1;
}

/* Does the node at `at` have `cells` int32s after its kind inside the plan? */
static int
plan_has(const AvroWalk *w, int32_t at, int64_t cells)
{
    return at >= 0 && at + 1 + cells <= w->plan_len;
}

static int avro_node(AvroWalk *w, int32_t at, int depth);

/* An array's or map's blocks: count, [byte size if count < 0], items; 0 ends them. */
static int
avro_blocks(AvroWalk *w, int32_t item, int is_map, int depth)
{
    for (;;) {
        int64_t count, size;
        if (!avro_varint(w, &count))
            return 0;
        if (count == 0)
            return 1;
        int sized = count < 0;
        /* the count's magnitude (2^63 for INT64_MIN, as the twin reads it) */
        uint64_t items = sized ? (uint64_t)0 - (uint64_t)count : (uint64_t)count;
        if (sized && !avro_varint(w, &size))
            return 0;
        const unsigned char *start = w->p;
        /* Items of zero bytes (null) could make a huge count loop for long: not sure.
         * With a bound on items the loop ends at the bound (counted item by item below,
         * as the twin counts them). */
        if (w->elements_left < 0 && items > (uint64_t)(w->end - w->p)) {
            w->not_sure = 1;
            return 0;
        }
        for (uint64_t i = 0; i < items; i++) {
            if (w->elements_left >= 0) {
                if (w->elements_left == 0) {
                    w->too_many = 1; /* every byte before this item conforms */
                    return 0;
                }
                w->elements_left--;
            }
            int64_t n;
            if (is_map && !(avro_int(w, &n) && avro_skip(w, n)))
                return 0;
            if (!avro_node(w, item, depth + 1))
                return 0;
        }
        /* A block's byte size must be what its items took: a reader that skips the
         * block by its size would go on elsewhere than one that reads the items. */
        if (sized && w->p - start != size)
            return 0;
    }
}

static int
avro_node(AvroWalk *w, int32_t at, int depth)
{
    if (depth > MAX_AVRO_DEPTH || !plan_has(w, at, 0)) {
        w->not_sure = 1;
        return 0;
    }
    const int32_t *node = w->plan + at;
    int64_t value;
    w->nodes++;
    switch (node[0]) {
    case PLAN_NULL:
        return 1;
    case PLAN_BOOLEAN:
        if (w->p >= w->end) {
            w->ran_out = 1;
            return 0;
        }
        return *w->p++ <= 1;
    case PLAN_VARINT:
        return avro_varint(w, &value);
    case PLAN_INT:
        return avro_int(w, &value);
    case PLAN_FLOAT:
        return avro_skip(w, 4);
    case PLAN_DOUBLE:
        return avro_skip(w, 8);
    case PLAN_SIZED:
        return avro_int(w, &value) && avro_skip(w, value);
    case PLAN_FIXED:
        return plan_has(w, at, 1) && avro_skip(w, node[1]);
    case PLAN_ENUM:
        if (!plan_has(w, at, 1)) {
            w->not_sure = 1;
            return 0;
        }
        return avro_int(w, &value) && value >= 0 && value < node[1];
    case PLAN_UNION:
        if (!plan_has(w, at, 1) || node[1] < 0 || !plan_has(w, at, 1 + (int64_t)node[1])) {
            w->not_sure = 1;
            return 0;
        }
        if (!avro_int(w, &value) || value < 0 || value >= node[1])
            return 0;
        return avro_node(w, node[2 + value], depth + 1);
    case PLAN_RECORD:
        if (!plan_has(w, at, 1) || node[1] < 0 || !plan_has(w, at, 1 + (int64_t)node[1])) {
            w->not_sure = 1;
            return 0;
        }
        for (int32_t i = 0; i < node[1]; i++)
            if (!avro_node(w, node[2 + i], depth + 1))
                return 0;
        return 1;
    case PLAN_ARRAY:
    case PLAN_MAP:
        if (!plan_has(w, at, 1)) {
            w->not_sure = 1;
            return 0;
        }
        return avro_blocks(w, node[1], node[0] == PLAN_MAP, depth);
    default: /* PLAN_REFUSE, or a kind this build does not know */
        w->not_sure = 1;
        return 0;
    }
}

/* What avro_walk_body found (avro_counted's codes; twin: refusal_of). */
enum {
    WALK_NOT_SURE = 0, /* a node it does not take (REFUSE, too deep): the twin decides */
    WALK_CONFORMS = 1, /* within the bound, if any */
    WALK_TOO_MANY = 2, /* more items than the bound; every byte before the first too many conforms */
    WALK_DAMAGED = 3,  /* breaks the spec before the body ends (or bytes after the record) */
    WALK_RAN_OUT = 4,  /* the body ends early (and conforms up to there) */
};

static int
avro_walk_body(Py_buffer *plan, Py_buffer *body, long long most_elements,
               Py_ssize_t *at, int64_t *nodes)
{
    AvroWalk w = {body->buf, (const unsigned char *)body->buf + body->len, plan->buf,
                  plan->len / (Py_ssize_t)sizeof(int32_t),
                  most_elements < 0 ? -1 : (int64_t)most_elements, 0, 0, 0, 0};
    int ok = avro_node(&w, 0, 0);
    *at = w.p - (const unsigned char *)body->buf;
    *nodes = w.nodes;
    if (ok)
        return w.p == w.end ? WALK_CONFORMS : WALK_DAMAGED; /* nothing after the record */
    if (w.too_many)
        return WALK_TOO_MANY;
    if (w.not_sure)
        return WALK_NOT_SURE;
    return w.ran_out ? WALK_RAN_OUT : WALK_DAMAGED;
}

static PyObject *
avro_conforms(PyObject *self, PyObject *args)
{
    Py_buffer plan, body;
    if (!PyArg_ParseTuple(args, "y*y*", &plan, &body))
        return NULL;
    Py_ssize_t at;
    int64_t nodes;
    int found = avro_walk_body(&plan, &body, -1, &at, &nodes);
    PyBuffer_Release(&plan);
    PyBuffer_Release(&body);
    return PyBool_FromLong(found == WALK_CONFORMS);
}

/* avro_counted(plan, body, most_elements) -> (code, byte, nodes): code as above (with
 * most_elements < 0: no bound), the byte the walk stopped at, the schema nodes it walked.
 * Twin: refusal_of in schemas/strict.py: 1 where it finds nothing, 2 where it refuses
 * too_many, 3 where it refuses otherwise before the end, 4 where it runs out. */
static PyObject *
avro_counted(PyObject *self, PyObject *args)
{
    Py_buffer plan, body;
    long long most_elements;
    if (!PyArg_ParseTuple(args, "y*y*L", &plan, &body, &most_elements))
        return NULL;
    Py_ssize_t at;
    int64_t nodes;
    int found = avro_walk_body(&plan, &body, most_elements, &at, &nodes);
    PyBuffer_Release(&plan);
    PyBuffer_Release(&body);
    return Py_BuildValue("(inL)", found, at, (long long)nodes);
}

/* ------------------------------------------- arrays and objects in JSON text */

/* json_containers(data, most) -> int. Twin: json_containers in schemas/canonical.py.
 *
 * The '[' and '{' of data outside JSON strings, counted up to most + 1 (the scan stops
 * there). A string opens at a '"' and closes at the next '"' that a backslash does not
 * escape (a backslash escapes the byte after it); one left open runs to the end. What
 * parsing a JSON text builds is bounded by this count (schemas/limits.py); text that
 * is not JSON is counted all the same (the parser refuses it later). */
static PyObject *
json_containers(PyObject *self, PyObject *args)
{
    Py_buffer data;
    long long most;
    if (!PyArg_ParseTuple(args, "y*L", &data, &most))
        return NULL;
    const unsigned char *p = data.buf, *end = p + data.len;
    long long count = 0;
    int in_string = 0;
    for (; p < end; p++) {
        unsigned c = *p;
        if (in_string) {
            if (c == '\\') {
                if (p + 1 < end)
                    p++; /* the escaped byte */
            } else if (c == '"') {
                in_string = 0;
            }
        } else if (c == '"') {
            in_string = 1;
        } else if ((c == '[' || c == '{') && ++count > most) {
            break;
        }
    }
    PyBuffer_Release(&data);
    return PyLong_FromLongLong(count);
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"decode_items_cell", decode_items_cell, METH_O,
     "The columns of an items cell, or None for no items (twin: services/store/rows.py)."},
    {"first_digest_mismatch", first_digest_mismatch, METH_VARARGS,
     "Index of the first content whose sha256 hex is not its digest, or -1."},
    {"ids_digest", ids_digest, METH_VARARGS,
     "A turn's items digest from its id and digest columns (twin: ratchet/domain/history.py)."},
    {"lineage_digest", lineage_digest, METH_VARARGS,
     "A turn's lineage digest (twin: ratchet/domain/history.py)."},
    {"is_json_object", is_json_object, METH_O,
     "True if surely one UTF-8 JSON object (False: not sure; the Python twin decides)."},
    {"columns_agree", columns_agree_fast, METH_VARARGS,
     "Do an item's type, role, call_id say what its content does? None: not sure."},
    {"item_mismatches", item_mismatches, METH_VARARGS,
     "(first digest mismatch, first column mismatch) over turns' items "
     "(twin: ratchet/domain/history.py)."},
    {"render_items", render_items, METH_VARARGS,
     "The items array's JSON (twin: items_json in services/api/render.py)."},
    {"avro_conforms", avro_conforms, METH_VARARGS,
     "True if an Avro body keeps to the spec over its plan (False: refused or not sure; "
     "twin: strict_violation in schemas/strict.py)."},
    {"json_containers", json_containers, METH_VARARGS,
     "The '[' and '{' of JSON text outside its strings, up to most + 1 "
     "(twin: json_containers in schemas/canonical.py)."},
    {"avro_counted", avro_counted, METH_VARARGS,
     "(code, byte, nodes): 1 if an Avro body keeps to the spec over its plan holding at "
     "most most_elements array items and map entries (< 0: any number), 2 if it holds "
     "more and keeps to it up to the first one too many, 3 damaged, 4 ends early, 0 not "
     "sure (twin: refusal_of in schemas/strict.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ratchet._speedups",
    "C twins of a history read's per-item loops and of the strict Avro walk "
    "(see ratchet/speedups.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    static const char *names[N_COLUMNS] = {"seqs", "ids", "types", "roles",
                                           "call_ids", "contents", "digests", "formats"};
    for (int c = 0; c < N_COLUMNS; c++)
        if ((column_names[c] = PyUnicode_InternFromString(names[c])) == NULL)
            return NULL;
    static const char *checked[N_CHECKED] = {"contents", "digests", "types", "roles",
                                             "call_ids"};
    for (int c = 0; c < N_CHECKED; c++)
        if ((checked_names[c] = PyUnicode_InternFromString(checked[c])) == NULL)
            return NULL;
    for (int c = 0; c < 256; c++) {
        escaped[c] = c < 0x20 || c == '"' || c == '\\';
        string_special[c] = escaped[c] || c >= 0x80;
    }
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    sha256_ctx = EVP_MD_CTX_new();
    if (sha256_md == NULL || sha256_ctx == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256");
        return NULL;
    }
    return PyModule_Create(&module);
}
