"""An emulation of torch_npu's caching allocator (the one PyTorch users on
Ascend have), as a peer for replay, fit and plan: what a model's tensors
would reserve through it.

It follows Ascend/pytorch torch_npu/csrc/core/npu/NPUCachingAllocator.cpp
(commit 9e73e708a; "[C] line" below) and NPUAllocatorConfig.h ("[H]"):
  - sizes: 32 bytes of padding added (none on the Ascend 950 with CANN
    9.1.0 or later: pad=0), then at least 512 and a multiple of
    512 ([C] 2202-2214, AddPadSize 161-174, kMinBlockSize 97), or the
    roundup_power2_divisions rounding ([C] 2183-2199);
  - two pools: requests up to 1 MiB from the small pool ([C] get_pool
    2685-2700, kSmallSize 98), larger ones from the large pool;
  - a new segment is 2 MiB for small requests, 20 MiB for requests below
    10 MiB, else the request rounded up to 2 MiB ([C] get_allocation_size
    2771-2779; [H] kSmallBuffer, kLargeBuffer, kMinLargeAlloc 16-18);
  - a request takes the smallest free block that fits (by size, then
    address: BlockComparatorSize [C] 668-676), not an oversized one
    (>= max_split_size) for a request below it, nor one more than
    max_non_split_rounding_size (20 MiB by default) larger for a request above
    it ([C] get_free_block 2781-2840); it splits when the rest is at least 512
    bytes in the small pool, or more than 1 MiB in the large pool for a
    request below max_split_size ([C] should_split 2718-2729);
  - a freed block merges with free neighbours of its segment ([C]
    free_block / try_merge_blocks 2581-2683);
  - out of memory: garbage collection when garbage_collection_threshold is
    set -- of the large pool's whole cached segments only
    (garbage_collect_cached_blocks [C] 2859-2925) --, then release oversize
    cached blocks (release_available_cached_blocks [C] 3061-3110), then
    release every cached segment and retry ([C] 1233-1290) before failing.
  - PYTORCH_NPU_ALLOC_CONF: max_split_size_mb at least 20 (PyTorch's
    c10/core/AllocatorConfig.cpp, which torch_npu's NPUAllocatorConfig.cpp
    hands the key to: kLargeBuffer / 1 MiB); expandable_segments with
    max_split_size_mb or garbage_collection_threshold is refused
    (NPUAllocatorConfig.cpp 306-312).
  - expandable_segments: ascmem.emulations.torch_expandable (from_conf picks it).
One stream, no events: a trace has neither.

This is the readable reference.  ascmem._replay_peers.TorchCachingAllocator
is its compiled twin, which replay, fit and plan run (ascmem.trace.
make_allocator picks it unless max_split_size_mb or
garbage_collection_threshold is set); tests/test_replay_compiled.py checks
that every figure is the same.
"""

import bisect
import itertools

from ascmem.errors import InvalidArgumentError, OutOfMemoryError

MiB = 1 << 20
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB
SMALL_BUFFER = 2 * MiB
LARGE_BUFFER = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB
PAD = 32
_UNLIMITED = 1 << 63


def parse_conf(conf):
    """PYTORCH_NPU_ALLOC_CONF ("max_split_size_mb:128,roundup_power2_divisions:4,
    garbage_collection_threshold:0.6") as the options this emulation takes."""
    opts = {}
    for item in filter(None, (p.strip() for p in (conf or "").split(","))):
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        try:
            if key == "max_split_size_mb":
                opts["max_split_size"] = int(value) * MiB
                if opts["max_split_size"] < LARGE_BUFFER:
                    raise ValueError("max_split_size_mb must be at least 20")
            elif key == "roundup_power2_divisions":
                divisions = int(value)
                if divisions & (divisions - 1) or divisions < 0:
                    raise ValueError("a power of 2")
                opts["roundup_power2_divisions"] = divisions
            elif key == "garbage_collection_threshold":
                threshold = float(value)
                if not 0.0 < threshold < 1.0:
                    raise ValueError("between 0 and 1")
                opts["garbage_collection_threshold"] = threshold
            elif key == "expandable_segments":
                if value.lower() not in ("true", "false"):
                    raise ValueError("True or False")
                opts["expandable_segments"] = value.lower() == "true"
            else:
                raise ValueError("not an option this emulation knows")
        except ValueError as exc:
            raise InvalidArgumentError(f"PYTORCH_NPU_ALLOC_CONF {item!r}: {exc}") from None
    if opts.get("expandable_segments") and ("max_split_size" in opts or
                                            "garbage_collection_threshold" in opts):
        # NPUAllocatorConfig.cpp lines 306-312
        raise InvalidArgumentError("PYTORCH_NPU_ALLOC_CONF: max_split_size_mb or "
                                   "garbage_collection_threshold cannot be enabled with "
                                   "expandable_segments")
    return opts


class _Block:
    __slots__ = ("addr", "size", "prev", "next", "allocated", "small", "stamp")

    def __init__(self, addr, size, small):
        self.addr, self.size, self.small = addr, size, small
        self.prev = self.next = None
        self.allocated = False
        self.stamp = 0


class TorchCachingAllocator:
    """capacity: the device memory the allocator may reserve in segments.
    alloc/free/usable_size as ascmem's allocators, so replay takes it;
    reserved and peak_reserved are what it holds from the device."""

    def __init__(self, capacity, max_split_size=_UNLIMITED, roundup_power2_divisions=0,
                 garbage_collection_threshold=0.0, max_non_split_rounding_size=20 * MiB,
                 pad=PAD):
        self.capacity = capacity
        self.max_split_size = max_split_size
        self.divisions = roundup_power2_divisions
        self.gc_threshold = garbage_collection_threshold
        self.max_non_split_rounding = max_non_split_rounding_size
        self._free = {True: [], False: []}   # small pool? -> sorted [(size, addr)]
        self._blocks = {}                    # address -> _Block (free or allocated)
        self._next_segment = itertools.count(1)
        self.reserved = self.peak_reserved = self.allocated = 0
        self.segments = 0
        self.retries = 0
        self._clock = 0
        self.pad = pad

    @classmethod
    def from_conf(cls, capacity, conf):
        """The allocator PYTORCH_NPU_ALLOC_CONF (conf) gives: this one, or
        with expandable_segments:True, TorchExpandableSegments."""
        opts = parse_conf(conf)
        if opts.pop("expandable_segments", False):
            from ascmem.emulations.torch_expandable import TorchExpandableSegments
            return TorchExpandableSegments(capacity, **opts)
        return cls(capacity, **opts)

    # ---- sizes -----------------------------------------------------------------------

    def round_size(self, size):
        return round_request(size, self.pad, self.divisions)

    @staticmethod
    def allocation_size(size):
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE

    # ---- allocate ----------------------------------------------------------------------

    def alloc(self, size, align=None):
        if size <= 0:
            raise InvalidArgumentError("size must be positive")
        self._clock += 1
        size = self.round_size(size)
        small = size <= SMALL_SIZE
        block = self._find(size, small)
        if block is None:
            seg = self.allocation_size(size)
            if self.gc_threshold:
                self._collect()
            block = self._new_segment(seg, small)
            if block is None and self._release_oversize(size, small):
                block = self._new_segment(seg, small)
            if block is None:
                self.retries += 1
                self._release_all()
                block = self._new_segment(seg, small)
            if block is None:
                raise OutOfMemoryError(f"torch caching allocator: no room for a {seg}-byte "
                                       f"segment ({self.reserved} of {self.capacity} reserved)")
        if self._should_split(block, size):
            rest = _Block(block.addr + size, block.size - size, small)
            rest.prev, rest.next = block, block.next
            if block.next:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._blocks[rest.addr] = rest
            self._add_free(rest)
        block.allocated = True
        block.stamp = self._clock
        self.allocated += block.size
        return block.addr

    def _find(self, size, small):
        free = self._free[small]
        i = bisect.bisect_left(free, (size, 0))
        if i == len(free):
            return None
        bsize, addr = free[i]
        if size < self.max_split_size <= bsize:
            return None  # no oversized block for a request below max_split_size
        if size >= self.max_split_size and bsize >= size + self.max_non_split_rounding:
            return None
        del free[i]
        return self._blocks[addr]

    def _should_split(self, block, size):
        rest = block.size - size
        if block.small:
            return rest >= MIN_BLOCK
        return size < self.max_split_size and rest > SMALL_SIZE

    def _new_segment(self, size, small):
        if self.reserved + size > self.capacity:
            return None
        addr = next(self._next_segment) << 44  # far apart: segments never touch
        block = _Block(addr, size, small)
        self._blocks[addr] = block
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.segments += 1
        return block

    # ---- free --------------------------------------------------------------------------

    def free(self, addr):
        block = take_back(self, addr)
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                self._remove_free(other)
                del self._blocks[other.addr]
                if other is block.prev:
                    block.addr, block.prev = other.addr, other.prev
                    if other.prev:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next:
                        other.next.prev = block
                block.size += other.size
        self._blocks.pop(addr, None)
        self._blocks[block.addr] = block
        self._add_free(block)

    def usable_size(self, addr):
        return self._blocks[addr].size

    def _add_free(self, block):
        bisect.insort(self._free[block.small], (block.size, block.addr))

    def _remove_free(self, block):
        free = self._free[block.small]
        del free[bisect.bisect_left(free, (block.size, block.addr))]

    # ---- giving segments back ------------------------------------------------------------

    def _whole_free_segments(self):
        return [b for b in self._blocks.values()
                if not b.allocated and b.prev is None and b.next is None]

    def _release(self, block):
        self._remove_free(block)
        del self._blocks[block.addr]
        self.reserved -= block.size
        self.segments -= 1

    def _release_oversize(self, size, small):
        """Frees cached whole segments of at least max_split_size, largest
        first, until size is covered."""
        if self.max_split_size == _UNLIMITED:
            return False
        big = sorted((b for b in self._whole_free_segments()
                      if b.small == small and b.size >= self.max_split_size),
                     key=lambda b: -b.size)
        need, released = max(size, self.max_split_size), 0
        for b in big:
            if released >= need:
                break
            released += b.size
            self._release(b)
        return released >= need

    def _release_all(self):
        for b in self._whole_free_segments():
            self._release(b)

    def _collect(self):
        """garbage_collection_threshold: above threshold x capacity reserved,
        cached segments at least as old as the average go back, oldest first."""
        limit = self.gc_threshold * self.capacity
        if self.reserved <= limit:
            return
        idle = [b for b in self._whole_free_segments() if not b.small]  # large pool only
        if not idle:
            return
        average = sum(self._clock - b.stamp for b in idle) / len(idle)
        for b in sorted(idle, key=lambda b: b.stamp):
            if self.reserved <= limit or self._clock - b.stamp < average:
                break
            self._release(b)

    def stats(self):
        return {"reserved": self.reserved, "peak_reserved": self.peak_reserved,
                "allocated": self.allocated, "segments": self.segments, "retries": self.retries}


def take_back(alloc, addr):
    """The live block at addr of an emulated allocator (its _blocks by
    address, its allocated bytes), marked free; InvalidArgumentError if
    there is none."""
    block = alloc._blocks.get(addr)
    if block is None or not block.allocated:
        raise InvalidArgumentError(f"{addr:#x} is not a live block")
    block.allocated = False
    alloc.allocated -= block.size
    return block


def round_request(size, pad=PAD, divisions=0):
    """A request's size as the caching allocator rounds it ([C] round_size
    2202-2214): pad added, then at least 512 and a multiple of 512, or the
    roundup_power2_divisions step."""
    size += pad
    if size < MIN_BLOCK:
        return MIN_BLOCK
    if divisions > 1 and size > MIN_BLOCK * divisions:
        return _next_division(size, divisions)
    return (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def _next_division(size, divisions):
    """roundup_power2_next_division: the next of `divisions` equal steps
    between the powers of two around size ([C] 2183-2199)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step
