# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Pairing by address, compiled (ascmem.trace.profiler): a PyTorch trace
tells allocations and frees by address; ascmem's events name blocks by id.
The rules are those of trace_import._pair, which reads the rare trace this
cannot (sizes past 64 bits)."""

from libc.stdint cimport uint8_t, int64_t, uint64_t

import numpy as np


def pair_by_address(addr, delta, stream, where):
    """(alloc, ids, size, stream, where, skipped) of steps given as arrays:
    addr (uint64), delta (int64: > 0 an allocation of that size, < 0 a
    free, 0 nothing), stream (int64), where (int64).  An allocation at a
    live address first frees the block there (the profiler missed its
    free); a free of no live block is skipped and counted; a free carries
    its allocation's id, size and stream."""
    cdef Py_ssize_t n = len(addr), k, m = 0
    cdef int64_t skipped = 0, next_id = 0, d, c
    _, codes_arr = np.unique(np.asarray(addr, np.uint64), return_inverse=True)
    codes_arr = np.ascontiguousarray(codes_arr.reshape(-1), np.int64)
    cdef const int64_t[::1] code = codes_arr
    cdef const int64_t[::1] dl = np.ascontiguousarray(delta, np.int64)
    cdef const int64_t[::1] st = np.ascontiguousarray(stream, np.int64)
    cdef const int64_t[::1] wh = np.ascontiguousarray(where, np.int64)
    n_codes = int(codes_arr.max()) + 1 if n else 0
    live_id_arr = np.full(n_codes, -1, np.int64)
    live_size_arr = np.zeros(n_codes, np.int64)
    live_stream_arr = np.zeros(n_codes, np.int64)
    cdef int64_t[::1] live_id = live_id_arr, live_size = live_size_arr
    cdef int64_t[::1] live_stream = live_stream_arr
    for k in range(n):  # how many events: an allocation over a live block adds its free
        d = dl[k]
        c = code[k]
        if d > 0:
            m += 2 if live_id[c] >= 0 else 1
            live_id[c] = 0
        elif d < 0 and live_id[c] >= 0:
            m += 1
            live_id[c] = -1
    live_id_arr[:] = -1
    out_alloc = np.empty(m, np.uint8)
    out_ids = np.empty(m, np.int64)
    out_size = np.empty(m, np.uint64)
    out_stream = np.empty(m, np.int64)
    out_where = np.empty(m, np.int64)
    cdef uint8_t[::1] o_alloc = out_alloc
    cdef int64_t[::1] o_ids = out_ids, o_stream = out_stream, o_where = out_where
    cdef uint64_t[::1] o_size = out_size
    m = 0
    for k in range(n):
        d = dl[k]
        c = code[k]
        if d > 0:
            if live_id[c] >= 0:
                o_alloc[m] = 0
                o_ids[m] = live_id[c]
                o_size[m] = <uint64_t>live_size[c]
                o_stream[m] = live_stream[c]
                o_where[m] = wh[k]
                m += 1
            live_id[c] = next_id
            live_size[c] = d
            live_stream[c] = st[k]
            o_alloc[m] = 1
            o_ids[m] = next_id
            o_size[m] = <uint64_t>d
            o_stream[m] = st[k]
            o_where[m] = wh[k]
            m += 1
            next_id += 1
        elif d < 0:
            if live_id[c] < 0:
                skipped += 1  # allocated before recording started
                continue
            o_alloc[m] = 0
            o_ids[m] = live_id[c]
            o_size[m] = <uint64_t>live_size[c]
            o_stream[m] = live_stream[c]
            o_where[m] = wh[k]
            m += 1
            live_id[c] = -1
    return out_alloc, out_ids, out_size, out_stream, out_where, int(skipped)
