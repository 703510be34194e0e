# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The fast path of ascmem's CSV trace reader: complete lines of a chunk of
bytes into columns (typed memoryviews over numpy arrays; no numpy headers
needed).  It accepts the plain form of the format -- decimal ids and sizes,
decimal or 0x policies, known kinds, no quotes -- and stops at the first line
that is anything else; the caller then reads the file with the csv module,
which accepts what Python's int() does and names the error exactly."""

from libc.stdint cimport uint8_t, uint32_t, int64_t, uint64_t

# parse() status
cdef enum:
    _OK = 0      # every complete line in the chunk was read
    _FULL = 1    # the output columns are full: grow them and call again
    _OTHER = 2   # a line outside the fast path's form: the csv reader reads the file
OK, FULL, OTHER = _OK, _FULL, _OTHER

cdef uint64_t _U64_MAX = <uint64_t>-1
cdef uint64_t _I64_LIMIT = (<uint64_t>1) << 63
cdef uint64_t _U32_LIMIT = (<uint64_t>1) << 32


cdef inline bint _space(unsigned char c) nogil:
    return c == 32 or c == 9


cdef inline int _kind_code(const unsigned char[::1] b, Py_ssize_t s, Py_ssize_t e) nogil:
    """0: empty; 1-4: huge, normal, dvpp, host (any case); -1: anything else."""
    while s < e and _space(b[s]):
        s += 1
    while e > s and _space(b[e - 1]):
        e -= 1
    if s == e:
        return 0
    cdef char w[8]
    cdef Py_ssize_t n = e - s, i
    if n > 6:
        return -1
    for i in range(n):
        w[i] = b[s + i] | 0x20  # lower case (letters only reach here sensibly)
    if n == 4 and w[0] == b'h' and w[1] == b'u' and w[2] == b'g' and w[3] == b'e':
        return 1
    if n == 6 and w[0] == b'n' and w[1] == b'o' and w[2] == b'r' and w[3] == b'm' and \
            w[4] == b'a' and w[5] == b'l':
        return 2
    if n == 4 and w[0] == b'd' and w[1] == b'v' and w[2] == b'p' and w[3] == b'p':
        return 3
    if n == 4 and w[0] == b'h' and w[1] == b'o' and w[2] == b's' and w[3] == b't':
        return 4
    return -1


cdef inline bint _uint(const unsigned char[::1] b, Py_ssize_t s, Py_ssize_t e, int base,
                       uint64_t *out) nogil:
    """Digits between spaces, no sign, below 2**64; False for anything else
    (empty included)."""
    while s < e and _space(b[s]):
        s += 1
    while e > s and _space(b[e - 1]):
        e -= 1
    if s == e:
        return False
    cdef uint64_t v = 0, d
    cdef unsigned char c
    for i in range(s, e):
        c = b[i]
        if 48 <= c <= 57:
            d = c - 48
        elif base == 16 and 97 <= (c | 0x20) <= 102:
            d = (c | 0x20) - 87
        else:
            return False
        if v > (_U64_MAX - d) // <uint64_t>base:
            return False
        v = v * <uint64_t>base + d
    out[0] = v
    return True


cdef struct _At:
    Py_ssize_t n      # rows filled
    Py_ssize_t pos    # bytes consumed (complete lines read)
    Py_ssize_t line   # the file line number reached


cdef int _lines(const unsigned char[::1] buf, int id_col, int size_col, int kind_col,
                int policy_col, int stream_col, uint8_t[::1] op, int64_t[::1] ids,
                uint64_t[::1] size, uint8_t[::1] kind, uint32_t[::1] policy, uint32_t[::1] line,
                int64_t[::1] stream, _At *at) noexcept nogil:
    """parse()'s loop; at holds where it is, and where it stopped."""
    cdef Py_ssize_t length = buf.shape[0], cap = op.shape[0], end, s, e, f
    cdef Py_ssize_t starts[32]
    cdef Py_ssize_t ends[32]
    cdef int nf, k
    cdef uint64_t v, p
    cdef bint blank
    cdef unsigned char c, o
    while at.pos < length:
        end = at.pos
        while end < length and buf[end] != 10:
            end += 1
        if end == length:
            return _OK  # a partial last line: the next chunk completes it
        e = end
        if e > at.pos and buf[e - 1] == 13:
            e -= 1  # CRLF
        nf = 0
        s = at.pos
        blank = True
        for f in range(at.pos, e):
            c = buf[f]
            if c == 34 or c == 13:  # quotes, a stray CR: the csv reader's business
                return _OTHER
            if c == 44:
                if nf >= 31:
                    return _OTHER
                starts[nf] = s
                ends[nf] = f
                nf += 1
                s = f + 1
            elif not _space(c):
                blank = False
        starts[nf] = s
        ends[nf] = e
        nf += 1
        if blank:  # an empty line, or only commas and spaces: skipped
            at.pos = end + 1
            at.line += 1
            continue
        if nf < 3:
            return _OTHER
        if at.n == cap:
            return _FULL
        s, e = starts[0], ends[0]  # op: one letter between spaces
        while s < e and _space(buf[s]):
            s += 1
        while e > s and _space(buf[e - 1]):
            e -= 1
        if e - s != 1 or (buf[s] != 97 and buf[s] != 102):
            return _OTHER
        o = buf[s]
        if not _uint(buf, starts[id_col], ends[id_col], 10, &v) or v >= _I64_LIMIT:
            return _OTHER  # a negative or huge id: the csv reader takes it
        ids[at.n] = <int64_t>v
        line[at.n] = <uint32_t>at.line if <uint64_t>at.line < _U32_LIMIT else <uint32_t>(_U32_LIMIT - 1)
        if o == 97:  # 'a'
            op[at.n] = 1
            if not _uint(buf, starts[size_col], ends[size_col], 10, &v) or v == 0:
                return _OTHER
            size[at.n] = v
            k = 0
            if 0 <= kind_col < nf:
                k = _kind_code(buf, starts[kind_col], ends[kind_col])
                if k < 0:
                    return _OTHER
            kind[at.n] = <uint8_t>k
            p = 0
            if 0 <= policy_col < nf:
                s, e = starts[policy_col], ends[policy_col]
                while s < e and _space(buf[s]):
                    s += 1
                while e > s and _space(buf[e - 1]):
                    e -= 1
                if e > s:
                    if e - s > 2 and buf[s] == 48 and (buf[s + 1] | 0x20) == 120:
                        if not _uint(buf, s + 2, e, 16, &p):
                            return _OTHER
                    elif (e - s > 1 and buf[s] == 48) or not _uint(buf, s, e, 10, &p):
                        return _OTHER  # 0o, 0b, a leading zero: int(x, 0)'s rules
                    if p >= _U32_LIMIT:
                        return _OTHER
            policy[at.n] = <uint32_t>p
            if stream_col >= 0:  # without the column, stream is not written (a 1-row dummy)
                v = 0
                if stream_col < nf:
                    s, e = starts[stream_col], ends[stream_col]
                    while s < e and _space(buf[s]):
                        s += 1
                    if s < e and (not _uint(buf, s, e, 10, &v) or v >= _I64_LIMIT):
                        return _OTHER
                stream[at.n] = <int64_t>v
        else:
            op[at.n] = 0
            size[at.n] = 0
            kind[at.n] = 0
            policy[at.n] = 0
            if stream_col >= 0:
                stream[at.n] = 0
        at.n += 1
        at.pos = end + 1
        at.line += 1
    return _OK


def parse(const unsigned char[::1] buf, Py_ssize_t first_line, int id_col, int size_col,
          int kind_col, int policy_col, int stream_col, uint8_t[::1] op, int64_t[::1] ids,
          uint64_t[::1] size, uint8_t[::1] kind, uint32_t[::1] policy, uint32_t[::1] line,
          int64_t[::1] stream, Py_ssize_t n):
    """Reads the complete lines of buf (up to its last newline) into the
    columns from row n on.  first_line: the file line number of buf's first
    byte.  Returns (status, rows now filled, bytes consumed, the line number
    reached).  Frees get size 0, kind 0, policy 0, stream 0 (the caller
    copies them from their allocation)."""
    cdef _At at
    at.n, at.pos, at.line = n, 0, first_line
    cdef int status
    with nogil:
        status = _lines(buf, id_col, size_col, kind_col, policy_col, stream_col, op, ids, size,
                        kind, policy, line, stream, &at)
    return status, at.n, at.pos, at.line


# ---- pairing frees with their allocations ------------------------------------------------

from libc.stdlib cimport calloc, free as c_free


cdef struct _Slot:
    int64_t id
    int64_t row    # -1: empty; -2: a removed entry (a tombstone)


cdef inline uint64_t _hash(int64_t key) noexcept nogil:
    cdef uint64_t h = <uint64_t>key * <uint64_t>0x9E3779B97F4A7C15
    return h ^ (h >> 29)


cdef int _pair_rows(uint8_t[::1] op, int64_t[::1] ids, uint64_t[::1] size, uint8_t[::1] kind,
                    uint32_t[::1] policy, int64_t[::1] stream, Py_ssize_t *bad) noexcept nogil:
    """One pass in event order with a table of the live allocations (so its
    size follows the live set, not the trace).  0: every free found its
    allocation and took its size, kind and policy; 1: row *bad is a free of
    an id that is not live, or an allocation of an id that is live; -1: no
    memory for the table."""
    cdef Py_ssize_t n = op.shape[0], i, cap = 1024, used = 0, live = 0, j, k
    cdef bint streams = stream.shape[0] == n  # else a dummy: the trace has no streams
    cdef uint64_t mask, h
    cdef _Slot *t = <_Slot *>calloc(cap, sizeof(_Slot))
    cdef _Slot *old
    cdef Py_ssize_t old_cap
    cdef int64_t key, row
    if t is NULL:
        return -1
    for j in range(cap):
        t[j].row = -1
    for i in range(n):
        key = ids[i]
        mask = cap - 1
        h = _hash(key) & mask
        if op[i]:
            while t[h].row != -1 and not (t[h].row >= 0 and t[h].id == key):
                h = (h + 1) & mask
            if t[h].row >= 0:  # live already: a duplicate id (the csv reader words it)
                c_free(t)
                bad[0] = i
                return 1
            t[h].id = key
            t[h].row = i
            used += 1
            live += 1
            if used * 2 > cap:  # rebuild: drops the tombstones, doubles when the live set needs it
                old, old_cap = t, cap
                cap = cap * 2 if live * 4 > cap else cap
                t = <_Slot *>calloc(cap, sizeof(_Slot))
                if t is NULL:
                    c_free(old)
                    return -1
                for j in range(cap):
                    t[j].row = -1
                mask = cap - 1
                for j in range(old_cap):
                    if old[j].row >= 0:
                        k = _hash(old[j].id) & mask
                        while t[k].row != -1:
                            k = (k + 1) & mask
                        t[k] = old[j]
                c_free(old)
                used = live
        else:
            while t[h].row != -1 and not (t[h].row >= 0 and t[h].id == key):
                h = (h + 1) & mask
            if t[h].row < 0:
                c_free(t)
                bad[0] = i
                return 1
            row = t[h].row
            t[h].row = -2
            live -= 1
            size[i] = size[row]
            kind[i] = kind[row]
            policy[i] = policy[row]
            if streams:
                stream[i] = stream[row]
    c_free(t)
    return 0


def pair(uint8_t[::1] op, int64_t[::1] ids, uint64_t[::1] size, uint8_t[::1] kind,
         uint32_t[::1] policy, int64_t[::1] stream):
    """Gives each free its allocation's size, kind, policy and stream, in place.
    Returns -1 when every free found its allocation earlier in the trace,
    else the row of the first event that breaks the pairing."""
    cdef Py_ssize_t bad = -1
    cdef int st
    with nogil:
        st = _pair_rows(op, ids, size, kind, policy, stream, &bad)
    if st < 0:
        raise MemoryError("no memory for the trace reader's table of live allocations")
    return bad if st else -1
