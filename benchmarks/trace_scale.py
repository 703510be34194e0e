"""Planning at real scale (issue 44): generates a large trace -- a PyTorch
profiler Chrome trace (JSON) and an ascmem CSV of the same workload -- and
runs `ascmem replay`, `fit` and `plan` on it, each in a child process,
reporting CPU seconds, events per second and peak memory (the child's
maximum resident set size).  The workload and the measuring are
ascmem.tools.bench_scale's (`ascmem bench` runs them small).

    python benchmarks/trace_scale.py --events 1000000 [--commands replay,fit,plan]
    python benchmarks/trace_scale.py --events 10000000 --formats csv --commands fit
"""

import argparse
import json

from ascmem.tools import bench_scale


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--formats", default="json,csv")
    ap.add_argument("--commands", default="replay,fit,plan")
    ap.add_argument("--dir", default=None, help="where the traces go and stay (default: a "
                    "temporary dir, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = bench_scale.rows(args.events, args.formats.split(","), args.commands.split(","),
                               args.dir)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "output"} for r in results],
                         indent=2))
        return
    for r in results:
        print(f"{r['format']:5} {r['command']:7} {r['events']:>11,} events  {r['cpu_s']:7.2f} s "
              f"CPU  {r['wall_s']:7.2f} s wall  {r['events_per_s'] / 1e6:6.2f} M events/s  peak "
              f"{r['peak_rss_mb']:7.0f} MB  exit {r['exit']}")
        if r["exit"] not in (0, 1):
            print(r["output"])


if __name__ == "__main__":
    main()
