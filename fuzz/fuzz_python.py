"""atheris harness over the Python API, the trace loader included.
    python fuzz/fuzz_python.py -max_total_time=600
Any exception other than ascmem's own errors (and TraceError) is a finding,
as is a failed check()."""
import io
import sys

import atheris

with atheris.instrument_imports():
    import ascmem
    from ascmem import trace as tr

EXPECTED = (ascmem.AscmemError,)


def one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    pool = ascmem.Pool(1 << 22, base=1 << 32)
    dev = ascmem.Device("atlas-inference", memory=64 << 20)
    live = []
    for _ in range(fdp.ConsumeIntInRange(0, 40)):
        op = fdp.ConsumeIntInRange(0, 7)
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
                tr.load(io.BytesIO(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200))))
            else:
                pool.alloc_many([fdp.ConsumeIntInRange(-1, 1 << 20) for _ in range(3)])
        except EXPECTED:
            pass
    pool.check()
    dev.check()


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
