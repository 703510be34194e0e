"""Events per second of each replay that replay, fit and plan make, in one
process: the Device (as plan and as replay play it), every peer, raw CANN,
and plan's footprints together.  On a trace file, or on the generated
serving trace of ascmem.tools.bench_scale.

    python benchmarks/replay_speed.py [TRACE] [--events 1000000]

Run it with an older ascmem on PYTHONPATH for the before of a change.
"""

import argparse
import os
import tempfile
import time

import ascmem
from ascmem.tools import planner
from ascmem.emulations import raw_cann
from ascmem import trace as tr


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", help="a trace file (default: a generated one)")
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    if args.trace:
        t = tr.load(args.trace)
    else:
        from ascmem.tools import bench_scale
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "scale.csv")
            bench_scale.write_csv(path, *bench_scale.workload(args.events))
            t = tr.load(path)
    n = len(t)
    capacity = (4 * t.peak_live() + (1 << 30)) >> 20 << 20  # whole MiB: any pool takes it
    names = [a for a in tr.ALLOCATORS if a != "tlsf" or tr.tlsf_available()]

    def timed(label, run):
        t0 = time.process_time()
        run()
        cpu = time.process_time() - t0
        print(f"{label:32s} {cpu:7.2f} s CPU {n / cpu / 1e6 if cpu else 0:8.2f} M events/s",
              flush=True)

    print(f"{t.name}: {n:,} events")
    timed("device, as plan replays it", lambda: planner.footprints(t, ["ascmem"]))
    timed("device, as replay does",
          lambda: tr.replay(t, ascmem.Device(planner.REFERENCE, memory=planner.REFERENCE_MEMORY)))
    for name in names:
        timed(name, lambda: tr.replay(t, name, capacity=capacity))
    timed("cann-raw", lambda: raw_cann.peak(t, ascmem.Device(planner.REFERENCE)))
    timed("plan's footprints, all", lambda: planner.footprints(t))


if __name__ == "__main__":
    main()
