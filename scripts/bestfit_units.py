"""Textbook best fit's efficiency with each rounding unit, beside the
contiguous Pool's: how far best fit moves on a trace when nothing but its
unit changes.  Issue 42 holds the Pool to best fit in 64-byte units; where
best fit in 128 B - 4 KiB units reads far apart from it, that figure is one
draw of a placement that small changes reorder, not a floor any rule of the
Pool's aims at (docs/ARCHITECTURE.md, Note [Best fit], "How close to best
fit").

    python scripts/bestfit_units.py [--units 64,512,4096] [--only NAME ...] [--json OUT] [trace ...]

Traces: as scripts/frugality_table.py (held-out ones marked *).  Efficiency
is peak live / the smallest arena that replays the trace (64 KiB bisection).
"""
import argparse
import json
import os
import sys

import ascmem.trace as tr
from ascmem import _replay_peers as peers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frugality_table import selected  # noqa: E402  (the table's own trace list)

RESOLUTION = 64 << 10


def row(t, units):
    """Efficiencies of trace t: the Pool's, then best fit's at each unit."""
    peak = t.peak_live()
    r = {"trace": t.name, "peak_live": peak, "pool": tr.efficiency(t, "pool", RESOLUTION)[0]}
    for u in units:
        cap = tr.min_capacity(t, lambda c, u=u: peers.BestFit(c, granule=u), RESOLUTION)
        r[f"bestfit{u}"] = peak / cap
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="more traces (any format `ascmem fit` reads)")
    ap.add_argument("--units", default="64,128,512,1024,4096",
                    help="best fit's units in bytes, comma-separated (default: %(default)s)")
    ap.add_argument("--only", action="append", help="only traces of this name (repeat)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    try:
        units = [int(u) for u in args.units.split(",")]
    except ValueError:
        ap.error(f"--units: comma-separated byte counts, not {args.units!r}")
    if any(u <= 0 for u in units):
        ap.error("--units: every unit must be a positive number of bytes")
    cols = ["pool"] + [f"bestfit{u}" for u in units]
    print(f"{'trace':24s}{'peak MiB':>9s}" + "".join(f"{c:>12s}" for c in cols) + f"{'bf spread':>11s}")
    rows = []
    for t, held in selected(args.paths, args.only):
        r = row(t, units)
        r["heldout"] = held
        spread = max(r[c] for c in cols[1:]) - min(r[c] for c in cols[1:])
        name = ("*" if held else " ") + t.name
        print(f"{name:24s}{r['peak_live'] / 2**20:9.1f}" + "".join(f"{r[c]:12.3f}" for c in cols)
              + f"{spread:11.3f}", flush=True)
        rows.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
