# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled guard of the JSON trace reader (ascmem.trace.profiler): the
nesting depth of a JSON text fed to it chunk by chunk.  The streaming parser
(ijson's yajl backend) spends gigabytes on a few hundred thousand open
brackets before it fails; a Chrome trace nests four deep, so the reader
refuses a text that goes deeper than a limit before the parser sees it."""


cdef class NestingGuard:
    """feed(chunk) returns the byte offset (from the text's start) where the
    depth first exceeds limit, or -1; strings (and their escapes) are
    skipped, across chunk boundaries too."""
    cdef int depth, limit
    cdef bint in_string, escaped
    cdef long long offset

    def __init__(self, int limit):
        self.limit = limit

    def feed(self, const unsigned char[::1] chunk):
        cdef Py_ssize_t i, n = chunk.shape[0]
        cdef unsigned char c
        cdef int depth = self.depth, limit = self.limit
        cdef bint in_string = self.in_string, escaped = self.escaped
        cdef long long found = -1
        with nogil:
            for i in range(n):
                c = chunk[i]
                if in_string:
                    if escaped:
                        escaped = False
                    elif c == 92:  # backslash
                        escaped = True
                    elif c == 34:
                        in_string = False
                elif c == 34:
                    in_string = True
                elif c == 91 or c == 123:  # [ {
                    depth += 1
                    if depth > limit:
                        found = self.offset + i
                        break
                elif c == 93 or c == 125:  # ] }
                    depth -= 1
        self.depth, self.in_string, self.escaped = depth, in_string, escaped
        self.offset += n
        return found
