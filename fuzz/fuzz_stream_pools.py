"""atheris harness over the drop-in's stream-ordered pools (acl.rt.mem_pool_*,
ascmem/acl_soma.py and ascmem/stream_pools.py), with streams and events.
    python fuzz/fuzz_stream_pools.py -max_total_time=600
Calls come with arguments of every shape: live, freed, interior and foreign
pointers, destroyed pools and streams, NULL, unhashable objects, huge and
negative numbers.  Findings:
- a call that raises (the drop-in answers codes, as pyACL does);
- a refused call (a non-zero code) that changed a pool's books;
- a successful allocation that hands out an address some pool holds;
- the Device's or a pool's check() failing after any call;
- once every block is freed, every stream synchronized and every pool
  destroyed, a Device whose statistics are not back at zero."""
import fractions
import operator
import os
import sys

import atheris
import numpy

with atheris.instrument_imports():
    import ascmem
    from ascmem import acl
    from ascmem.acl import soma as acl_soma
    from ascmem.acl import stream_pools

MiB = 1 << 20
VERBOSE = bool(os.environ.get("FUZZ_VERBOSE"))  # print each call (to read a reproducer)
ATTRS = (1, 2, 3, 4, 5, 6, 7, 8)  # aclrtMemPoolAttr; others are picked as odd values


class Index:
    """An object with __index__, which integer-taking code might accept."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class State:
    """What the harness made in one run: the handles, and the blocks it
    believes each pool holds live (ptr -> (pool, stream))."""

    def __init__(self):
        self.pools, self.dead_pools = [], []
        self.streams, self.dead_streams = [], []
        self.events = []
        self.live = {}      # pool block -> (pool handle, stream it was allocated on)
        self.freed = []     # pool blocks freed to their pool (cached or given back)
        self.plain = []     # acl.rt.malloc blocks


def odd(fdp):
    """A value of a shape no careful caller passes."""
    return (None, [], {}, "x", -1, 1 << 64, 1 << 70, 1.5, float("inf"), True, Index(2 * MiB),
            b"\x00", (1, 2), -(1 << 63))[fdp.ConsumeIntInRange(0, 13)]


def pick(fdp, items):
    return items[fdp.ConsumeIntInRange(0, len(items) - 1)] if items else None


def a_pool(fdp, st):
    choice = fdp.ConsumeIntInRange(0, 9)
    if choice < 6 and st.pools:
        return pick(fdp, st.pools)
    if choice < 8 and st.dead_pools:
        return pick(fdp, st.dead_pools)
    return (0, odd(fdp), fdp.ConsumeIntInRange(0x5000_0000, 0x5000_4000))[fdp.ConsumeIntInRange(0, 2)]


def a_stream(fdp, st):
    choice = fdp.ConsumeIntInRange(0, 9)
    if choice < 6 and st.streams:
        return pick(fdp, st.streams)
    if choice < 7 and st.dead_streams:
        return pick(fdp, st.dead_streams)
    return (0, None, odd(fdp), "s")[fdp.ConsumeIntInRange(0, 3)]


def a_pointer(fdp, st):
    choice = fdp.ConsumeIntInRange(0, 9)
    live = list(st.live)
    if choice < 3 and live:
        return pick(fdp, live)
    if choice == 3 and live:  # equal to a block's address, of another type
        return (float, fractions.Fraction, Index, numpy.int64)[fdp.ConsumeIntInRange(0, 3)](
            pick(fdp, live))
    if choice == 4 and live:  # inside a block, or just past it
        return pick(fdp, live) + (fdp.ConsumeIntInRange(1, 2 * MiB) & ~63 or 64)
    if choice == 5 and st.freed:
        return pick(fdp, st.freed)
    if choice == 6 and st.plain:
        return pick(fdp, st.plain)
    if choice == 7:
        return fdp.ConsumeIntInRange(0, 1 << 48)
    return odd(fdp)


def a_size(fdp):
    choice = fdp.ConsumeIntInRange(0, 5)
    if choice == 0:
        return odd(fdp)
    if choice == 1:
        return fdp.ConsumeIntInRange(0, 1 << 64)
    return fdp.ConsumeIntInRange(0, 12 * MiB)


def props(fdp):
    size = (fdp.ConsumeIntInRange(0, 64) * MiB, 0, odd(fdp))[fdp.ConsumeIntInRange(0, 2)] \
        if fdp.ConsumeIntInRange(0, 3) else fdp.ConsumeIntInRange(1, 64 * MiB)
    p = {"allocType": 0, "handleType": 0, "location": {"id": 0, "type": 1}, "maxSize": size}
    mutate = fdp.ConsumeIntInRange(0, 19)
    if mutate == 0:
        p["allocType"] = odd(fdp)
    elif mutate == 1:
        p["location"] = odd(fdp)
    elif mutate == 2:
        p["location"] = {"id": odd(fdp), "type": 1}
    elif mutate == 3:
        p["reserved"] = (odd(fdp), [0, 1], b"\x00\x01", [0] * 4)[fdp.ConsumeIntInRange(0, 3)]
    elif mutate == 4:
        return odd(fdp)
    return p


def books():
    """Every pool's statistics (what a refused call must leave alone)."""
    return {h: acl_soma.pool_stats(h) for h in list(acl_soma._pools)}


def call(fdp, st, op):
    """One call of the drop-in: (name, its return value)."""
    rt = acl.rt
    if op == 0:
        handle, ret = rt.mem_pool_create(props(fdp))
        if ret == 0:
            st.pools.append(handle)
        return "mem_pool_create", ret
    if op == 1:
        pool, stream = a_pool(fdp, st), a_stream(fdp, st)
        ptr, ret = rt.mem_pool_malloc_async(a_size(fdp), pool, stream)
        if ret == 0 and ptr:
            if ptr in st.live:
                raise AssertionError(f"mem_pool_malloc_async handed out {ptr:#x} twice")
            st.live[ptr] = (pool, stream)
            if ptr in st.freed:
                st.freed.remove(ptr)
        return "mem_pool_malloc_async", ret
    if op == 2:
        ptr, stream = a_pointer(fdp, st), a_stream(fdp, st)
        ret = rt.mem_pool_free_async(ptr, stream)
        key = _key(ptr)
        if ret == 0:
            if key in st.freed and key not in st.live and key not in st.plain:
                raise AssertionError(f"mem_pool_free_async({ptr!r}) of a block already freed "
                                     f"to its pool answered 0")
            if key in st.live:
                del st.live[key]
                st.freed.append(key)
            elif key in st.plain:
                st.plain.remove(key)
        return "mem_pool_free_async", ret
    if op == 3:
        value, ret = rt.mem_pool_get_attr(a_pool(fdp, st), (pick(fdp, ATTRS), odd(fdp))[
            fdp.ConsumeIntInRange(0, 7) == 0])
        return "mem_pool_get_attr", ret
    if op == 4:
        attr = pick(fdp, ATTRS) if fdp.ConsumeIntInRange(0, 5) else (odd(fdp), 0, 9)[fdp.ConsumeIntInRange(0, 2)]
        value = (fdp.ConsumeIntInRange(0, 1), 0, fdp.ConsumeIntInRange(0, 80) * MiB,
                 odd(fdp))[fdp.ConsumeIntInRange(0, 3)]
        return "mem_pool_set_attr", rt.mem_pool_set_attr(a_pool(fdp, st), attr, value)
    if op == 5:
        keep = (fdp.ConsumeIntInRange(0, 80) * MiB, odd(fdp))[fdp.ConsumeIntInRange(0, 3) == 0]
        return "mem_pool_trim_to", rt.mem_pool_trim_to(a_pool(fdp, st), keep)
    if op == 6:
        return "synchronize_stream", rt.synchronize_stream(a_stream(fdp, st))
    if op == 7:
        stream, ret = rt.create_stream()
        if ret == 0:
            st.streams.append(stream)
        return "create_stream", ret
    if op == 8:
        stream = a_stream(fdp, st)
        ret = rt.destroy_stream(stream)
        if ret == 0 and stream in st.streams:
            st.streams.remove(stream)
            st.dead_streams.append(stream)
        return "destroy_stream", ret
    if op == 9:
        pool = a_pool(fdp, st)
        ret = rt.mem_pool_destroy(pool)
        if ret == 0 and pool in st.pools:
            st.pools.remove(pool)
            st.dead_pools.append(pool)
        return "mem_pool_destroy", ret
    if op == 10:
        event, ret = rt.create_event()
        if ret == 0:
            st.events.append(event)
        return "create_event", ret
    if op == 11:
        event = pick(fdp, st.events) if st.events and fdp.ConsumeIntInRange(0, 4) else odd(fdp)
        how = fdp.ConsumeIntInRange(0, 4)
        if how == 0:
            return "record_event", rt.record_event(event, a_stream(fdp, st))
        if how == 1:
            return "stream_wait_event", rt.stream_wait_event(a_stream(fdp, st), event)
        if how == 2:
            return "synchronize_event", rt.synchronize_event(event)
        if how == 3:
            return "query_event_status", rt.query_event_status(event)[1]
        ret = rt.destroy_event(event)
        if ret == 0 and event in st.events:
            st.events.remove(event)
        return "destroy_event", ret
    if op == 12:  # a plain aclrtMalloc block, to be freed through the pool call at times
        ptr, ret = rt.malloc(fdp.ConsumeIntInRange(1, 4 * MiB), 0)
        if ret == 0:
            st.plain.append(ptr)
        return "malloc", ret
    if op == 13:  # aclrtFree of anything: a live pool block leaves its pool at once
        ptr = a_pointer(fdp, st)
        ret = rt.free(ptr)
        key = _key(ptr)
        if ret == 0:
            st.live.pop(key, None)
            if key in st.plain:
                st.plain.remove(key)
        return "free", ret
    if op == 14:
        if fdp.ConsumeIntInRange(0, 3) == 0:  # aclrtResetDevice: every block and pool goes
            ret = rt.reset_device(0)
            if ret == 0:
                st.dead_pools += st.pools
                st.pools, st.live, st.plain = [], {}, []
            return "reset_device", ret
        return "synchronize_device", rt.synchronize_device()
    # a pool set to reuse across streams, so that the reuse rules run
    pool = a_pool(fdp, st)
    return "mem_pool_set_attr", rt.mem_pool_set_attr(pool, pick(fdp, (1, 2, 3)), 1)


def _key(ptr):
    """The address a pointer argument stands for (pyACL parses pointers
    with __index__), or None: what the harness's books are keyed on."""
    if isinstance(ptr, bool):
        return None
    try:
        return int(operator.index(ptr))
    except TypeError:
        return None


def check_all(dev, where):
    dev.check()
    for handle, pool in list(acl_soma._pools.items()):
        if pool.device is dev:
            try:
                pool.check()
            except ascmem.CorruptionError as exc:
                raise AssertionError(f"{where}: pool {handle:#x}: {exc}") from None


def one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    dev = ascmem.Device("atlas-a2-training")
    acl.use(dev)
    st = State()
    # a pool and two streams to start with: most runs then reach reuse,
    # limits and release, whatever the create calls the input makes
    handle, _ = acl.rt.mem_pool_create(
        {"allocType": 0, "handleType": 0, "location": {"id": 0, "type": 1},
         "maxSize": fdp.ConsumeIntInRange(1, 32) * 2 * MiB})
    st.pools.append(handle)
    st.streams += [acl.rt.create_stream()[0], acl.rt.create_stream()[0]]
    try:
        step = 0
        while fdp.remaining_bytes() and step < 64:  # no run of calls made of exhausted input
            step += 1
            op = fdp.ConsumeIntInRange(0, 15)
            before = books()
            name, ret = call(fdp, st, op)
            if VERBOSE:
                print(f"step {step}: {name} -> {ret}", file=sys.stderr)
            if not isinstance(ret, int):
                raise AssertionError(f"{name} answered {ret!r}, not a code")
            after = books()
            if ret != 0:
                changed = {h: (before.get(h), after.get(h)) for h in set(before) | set(after)
                           if before.get(h) != after.get(h)}
                if changed:
                    raise AssertionError(f"step {step}: {name} refused with {ret} but changed "
                                         f"the pools' books: {changed}")
            check_all(dev, f"step {step} ({name})")
        drain(dev, st)
    finally:
        acl_soma.forget_pools_of(dev)
        acl.use(None)


def drain(dev, st):
    """Frees everything, synchronizes, destroys: the Device must be empty."""
    rt = acl.rt
    for ptr, (pool, stream) in list(st.live.items()):
        if ptr in _live_pool_blocks():
            ret = rt.mem_pool_free_async(ptr, stream)
            if ret != 0:
                raise AssertionError(f"drain: freeing live block {ptr:#x} on {stream!r}: {ret}")
    for ptr in st.plain:
        rt.free(ptr)
    for stream in st.streams + st.dead_streams:
        rt.synchronize_stream(stream)
    for handle, pool in list(acl_soma._pools.items()):
        if pool.device is dev:
            ret = rt.mem_pool_destroy(handle)
            if ret != 0:
                raise AssertionError(f"drain: mem_pool_destroy({handle:#x}) answered {ret}, "
                                     f"{pool.stats()}")
    dev.synchronize()
    dev.empty_cache()  # the small-block slabs a Device keeps for reuse
    dev.check()
    budget = dev.budget()
    stats = dev.stats()
    held = {k: (s["used"], s["live_count"]) for k, s in stats.items()
            if k != "device" and (s["used"] or s["live_count"])}
    if held or budget["huge_used"] or budget["normal_used"] or stats["device"]["pending_bytes"]:
        raise AssertionError(f"drain: the Device still holds memory: {held}, budget {budget}, "
                             f"pending {stats['device']['pending_bytes']}")


def _live_pool_blocks():
    out = set()
    for pool in list(acl_soma._pools.values()):
        out.update(pool.live)
    return out


if __name__ == "__main__":
    stream_pools  # noqa: B018  (instrumented with the rest)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
