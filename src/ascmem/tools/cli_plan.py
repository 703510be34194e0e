"""`ascmem plan`: the command over ascmem.tools.planner -- a table by default,
--json (schema ascmem.plan/1, docs/CLI_JSON.md), --plot of memory over time
per allocator."""

import argparse


def add_parser(sub, trace_args, size):
    """size: the parser of a number of bytes >= 0 (cli._bytes_of)."""
    from ascmem.tools import planner
    s = sub.add_parser("plan", help="will a workload fit on each product, with what headroom, "
                       "per allocator (ascmem, torch_npu caching and expandable segments, cann-raw)")
    trace_args(s)
    s.add_argument("--weights", type=size, default=0, help="model weights per instance (300MiB...)")
    s.add_argument("--instances", type=count, default=1,
                   help="processes sharing a card, each running the workload (default: 1)")
    s.add_argument("--headroom", type=size, default=0,
                   help="memory to keep free per instance: HCCL, workspaces (default: 0)")
    s.add_argument("--dvpp", type=size, default=0, help="media (DVPP) memory per instance, "
                   "besides the trace's own")
    s.add_argument("--model", action="append", help="only these products (repeat; default: all)")
    s.add_argument("--allocator", action="append", choices=planner.PEERS,
                   help="repeat to compare several (default: " + ", ".join(planner.ALLOCATORS) + ")")
    s.add_argument("--json", action="store_true", help="one JSON document (docs/CLI_JSON.md)")
    s.add_argument("--plot", metavar="PNG", help="memory over time per allocator (matplotlib)")
    s.set_defaults(func=cmd_plan)


def count(text):
    """A whole number >= 1 (of processes, of entries)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return n


def cmd_plan(args):
    import dataclasses
    from ascmem import trace as tr
    from ascmem.tools import planner
    from ascmem.tools.cli import _json, _load, _mib, _print_notes, _table
    if args.plot:
        from ascmem.tools import plot
        plot.require()
    t = _load(args)
    p = planner.plan(t, weights=args.weights, instances=args.instances, headroom=args.headroom,
                     dvpp=args.dvpp, models=args.model, curves=bool(args.plot),
                     allocators=args.allocator or planner.ALLOCATORS)
    if args.plot:
        from ascmem.tools import plot
        plot.plan_plot(p, args.plot)
    if args.json:
        body = dataclasses.asdict(p)
        for fp in body["footprints"]:
            fp.pop("curve")
        body["source"] = t.source
        _json("plan", body)
        return 0 if any(p.smallest.values()) else 1
    print(f"ascmem plan: {t.name}: peak live {_mib(p.peak_live)}; {p.instances} instance(s), "
          f"each with weights {_mib(p.weights)}, media {_mib(p.dvpp)}, headroom "
          f"{_mib(p.headroom)}")
    print("workload peak per instance: " + ", ".join(
        f"{fp.allocator} {'' if fp.complete else 'over '}{_mib(fp.peak)}" for fp in p.footprints)
        + f" (media {_mib(p.footprints[0].media_peak)})")
    print("(device memory held at the worst moment, in whole pages of each kind; `ascmem fit` "
          "answers another question: the smallest contiguous arena)")
    for fp in p.footprints:
        if fp.placements:
            print(f"ascmem placements in {tr.CONTIGUOUS_UNITS[0]}-byte units "
                  "(Device(placement=...)): " + ", ".join(
                f"{name} {_mib(peak)}" for name, peak in fp.placements.items()) +
                f"; fewest pages of every setting: {_mib(fp.peak)}; deploy with "
                f"placement={fp.placement!r}, min_block={fp.min_block}, "
                f"slab_max={fp.slab_max}")
    names = [fp.allocator for fp in p.footprints]
    rows, cells = [], {}
    for f in p.fits:
        cells[(f.model, f.mode, f.allocator)] = f
    seen = []
    for f in p.fits:
        if (f.model, f.mode) not in seen:
            seen.append((f.model, f.mode))
    for model, mode in seen:
        first = cells[(model, mode, names[0])]
        rows.append([f"{model} {mode}", _mib(first.memory), _mib(first.first_job)] +
                    [_cell(cells[(model, mode, n)], _mib) for n in names])
    print(_table(rows, ["product, mode", "memory", "first job"] + names))
    if any(f.runs_as != f.allocator for f in p.fits):
        print("(as torch-caching): that product and mode has no virtual memory management, so "
              "torch_npu turns expandable segments off and its caching allocator runs")
    for name in names:
        print(f"smallest card that fits with {name}: {p.smallest[name] or 'none'}")
    _print_notes(t)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0 if any(p.smallest.values()) else 1


def _cell(f, mib):
    return _verdict(f, mib) + ("" if f.runs_as == f.allocator else f" (as {f.runs_as})")


def _verdict(f, mib):
    if f.fits:
        return f"fits, {mib(f.headroom)} free"
    short = mib(-f.headroom) if f.headroom < 0 else "0 B"
    if f.limit.startswith("workload over"):
        return f"no: {f.limit}"
    return f"no: {f.limit}" + (f", {short} short" if f.limit == "device memory" else "")
