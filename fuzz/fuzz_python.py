"""atheris harness over the Python API, the trace loader included.
    python fuzz/fuzz_python.py -max_total_time=600
Any exception other than ascmem's own errors (and TraceError) is a finding,
as is a failed check().  Arguments come in every shape a careless caller
passes: negative, huge, float, str, None, __index__ objects that lie,
unhashable streams, events out of order, resets and a close part-way; on
the paged device, tags (mistyped ones too) put to sleep and woken between
stream frees, writes through views, buffer objects kept past their view,
and resets."""
import io
import os
import sys

import atheris

with atheris.instrument_imports():
    import ascmem
    from ascmem import trace as tr

EXPECTED = (ascmem.AscmemError,)
# the pluggable functions (no GIL, through ctypes) free a paged device's
# blocks behind the Python layer's back: refused for the blocks it tracks
import ascmem.pluggable as pluggable  # noqa: E402

# the acl backend on the tests' recording stand-in, whose calls may raise
# (as pyACL might, instead of returning a code): a raise is a refusal
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import fake_acl  # noqa: E402

RAISING = ("malloc_physical", "map_mem", "unmap_mem", "free_physical", "memcpy", "malloc",
           "free", "create_event", "record_event", "destroy_event", "release_mem_address")


def raising_acl(fdp):
    """The stand-in, one of whose runtime calls raises on its n-th call."""
    acl = fake_acl.make()
    name, nth = RAISING[fdp.ConsumeIntInRange(0, len(RAISING) - 1)], fdp.ConsumeIntInRange(1, 8)
    orig, calls = getattr(acl.rt, name), [0]

    def call(*args):
        calls[0] += 1
        if calls[0] == nth:
            raise MemoryError(f"injected in rt.{name}")
        return orig(*args)
    setattr(acl.rt, name, call)
    return acl

RAW = pluggable.functions()
RAW_INDEX = 7


class Index:
    """An object with __index__, which may return something other than an int."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def odd_value(fdp):
    """An argument of any shape: mostly integers, sometimes not."""
    choice = fdp.ConsumeIntInRange(0, 9)
    n = fdp.ConsumeIntInRange(-(1 << 65), 1 << 65) if choice == 1 else fdp.ConsumeIntInRange(0, 1 << 22)
    return (n, n, float(n) + 0.5, str(n), None, Index(n), Index(float(n)), Index(str(n)),
            [n], True)[choice]


def odd_stream(fdp):
    return (None, "s1", "s2", 3, [], {}, ("s", 1))[fdp.ConsumeIntInRange(0, 6)]


def given_back_at_threshold_0(paged, plive, threshold):
    """Everything freed (stream frees done, sleepers freed too): at release
    threshold 0 a paged device keeps nothing mapped or charged (45.10)."""
    try:
        for a in plive:
            try:
                paged.free(a)
            except EXPECTED:
                pass
        paged.synchronize()
    except EXPECTED:  # closed, or the stand-in's runtime refused
        return
    s = paged.stats()
    if threshold or any(s[k]["live_count"] for k in s if k != "device"):
        return  # blocks freed behind this list's back (the raw path) or refused frees
    b = paged.budget()
    if b["huge_used"] + b["normal_used"]:
        raise AssertionError(f"nothing live at threshold 0, yet charged: {b}")


def one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    pool = ascmem.Pool(1 << 22, base=1 << 32)
    dev = ascmem.Device("atlas-inference", memory=64 << 20,
                        thread_caches=("off", "on", "auto")[fdp.ConsumeIntInRange(0, 2)])
    # real memory at times (host backend, guard bytes on half of those): the
    # frees then read and write it, and a paged pool unmaps what it frees
    backend = ("sim", "host", "host-debug", "acl")[fdp.ConsumeIntInRange(0, 3)]
    if backend == "host-debug":
        os.environ["ASCMEM_DEBUG"] = "1"
    paged = ascmem.Device("atlas-a2-training", memory=256 << 20, paged=True,
                          backend=backend.split("-")[0],
                          acl_module=raising_acl(fdp) if backend == "acl" else None,
                          release_threshold=(threshold := fdp.ConsumeIntInRange(0, 3) << 21))
    os.environ.pop("ASCMEM_DEBUG", None)
    raw = backend != "acl"  # an acl paged device maps through pyACL: no GIL-free calls
    if raw:
        pluggable.configure(paged, RAW_INDEX)
    live, dlive, plive, events, escaped = [], [], [], [], []
    readable = backend in ("host", "host-debug")
    for _ in range(fdp.ConsumeIntInRange(0, 40)):
        op = fdp.ConsumeIntInRange(0, 22)
        try:
            if op == 0:
                live.append(pool.alloc(fdp.ConsumeIntInRange(-5, 1 << 23),
                                       fdp.ConsumeIntInRange(0, 1 << 13)))
            elif op == 1 and live:
                pool.free(live.pop(fdp.ConsumeIntInRange(0, len(live) - 1)))
            elif op == 2:
                pool.free(fdp.ConsumeInt(8))
            elif op == 3:
                dev.malloc(fdp.ConsumeIntInRange(0, 1 << 25), fdp.ConsumeInt(4))
            elif op == 4:
                dev.dvpp_malloc(fdp.ConsumeIntInRange(0, 1 << 24))
            elif op == 5:
                dev.get_mem_info(fdp.ConsumeIntInRange(-2, 20))
            elif op == 6:
                # with a header half the time: the compiled CSV reader's own input
                head = b"op,id,size,kind,policy\n" if fdp.ConsumeBool() else b""
                tr.load(io.BytesIO(head + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200))))
            elif op == 7:  # all or nothing: a refused batch moves no counter (issue 45.11)
                before = pool.stats()
                try:
                    live.extend(int(a) for a in
                                pool.alloc_many([fdp.ConsumeIntInRange(-1, 1 << 20) for _ in range(3)]))
                except EXPECTED:
                    after = pool.stats()
                    for k in ("alloc_count", "free_count", "live_count", "used"):
                        if after[k] != before[k]:
                            raise AssertionError(f"a refused alloc_many moved {k}: {before[k]} -> {after[k]}")
            elif op == 8:
                live.append(pool.alloc(odd_value(fdp), odd_value(fdp)))
            elif op == 9:
                pool.free_many([odd_value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 4))])
            elif op == 10:
                dlive.append(dev.malloc(odd_value(fdp), stream=odd_stream(fdp)))
            elif op == 11 and dlive:
                dev.free(dlive.pop(fdp.ConsumeIntInRange(0, len(dlive) - 1)),
                         stream=odd_stream(fdp))
            elif op == 12:
                events.append(dev.record_event(odd_stream(fdp)))
                if dlive and fdp.ConsumeBool():
                    dev.record_stream(dlive[-1], odd_stream(fdp))
            elif op == 13:
                if events and fdp.ConsumeBool():
                    dev.complete_event(events.pop(0))
                else:
                    dev.synchronize(odd_stream(fdp))
            elif op == 14:
                dev.set_memory_fraction((0.5, 1e-12, "x", None, 2.0, float("nan"))[
                    fdp.ConsumeIntInRange(0, 5)])
            elif op == 16:  # paged, tagged (a tag of any shape), on a stream at times
                plive.append(paged.malloc(fdp.ConsumeIntInRange(0, 24 << 20),
                                          tag=("kv", "w", None, ["x"], 3)[fdp.ConsumeIntInRange(0, 4)],
                                          stream=(None, "s1")[fdp.ConsumeIntInRange(0, 1)]))
            elif op == 17 and plive:  # freed by Python (on a stream at times) or by the raw path
                a = plive.pop(fdp.ConsumeIntInRange(0, len(plive) - 1))
                how = fdp.ConsumeIntInRange(0, 3)
                if how == 3 and raw:
                    RAW[pluggable.FREE](a, 0, RAW_INDEX, None)
                else:
                    paged.free(a, stream=(None, "s1", "s2", None)[how])  # 3: acl, no raw path
            elif op == 18:
                tag = ("kv", "w", {}, "typo")[fdp.ConsumeIntInRange(0, 3)]
                if fdp.ConsumeBool():
                    paged.sleep(tag, keep=fdp.ConsumeBool())
                else:
                    paged.wake(tag)
            elif op == 19:
                paged.synchronize(("s1", "s2", None)[fdp.ConsumeIntInRange(0, 2)])
                if plive and fdp.ConsumeBool():
                    paged.record_stream(plive[-1], "s2")
                if plive and backend in ("host", "host-debug") and fdp.ConsumeBool():  # write where it may
                    view = paged.buffer(plive[-1])
                    view[0] = view[len(view) - 1] = 7
                    del view
            elif op == 20 and plive and readable:  # a buffer's object kept past its view (45.2)
                escaped.append(paged.buffer(plive[fdp.ConsumeIntInRange(0, len(plive) - 1)]).obj)
                if fdp.ConsumeBool():
                    o = escaped[fdp.ConsumeIntInRange(0, len(escaped) - 1)]
                    try:
                        m = memoryview(o)
                    except EXPECTED:
                        pass
                    else:  # its last export ended: the block may be freed, asleep or reset
                        m[0] = 1
                        raise AssertionError("a released block buffer exported its memory again")
            elif op == 21 and readable:  # every block this layer thinks live and awake is writable
                for a in plive:          # (a sleeping block reused on a stream was not: 45.1)
                    try:
                        view = paged.buffer(a)
                    except EXPECTED:     # asleep, waiting on a stream, gone in a reset
                        continue
                    view[0] = view[len(view) - 1] = 9
                    del view
            elif op == 22:  # a reset of the paged device under tags, sleepers and stream frees
                paged.reset()
                plive.clear()
            elif fdp.ConsumeIntInRange(0, 7) == 0:
                dev.close()
            else:
                dev.reset()
                dlive.clear()
        except EXPECTED:
            pass
    pool.check()
    dev.check()
    paged.check()
    if raw:
        pluggable.unconfigure(RAW_INDEX)
    given_back_at_threshold_0(paged, plive, threshold)
    paged.close()
    s = pool.stats()
    for a in live:
        try:
            pool.free(a)
        except EXPECTED:
            pass
    s = pool.stats()
    if s["live_count"] == 0 and s["largest_free"] != s["capacity"]:
        raise AssertionError(f"an empty pool is not whole: {s}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
