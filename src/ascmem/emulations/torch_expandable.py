"""torch_npu's caching allocator with expandable segments
(PYTORCH_NPU_ALLOC_CONF=expandable_segments:True), emulated as a peer for
replay, fit and plan, in two regimes: pages kept mapped until memory runs
out (torch_npu's behaviour without empty_cache), and pages unmapped as soon
as they are free (empty_cache after every free).

It follows Ascend/pytorch torch_npu/csrc/core/npu/NPUCachingAllocator.cpp
(commit 9e73e708a; "[C] line" below) and NPUAllocatorConfig.h ("[H]"):
  - sizes as the caching allocator's: 32 bytes of padding (none on the
    Ascend 950 with CANN 9.1.0 or later: AddPadSize [C] 161-174), then at
    least 512 and a multiple of 512 ([C] 2202-2214); requests up to 1 MiB
    from the small pool ([C] 2685-2700);
  - one virtual segment per pool, mapped in pages of 2 MiB (small pool) and
    20 MiB (large pool) ([H] kSmallBuffer, kLargeBuffer 16-17;
    find_expandable_block, the ExpandableSegment note [C] 296-350);
  - a request takes the free mapped block that fits best, preferring among
    equal fits the one that could grow least ([C] get_free_block 2781-2812);
    a request of 2 MiB or more starts on a 16 KiB boundary, the gap before
    it left as a free block ([C] 1396-1421, [H] kAlignRoundLarge 15);
  - no free block fits: the lowest unmapped range that, with the free block
    before it, holds the request is mapped page by page
    (find_expandable_block, try_allocate_expandable_block, map_block
    [C] 2488-2560);
  - blocks split whenever 512 bytes remain ([C] should_split 2718-2729); a
    freed block merges with free neighbours in the same mapped state
    ([C] try_merge_blocks);
  - pages are unmapped only by empty_cache or by the last retry before
    out-of-memory: release_cached_blocks unmaps the whole pages inside every
    free block of both pools ([C] 3122-3168, unmap_block 3241-3302,
    release_blocks 3304-3330).
One stream, no events: a trace has neither.

This is the readable reference.  ascmem._replay_peers.TorchExpandableSegments is its
compiled twin, which replay, fit and plan run (ascmem.trace.make_allocator
picks it);
tests/test_replay_compiled.py checks that every figure is the same.
"""

import bisect

from ascmem.errors import InvalidArgumentError, OutOfMemoryError
from ascmem.emulations.torch_caching import (LARGE_BUFFER, MIN_BLOCK, PAD, SMALL_BUFFER, SMALL_SIZE,
                                  round_request, take_back)

ROUND_LARGE = 2 * 1024 * 1024       # kRoundLarge: requests from here are aligned
ALIGN_LARGE = 16 * 1024             # kAlignRoundLarge, base_addr_aligned_kb's default
_SPAN = 1 << 44                     # virtual size of a pool's segment


class _Block:
    __slots__ = ("addr", "size", "prev", "next", "allocated", "mapped", "small", "listed")

    def __init__(self, addr, size, small, mapped):
        self.addr, self.size, self.small, self.mapped = addr, size, small, mapped
        self.prev = self.next = None
        self.allocated = self.listed = False


class TorchExpandableSegments:
    """capacity: the device memory the allocator may map.  eager: unmap
    the whole pages of every block as soon as it is free (torch_npu with
    empty_cache after each free); otherwise pages are unmapped only on the
    last retry before out-of-memory.  pad: 32, or 0 for the Ascend 950 with
    CANN 9.1.0 or later.  alloc/free/usable_size as ascmem's allocators,
    so replay takes it; reserved and peak_reserved are mapped bytes."""

    def __init__(self, capacity, eager=False, pad=PAD, roundup_power2_divisions=0):
        self.capacity = capacity
        self.eager = eager
        self.pad = pad
        self.divisions = roundup_power2_divisions
        self.reserved = self.peak_reserved = self.allocated = 0
        self.retries = 0
        self.segments = 0
        self._blocks = {}                         # address -> _Block (every state)
        self._free = {True: [], False: []}        # pool -> sorted [(size, addr)] free, mapped
        self._unmapped = {True: [], False: []}    # pool -> sorted [addr] unmapped
        self._base = {True: 1 << 45, False: 2 << 45}

    # ---- sizes -------------------------------------------------------------------------

    def round_size(self, size):
        return round_request(size, self.pad, self.divisions)

    @staticmethod
    def _page(small):
        return SMALL_BUFFER if small else LARGE_BUFFER

    # ---- allocate ------------------------------------------------------------------------

    def alloc(self, size, align=None):
        if size <= 0:
            raise InvalidArgumentError("size must be positive")
        size = self.round_size(size)
        small = size <= SMALL_SIZE
        block = self._best_free(size, small)
        if block is None:
            block = self._map_for(size, small)
            if block is None:  # the last retry: every free page of both pools goes back
                self.retries += 1
                self.empty_cache()
                block = self._map_for(size, small)
            if block is None:
                raise OutOfMemoryError(f"torch_npu expandable segments: no room to map for "
                                       f"{size} bytes ({self.reserved} of {self.capacity} mapped)")
        else:
            self._unlist(block)
        block = self._aligned(block, size)
        if block.size - size >= MIN_BLOCK:  # should_split: 512 bytes left
            self._split(block, size)
        block.allocated = True
        self.allocated += block.size
        return block.addr

    def _best_free(self, size, small):
        """get_free_block: the smallest free block that fits; among those
        that follow, one whose size with the unmapped block after it is
        smaller is preferred."""
        free = self._free[small]
        i = bisect.bisect_left(free, (size, 0))
        if i == len(free):
            return None
        grow = lambda j: free[j][0] + self._unmapped_after(free[j][1])  # noqa: E731
        while i + 1 < len(free) and grow(i + 1) < grow(i):
            i += 1
        return self._blocks[free[i][1]]

    def _unmapped_after(self, addr):
        nxt = self._blocks[addr].next
        return nxt.size if nxt is not None and not nxt.mapped else 0

    def _aligned(self, block, size):
        """A request of 2 MiB or more starts on a 16 KiB boundary: the gap
        before it stays a free block ([C] 1396-1421)."""
        off = (-(block.addr - self._base[block.small])) % ALIGN_LARGE
        if size < ROUND_LARGE or off == 0 or off + size > block.size:
            return block
        rest = self._split(block, off)
        self._unlist(rest)
        self._list(block)  # block keeps the gap, free
        return rest

    def _split(self, block, size):
        """block (unlisted) keeps its first size bytes; the rest becomes a
        free block in the same mapped state (listed); returns the rest."""
        rest = _Block(block.addr + size, block.size - size, block.small, block.mapped)
        rest.prev, rest.next = block, block.next
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = size
        self._blocks[rest.addr] = rest
        self._list(rest)
        return rest

    def _map_for(self, size, small):
        """find_expandable_block + try_allocate_expandable_block: the lowest
        unmapped range that, with the free block before it, holds size is
        mapped page by page; the free mapped block returned (unlisted), or
        None if mapping would pass the capacity (what was mapped stays)."""
        if not self._unmapped[small]:
            whole = _Block(self._base[small], _SPAN, small, mapped=False)
            self._blocks[whole.addr] = whole
            self._list(whole)
            self.segments += 1
        for addr in list(self._unmapped[small]):
            c = self._blocks[addr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room, b = 0, c
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                break
        else:
            return None
        if not c.mapped:
            if not self._map(c, min(c.size, size)):
                return None
        cand = self._merge(c)
        while cand.size < size:
            nxt = cand.next
            if not self._map(nxt, min(size - cand.size, nxt.size)):
                return None  # cand stays free and listed
            cand = self._merge(nxt)
        self._unlist(cand)
        return cand

    def _map(self, block, nbytes):
        """map_block: the pages holding the first nbytes of unmapped block
        are mapped (block becomes that mapped part, free, listed); False if
        that passes the capacity."""
        page = self._page(block.small)
        n = min(block.size, (nbytes + page - 1) // page * page)
        if self.reserved + n > self.capacity:
            return False
        self._unlist(block)
        if n < block.size:
            self._split(block, n)  # the unmapped rest, listed
        block.mapped = True
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self._list(block)
        return True

    # ---- free --------------------------------------------------------------------------

    def free(self, addr):
        block = self._merge(take_back(self, addr))
        if self.eager:
            self._unmap(block)

    def usable_size(self, addr):
        return self._blocks[addr].size

    def _merge(self, block):
        """Joins free block with free neighbours in the same mapped state;
        the joined block, listed."""
        if block.listed:
            self._unlist(block)
        for other in (block.prev, block.next):
            if other is None or other.allocated or other.mapped != block.mapped:
                continue
            if other.listed:
                self._unlist(other)
            del self._blocks[other.addr]
            if other is block.prev:
                del self._blocks[block.addr]
                block.addr, block.prev = other.addr, other.prev
                if other.prev is not None:
                    other.prev.next = block
                self._blocks[block.addr] = block
            else:
                block.next = other.next
                if other.next is not None:
                    other.next.prev = block
            block.size += other.size
        self._list(block)
        return block

    # ---- unmapping ---------------------------------------------------------------------

    def empty_cache(self):
        """release_cached_blocks: the whole pages inside every free mapped
        block of both pools are unmapped."""
        for small in (True, False):
            for _, addr in list(self._free[small]):
                block = self._blocks.get(addr)
                if block is not None and block.listed and block.mapped:
                    self._unmap(block)

    def _unmap(self, block):
        """unmap_block: the whole pages inside free mapped block go back;
        what is left on either side stays free and mapped."""
        page, base = self._page(block.small), self._base[block.small]
        lo = base + (block.addr - base + page - 1) // page * page
        hi = base + (block.addr + block.size - base) // page * page
        if hi <= lo:
            return
        self._unlist(block)
        if lo > block.addr:
            before, block = block, self._split(block, lo - block.addr)
            self._unlist(block)
            self._list(before)                            # the part before stays mapped
        if hi < block.addr + block.size:
            self._split(block, hi - block.addr)          # the part after stays mapped, listed
        block.mapped = False
        self.reserved -= block.size
        self._merge(block)

    # ---- free lists ----------------------------------------------------------------------

    def _list(self, block):
        if block.mapped:
            bisect.insort(self._free[block.small], (block.size, block.addr))
        else:
            bisect.insort(self._unmapped[block.small], block.addr)
        block.listed = True

    def _unlist(self, block):
        if block.mapped:
            free = self._free[block.small]
            del free[bisect.bisect_left(free, (block.size, block.addr))]
        else:
            unm = self._unmapped[block.small]
            del unm[bisect.bisect_left(unm, block.addr)]
        block.listed = False

    def stats(self):
        return {"reserved": self.reserved, "peak_reserved": self.peak_reserved,
                "allocated": self.allocated, "segments": self.segments, "retries": self.retries}
