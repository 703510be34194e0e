"""Side-by-side comparison of ascmem and its peers, measured in one run.

    ascmem bench            (also: python benchmarks/compare.py)
    ascmem bench --quick    tiny counts, a smoke run

Speed: median ns per allocate+free pair from Python, for ascmem's Pool,
BuddyAllocator and Device, the PyPI package tlsfallocator (OffsetAllocator) and
the floor (NoopPool: a Cython method pair that does nothing, built on the spot
when Cython and a C compiler are there).  Ratios are to
the floor and to tlsfallocator, measured in the same process, so machine speed
and noise cancel as far as they can.  Batch calls, the C core (built on the
spot when a C compiler is there) and the frugality of each allocator on the
recorded trace and the shipped examples follow.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import timeit

# numpy's BLAS threads spin on the other core of a 2-core machine; nothing here
# uses BLAS.  (Only effective when numpy is not imported yet.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import ascmem
from ascmem import trace as tr

MiB = 1 << 20
SIZES = (64, 4096, MiB, 64 * MiB)
# the source checkout this module sits in (src/ascmem/tools/../../..): benchmarks/c lives there
SOURCE_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


# The floor: a Cython method pair with Pool's signatures that only converts its
# arguments, compiled with ascmem._core's directives, so Pool / floor reads
# what Pool's work costs beyond the call itself.  It is the benchmark's
# reference, not part of the package: built here, in a temporary folder.
FLOOR_PYX = """# cython: language_level=3, binding=False
cimport cython
from libc.stdint cimport uint64_t

@cython.final
cdef class NoopPool:
    def alloc(self, nbytes, align=64):
        cdef uint64_t n = nbytes
        return n | (<uint64_t>1 << 40)  # an address-sized int, as a real allocator returns

    def free(self, addr):
        cdef uint64_t a = addr
"""
FLOOR_SETUP = """
from setuptools import Extension, setup
from Cython.Build import cythonize
setup(name="ascmem_floor", script_args=["build_ext", "--inplace", "-q"],
      ext_modules=cythonize([Extension("ascmem_floor", ["ascmem_floor.pyx"])], quiet=True))
"""
_FLOOR = []


def floor_module():
    """The floor's module (its NoopPool class), built once per process; None
    when Cython or a C compiler is missing."""
    if not _FLOOR:
        import atexit
        d = tempfile.mkdtemp(prefix="ascmem_floor_")
        atexit.register(shutil.rmtree, d, True)
        with open(os.path.join(d, "ascmem_floor.pyx"), "w") as f:
            f.write(FLOOR_PYX)
        built = subprocess.run([sys.executable, "-c", FLOOR_SETUP], cwd=d,
                               capture_output=True).returncode == 0
        module = None
        if built:
            sys.path.insert(0, d)
            try:
                import ascmem_floor as module
            except ImportError:
                module = None
            finally:
                sys.path.remove(d)
        _FLOOR.append(module)
    return _FLOOR[0]


def _median_ns(stmt, env, number, repeat):
    runs = timeit.repeat(stmt, globals=env, number=number, repeat=repeat)
    return statistics.median(runs) / number * 1e9


def python_pairs(number, repeat):
    """Median ns per alloc+free pair; one dict per (allocator, size)."""
    pool = ascmem.Pool(1 << 30, base=1 << 32)
    # paged, with a release threshold above the largest pair: freed granules
    # stay mapped (kept), so after the first pair no map call is made; a
    # resident block of each small size keeps its slab, and its granule, live
    # (the case the speed target is about: mapping is the backend's cost)
    paged = ascmem.Pool(1 << 30, base=1 << 32, granule=2 * MiB, release_threshold=128 * MiB)
    resident = [paged.alloc(n) for n in SIZES if n < MiB]  # small pairs: their slab stays live
    buddy = ascmem.BuddyAllocator(1 << 30, base=1 << 32)
    dev = ascmem.Device("atlas-training")
    env = {"pool": pool, "paged": paged, "resident": resident, "buddy": buddy, "dev": dev}
    peers = [("ascmem Pool", "pool.free(pool.alloc({n}))"),
             ("ascmem Pool, paged", "paged.free(paged.alloc({n}))"),
             ("ascmem BuddyAllocator", "buddy.free(buddy.alloc({n}))"),
             ("ascmem Device.malloc", "dev.free(dev.malloc({n}))")]
    floor = floor_module()
    if floor is not None:
        env["floor"] = floor.NoopPool()
        peers.insert(0, (FLOOR, "floor.free(floor.alloc({n}))"))
    if tr.tlsf_available():
        import TLSFAllocator
        env["tlsf"] = TLSFAllocator.OffsetAllocator(1 << 30, 1 << 17)
        peers.append(("tlsfallocator", "tlsf.free(tlsf.allocate({n}))"))
    # round-robin: each repeat measures every peer once, so that drifts in
    # machine speed (shared, noisy hosts) hit all peers alike
    samples = {(name, n): [] for n in SIZES for name, _ in peers}
    timers = {(name, n): timeit.Timer(stmt.format(n=n), globals=env)
              for n in SIZES for name, stmt in peers}
    for _ in range(repeat):
        for key, timer in timers.items():
            samples[key].append(timer.timeit(number) / number * 1e9)
    return [{"peer": name, "size": n, "ns": statistics.median(samples[(name, n)]),
             "samples": samples[(name, n)]}
            for n in SIZES for name, _ in peers]


def paired_ratio(a, b):
    """Median over repeats of a's time / b's time in the same repeat: each
    repeat measures every peer within a fraction of a second, so a slow spell
    of the host cancels in the quotient (a ratio of two medians does not)."""
    return statistics.median(x / y for x, y in zip(a["samples"], b["samples"]))


FLOOR = "floor (NoopPool)"
NOISY_SPREAD = 0.25  # p10 to p90 of a figure's samples, over their median
TLSF_MISSING = ("tlsfallocator is not installed, so nothing is compared with it: "
                "pip install '.[bench]' in the source tree (or pip install tlsfallocator) "
                "adds it")


def noise(rows):
    """Why a run's Python pair figures are not to be trusted, as sentences
    (none: nothing seen).  Two signs: a peer measured faster than the floor,
    which does nothing, so that only noise puts a ratio below 1; and a
    figure whose repeats spread widely (other processes took the core in
    some of them)."""
    by = {(r["peer"], r["size"]): r for r in rows}
    out = []
    below = [(r["peer"], r["size"], paired_ratio(r, by[(FLOOR, r["size"])])) for r in rows
             if r["peer"] != FLOOR and (FLOOR, r["size"]) in by]
    below = [b for b in below if b[2] < 1]
    if below:
        peer, size, ratio = min(below, key=lambda b: b[2])
        out.append(f"{len(below)} figure(s) read faster than the floor, which does nothing "
                   f"({peer} at {_size(size)}: {ratio:.2f}x)")
    spreads = []
    for r in rows:
        if len(r["samples"]) >= 5:
            deciles = statistics.quantiles(r["samples"], n=10)
            spreads.append(((deciles[-1] - deciles[0]) / r["ns"], r["peer"], r["size"]))
    if spreads and max(spreads)[0] > NOISY_SPREAD:
        spread, peer, size = max(spreads)
        out.append(f"repeats of one figure spread by {spread:.0%} of its median ({peer} at "
                   f"{_size(size)}, 10th to 90th percentile; a quiet run stays under "
                   f"{NOISY_SPREAD:.0%})")
    return out


def batch_pairs(count, repeat):
    """ns per pair for alloc_many + free_many of count mixed sizes
    (log-uniform 64 B - 4 MiB, the C benchmark's distribution)."""
    rng = np.random.default_rng(1)
    sizes = np.exp(rng.uniform(np.log(64), np.log(4 * MiB), size=count)).astype(np.uint64)
    pool = ascmem.Pool(64 << 30, base=1 << 40)
    env = {"pool": pool, "sizes": sizes}
    return _median_ns("pool.free_many(pool.alloc_many(sizes))", env, 1, repeat) / count


def host_buffers(number, repeat):
    """8 MiB host buffer: acquire + release from a host-backend pool (its
    pages stay resident, so nothing needs touching), and the same with a numpy
    view made on it, against numpy.empty of 8 MiB plus touching every page
    (what a pipeline does without a pool).  Median ns of each."""
    dev = ascmem.Device("atlas-inference", backend="host")
    n = 8 * MiB
    warm = dev.malloc_host(n)
    dev.as_array(warm, n)[::4096] = 1  # first use faults the pages in once
    dev.free_host(warm)

    def pooled():
        dev.free_host(dev.malloc_host(n))

    def pooled_view():
        p = dev.malloc_host(n)
        a = dev.as_array(p, n)
        del a
        dev.free_host(p)

    def fresh():
        a = np.empty(n, dtype=np.uint8)
        a[::4096] = 1  # touch every page

    env = {"pooled": pooled, "pooled_view": pooled_view, "fresh": fresh}
    timers = {"pool": timeit.Timer("pooled()", globals=env),
              "pool+view": timeit.Timer("pooled_view()", globals=env),
              "numpy": timeit.Timer("fresh()", globals=env)}
    samples = {k: [] for k in timers}
    for _ in range(repeat):
        for k, t in timers.items():
            samples[k].append(t.timeit(number) / number * 1e9)
    return {k: statistics.median(v) for k, v in samples.items()}


def _made(bench_dir, target):
    """Builds a benchmarks/c target with make; whether it was built."""
    return subprocess.run(["make", "-s", "-C", bench_dir, target, f"PYTHON={sys.executable}"],
                          capture_output=True, text=True).returncode == 0


def _run_pinned(exe, runs):
    cmd = [exe, str(runs)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0"] + cmd
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {k: float(v) for k, v in (line.split() for line in out.strip().splitlines())}


def c_core(runs, peer=True):
    """Runs benchmarks/c/bench_core.c when the source tree and a C compiler are
    here, and, with peer, the same workloads against OffsetAllocator (built by
    `make -C benchmarks/c bench_offset`, which downloads the tlsfallocator
    sdist; skipped when that fails).  The two alternate, run by run, so their
    ratio comes from one stretch of machine time.  Returns a dict of ns per
    pair (steady, lifo, steady_single_threaded, lifo_single_threaded, batch,
    device_1mib (a Device's 1 MiB pair, which charges the page budget twice);
    the same by handle: steady_handle, lifo_handle, ...; and offset_steady, offset_lifo, offset_steady_by_offset when the peer was
    built) or None."""
    root = SOURCE_ROOT
    bench_dir = os.path.join(root, "benchmarks", "c")
    src = os.path.join(bench_dir, "bench_core.c")
    csrc = os.path.join(root, "csrc")
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not (os.path.exists(src) and os.path.isdir(csrc) and cc):
        return None
    offset = None
    if peer and shutil.which("make") and shutil.which(os.environ.get("CXX", "c++")):
        if _made(bench_dir, "bench_offset"):
            offset = os.path.join(bench_dir, "bench_offset")
    with tempfile.TemporaryDirectory() as tmp:
        exe, exe_handle = os.path.join(tmp, "bench_core"), os.path.join(tmp, "bench_core_handle")
        cfiles = sorted(os.path.join(csrc, f) for f in os.listdir(csrc) if f.endswith(".c"))
        for out, flags in ((exe, []), (exe_handle, ["-DBY_HANDLE"])):
            subprocess.run([cc, "-O3", "-flto", "-std=gnu11", *flags, "-I", csrc, "-I", bench_dir,
                            "-o", out, src, *cfiles, "-lm"], check=True)
        ours, theirs = [], []
        for _ in range(max(1, runs // 3) if runs > 1 else 1):
            ours.append(_run_pinned(exe, 3 if runs > 1 else 1))
            ours[-1].update(_run_pinned(exe_handle, 3 if runs > 1 else 1))
            if offset:
                theirs.append(_run_pinned(offset, 3 if runs > 1 else 1))
    result = {}
    for key in ("steady", "lifo", "steady_single_threaded", "lifo_single_threaded", "batch",
                "device_1mib", "steady_handle", "lifo_handle", "steady_handle_single_threaded",
                "lifo_handle_single_threaded"):
        result[key] = float(np.median([r[f"{key}_ns_per_pair"] for r in ours]))
    if theirs:
        for key in ("steady", "lifo", "steady_by_offset"):
            result[f"offset_{key}"] = float(np.median([r[f"{key}_ns_per_pair"] for r in theirs]))
    return result


_CPUS = set()  # the CPUs this process could run on before main() pinned it


def _unpin():
    if _CPUS:
        os.sched_setaffinity(0, _CPUS)


BESIDE_BATCHES = "single pairs beside batches"  # c_threads' entry from bench_batch_wait.c


def c_threads(runs):
    """Runs benchmarks/c's multi-thread workloads (threads.h: 1, 2 and as many
    threads as the machine has on one pool, on one Device (and through the
    pluggable functions on one), and OffsetAllocator
    behind a mutex; steady state and producer-consumer), and a thread's single
    pairs beside another's batches (bench_batch_wait.c), when the source
    tree, make and compilers are here.  Returns {backend: {figure: value}}
    or None."""
    root = SOURCE_ROOT
    bench_dir = os.path.join(root, "benchmarks", "c")
    if not (os.path.exists(os.path.join(bench_dir, "threads.h")) and shutil.which("make")):
        return None
    if not _made(bench_dir, "bench_threads"):
        return None
    runs_of = {"ascmem pool": ["bench_threads", str(runs)],
               "ascmem pool, caches on": ["bench_threads", str(runs), "cached"],
               "ascmem pool, caches on, slab sizes": ["bench_threads", str(runs), "cached", "small"],
               # AUTO, what a Pool or Device made in Python starts in
               "ascmem pool, caches auto, slab sizes": ["bench_threads", str(runs), "auto", "small"],
               "ascmem pool, slab sizes": ["bench_threads", str(runs), "small"],
               "ascmem device": ["bench_threads", str(runs), "device"],
               "ascmem device, caches on, slab sizes": ["bench_threads", str(runs), "device", "cached",
                                                        "small"],
               "ascmem device, caches auto, slab sizes": ["bench_threads", str(runs), "device", "auto",
                                                          "small"],
               "pluggable functions, caches on, slab sizes": ["bench_threads", str(runs), "pluggable",
                                                              "cached", "small"]}
    if _made(bench_dir, "peer_threads"):
        runs_of["OffsetAllocator + mutex"] = ["peer_threads", str(runs)]
    if _made(bench_dir, "bench_batch_wait"):
        runs_of[BESIDE_BATCHES] = ["bench_batch_wait"]
    out = {}
    for name, cmd in runs_of.items():
        # every CPU this process had before main() pinned it to one: threads
        # pinned to one core wait for each other, and would measure that
        text = subprocess.run([os.path.join(bench_dir, cmd[0])] + cmd[1:], check=True,
                              capture_output=True, text=True, preexec_fn=_unpin).stdout
        out[name] = {k: float(v) for k, v in (line.split() for line in text.strip().splitlines())}
    return out


def frugality(traces, names, resolution):
    rows = []
    for t in traces:
        peak = t.peak_live()
        row = {"trace": t.name, "peak_live": peak}
        for name in names:
            cap = tr.min_capacity(t, name, resolution=resolution)
            row[name] = peak / cap
        rows.append(row)
    return rows


def expandable_eager_efficiency(trace):
    """Peak live / peak mapped of torch_npu's expandable segments unmapping
    every free page at once (ascmem.emulations.torch_expandable, eager).  One replay
    with room to spare gives it: an allocator that keeps nothing free mapped
    has nothing to release before an out-of-memory, so it replays alike in
    any capacity that holds its peak."""
    report = tr.replay(trace, "torch-expandable-eager", capacity=1 << 44)
    return report["peak_live"] / report["peak_reserved"]


def _traces(quick):
    """The frugality table's traces: every shipped example (what a clone
    has); a smoke run takes two small real ones."""
    if quick:
        return [tr.example("resnet50_multires"), tr.example("encoder_varlen")]
    return [tr.example(name) for name in tr.example_names()]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="ascmem bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    ap.add_argument("--no-c", action="store_true", help="skip the C core benchmark")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    args = ap.parse_args(argv)
    if args.json:  # the same runs; the text goes nowhere, the figures to stdout
        import contextlib
        import io
        import json
        with contextlib.redirect_stdout(io.StringIO()):
            figures = _run(args)
        from ascmem._version import __version__
        print(json.dumps({"schema": "ascmem.tools.bench/1", "ascmem": __version__, "command": "bench",
                          **figures}, indent=2))
        return 0
    _run(args)
    return 0


def _run(args):
    """Runs every benchmark, printing the text report; returns the figures."""
    # many short samples, round-robin: a burst of load on these shared hosts
    # then spoils a few samples of every peer rather than all of one
    number, repeat = (2000, 3) if args.quick else (20_000, 61)
    # one core for everything, as the C benchmark runs under taskset: a
    # process the scheduler moves between cores starts over with cold caches
    pinned = ""
    if hasattr(os, "sched_setaffinity"):
        try:
            _CPUS.update(os.sched_getaffinity(0))  # the threads benchmark gets them back
            os.sched_setaffinity(0, {0})
            pinned = "; pinned to CPU 0"
        except OSError:
            pass
    print(f"ascmem {ascmem.__version__} bench; python {sys.version.split()[0]}; "
          f"{os.cpu_count()} CPUs; medians of {repeat} runs{pinned}")

    rows = python_pairs(number, repeat)
    figures = {"python_pairs": [{k: r[k] for k in ("peer", "size", "ns")} for r in rows]}
    by = {(r["peer"], r["size"]): r for r in rows}
    has_floor = (FLOOR, SIZES[0]) in by
    tlsf = ("tlsfallocator", SIZES[0]) in by
    figures["tlsfallocator"] = tlsf
    print("\nalloc+free pair from Python, median ns (" +
          ("median of same-repeat ratios to the floor" if has_floor
           else "no floor: it needs Cython and a C compiler") +
          ("; to tlsfallocator)" if tlsf else ")"))
    if not tlsf:
        print(TLSF_MISSING)
    print(f"{'peer':24s}" + "".join(f"{_size(n):>26s}" for n in SIZES))
    for peer in dict.fromkeys(r["peer"] for r in rows):
        cells = []
        for n in SIZES:
            r = by[(peer, n)]
            floor_ratio = f"{paired_ratio(r, by[(FLOOR, n)]):.2f}x" if has_floor else "-"
            t = (f"; {paired_ratio(r, by[('tlsfallocator', n)]):.2f}x"
                 if ("tlsfallocator", n) in by else "")
            cells.append(f"{r['ns']:8.1f} ({floor_ratio}{t})")
        print(f"{peer:24s}" + "".join(f"{c:>26s}" for c in cells))
    figures["warnings"] = noise(rows)
    if figures["warnings"]:
        load = f" (load average {os.getloadavg()[0]:.1f})" if hasattr(os, "getloadavg") else ""
        print(f"WARNING: this run was noisy{load}: " + "; ".join(figures["warnings"]) +
              ". Its ratios are not to be trusted: run it again on an idle machine.")
    print("Device pair / Pool pair: " + ", ".join(
        f"{_size(n)} {paired_ratio(by[('ascmem Device.malloc', n)], by[('ascmem Pool', n)]):.2f}x"
        for n in SIZES))
    print("paged Pool pair (2 MiB granules, kept mapped: no map call) / Pool pair: " + ", ".join(
        f"{_size(n)} {paired_ratio(by[('ascmem Pool, paged', n)], by[('ascmem Pool', n)]):.2f}x"
        for n in SIZES))

    count = 2000 if args.quick else 100_000
    batch = batch_pairs(count, 3 if args.quick else 15)
    figures["batch_ns_per_pair"] = batch
    print(f"\nalloc_many + free_many of {count:,} mixed sizes: {batch:.1f} ns per pair")
    core = None if args.no_c else c_core(1 if args.quick else 9, peer=not args.quick)
    figures["c_core_ns_per_pair"] = core
    if core:
        print(f"C core (no Python), median ns per pair: steady state {core['steady']:.1f}, "
              f"LIFO {core['lifo']:.1f}; single-threaded pool (no lock) steady "
              f"{core['steady_single_threaded']:.1f}, LIFO {core['lifo_single_threaded']:.1f}; "
              f"the same 100,000-block batch {core['batch']:.1f}")
        print(f"by handle (no lookup by address): steady {core['steady_handle']:.1f}, LIFO "
              f"{core['lifo_handle']:.1f}; single-threaded steady "
              f"{core['steady_handle_single_threaded']:.1f}, LIFO "
              f"{core['lifo_handle_single_threaded']:.1f}")
        print(f"Python batch / C steady = {batch / core['steady']:.2f}x; "
              f"Python batch / C batch = {batch / core['batch']:.2f}x")
        if "offset_steady" in core:
            print(f"OffsetAllocator (C++, same workloads, alternating runs): steady "
                  f"{core['offset_steady']:.1f}, LIFO {core['offset_lifo']:.1f}; ascmem / "
                  f"OffsetAllocator: locked {core['steady'] / core['offset_steady']:.2f}x / "
                  f"{core['lifo'] / core['offset_lifo']:.2f}x, single-threaded "
                  f"{core['steady_single_threaded'] / core['offset_steady']:.2f}x / "
                  f"{core['lifo_single_threaded'] / core['offset_lifo']:.2f}x (steady / LIFO)")
            print(f"by handle / OffsetAllocator: single-threaded "
                  f"{core['steady_handle_single_threaded'] / core['offset_steady']:.2f}x / "
                  f"{core['lifo_handle_single_threaded'] / core['offset_lifo']:.2f}x (steady / LIFO)")
            print(f"OffsetAllocator freeing by offset (its caller keeps offset -> node in a "
                  f"std::unordered_map, as a free-by-address caller must): steady "
                  f"{core['offset_steady_by_offset']:.1f}; ascmem / that: "
                  f"{core['steady'] / core['offset_steady_by_offset']:.2f}x")

    threads = None if args.no_c or args.quick else c_threads(3)
    figures["c_threads_pairs_per_s"] = threads
    if threads:
        print("\nthreads on one allocator, million pairs per second (in all / per thread; "
              "in brackets, the median of same-round quotients to one thread); "
              "producer-consumer: one thread allocates, another frees; line: the round trip "
              "of one cache line between two threads right after (every shared line costs "
              "it, and on a virtual machine it moves with where the host puts the vCPUs)")
        width = max(len(name) for name in threads) + 2
        for name, r in threads.items():
            if name == BESIDE_BATCHES:  # not pairs per second: printed below
                continue
            counts = sorted({int(k.split("_")[1]) for k in r if k.startswith("steady_")})
            cells = [f"{n} thr {r[f'steady_{n}_threads_pairs_per_s'] / 1e6:.2f} / "
                     f"{r[f'steady_{n}_threads_pairs_per_s_per_thread'] / 1e6:.2f}" +
                     (f" ({r[f'steady_{n}_threads_scaling']:.2f}x 1 thr)"
                      if f"steady_{n}_threads_scaling" in r else "") for n in counts]
            line = (f"; line {r['line_round_trip_ns']:.0f} ns"
                    if r.get("line_round_trip_ns") else "")
            print(f"  {name:{width}s}" + "; ".join(cells) +
                  f"; producer-consumer {r['producer_consumer_pairs_per_s'] / 1e6:.2f}" + line)
        beside = threads.get(BESIDE_BATCHES)
        if beside:  # batches hand the lock to a waiting thread every 256 blocks (pool.c)
            print(f"  a thread's 64 B pairs beside another's batches of {beside['batch_blocks']:,.0f} "
                  f"blocks: {beside['single_pairs']:,.0f} pairs, longest wait "
                  f"{beside['longest_wait_us'] / 1e3:.1f} ms ({beside['waits_over_1ms']:.0f} over 1 ms)")

    host = host_buffers(20 if args.quick else 200, 3 if args.quick else 7)
    figures["host_buffer_ns"] = host
    print(f"8 MiB host buffer: pool acquire+release {host['pool'] / 1e3:.2f} us "
          f"({host['numpy'] / host['pool']:.0f}x faster than numpy.empty + touching every page, "
          f"{host['numpy'] / 1e3:.1f} us); with a numpy view on the block "
          f"{host['pool+view'] / 1e3:.2f} us ({host['numpy'] / host['pool+view']:.1f}x)")

    names = ["pool", "buddy", "bestfit", "bestfit-wilderness", "torch-expandable"] + (
        ["tlsf"] if tr.tlsf_available() else [])
    resolution = (1 << 20) if args.quick else 64 * 1024
    print(f"\nefficiency = peak live / smallest arena that replays the trace "
          f"(bisection to {resolution // 1024} KiB; higher is better)")
    widths = [max(10, len(n) + 1) for n in names]
    print(f"{'trace':22s}{'peak live':>12s}" + "".join(f"{n:>{w}s}" for n, w in zip(names, widths)))
    traces = _traces(args.quick)
    figures["efficiency"] = frugality(traces, names, resolution)
    for r in figures["efficiency"]:
        print(f"{r['trace']:22s}{r['peak_live'] / MiB:9.1f} MiB" +
              "".join(f"{r[n]:{w}.3f}" for n, w in zip(names, widths)))
    print("\nphysical efficiency of a paged pool = peak live / peak mapped (granules mapped only "
          "where live bytes are); torch_npu's expandable segments unmapping every free page "
          "at once, the same way")
    print(f"{'trace':22s}{'2 MiB':>10s}{'64 KiB':>10s}{'torch-expandable-eager':>24s}")
    figures["physical_efficiency"] = []
    for t in traces:
        effs = [tr.physical_efficiency(t, g)[0] for g in (2 * MiB, 64 * 1024)]
        eager = expandable_eager_efficiency(t)
        figures["physical_efficiency"].append({"trace": t.name, "2MiB": effs[0], "64KiB": effs[1],
                                               "torch-expandable-eager": eager})
        print(f"{t.name:22s}" + "".join(f"{e:10.3f}" for e in effs) + f"{eager:24.3f}")

    figures["trace_scale"] = trace_scale(args.quick)
    return figures


def trace_scale(quick):
    """The trace-scale row (ascmem.tools.bench_scale): each command on a generated
    trace, in a child process; printed, and its figures returned."""
    from ascmem.tools import bench_scale
    events = 20_000 if quick else 200_000
    formats = ("csv",) if quick else ("csv", "json")
    rows = bench_scale.rows(events, formats)
    cpu, rss = bench_scale.startup()
    print(f"\ntrace scale: commands on a generated serving trace of {rows[0]['events']:,} events, "
          f"each in a child process (benchmarks/trace_scale.py runs it at a million and more); "
          f"a child's start and imports alone take {cpu:.2f} s CPU and {rss / 1e6:.0f} MB")
    print(f"{'format':8s}{'command':16s}{'CPU s':>8s}{'M events/s':>12s}{'peak RSS':>10s}")
    for r in rows:
        print(f"{r['format']:8s}{r['command']:16s}{r['cpu_s']:8.2f}"
              f"{(r['events_per_s'] or 0) / 1e6:12.2f}{r['peak_rss_mb']:7d} MB" +
              ("" if r["exit"] in (0, 1) else f"  (exit {r['exit']})"))
    return {"startup": {"cpu_s": round(cpu, 2), "peak_rss_mb": round(rss / 1e6)},
            "rows": [{k: v for k, v in r.items() if k != "output"} for r in rows]}


def _size(n):
    return f"{n // MiB} MiB" if n >= MiB else (f"{n // 1024} KiB" if n >= 1024 else f"{n} B")


if __name__ == "__main__":
    sys.exit(main())
