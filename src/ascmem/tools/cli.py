"""The ``ascmem`` command: info, replay, fit, bench.

Exit codes: 0 success; 1 the work ran but failed (a replay with allocation
failures, an error while running); 2 bad usage or bad input (unknown model,
malformed trace).
"""

import argparse
import io
import json
import os
import re
import sys

# shipped workloads and the product each is replayed on by default; the last
# fifteen are real traces (scripts/record_traces.py), recorded on a CPU
EXAMPLE_MODELS = {"video_pipeline": "atlas-inference", "batch_inference": "atlas-training",
                  "many_small": "atlas-training", "resnet50_multires": "atlas-inference-series",
                  "encoder_varlen": "atlas-a2-inference", "decoder_kvcache": "atlas-a2-inference",
                  "unet_multires": "atlas-inference-series", "vit_train": "atlas-a2-training",
                  "resnet18_train": "atlas-a2-training", "seq2seq_generate": "atlas-a2-inference",
                  "gru_lm": "atlas-a2-inference", "mobilenet_multires": "atlas-inference-series",
                  "bert_train": "atlas-a2-training", "decoder_static_cache": "atlas-a2-inference",
                  "diffusion_denoise": "atlas-a2-inference", "speech_to_text": "atlas-a2-inference",
                  "convnext_multires": "atlas-inference-series", "lstm_tagger_train": "atlas-a2-training",
                  "moe_train": "atlas-a2-training", "llm_serving": "atlas-a2-inference"}


def _mib(n):
    if n >= 2**20:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**10:,.1f} KiB" if n >= 2**10 else f"{n} B"


def _example(name):
    from ascmem import trace
    if name not in trace.example_names():
        known = ", ".join(sorted(EXAMPLE_MODELS))
        raise _Usage(f"unknown example {name!r}; known: {known}")
    return trace.example(name)


class _Usage(Exception):
    """A usage error: exit code 2."""


def _load(args):
    from ascmem import trace
    if getattr(args, "example", None):
        if args.trace:
            raise _Usage("give a trace file or --example, not both")
        return _example(args.example)
    if not args.trace:
        raise _Usage("give a trace file, - for standard input, or --example NAME")
    from ascmem.tools import progress
    with progress.step("load", unit="B") as watch:
        if args.trace == "-":
            data = io.BytesIO(sys.stdin.buffer.read())
            data.name = "<stdin>"
            return trace.load(data, device=args.device, progress=watch)
        return trace.load(args.trace, device=args.device, progress=watch)


def _source_notes(t):
    """Lines about what the import of a PyTorch trace left out (printed by
    every command's table output; --json has them in "source")."""
    skipped = t.source.get("skipped_frees")
    if not skipped:
        return []
    return [f"note: {skipped:,} frees of blocks allocated before recording started were "
            f"skipped (the profile began mid-run; the figures cover what it recorded)"]


def _print_notes(t):
    for line in _source_notes(t):
        print(line)


def _check_mode(model, mode):
    """A mode the product does not have is a usage error (exit 2)."""
    from ascmem import profiles
    if mode is None:
        return
    try:
        prof = profiles.get(model)
    except Exception:
        return  # the device's own error names the known products
    if str(mode).upper() not in prof.modes:
        raise _Usage(f"{prof.title} has no {str(mode).upper()} mode (it has: {', '.join(prof.modes)})")


def _table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


# ---- info ---------------------------------------------------------------------------------

def cmd_info(args):
    import ascmem
    from ascmem import MemAttr, profiles
    if args.list:
        if args.json:
            return _json("info", {"models": [{"model": p.name, "product": p.title,
                                               "aliases": list(p.aliases)}
                                              for p in map(profiles.get, profiles.names())]})
        rows = [(p.name, p.title, ", ".join(p.aliases) or "-")
                for p in (profiles.get(n) for n in profiles.names())]
        print(_table(rows, ("model", "product", "aliases")))
        return 0
    prof = profiles.get(args.model)
    _check_mode(prof.name, args.mode)
    dev = ascmem.Device(prof.name, mode=args.mode)
    b = dev.budget()
    if args.json:
        mem = "HBM" if prof.memory_type == "HBM" else "DDR"
        info = {name: dict(zip(("free", "total"), dev.get_mem_info(MemAttr[f"{mem}_{name}"])))
                for name in ("MEM", "MEM_HUGE", "MEM_NORMAL")}
        return _json("info", {"model": prof.name, "mode": dev.mode, "product": prof.title,
                              "memory_type": prof.memory_type, "memory": prof.memory,
                              "free_os_memory": prof.free_os_memory, "modes": list(prof.modes),
                              "budget": b, "aicpu_cache": list(prof.aicpu_cache),
                              "first_job_package": prof.first_job_package,
                              "media_window": prof.media_window, "p2p": prof.p2p,
                              "huge1g": prof.huge1g, "virtual_memory": prof.virtual_memory,
                              "mem_info": {f"{mem}_{k}": v for k, v in info.items()},
                              "precautions": dev.precautions()})
    print(f"{prof.title}  [{prof.name}; aliases: {', '.join(prof.aliases) or '-'}]")
    rows = [
        ("memory type", prof.memory_type),
        ("device memory", _mib(prof.memory)),
        ("free OS memory", _mib(prof.free_os_memory)),
        ("mode", f"{dev.mode} (modes: {', '.join(prof.modes)})"),
        ("huge-page reserve", _mib(b["reserve"]) if b["reserve"] else "none"),
        ("huge pages grow", "yes" if b["huge_grows"] else "no (RC: the reserve is the limit)"),
        ("AI CPU operator cache", f"{_mib(prof.aicpu_cache[0])} - {_mib(prof.aicpu_cache[1])}"
         if prof.aicpu_cache[1] else "none"),
        ("first-job system package", _mib(prof.first_job_package) if prof.first_job_package else "none"),
        ("media (DVPP) window", _mib(prof.media_window)),
        ("P2P policies", "supported" if prof.p2p else "not supported"),
        ("1 GiB huge pages", "supported" if prof.huge1g else "not supported"),
    ]
    print(_table(rows, ("property", "value")))
    print()
    mem = "HBM" if prof.memory_type == "HBM" else "DDR"
    rows = []
    for name in ("MEM", "MEM_HUGE", "MEM_NORMAL"):
        attr = MemAttr[f"{mem}_{name}"]
        free, total = dev.get_mem_info(attr)
        rows.append((attr.name, _mib(free), _mib(total)))
    print(_table(rows, ("aclrtGetMemInfo", "free", "total")))
    print("\nPrecautions:")
    for text in dev.precautions():
        print(f"  - {text}")
    return 0


# ---- replay -------------------------------------------------------------------------------

def _no_idle_flags(args, t):
    """A flag that would change nothing in the chosen mode is a usage error."""
    device = args.allocator == "device" and not (args.paged or args.granule)
    if not args.snapshot and (args.at_peak or args.max_entries):
        raise _Usage("--at-peak and --max-entries shape a snapshot: give --snapshot FILE too")
    if not device and (args.model or args.mode):
        raise _Usage("--model and --mode choose the device; this replay goes through "
                     + ("a paged pool" if args.paged or args.granule else f"--allocator "
                        f"{args.allocator}"))
    if getattr(args, "device", None) and t.source.get("format") == "csv":
        raise _Usage("--device picks the device of a PyTorch trace; this is an ascmem CSV trace")


def cmd_replay(args):
    import ascmem
    from ascmem import trace as tr
    t = _load(args)
    _no_idle_flags(args, t)
    model = args.model or EXAMPLE_MODELS.get(args.example or "", "atlas-inference")
    if args.plot:
        from ascmem.tools import plot
        plot.require()  # before the replay, not after it
    if args.paged or args.granule:
        if args.allocator not in ("device", "pool") or args.capacity:
            raise _Usage("--paged replays through a paged pool, whose range is virtual: no "
                         "--allocator or --capacity with it")
        granule = args.granule or 2 << 20
        _check_granule(granule)
        target = tr.paged_pool(t, granule)
        where = f"a paged pool ({_kib(granule)} granules)"
    elif args.allocator == "device":
        if args.capacity:
            raise _Usage("--capacity sizes a pool, buddy or tlsf arena; the device's memory comes "
                         "from --model (and --mode)")
        _check_mode(model, args.mode)
        target = ascmem.Device(model, mode=args.mode)
        where = f"{target.profile.name} {target.mode} (sim backend)"
    else:
        # pools take whole 4 KiB units: a capacity in any unit is rounded down to them
        cap = (args.capacity or max(4 * t.peak_live(), 1 << 20) // (1 << 20) * (1 << 20)) // 4096 * 4096
        if not cap:
            raise _Usage("--capacity must be at least 4 KiB")
        target = tr.make_allocator(args.allocator, cap)
        where = f"{args.allocator} of {_mib(cap)}"
    import warnings

    from ascmem.tools import progress
    with warnings.catch_warnings(record=True) as caught, \
            progress.step("replay", len(t)) as watch:
        warnings.simplefilter("always", ascmem.PrecautionWarning)
        report = tr.replay(t, target, progress=watch, snapshot=args.snapshot,
                           curve=bool(args.plot), snapshot_at_peak=args.at_peak,
                           history_limit=args.max_entries)
    if isinstance(target, ascmem.Device):
        from ascmem.emulations import raw_cann
        report["device"] = target.budget()
        report["precaution_warnings"] = sorted({str(w.message) for w in caught})
        report["cann_raw"] = raw_cann.peak(t, target)  # the same trace, each call to the runtime
    if args.plot:
        from ascmem.tools import plot
        plot.replay_plot(t, report, args.plot, title=f"{t.name} on {where}")
    for key in ("curve_live", "curve_used", "curve_used_label"):
        report.pop(key, None)
    if args.json:
        timing = {k: report.pop(k) for k in ("ops_per_sec", "seconds")}
        report.update(allocator=args.allocator if not (args.paged or args.granule) else "paged-pool",
                      target=where, model=getattr(target, "profile", None) and target.profile.name,
                      mode=getattr(target, "mode", None),
                      capacity=getattr(target, "capacity", None), source=t.source, timing=timing)
        _json(args.command, report)
        return 1 if report["failures"] else 0
    print(f"ascmem replay: {t.name}: {report['events']:,} events, "
          f"{report['allocations']:,} allocations on {where}")
    rows = []
    for kind, peak in sorted(report.get("per_kind_peak_live", {}).items()):
        rows.append((f"peak live, {kind or 'all'}", _mib(peak)))
    for stream, peak in sorted(report.get("per_stream_peak_live", {}).items()):
        rows.append((f"peak live, stream {stream}", _mib(peak)))
    rows += [
        ("peak live, all kinds", _mib(report["peak_live"])),
        ("peak held (CANN-rounded)" if "device" in report else "peak held (after rounding)",
         _mib(report["peak_used"])),
        ("failures", f"{report['failures']:,}"),
        ("speed", f"{report['ops_per_sec'] / 1e6:.2f} M events/s"),
    ]
    if "peak_mapped" in report:
        rows += [
            ("peak mapped", _mib(report["peak_mapped"])),
            ("physical efficiency", f"{report['physical_efficiency']:.3f}"),
            ("map / unmap calls", f"{report['map_calls']:,} / {report['unmap_calls']:,}"),
        ]
    if "device" in report:
        b = report["device"]
        rows += [
            ("device peak, huge pages", _mib(b["peak_huge"])),
            ("device peak, normal pages", _mib(b["peak_normal"])),
            ("huge-page reserve", _mib(b["reserve"]) if b["reserve"] else "none"),
            ("raw CANN peak (whole pages per call)", _mib(report["cann_raw"]["peak"])),
        ]
    print(_table(rows, ("measure", "value")))
    _print_notes(t)
    if report["first_failure"]:
        f = report["first_failure"]
        print(f"first failure: event {f['event']} ({f['where']}), id {f['id']}, "
              f"{f['size']:,} bytes {f['kind']}: {f['error']}")
    for w in report.get("precaution_warnings", []):
        print(f"precaution: {w}")
    if args.plot:
        print(f"plot written to {args.plot}")
    if args.snapshot:
        print(f"PyTorch memory snapshot written to {args.snapshot} "
              f"(open it at https://pytorch.org/memory_viz)")
    return 1 if report["failures"] else 0


def cmd_snapshot(args):
    args.snapshot = args.output
    return cmd_replay(args)


# ---- fit ----------------------------------------------------------------------------------

def _in_default_setting(plans, unit):
    """{placement: figures} of a plan's figures in this unit, with slabs (the
    default slab_max)."""
    from ascmem import trace as tr
    return {p: got for (p, u, slab_max), got in plans.items()
            if u == unit and slab_max == tr.SLAB_MAX}


def cmd_fit(args):
    from ascmem import trace as tr
    t = _load(args)
    if args.device and t.source.get("format") == "csv":
        raise _Usage("--device picks the device of a PyTorch trace; this is an ascmem CSV trace")
    names = args.allocator or [a for a in tr.ALLOCATORS if a != "tlsf" or tr.tlsf_available()]
    if args.allocator is None and not tr.tlsf_available():
        print("(tlsf skipped: pip install tlsfallocator to compare with it)", file=sys.stderr)
    from ascmem.tools import progress
    peak = t.peak_live()
    rows, results = [], []
    placements = plan = None  # the contiguous Pool's, when it is fitted
    for name in names:
        with progress.step(f"fit {name}", unit="replays") as watch:
            if name == "pool":  # under each placement, unit and slab_max; the default's is the row
                plans = tr.contiguous_plan_efficiencies(t, args.resolution, progress=watch)
                placements = _in_default_setting(plans, tr.CONTIGUOUS_UNITS[0])
                plan = tr.best_contiguous_plan(plans)
                cap = placements[tr.CONTIGUOUS_PLACEMENTS[0]][1]
            else:
                cap = tr.min_capacity(t, name, resolution=args.resolution, progress=watch)
        rows.append((name, _mib(cap), f"{peak / cap:.3f}"))
        results.append({"allocator": name, "min_capacity": cap, "efficiency": peak / cap})
        if name == "pool":
            results[-1].update(
                placement=tr.fewest_mapped(placements), placements={
                    p: {"min_capacity": c, "efficiency": e} for p, (e, c) in placements.items()},
                plan={"placement": plan.placement, "min_block": plan.min_block,
                      "slab_max": plan.slab_max, "min_capacity": plan.arena,
                      "efficiency": plan.efficiency},
                plans=[{"placement": p, "min_block": u, "slab_max": sm, "min_capacity": c,
                        "efficiency": e} for (p, u, sm), (e, c) in plans.items()])
    paged = []
    for g in (args.granule or (2 << 20, 64 << 10)) if (args.paged or args.granule) else ():
        _check_granule(g)
        replays = len(tr.PLACEMENTS) * len(tr.SLAB_MAXES) * sum(u <= g for u in tr.PAGED_UNITS)
        with progress.step(f"paged {_kib(g)}", replays * len(t)) as watch:
            paged_plans = tr.paged_plan_efficiencies(t, g, progress=watch)
        figures = _in_default_setting(paged_plans, tr.PAGED_UNITS[0])
        chosen = tr.best_paged_plan(paged_plans)
        eff, mapped = figures["granules"]
        # what no placement can beat: the peak's live bytes in whole granules
        bound = peak / (-(-peak // g) * g) if peak else 1.0
        paged.append({"granule": g, "peak_mapped": mapped, "physical_efficiency": eff,
                      "bound": bound, "packed_peak_mapped": figures["packed"][1],
                      "packed_efficiency": figures["packed"][0],
                      "best_fit_peak_mapped": figures["best-fit"][1],
                      "best_fit_efficiency": figures["best-fit"][0],
                      "placements": {p: {"peak_mapped": m, "efficiency": e}
                                     for p, (e, m) in figures.items()},
                      "placement": tr.fewest_mapped(figures),
                      "plan": {"placement": chosen.placement, "min_block": chosen.min_block,
                               "slab_max": chosen.slab_max, "peak_mapped": chosen.peak_mapped,
                               "efficiency": chosen.efficiency},
                      "plans": [{"placement": p, "min_block": u, "slab_max": sm, "peak_mapped": m,
                                 "efficiency": e}
                                for (p, u, sm), (e, m) in paged_plans.items()]})
    if args.json:
        return _json("fit", {"trace": t.name, "source": t.source, "peak_live": peak,
                             "resolution": args.resolution, "allocators": results,
                             "paged": paged})
    print(f"ascmem fit: {t.name}: peak live {_mib(peak)}; smallest arena that replays the "
          f"whole trace, found by bisection to {args.resolution // 1024} KiB")
    print(_table(rows, ("allocator", "min capacity", "efficiency")))
    print("(the size of one contiguous arena; `ascmem plan` answers another question: the "
          "device memory a process holds, in whole pages, beside weights and the runtime)")
    if placements:
        print(f"pool placements in {tr.CONTIGUOUS_UNITS[0]}-byte units (Pool(placement=...)): " +
              ", ".join(f"{p} {e:.3f}" for p, (e, _) in placements.items()) +
              f"; smallest arena here: {tr.fewest_mapped(placements)}")
        print(f"pool placement, unit and slabs with the smallest arena (of min_block "
              f"{', '.join(map(str, tr.CONTIGUOUS_UNITS))}, slab_max "
              f"{', '.join(map(str, tr.SLAB_MAXES))}): {plan.efficiency:.3f}, "
              f"{_mib(plan.arena)}; deploy with placement={plan.placement!r}, "
              f"min_block={plan.min_block}, slab_max={plan.slab_max}")
    if paged:
        rows = [(f"paged pool, {_kib(p['granule'])} granules", _mib(p["peak_mapped"]),
                 f"{p['physical_efficiency']:.3f}", f"{p['bound']:.4f}") for p in paged]
        print("physical: a virtual range mapped in granules only where live bytes are; bound: "
              "peak live over the whole granules it needs, which no placement beats")
        print(_table(rows, ("allocator", "peak mapped", "efficiency", "bound")))
        print("placement packed (Pool(placement='packed'): every block end to end): " +
              ", ".join(f"{_kib(p['granule'])} {p['packed_efficiency']:.3f}" for p in paged) +
              "; best-fit (every block as plain best fit places it): " +
              ", ".join(f"{_kib(p['granule'])} {p['best_fit_efficiency']:.3f}" for p in paged) +
              "; maps least here: " +
              ", ".join(f"{_kib(p['granule'])} {p['placement']}" for p in paged))
        for p in paged:
            print(f"paged {_kib(p['granule'])}: placement, unit and slabs that map least (of "
                  f"min_block {', '.join(str(u) for u in tr.PAGED_UNITS if u <= p['granule'])}, "
                  f"slab_max {', '.join(map(str, tr.SLAB_MAXES))}): "
                  f"{p['plan']['efficiency']:.3f}, {_mib(p['plan']['peak_mapped'])}; deploy with "
                  f"placement={p['plan']['placement']!r}, min_block={p['plan']['min_block']}, "
                  f"slab_max={p['plan']['slab_max']}")
    _print_notes(t)
    return 0


JSON_SCHEMA_VERSION = 1


def _json(command, body):
    """Prints one JSON document: the schema (docs/CLI_JSON.md), the ascmem
    version, the command, then its fields; run-to-run noise only in timing."""
    from ascmem._version import __version__
    doc = {"schema": f"ascmem.{command}/{JSON_SCHEMA_VERSION}", "ascmem": __version__,
           "command": command}
    doc.update(body)
    print(json.dumps(doc, indent=2, default=str))
    return 0


def _check_granule(g):
    if g & (g - 1) or g < 4096:
        raise _Usage(f"--granule must be a power of two of at least 4 KiB, not {g}")


def _kib(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB"


# ---- bench --------------------------------------------------------------------------------

def cmd_bench(args):
    flags = (["--quick"] if args.quick else []) + (["--json"] if args.json else [])
    if args.torch:  # torch's CPU allocator against ascmem's (needs torch)
        from ascmem.torch import bench as torch_bench
        return torch_bench.main(flags)
    from ascmem.tools import bench
    return bench.main(flags)


def build_parser():
    from ascmem import trace as tr  # its ALLOCATORS name the peers replay and fit take
    p = argparse.ArgumentParser(
        prog="ascmem", description="Plan and compare Ascend device memory with the ascmem "
        "allocator, no hardware needed.")
    from ascmem.tools import cli_plan
    from ascmem._version import __version__
    p.add_argument("--version", action="version", version=f"ascmem {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("info", help="a product's memory profile, budgets and precautions",
                       description="A product's memory profile: device memory, the huge-page "
                       "reserve and the page budgets, aclrtGetMemInfo's answers and the CANN "
                       "memory precautions that apply, for one product and mode (--model, "
                       "--mode), or the list of product names (--list).")
    s.add_argument("--model", default="atlas-inference", help="product profile (default: %(default)s)")
    s.add_argument("--mode", default=None, help="EP or RC (default: the product's first)")
    s.add_argument("--list", action="store_true", help="list the product names and exit")
    s.add_argument("--json", action="store_true", help="print the facts as JSON (docs/CLI_JSON.md)")
    s.set_defaults(func=cmd_info)

    def trace_args(s):
        s.add_argument("trace", nargs="?", help="trace file: ascmem CSV (op,id,size[,kind,policy]), "
                       "a PyTorch profiler Chrome trace or a PyTorch memory snapshot; .gz ok")
        s.add_argument("--device", help="a PyTorch trace's device: cpu, cuda, npu, cuda:1, or a "
                       "snapshot's index (default: the one with the most events)")
        s.add_argument("--example", help="a shipped workload: " + ", ".join(sorted(EXAMPLE_MODELS)))
        s.add_argument("--quiet", action="store_true", help="no progress bars (they are drawn "
                       "on a terminal only, with tqdm installed)")

    def snapshot_args(s):
        s.add_argument("--at-peak", action="store_true",
                       help="capture the device at its peak of live bytes, not at the trace's end")
        s.add_argument("--max-entries", type=cli_plan.count, default=None,
                       help="keep the last N allocation-history entries (default: all, as PyTorch)")

    s = sub.add_parser("replay", help="play a trace through a device or an allocator")
    trace_args(s)
    s.add_argument("--model", help="product profile for the device (default: the example's, "
                   "else atlas-inference)")
    s.add_argument("--mode", default=None, help="EP or RC")
    s.add_argument("--allocator", default="device",
                   choices=["device"] + list(tr.ALLOCATORS),
                   help="what to replay through (default: %(default)s)")
    s.add_argument("--capacity", type=_positive_int, help="bytes (units allowed: 300MiB), for --allocator pool/buddy/tlsf "
                   "(default: 4 x peak live)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--plot", metavar="FILE.png", help="write live bytes per kind over time")
    s.add_argument("--snapshot", metavar="FILE.pickle",
                   help="write the device at the trace's end in PyTorch's memory-snapshot format")
    snapshot_args(s)
    s.add_argument("--paged", action="store_true",
                   help="replay through a paged pool (a virtual range mapped in granules) and "
                   "report its physical efficiency: peak live / peak mapped")
    s.add_argument("--granule", type=_positive_int, default=None,
                   help="granule of --paged (units allowed: 64KiB; default 2MiB)")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("snapshot", help="replay on a device, then write PyTorch's "
                       "memory-snapshot pickle of it")
    trace_args(s)
    s.add_argument("--model", help="product profile (default: the example's, else atlas-inference)")
    s.add_argument("--mode", default=None, help="EP or RC")
    s.add_argument("-o", "--output", default="snapshot.pickle", help="(default: %(default)s)")
    s.add_argument("--json", action="store_true", help="print the replay report as JSON")
    snapshot_args(s)
    s.set_defaults(func=cmd_snapshot, allocator="device", capacity=None, plot=None,
                   paged=False, granule=None)

    s = sub.add_parser("fit", help="minimum capacity and efficiency per allocator")
    trace_args(s)
    s.add_argument("--allocator", action="append",
                   choices=list(tr.ALLOCATORS),
                   help="repeat to compare several (default: all available)")
    s.add_argument("--resolution", type=_positive_int, default=64 * 1024,
                   help="bisection step (a size: 64KiB, 1MiB; default: 64KiB)")
    s.add_argument("--paged", action="store_true",
                   help="also the physical efficiency (peak live / peak mapped) of a paged pool")
    s.add_argument("--json", action="store_true", help="print the results as JSON (docs/CLI_JSON.md)")
    s.add_argument("--granule", type=_positive_int, action="append",
                   help="granule of --paged, repeat for several (units allowed; default 2MiB "
                   "and 64KiB)")
    s.set_defaults(func=cmd_fit)

    cli_plan.add_parser(sub, trace_args, _bytes_of)

    s = sub.add_parser("bench", help="speed and frugality against peers, in one run")
    s.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.add_argument("--torch", action="store_true",
                   help="PyTorch's CPU allocator against ascmem.torch, A/B in one process")
    s.set_defaults(func=cmd_bench)
    for choice in getattr(sub, "_choices_actions", ()):  # `COMMAND --help` says what it does
        if sub.choices[choice.dest].description is None:
            sub.choices[choice.dest].description = choice.help[:1].upper() + choice.help[1:] + "."
    return p


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def _positive_int(text):
    """A positive size with its unit, in _bytes_of's forms."""
    value = _bytes_of(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of bytes, not {text!r}")
    return value


def _bytes_of(text):
    """A size >= 0 with its unit: 300MiB, 64KiB, 1.5 GiB, 2GB, 4096B (KiB,
    MiB... and K, M... are powers of 1024; kB, MB... powers of 1000; B
    bytes), 0, or bytes in hexadecimal (0x10000).  Any other decimal number
    without a unit is refused: `--weights 300` read as 300 bytes where 300
    MiB was meant passes every check silently."""
    m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?|0[xX][0-9a-fA-F_]+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size (a positive number with a unit: B, KiB, MiB, GiB, TiB, "
            f"kB, MB, GB, TB; e.g. 300MiB)")
    number = m.group(1)
    value = int(number, 16) if number[:2].lower() == "0x" else float(number) if "." in number \
        else int(number)
    value = int(value * _UNITS[unit])
    if value and not unit and number[:2].lower() != "0x":
        raise argparse.ArgumentTypeError(
            f"{text!r} has no unit: write {number.strip()}MiB for mebibytes (or {number.strip()}B "
            f"if bytes are meant; KiB, GiB, ... work too)")
    return value


def _negative_sizes_as_values(parser, argv):
    """`--weights -5MiB` as `--weights=-5MiB`: argparse takes a token that
    starts with '-' and is not a plain negative number for an option, and
    says "expected one argument"; joined, the size's own check says what is
    wrong with it."""
    takes_value = set()
    stack = [parser]
    while stack:
        for action in stack.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif action.option_strings and action.nargs is None and action.type is not None:
                takes_value.update(action.option_strings)
    out, i = [], 0
    while i < len(argv):
        if argv[i] in takes_value and i + 1 < len(argv) and re.match(r"-[0-9.]", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv=None):
    from ascmem.errors import AscmemError, OutOfMemoryError
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # bare `ascmem`: what it can do, not a usage error
        parser.print_help()
        return 0
    args = parser.parse_args(_negative_sizes_as_values(parser, argv))
    from ascmem.tools import progress
    progress.configure(quiet=getattr(args, "quiet", True))
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (| head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _Usage as exc:
        parser.error(str(exc))
    except OutOfMemoryError as exc:  # the workload did not fit: 1, as a replay with failures
        print(f"ascmem: error: {exc}", file=sys.stderr)
        return 1
    except (AscmemError, OSError, ImportError) as exc:  # bad input, unreadable or unwritable files
        print(f"ascmem: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
