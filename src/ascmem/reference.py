"""Best fit with immediate coalescing: the classic fragmentation champion,
written plainly in Python as a reference peer for frugality (slow is fine).
It lives in the package so that `ascmem fit --allocator bestfit` and
`ascmem bench` can compare against it anywhere.

Free blocks are kept in a list sorted by (size, offset); allocation takes the
smallest free block that fits (lowest address among equals), splits off the
rest; free merges with both neighbours at once."""
import bisect

from ascmem.errors import OutOfMemoryError

GRANULE = 64


class BestFit:
    def __init__(self, capacity, granule=GRANULE):
        self.granule = granule
        self.capacity = capacity // granule * granule
        self.by_size = [(self.capacity, 0)]  # (size, offset), sorted
        self.free_at = {0: self.capacity}     # offset -> size of free block
        self.free_end = {self.capacity: 0}    # end offset -> start offset
        self.used = {}                        # offset -> size

    def _remove_free(self, off):
        size = self.free_at.pop(off)
        del self.free_end[off + size]
        self.by_size.pop(bisect.bisect_left(self.by_size, (size, off)))
        return size

    def _add_free(self, off, size):
        self.free_at[off] = size
        self.free_end[off + size] = off
        bisect.insort(self.by_size, (size, off))

    def alloc(self, size, align=GRANULE):
        need = (size + self.granule - 1) // self.granule * self.granule
        i = bisect.bisect_left(self.by_size, (need, -1))
        if i == len(self.by_size):
            raise OutOfMemoryError(f"best fit: no free block of {need} bytes")
        block, off = self.by_size[i]
        self._remove_free(off)
        if block > need:
            self._add_free(off + need, block - need)
        self.used[off] = need
        return off

    def free(self, off):
        size = self.used.pop(off)
        if off + size in self.free_at:          # merge with the next block
            size += self._remove_free(off + size)
        if off in self.free_end:                # and with the previous one
            prev = self.free_end[off]
            size += self._remove_free(prev)
            off = prev
        self._add_free(off, size)

    def usable_size(self, off):
        return self.used[off]
