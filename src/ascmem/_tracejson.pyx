# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled reader of PyTorch profiler (Chrome) traces behind
ascmem.trace.profiler: a JSON scanner fed the text chunk by chunk that checks
the whole text is JSON (the grammar, string escapes, UTF-8, nesting no deeper
than a limit) and keeps, of the traceEvents list, only the [memory] events'
numbers in growable C columns: memory follows the number of memory events,
not the size of the text, and no Python object is made per event.

An event is read here when its fields are in the plain form the profiler
writes (name "[memory]"; ts a number; args an object whose Addr, Bytes,
Device Type and Device Id are integers of at most 18 digits, in range); any
other [memory] event -- and any event with an escape in a key or in its
name -- is handed whole to a Python callback (json on that one object), so
that its value or its error is exactly the one the whole-document reader
gives.  Duplicate keys: the last one counts, as in json."""

from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memcmp
from libc.stdint cimport int64_t, uint64_t
from libc.math cimport isfinite
from cpython.ref cimport PyObject
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE

import numpy as np

cdef extern from "Python.h":
    double PyOS_string_to_double(const char *s, char **endptr,
                                 PyObject *overflow_exception) except? -1.0

# json refuses integers longer than this (sys.get_int_max_str_digits())
DEF INT_DIGITS_MAX = 4300

# a step's outcome
cdef enum:
    OK = 0
    MORE = 1     # the text ends inside it: wait for the next chunk
    ERR = 2

# top-level states
cdef enum:
    S_START, S_DOC_FIRST_KEY, S_DOC_KEY, S_DOC_COLON, S_DOC_VALUE, S_DOC_AFTER,
    S_ITEMS_FIRST, S_ITEMS_NEXT, S_ITEMS_AFTER, S_END

# what an event's field held: missing, a plain value read here, anything else
cdef enum:
    F_MISSING = 0
    F_PLAIN = 1
    F_OTHER = 2


class ScanError(ValueError):
    """The text is not JSON (or nests too deep): offset is the byte where,
    index the traceEvents entry being read (-1 outside the list), nesting
    whether the depth limit was hit."""

    def __init__(self, what, offset, index, nesting=False):
        super().__init__(what)
        self.offset, self.index, self.nesting = offset, index, nesting


cdef struct Fields:
    # what the event object read so far holds (the last of each key)
    int slow             # an escape in a key or the name: Python decides
    int memory           # name is "[memory]"
    int ts, args, addr, nbytes, dtype, did   # F_* of each
    const unsigned char *ts_at
    int ts_int
    int64_t ts_value, addr_value, nbytes_value, dtype_value, did_value


cdef struct Ctx:
    const unsigned char *end
    const char *err
    const unsigned char *err_at
    int status
    int limit            # the deepest nesting allowed
    int nesting          # err is the depth limit


cdef inline const unsigned char *_more(Ctx *c) noexcept:
    c.status = MORE
    return NULL


cdef inline const unsigned char *_fail(Ctx *c, const unsigned char *at, const char *what) noexcept:
    c.status = ERR
    c.err = what
    c.err_at = at
    return NULL


cdef inline const unsigned char *_ws(const unsigned char *p, const unsigned char *end) noexcept:
    while p < end and (p[0] == 32 or p[0] == 10 or p[0] == 13 or p[0] == 9):
        p += 1
    return p


cdef inline bint _cont(unsigned char b) noexcept:
    return b & 0xC0 == 0x80


cdef const unsigned char *_string(Ctx *c, const unsigned char *p, int *escaped) noexcept:
    """p at the opening quote; past the closing one.  Escapes, control
    characters and UTF-8 checked as Python's decoder and json check them."""
    cdef const unsigned char *end = c.end
    cdef unsigned char b
    cdef int k, need
    p += 1
    while True:
        while p < end and p[0] >= 32 and p[0] < 128 and p[0] != 34 and p[0] != 92:
            p += 1
        if p >= end:
            return _more(c)
        b = p[0]
        if b == 34:
            return p + 1
        if b == 92:
            escaped[0] = 1
            if p + 1 >= end:
                return _more(c)
            b = p[1]
            if b == 117:  # \uXXXX
                for k in range(4):
                    if p + 2 + k >= end:
                        return _more(c)
                    b = p[2 + k]
                    if not (48 <= b <= 57 or 65 <= b <= 70 or 97 <= b <= 102):
                        return _fail(c, p, "a \\u escape without four hex digits")
                p += 6
            elif b == 34 or b == 92 or b == 47 or b == 98 or b == 102 or b == 110 or \
                    b == 114 or b == 116:
                p += 2
            else:
                return _fail(c, p, "an invalid escape in a string")
            continue
        if b < 32:
            return _fail(c, p, "a control character in a string")
        # a UTF-8 sequence: what Python's utf-8 decoder accepts
        if 0xC2 <= b <= 0xDF:
            need = 1
        elif 0xE0 <= b <= 0xEF:
            need = 2
        elif 0xF0 <= b <= 0xF4:
            need = 3
        else:
            return _fail(c, p, "not UTF-8")
        if p + need >= end:
            return _more(c)
        for k in range(1, need + 1):
            if not _cont(p[k]):
                return _fail(c, p, "not UTF-8")
        if (b == 0xE0 and p[1] < 0xA0) or (b == 0xED and p[1] > 0x9F) or \
                (b == 0xF0 and p[1] < 0x90) or (b == 0xF4 and p[1] > 0x8F):
            return _fail(c, p, "not UTF-8")  # overlong, a surrogate, past U+10FFFF
        p += need + 1


cdef const unsigned char *_number(Ctx *c, const unsigned char *p, int *is_int,
                                  int *digits, int64_t *value) noexcept:
    """A JSON number at p; is_int: no fraction, no exponent; value: the
    integer when digits <= 18."""
    cdef const unsigned char *end = c.end
    cdef const unsigned char *start = p
    cdef bint negative = False
    cdef int64_t v = 0
    cdef int n = 0
    if p[0] == 45:
        negative = True
        p += 1
        if p >= end:
            return _more(c)
    if p[0] == 48:
        p += 1
        n = 1
    elif 49 <= p[0] <= 57:
        while p < end and 48 <= p[0] <= 57:
            if n < 18:
                v = v * 10 + (p[0] - 48)
            n += 1
            p += 1
    else:
        return _fail(c, start, "an invalid value")
    is_int[0] = 1
    if p < end and p[0] == 46:  # .
        is_int[0] = 0
        p += 1
        if p >= end:
            return _more(c)
        if not 48 <= p[0] <= 57:
            return _fail(c, p, "a number without digits after its point")
        while p < end and 48 <= p[0] <= 57:
            p += 1
    if p < end and (p[0] == 101 or p[0] == 69):  # e E
        is_int[0] = 0
        p += 1
        if p < end and (p[0] == 43 or p[0] == 45):
            p += 1
        if p >= end:
            return _more(c)
        if not 48 <= p[0] <= 57:
            return _fail(c, p, "a number without digits in its exponent")
        while p < end and 48 <= p[0] <= 57:
            p += 1
    if p >= end:
        return _more(c)  # the number may go on in the next chunk
    if is_int[0] and n > INT_DIGITS_MAX:
        return _fail(c, start, "an integer of more digits than Python reads")
    digits[0] = n
    value[0] = -v if negative else v
    return p


cdef const unsigned char *_literal(Ctx *c, const unsigned char *p, const char *word,
                                   int n) noexcept:
    cdef int k
    for k in range(n):
        if p + k >= c.end:
            return _more(c)
        if p[k] != <unsigned char>word[k]:
            return _fail(c, p, "an invalid value")
    return p + n


cdef const unsigned char *_value(Ctx *c, const unsigned char *p, int depth) noexcept:
    """Past the JSON value at p (depth: that of the container it is in)."""
    cdef int escaped = 0, is_int, digits
    cdef int64_t v
    cdef unsigned char b, close
    if p >= c.end:
        return _more(c)
    b = p[0]
    if b == 34:
        return _string(c, p, &escaped)
    if b == 123 or b == 91:  # { [
        if depth + 1 > c.limit:
            c.nesting = 1
            return _fail(c, p, "nested too deep")
        close = 125 if b == 123 else 93
        p = _ws(p + 1, c.end)
        if p >= c.end:
            return _more(c)
        if p[0] == close:
            return p + 1
        while True:
            if b == 123:
                if p[0] != 34:
                    return _fail(c, p, "expected a key")
                p = _string(c, p, &escaped)
                if p == NULL:
                    return NULL
                p = _ws(p, c.end)
                if p >= c.end:
                    return _more(c)
                if p[0] != 58:
                    return _fail(c, p, "expected ':'")
                p = _ws(p + 1, c.end)
            p = _value(c, p, depth + 1)
            if p == NULL:
                return NULL
            p = _ws(p, c.end)
            if p >= c.end:
                return _more(c)
            if p[0] == close:
                return p + 1
            if p[0] != 44:
                return _fail(c, p, "expected ',' or '}'" if b == 123 else "expected ',' or ']'")
            p = _ws(p + 1, c.end)
            if p >= c.end:
                return _more(c)
    if b == 116:
        return _literal(c, p, "true", 4)
    if b == 102:
        return _literal(c, p, "false", 5)
    if b == 110:
        return _literal(c, p, "null", 4)
    if b == 45 or 48 <= b <= 57:
        return _number(c, p, &is_int, &digits, &v)
    return _fail(c, p, "an invalid value")


cdef inline bint _key_is(const unsigned char *k, Py_ssize_t n, const char *word,
                         Py_ssize_t wn) noexcept:
    return n == wn and memcmp(k, word, wn) == 0


cdef const unsigned char *_members(Ctx *c, const unsigned char *p, int depth, Fields *f,
                                   bint top) noexcept:
    """The members of the event object (top) or of its args at p (past the
    '{'), with the fields the reader needs noted in f."""
    cdef const unsigned char *k
    cdef Py_ssize_t kn
    cdef int escaped, is_int, digits
    cdef int64_t v
    p = _ws(p, c.end)
    if p >= c.end:
        return _more(c)
    if p[0] == 125:
        return p + 1
    while True:
        if p[0] != 34:
            return _fail(c, p, "expected a key")
        escaped = 0
        k = p + 1
        p = _string(c, p, &escaped)
        if p == NULL:
            return NULL
        kn = p - 1 - k
        if escaped:
            f.slow = 1
        p = _ws(p, c.end)
        if p >= c.end:
            return _more(c)
        if p[0] != 58:
            return _fail(c, p, "expected ':'")
        p = _ws(p + 1, c.end)
        if p >= c.end:
            return _more(c)
        if top and _key_is(k, kn, "name", 4):
            if p[0] == 34:
                escaped = 0
                k = p + 1
                p = _string(c, p, &escaped)
                if p == NULL:
                    return NULL
                if escaped:
                    f.slow = 1
                f.memory = _key_is(k, p - 1 - k, "[memory]", 8)
            else:
                f.memory = 0
                p = _value(c, p, depth)
        elif top and _key_is(k, kn, "ts", 2):
            if p[0] == 45 or 48 <= p[0] <= 57:
                f.ts_at = p
                p = _number(c, p, &is_int, &digits, &f.ts_value)
                f.ts_int = is_int
                f.ts = F_PLAIN if (not is_int or digits <= 15) else F_OTHER
            else:
                f.ts = F_OTHER
                p = _value(c, p, depth)
        elif top and _key_is(k, kn, "args", 4):
            f.addr = f.nbytes = f.dtype = f.did = F_MISSING
            if p[0] == 123:
                if depth + 1 > c.limit:
                    c.nesting = 1
                    return _fail(c, p, "nested too deep")
                f.args = F_PLAIN
                p = _members(c, p + 1, depth + 1, f, False)
            else:
                f.args = F_OTHER
                p = _value(c, p, depth)
        elif not top and _key_is(k, kn, "Addr", 4):
            p = _int_member(c, p, depth, &f.addr, &f.addr_value)
        elif not top and _key_is(k, kn, "Bytes", 5):
            p = _int_member(c, p, depth, &f.nbytes, &f.nbytes_value)
        elif not top and _key_is(k, kn, "Device Type", 11):
            p = _int_member(c, p, depth, &f.dtype, &f.dtype_value)
        elif not top and _key_is(k, kn, "Device Id", 9):
            p = _int_member(c, p, depth, &f.did, &f.did_value)
        else:
            p = _value(c, p, depth)
        if p == NULL:
            return NULL
        p = _ws(p, c.end)
        if p >= c.end:
            return _more(c)
        if p[0] == 125:
            return p + 1
        if p[0] != 44:
            return _fail(c, p, "expected ',' or '}'")
        p = _ws(p + 1, c.end)
        if p >= c.end:
            return _more(c)


cdef const unsigned char *_int_member(Ctx *c, const unsigned char *p, int depth, int *kind,
                                      int64_t *value) noexcept:
    cdef int is_int = 0, digits = 0
    if p[0] == 45 or 48 <= p[0] <= 57:
        p = _number(c, p, &is_int, &digits, value)
        kind[0] = F_PLAIN if is_int and digits <= 18 else F_OTHER
        return p
    kind[0] = F_OTHER
    return _value(c, p, depth)


cdef inline bint _grown(void **column, Py_ssize_t rows) noexcept:
    """Reallocates one 8-byte column to rows; False (the old array kept) when
    there is no memory."""
    cdef void *p = realloc(column[0], rows * 8)
    if p == NULL:
        return False
    column[0] = p
    return True


cdef class ChromeScanner:
    """feed(chunk) for each chunk of the text, then finish().  Columns, one
    entry per [memory] event of the (last) traceEvents list: ts, index (in
    the list), addr (as unsigned 64 bits), nbytes (signed; 0 with the exact
    value in big when it does not fit), device (Device Type << 32 | Device
    Id + 1).  slow_event(scanner, text, index) is called with the text of
    each event this reader leaves to Python; it calls add() for a [memory]
    event, or raises."""
    cdef bytearray buf
    cdef Py_ssize_t pos          # where in buf the next step starts
    cdef long long origin        # the text offset of buf[0]
    cdef long long retry_at      # the text offset the next step waits for
    cdef int state
    cdef int limit
    cdef int items_depth         # nesting of traceEvents' entries' container
    cdef bint key_is_events      # the document key just read is traceEvents
    cdef public bint has_list    # the (last) traceEvents is a list
    cdef public bint is_object   # the document is an object, not a list
    cdef public long long index  # entries of traceEvents read
    cdef public dict big
    cdef public object pending   # the first malformed event's error, raised at the end
    cdef object slow_event
    # the columns
    cdef Py_ssize_t n, cap
    cdef double *ts
    cdef int64_t *idx
    cdef uint64_t *addr
    cdef int64_t *nbytes
    cdef int64_t *dev

    def __init__(self, int limit, slow_event):
        self.buf = bytearray()
        self.limit = limit
        self.slow_event = slow_event
        self.big = {}
        self.state = S_START

    def __dealloc__(self):
        free(self.ts)
        free(self.idx)
        free(self.addr)
        free(self.nbytes)
        free(self.dev)

    cdef int _grow(self) except -1:
        # every column is 8 bytes a row; one that fails to grow keeps its old
        # array (freed in __dealloc__), so cap stays what all of them hold
        cdef Py_ssize_t cap = self.cap * 2 if self.cap else 4096
        cdef bint ok = (_grown(<void **>&self.ts, cap) & _grown(<void **>&self.idx, cap) &
                        _grown(<void **>&self.addr, cap) & _grown(<void **>&self.nbytes, cap) &
                        _grown(<void **>&self.dev, cap))
        if not ok:
            raise MemoryError()
        self.cap = cap
        return 0

    cdef inline int _add(self, double ts, int64_t index, uint64_t addr, int64_t nbytes,
                         int64_t dev) except -1:
        if self.n == self.cap:
            self._grow()
        self.ts[self.n] = ts
        self.idx[self.n] = index
        self.addr[self.n] = addr
        self.nbytes[self.n] = nbytes
        self.dev[self.n] = dev
        self.n += 1
        return 0

    def add(self, double ts, int64_t index, object addr, object nbytes, int dtype, int did):
        """A [memory] event the Python callback read (its fields checked)."""
        if -(1 << 63) <= nbytes < (1 << 63):
            small = nbytes
        else:
            small = 0
            self.big[index] = nbytes
        self._add(ts, index, <uint64_t>(addr & 0xFFFFFFFFFFFFFFFF), small,
                  (<int64_t>dtype << 32) | (<int64_t>did + 1))  # in 64 bits: did may be 2**31 - 1

    def __len__(self):
        return self.n

    def columns(self):
        """(ts, index, addr, nbytes, device) numpy arrays, once: the C
        columns are freed as they are handed over."""
        n = self.n
        ts = np.empty(n, np.float64)
        idx = np.empty(n, np.int64)
        addr = np.empty(n, np.uint64)
        nbytes = np.empty(n, np.int64)
        dev = np.empty(n, np.int64)
        cdef double[::1] ts_v = ts
        cdef int64_t[::1] idx_v = idx, nbytes_v = nbytes, dev_v = dev
        cdef uint64_t[::1] addr_v = addr
        if n:
            memcpy(&ts_v[0], self.ts, n * 8)
            memcpy(&idx_v[0], self.idx, n * 8)
            memcpy(&addr_v[0], self.addr, n * 8)
            memcpy(&nbytes_v[0], self.nbytes, n * 8)
            memcpy(&dev_v[0], self.dev, n * 8)
        free(self.ts)
        free(self.idx)
        free(self.addr)
        free(self.nbytes)
        free(self.dev)
        self.ts = NULL
        self.idx = self.nbytes = self.dev = NULL
        self.addr = NULL
        self.n = self.cap = 0
        return ts, idx, addr, nbytes, dev

    def feed(self, chunk):
        """Reads what chunk completes; raises ScanError where the text stops
        being JSON."""
        if self.pos:
            del self.buf[:self.pos]
            self.origin += self.pos
            self.pos = 0
        self.buf += chunk
        if self.origin + len(self.buf) >= self.retry_at:
            self._run(False)

    def finish(self):
        """After the last chunk: the text must have ended with the document."""
        self._run(True)
        if self.state != S_END:
            raise ScanError("the text ends before the document does", self.origin + self.pos,
                            self.index if self.state >= S_ITEMS_FIRST and
                            self.state <= S_ITEMS_AFTER else -1)

    cdef int _run(self, bint final) except -1:
        cdef const unsigned char *base = <const unsigned char *>PyByteArray_AS_STRING(self.buf)
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self.buf)
        cdef Ctx c
        cdef const unsigned char *p
        cdef const unsigned char *q = NULL
        cdef int escaped
        cdef Fields f
        c.end = base + size
        c.limit = self.limit
        while True:
            c.status = OK
            c.nesting = 0
            if self.state == S_START and self.origin + self.pos == 0:
                if size < 3 and not final:
                    return 0  # a byte order mark may be split
                if size >= 3 and memcmp(base, b"\xef\xbb\xbf", 3) == 0:
                    self.pos = 3  # one, as the utf-8-sig decoder takes
            p = _ws(base + self.pos, c.end)
            if p >= c.end:
                self.pos = p - base
                return 0
            if self.state == S_START:
                if p[0] == 123:
                    self.is_object = True
                    self.state = S_DOC_FIRST_KEY
                elif p[0] == 91:
                    self.has_list = True
                    self.items_depth = 1
                    self.state = S_ITEMS_FIRST
                else:
                    self._error(&c, p, "expected '{' or '['")
                q = p + 1
            elif self.state == S_DOC_FIRST_KEY or self.state == S_DOC_KEY:
                if p[0] == 125 and self.state == S_DOC_FIRST_KEY:
                    self.state = S_END
                    q = p + 1
                elif p[0] != 34:
                    self._error(&c, p, "expected a key")
                else:
                    escaped = 0
                    q = _string(&c, p, &escaped)
                    if q == NULL:
                        if c.status == MORE and not final:
                            return self._wait(base, p, size)
                        self._error(&c, p, "the text ends inside a key")
                    if escaped:
                        self.key_is_events = self._decoded(p, q) == "traceEvents"
                    else:
                        self.key_is_events = _key_is(p + 1, q - p - 2, "traceEvents", 11)
                    self.state = S_DOC_COLON
            elif self.state == S_DOC_COLON:
                if p[0] != 58:
                    self._error(&c, p, "expected ':'")
                self.state = S_DOC_VALUE
                q = p + 1
            elif self.state == S_DOC_VALUE:
                if self.key_is_events:  # a later traceEvents replaces an earlier one, as in json
                    self.n = 0
                    self.index = 0
                    self.big = {}
                    self.pending = None
                    self.has_list = p[0] == 91
                if self.key_is_events and p[0] == 91:
                    self.items_depth = 2
                    self.state = S_ITEMS_FIRST
                    q = p + 1
                else:
                    q = _value(&c, p, 1)
                    if q == NULL:
                        if c.status == MORE and not final:
                            return self._wait(base, p, size)
                        self._error(&c, p, "the text ends inside a value")
                    self.state = S_DOC_AFTER
            elif self.state == S_DOC_AFTER:
                if p[0] == 44:
                    self.state = S_DOC_KEY
                elif p[0] == 125:
                    self.state = S_END
                else:
                    self._error(&c, p, "expected ',' or '}'")
                q = p + 1
            elif self.state == S_ITEMS_FIRST or self.state == S_ITEMS_NEXT:
                if p[0] == 93 and self.state == S_ITEMS_FIRST:
                    self.state = S_DOC_AFTER if self.is_object else S_END
                    q = p + 1
                else:
                    q = self._event(&c, p, &f)
                    if q == NULL:
                        if c.status == MORE and not final:
                            return self._wait(base, p, size)
                        self._error(&c, p, "the text ends inside an entry")
                    self.index += 1
                    self.state = S_ITEMS_AFTER
            elif self.state == S_ITEMS_AFTER:
                if p[0] == 44:
                    self.state = S_ITEMS_NEXT
                elif p[0] == 93:
                    self.state = S_DOC_AFTER if self.is_object else S_END
                else:
                    self._error(&c, p, "expected ',' or ']'")
                q = p + 1
            else:  # S_END
                self._error(&c, p, "extra data after the document")
            self.pos = q - base

    cdef int _wait(self, const unsigned char *base, const unsigned char *p,
                   Py_ssize_t size) except -1:
        """The value at p goes on past the text so far: read again once the
        text has grown by as much as that value's part, so that a huge value
        is scanned a bounded number of times, not once per chunk."""
        self.pos = p - base
        self.retry_at = self.origin + size + (size - self.pos)
        return 0

    cdef const unsigned char *_event(self, Ctx *c, const unsigned char *p, Fields *f) except? NULL:
        """Past the traceEvents entry at p; a [memory] event's numbers
        added to the columns."""
        cdef const unsigned char *q = NULL
        cdef double ts
        cdef char *stop
        cdef int depth = self.items_depth + 1
        if p[0] != 123:
            return _value(c, p, self.items_depth)
        if depth > c.limit:
            c.nesting = 1
            return _fail(c, p, "nested too deep")
        f.slow = f.memory = 0
        f.ts = f.args = f.addr = f.nbytes = f.dtype = f.did = F_MISSING
        q = _members(c, p + 1, depth, f, True)
        if q == NULL:
            return NULL
        if f.slow:
            self.slow_event(self, bytes((<const char *>p)[:q - p]), self.index)
            return q
        if not f.memory:
            return q
        if f.args == F_PLAIN and f.addr == F_PLAIN and f.nbytes == F_PLAIN and \
                f.dtype != F_OTHER and f.did != F_OTHER and f.ts != F_OTHER:
            if f.dtype == F_MISSING:
                f.dtype_value = 0
            if f.did == F_MISSING:
                f.did_value = -1
            if f.ts == F_MISSING:
                ts = 0.0
            elif f.ts_int:
                ts = <double>f.ts_value
            else:
                ts = PyOS_string_to_double(<const char *>f.ts_at, &stop, NULL)
            if isfinite(ts) and 0 <= f.dtype_value < (1 << 31) and \
                    -1 <= f.did_value < (1 << 31):
                self._add(ts, self.index, <uint64_t>f.addr_value, f.nbytes_value,
                          (f.dtype_value << 32) | (f.did_value + 1))
                return q
        # anything else: json on this one event says what it holds, or what is wrong
        self.slow_event(self, bytes((<const char *>p)[:q - p]), self.index)
        return q

    cdef str _decoded(self, const unsigned char *p, const unsigned char *q):
        import json
        return json.loads(bytes((<const char *>p)[:q - p]).decode("utf-8"))

    cdef int _error(self, Ctx *c, const unsigned char *p, const char *what) except -1:
        cdef const unsigned char *base = <const unsigned char *>PyByteArray_AS_STRING(self.buf)
        cdef const unsigned char *at = c.err_at if c.status == ERR else p
        cdef str message = (c.err if c.status == ERR else what).decode("ascii")
        in_items = self.state >= S_ITEMS_FIRST and self.state <= S_ITEMS_AFTER
        raise ScanError(message, self.origin + (at - base), self.index if in_items else -1,
                        bool(c.nesting))
