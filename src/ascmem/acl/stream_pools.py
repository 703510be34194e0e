"""Stream-ordered memory pools: CANN's SOMA (aclrtMemPoolCreate,
aclrtMemPoolMallocAsync, aclrtMemPoolFreeAsync, ...) on an ascmem Device.

A StreamPool hands out Device blocks.  A block freed on a stream stays the
pool's ("cached": reserved, not used) and is reused without going back to
the Device: at once by the stream that freed it, and by another stream when
the pool's reuse modes allow it -- an event orders the two streams
(follow-event-dependencies), the freeing stream's work is known complete
(opportunistic), or the pool may make the new stream wait for the old one
itself (internal dependencies).  Free memory above the release threshold
goes back to the Device at the next synchronization of a stream, and
trim_to() gives back what the caller asks; a block whose stream may still
use it goes back through the Device's stream ledger, which holds it until
the stream is done.  Physical memory is then the Device's: on a paged
device it follows live bytes.

What the pools know about the order of work across streams lives in a
StreamOrder, shared by every pool of a process (the runtime's streams and
events are the process's): ascmem.acl feeds it from record_event,
stream_wait_event and the synchronizations.

Rules follow hicann/runtime (paths below are in that repository):
  [S] src/runtime/feature/soma/stream_mem_pool.cc -- SegmentManager: reuse
      flags are booleans (a non-zero value is 1), all off by default
      (stream_mem_pool.hpp line 108: only single-stream reuse is on); the
      release threshold may not exceed the pool size (line 498); the two
      _HIGH attributes accept only 0, which sets them to 0, not to the
      current value (lines 506-521; the API reference,
      docs/zh/api_ref/25-02_Enumerations.md lines 2116 and 2118, says only
      that the value must be 0);
      any other attribute is refused (lines 468, 524); trim_to refuses a
      size above the pool's or below its used bytes (lines 425-432).
  [A] src/runtime/feature/soma/soma.cc -- the pool size is rounded up to
      2 MB (0: the device's total memory rounded down) and may not exceed
      the device's memory (lines 204-221); the two _CURRENT attributes are
      read-only (line 159).
  [M] src/acl/aclrt_impl/memory.cpp lines 2081-2178 -- aclrtMemPoolCreate
      takes only pinned device memory and zeroed reserved bytes; a zero-size
      aclrtMemPoolMallocAsync succeeds without allocating; a null stream is
      refused (line 2150).
  [D] docs/zh/api_ref/25-02_Enumerations.md lines 2111-2114 -- the three
      reuse modes and the release threshold (free memory above it goes back
      at the next stream synchronization).  At this commit the runtime's
      code does not do either: TryToReuse is a stub that returns nothing
      (stream_mem_pool.cc lines 140-148) and waterMark is stored and read
      but never acted on (lines 452, 501).  Code and documentation
      disagree; the pools follow the documentation.
  [R] src/runtime/api/impl/api_impl_soma.cc -- every allocation is rounded
      up to DEVICE_POOL_MIN_BLOCK_SIZE, 2 MB (lines 81-86; soma.cc 242-243;
      stream_mem_pool.hpp 38), and that rounded size is what the pool counts
      as used and reserved (stream_mem_pool.cc 172, 193); a pointer inside a
      pool's range that is not the start of a live block answers
      RT_ERROR_INVALID_VALUE (line 134), ACL_ERROR_RT_PARAM_INVALID.
"""

import threading

from ascmem.errors import (CorruptionError, InvalidArgumentError, InvalidFreeError, OutOfMemoryError,
                           PoolStateError, RuntimeParamError)
from ascmem.rules import MiB

POOL_ALIGN = 2 * MiB  # DEVICE_POOL_ALIGN_SIZE, stream_mem_pool.hpp line 39
MIN_BLOCK = 2 * MiB   # DEVICE_POOL_MIN_BLOCK_SIZE, stream_mem_pool.hpp line 38
_UINT64_MAX = (1 << 64) - 1

# aclrtMemPoolAttr (include/external/acl/acl_rt_memory_soma.h)
REUSE_FOLLOW_EVENT_DEPENDENCIES = 0x1
REUSE_ALLOW_OPPORTUNISTIC = 0x2
REUSE_ALLOW_INTERNAL_DEPENDENCIES = 0x3
ATTR_RELEASE_THRESHOLD = 0x4
ATTR_RESERVED_MEM_CURRENT = 0x5
ATTR_RESERVED_MEM_HIGH = 0x6
ATTR_USED_MEM_CURRENT = 0x7
ATTR_USED_MEM_HIGH = 0x8
_REUSE_ATTRS = {REUSE_FOLLOW_EVENT_DEPENDENCIES: "follow_events",
                REUSE_ALLOW_OPPORTUNISTIC: "opportunistic",
                REUSE_ALLOW_INTERNAL_DEPENDENCIES: "internal"}

# A cached block serves a request that needs at least half of it: the
# runtime splits a larger segment; a Device block cannot be split.
_MAX_WASTE_FACTOR = 2


class StreamOrder:
    """Per stream, a count of the operations queued on it that the pools
    care about (frees, event records); per (waiter, stream), how far the
    waiter is ordered after the stream (a stream wait on an event, or a wait
    a pool inserted); per stream, how far its work is known complete."""

    def __init__(self):
        self.lock = threading.RLock()
        self.queued = {}   # stream -> sequence number of its last operation
        self.waited = {}   # (waiter, stream) -> sequence number
        self.done = {}     # stream -> sequence number known complete
        self.events = {}   # event -> (stream, sequence number) of its last record

    def mark(self, stream):
        """One more operation on stream; its sequence number."""
        with self.lock:
            seq = self.queued.get(stream, 0) + 1
            self.queued[stream] = seq
            return seq

    def record(self, event, stream):
        with self.lock:
            self.events[event] = (stream, self.mark(stream))

    def wait(self, waiter, event):
        """waiter waits for event (aclrtStreamWaitEvent).  False: the event
        was never recorded (the runtime ignores such a wait)."""
        with self.lock:
            if event not in self.events:
                return False
            stream, seq = self.events[event]
            self.order(waiter, stream, seq)
            return True

    def order(self, waiter, stream, seq):
        with self.lock:
            key = (waiter, stream)
            self.waited[key] = max(self.waited.get(key, 0), seq)

    def finished(self, stream, upto=None):
        """stream's work is done up to upto (None: all queued so far)."""
        with self.lock:
            upto = self.queued.get(stream, 0) if upto is None else upto
            self.done[stream] = max(self.done.get(stream, 0), upto)

    def event_done(self, event):
        """The event's stream is past it (aclrtSynchronizeEvent, or a query
        that found it complete)."""
        with self.lock:
            if event in self.events:
                self.finished(*self.events[event])

    def forget_event(self, event):
        with self.lock:
            self.events.pop(event, None)

    def ordered(self, waiter, stream, seq):
        """waiter's new work runs after stream's operation seq."""
        return waiter == stream or self.waited.get((waiter, stream), 0) >= seq

    def complete(self, stream, seq):
        return self.done.get(stream, 0) >= seq


class _Cached:
    __slots__ = ("nbytes", "stream", "seq")

    def __init__(self, nbytes, stream, seq):
        self.nbytes, self.stream, self.seq = nbytes, stream, seq


class StreamPool:
    """One aclrtMemPool over a Device: max_size bytes at most reserved."""

    def __init__(self, device, max_size, order):
        self.device = device
        self.max_size = max_size
        self.order = order
        self.lock = threading.RLock()
        self.live = {}     # address -> (usable bytes, stream it was allocated on)
        self.cached = {}   # address -> _Cached
        self.used = self.used_high = self.reserved = self.reserved_high = 0
        self.follow_events = self.opportunistic = self.internal = False
        self.release_threshold = 0
        # how requests were served: fresh from the Device, or reused by rule
        self.served = {"fresh": 0, "same_stream": 0, "event": 0, "opportunistic": 0,
                       "internal": 0}
        self.destroyed = False
        self.resets = device.resets  # a Device reset takes the pool's blocks with it

    # ---- allocation ---------------------------------------------------------------

    def malloc_async(self, size, stream):
        """A block of size bytes rounded up to 2 MB [R] for work queued on
        stream; 0 for size 0 (the runtime returns success and allocates
        nothing [M])."""
        check_stream(stream, "mem_pool_malloc_async")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= _UINT64_MAX:
            raise InvalidArgumentError(f"mem_pool_malloc_async: size must be an int in "
                                       f"0..2**64-1, not {size!r}")
        if size > _UINT64_MAX - (MIN_BLOCK - 1):  # api_impl_soma.cc lines 83-85
            raise RuntimeParamError(f"mem_pool_malloc_async({size}): rounding up to 2 MB "
                                    f"overflows")
        with self.lock:
            self._require_alive("mem_pool_malloc_async")  # also notices a Device reset
            if size == 0:
                return 0
            need = -(-size // MIN_BLOCK) * MIN_BLOCK  # [R]: what the pool counts
            addr = self._reuse(need, stream)
            if not addr:
                addr = self._fresh(size, need, stream)
            return addr

    def _reuse(self, need, stream):
        """A cached block of at least need bytes this request may have by
        the pool's rules [D], or 0.  Preference: the same stream, then an
        event-ordered one, then one known complete, then one the pool must
        wait for."""
        best = None
        for addr, c in self.cached.items():
            if not need <= c.nbytes <= need * _MAX_WASTE_FACTOR:
                continue
            rule = self._rule(c, stream)
            if rule is not None and (best is None or (rule, c.nbytes) < best[:2]):
                best = (rule, c.nbytes, addr)
        if best is None:
            return 0
        rule, nbytes, addr = best
        c = self.cached.pop(addr)
        if rule == 3:  # the pool orders stream after the free it reuses
            self.order.order(stream, c.stream, c.seq)
        self.served[("same_stream", "event", "opportunistic", "internal")[rule]] += 1
        self._take(addr, nbytes, stream)
        return addr

    def _rule(self, c, stream):
        """The first reuse rule that lets stream have cached block c (0-3),
        or None."""
        if c.stream == stream:
            return 0
        if self.follow_events and self.order.ordered(stream, c.stream, c.seq):
            return 1
        if self.opportunistic and self.order.complete(c.stream, c.seq):
            return 2
        if self.internal:
            return 3
        return None

    def _fresh(self, size, need, stream):
        if self.reserved + need > self.max_size:
            self._release(self._complete_blocks(), 0)
            if self.reserved + need > self.max_size:
                raise PoolStateError(f"mem_pool_malloc_async({size}): the pool has "
                                     f"{self.max_size - self.reserved} of its {self.max_size} "
                                     f"bytes left")
        # whole 2 MB granules on a granule boundary with no sub-allocation
        # tail (the runtime maps pool memory, it does not cut it from an
        # aclrtMalloc block), so the Device charges what the pool's books
        # count: a tail would put each block across one more huge page
        try:
            addr = self.device._malloc_mapped(need, POOL_ALIGN)
        except OutOfMemoryError:
            if not self._release(self._complete_blocks(), 0):
                raise
            addr = self.device._malloc_mapped(need, POOL_ALIGN)
        # the pool hands it out again after a free to the pool: a free behind
        # its back (the pluggable free, free_raw) would make that a double owner
        try:
            self.device._guard(addr)
        except BaseException:
            self.device.free(addr)
            raise
        nbytes = need  # the runtime's books count the 2 MB-rounded size [R]
        self.reserved += nbytes
        self.reserved_high = max(self.reserved_high, self.reserved)
        self.served["fresh"] += 1
        self._take(addr, nbytes, stream)
        return addr

    def _take(self, addr, nbytes, stream):
        self.live[addr] = (nbytes, stream)
        self.used += nbytes
        self.used_high = max(self.used_high, self.used)

    # ---- free ----------------------------------------------------------------------

    def free_async(self, addr, stream):
        """Back to the pool, not to the Device: reusable by stream at once,
        by other streams as the reuse modes allow.  False if addr is not
        this pool's (nothing changes)."""
        # an unhashable stream is refused before the books change (the
        # runtime's own null-stream handling is left to it: aclrtMemPoolFreeAsync
        # has no null check at the ACL layer, memory.cpp lines 2160-2168)
        if not _address(addr):
            return False
        check_stream(stream, "mem_pool_free_async", null_ok=True)
        with self.lock:
            if addr not in self.live:
                if self._gone():
                    return False
                if addr in self.cached:
                    raise RuntimeParamError(f"mem_pool_free_async: {addr:#x} was already freed "
                                            f"to its pool")
                return False
            if self._gone():
                return False
            nbytes, _ = self.live.pop(addr)
            self.used -= nbytes
            self.cached[addr] = _Cached(nbytes, stream, self.order.mark(stream))
            return True

    def free_now(self, addr):
        """aclrtFree of a live block of the pool: it leaves the pool and goes
        back to the Device at once (the runtime's DevFree: api_impl.cc lines
        2357-2367).  False if addr is not a live block of this pool; a block
        already freed to the pool is refused (PoolStateError: the runtime's
        RT_ERROR_POOL_PTR_NOTFOUND)."""
        if not _address(addr):
            return False
        with self.lock:
            if self._gone():
                return False
            if addr in self.cached:
                raise PoolStateError(f"free: {addr:#x} was already freed to its stream pool")
            if addr not in self.live:
                return False
            self.device.free(addr)
            nbytes, _ = self.live.pop(addr)
            self.used -= nbytes
            self.reserved -= nbytes
            return True

    def inside(self, addr):
        """addr lies within one of the pool's blocks (live or cached) without
        being its start: the runtime answers RT_ERROR_INVALID_VALUE for its
        free (api_impl_soma.cc line 134)."""
        if not _address(addr):
            return False
        with self.lock:
            if self._gone():
                return False
            blocks = [(a, n) for a, (n, _) in self.live.items()]
            blocks += [(a, c.nbytes) for a, c in self.cached.items()]
            return any(a < addr < a + n for a, n in blocks)

    # ---- giving memory back ----------------------------------------------------------

    def synchronized(self, stream):
        """stream was synchronized: free memory above the release threshold
        goes back to the Device [D]."""
        with self.lock:
            if self._gone():
                return 0
            blocks = sorted(self.cached, key=lambda a: -self.cached[a].nbytes)
            return self._release(blocks, self.used + self.release_threshold)

    def trim_to(self, min_bytes_to_keep):
        """Gives cached blocks back until at most min_bytes_to_keep bytes
        stay reserved [S lines 421-435]."""
        if not isinstance(min_bytes_to_keep, int) or min_bytes_to_keep < 0:
            raise InvalidArgumentError(f"mem_pool_trim_to: min_bytes_to_keep must be an int "
                                       f">= 0, not {min_bytes_to_keep!r}")
        with self.lock:
            self._require_alive("mem_pool_trim_to")
            if min_bytes_to_keep > self.max_size:
                raise PoolStateError(f"mem_pool_trim_to({min_bytes_to_keep}): above the pool's "
                                     f"size, {self.max_size}")
            if min_bytes_to_keep >= self.reserved:
                return 0
            if min_bytes_to_keep < self.used:
                raise PoolStateError(f"mem_pool_trim_to({min_bytes_to_keep}): below the bytes "
                                     f"in use, {self.used}")
            blocks = sorted(self.cached, key=lambda a: -self.cached[a].nbytes)
            return self._release(blocks, min_bytes_to_keep)

    def _complete_blocks(self):
        return [a for a, c in self.cached.items() if self.order.complete(c.stream, c.seq)]

    def _release(self, addrs, keep):
        """Gives the cached blocks addrs back to the Device, in order, while
        more than keep bytes are reserved; the bytes given back.  A block
        whose stream may still use it waits in the Device's stream ledger."""
        given = 0
        for addr in addrs:
            if self.reserved <= keep:
                break
            c = self.cached.pop(addr)
            self.reserved -= c.nbytes
            given += c.nbytes
            done = self.order.complete(c.stream, c.seq) or c.stream is None
            self.device.free(addr, stream=None if done else c.stream)
        return given

    # ---- attributes ------------------------------------------------------------------

    def set_attr(self, attr, value):
        with self.lock:
            if self._gone():
                raise RuntimeParamError("mem_pool_set_attr: the pool was destroyed")
            if value is None:
                raise RuntimeParamError("mem_pool_set_attr: the value may not be null")
            if attr in (ATTR_RESERVED_MEM_CURRENT, ATTR_USED_MEM_CURRENT):
                raise RuntimeParamError(f"mem_pool_set_attr: attribute {attr} is read-only")
            value = _attr_int(value)
            if attr in _REUSE_ATTRS:
                setattr(self, _REUSE_ATTRS[attr], value != 0)
            elif attr == ATTR_RELEASE_THRESHOLD:
                if not 0 <= value <= self.max_size:
                    raise PoolStateError(f"mem_pool_set_attr: a release threshold of {value} "
                                         f"is outside 0..{self.max_size} (the pool's size)")
                self.release_threshold = value
            elif attr in (ATTR_RESERVED_MEM_HIGH, ATTR_USED_MEM_HIGH):
                if value != 0:
                    raise PoolStateError(f"mem_pool_set_attr: attribute {attr} can only be "
                                         f"reset, with 0 (not {value})")
                # 0, not the current value: stream_mem_pool.cc lines 511 and 519
                if attr == ATTR_RESERVED_MEM_HIGH:
                    self.reserved_high = 0
                else:
                    self.used_high = 0
            else:
                raise PoolStateError(f"mem_pool_set_attr: unknown attribute {attr!r}")

    def get_attr(self, attr):
        with self.lock:
            if self._gone():
                raise RuntimeParamError("mem_pool_get_attr: the pool was destroyed")
            if attr in _REUSE_ATTRS:
                return int(getattr(self, _REUSE_ATTRS[attr]))
            values = {ATTR_RELEASE_THRESHOLD: self.release_threshold,
                      ATTR_RESERVED_MEM_CURRENT: self.reserved,
                      ATTR_RESERVED_MEM_HIGH: self.reserved_high,
                      ATTR_USED_MEM_CURRENT: self.used, ATTR_USED_MEM_HIGH: self.used_high}
            if attr not in values:
                raise PoolStateError(f"mem_pool_get_attr: unknown attribute {attr!r}")
            return values[attr]

    # ---- lifetime ----------------------------------------------------------------------

    def destroy(self):
        """Gives every cached block back.  A pool with live blocks is
        refused: their addresses would outlive it."""
        with self.lock:
            self._require_alive("mem_pool_destroy")
            if self.live:
                raise PoolStateError(f"mem_pool_destroy: {len(self.live)} block(s) of the pool "
                                     f"are still allocated; free them first")
            self._release(list(self.cached), 0)
            self.destroyed = True

    def forget(self):
        """The Device was reset: every block is gone with it."""
        with self.lock:
            self.live.clear()
            self.cached.clear()
            self.used = self.reserved = 0
            self.destroyed = True

    def _require_alive(self, call):
        if self._gone():
            raise PoolStateError(f"{call}: the pool was destroyed")

    def _gone(self):
        """Destroyed, or its Device was reset since (aclrtResetDevice frees
        every block: the pool's included)."""
        if not self.destroyed and self.device.resets != self.resets:
            self.forget()
        return self.destroyed

    def stats(self):
        with self.lock:
            return {"max_size": self.max_size, "reserved": self.reserved,
                    "reserved_high": self.reserved_high, "used": self.used,
                    "used_high": self.used_high, "live_blocks": len(self.live),
                    "cached_blocks": len(self.cached), "release_threshold": self.release_threshold,
                    "served": dict(self.served)}

    def check(self):
        """The pool's books agree with themselves and each block is live on
        the Device; CorruptionError if not."""
        with self.lock:
            used = sum(n for n, _ in self.live.values())
            cached = sum(c.nbytes for c in self.cached.values())
            if used != self.used or used + cached != self.reserved or \
                    self.reserved > self.max_size:
                raise CorruptionError(f"stream pool: used {self.used} (blocks: {used}), "
                                      f"reserved {self.reserved} (blocks: {used + cached}), "
                                      f"size {self.max_size}")
            for addr in list(self.live) + list(self.cached):
                try:
                    self.device.usable_size(addr)
                except (InvalidArgumentError, InvalidFreeError):
                    raise CorruptionError(f"stream pool: {addr:#x} is not a live Device "
                                          f"block") from None


def check_stream(stream, call, null_ok=False):
    """A stream the runtime takes: not NULL (None, or 0 as pyACL passes
    it; memory.cpp line 2150 refuses it with ACL_ERROR_INVALID_PARAM) and a
    handle the books can key on (hashable)."""
    try:
        hash(stream)
    except TypeError:
        raise InvalidArgumentError(f"{call}: {stream!r} is not a stream") from None
    if not null_ok and (stream is None or (isinstance(stream, int) and
                                           not isinstance(stream, bool) and stream == 0)):
        raise InvalidArgumentError(f"{call}: the stream may not be null")


def _address(addr):
    """Whether addr can be one of the pool's addresses: an exact int.  A
    float or Fraction equal to a block's address finds it in a dict, and
    the pool would then book it -- and hand it out again -- as that
    float."""
    return type(addr) is int


def _attr_int(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuntimeParamError(f"a pool attribute value is an int, not {value!r}")
    return value


def pool_size(max_size, device_total):
    """The pool's size from aclrtMemPoolProps.maxSize [A]: rounded up to
    2 MB; 0 is the device's total memory rounded down; more than the device
    has is refused."""
    if max_size == 0:
        size = device_total // POOL_ALIGN * POOL_ALIGN
    else:
        size = (max_size + POOL_ALIGN - 1) // POOL_ALIGN * POOL_ALIGN
    if size > device_total:
        raise RuntimeParamError(f"mem_pool_create: a pool of {size} bytes exceeds the device's "
                                f"{device_total}")
    return size
