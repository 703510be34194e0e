"""Best fit with immediate coalescing: the classic fragmentation champion,
written plainly in Python as a reference peer for frugality (slow is fine).
It lives in the package so that `ascmem fit --allocator bestfit` and
`ascmem bench` can compare against it anywhere.

Free blocks are kept in a list sorted by (size, offset); allocation takes the
smallest free block that fits (lowest address among equals), splits off the
rest; free merges with both neighbours at once.

BestFitWilderness is the same with the "wilderness" rule of the allocator
literature (Wilson, Johnstone, Neely and Boles, "Dynamic Storage Allocation:
A Survey and Critical Review", 1995, section 3.5 "wilderness preservation",
after Korn and Vo 1985): the free block at the arena's end -- the part never
touched, with whatever was freed next to it -- is taken only when no other
free block fits, whatever their sizes.  Its placements do not depend on the
capacity until one fails, so the smallest arena that replays a trace is its
high-water mark.

bestfit_unmapped_peak is best fit in a virtual range so large that the end
is never reached, unmapping every granule that no live block touches: the
reference of a page-mapped pool.

These are the readable references.  What replay, fit, plan and bench run
is their compiled twin, ascmem._replay_peers (the same algorithm over C++
ordered sets; tests/test_replay_compiled.py checks that every figure on
every shipped trace is the same)."""
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


class BestFitWilderness(BestFit):
    """Best fit that keeps the arena's untouched end for last (see the module's
    docstring).  high_water: the highest end of a block so far, the arena the
    replay needed."""

    def __init__(self, capacity, granule=GRANULE):
        super().__init__(capacity, granule)
        self.high_water = 0

    def alloc(self, size, align=GRANULE):
        need = (size + self.granule - 1) // self.granule * self.granule
        i = bisect.bisect_left(self.by_size, (need, -1))
        end = self.free_end.get(self.capacity)  # the wilderness's start, if any of it is left
        if i < len(self.by_size) and self.by_size[i][1] == end:
            i += 1  # the wilderness is the best fit: any larger block comes first
        if i == len(self.by_size):
            if end is None or self.free_at[end] < need:
                raise OutOfMemoryError(f"best fit: no free block of {need} bytes")
            off = end
        else:
            off = self.by_size[i][1]
        block = self._remove_free(off)
        if block > need:
            self._add_free(off + need, block - need)
        self.used[off] = need
        self.high_water = max(self.high_water, off + need)
        return off


def bestfit_unmapped_peak(trace, granule):
    """The most bytes in whole granules that best fit (in 64-byte units, in a
    range no trace reaches the end of) keeps mapped when it unmaps every
    granule no live block touches: peak over the trace of the granules live
    blocks touch, times granule."""
    fit = BestFit(1 << 46)
    refs = {}  # granule index -> live blocks touching it
    live, mapped, peak = {}, 0, 0
    for is_alloc, ident, size, _kind, _policy in trace.rows():
        if is_alloc:
            off = fit.alloc(size)
            live[ident] = off
            first, last = off // granule, (off + max(fit.usable_size(off), 1) - 1) // granule
            for g in range(first, last + 1):
                n = refs.get(g, 0)
                if n == 0:
                    mapped += 1
                refs[g] = n + 1
            peak = max(peak, mapped)
        elif ident in live:
            off = live.pop(ident)
            first, last = off // granule, (off + max(fit.usable_size(off), 1) - 1) // granule
            fit.free(off)
            for g in range(first, last + 1):
                refs[g] -= 1
                if refs[g] == 0:
                    del refs[g]
                    mapped -= 1
    return peak * granule
