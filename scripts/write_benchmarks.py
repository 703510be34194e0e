"""Writes BENCHMARKS.md: the current figures, from one command.

    python scripts/write_benchmarks.py            (about ten minutes on two cores)
    python scripts/write_benchmarks.py --quick    (a smoke run of the same steps)

It runs `ascmem bench` (speed from Python and C, threads, host buffers,
frugality on every shipped trace) and, where valgrind is installed,
`make -C benchmarks/c instructions` (instructions per pair in C, which do not
depend on the host's load), and writes their output under a header that says
on what machine and how to read it.  Nothing in BENCHMARKS.md is written by
hand: to update it, run this again.  The section "Figures from other
commands" (figures of commands this script does not run) is kept as the file
has it.
"""
import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOW_TO_READ = """\
## How to read it

- **floor**: `NoopPool`, a Cython method pair with `Pool`'s signatures that
  only converts its arguments, built on the spot with `ascmem._core`'s
  directives (it is the benchmark's, not the package's). Nothing called from
  Python can be faster: `1.50x` means a pair costs 1.5 do-nothing call pairs.
  Each ratio is the median, over the repeats, of the two peers' quotient
  within one repeat; peers are measured round-robin, pinned to CPU 0, so a
  slow spell of the host hits every peer alike. Absolute times move by a
  third from run to run on a shared host: compare ratios from one run.
- **tlsfallocator**: the PyPI binding of OffsetAllocator (a TLSF-style offset
  allocator), the peer a user would otherwise pick; ratios below 1 mean
  ascmem is faster. Without it installed (`pip install '.[bench]'`) its rows
  and ratios are absent.
- **C core**: `benchmarks/c/bench_core.c`, built with `-O3 -flto`: steady
  state (10,000 live blocks, each step frees a random one and allocates a new
  one, sizes log-uniform 64 B - 4 MiB) and LIFO (1,000 mixed sizes allocated,
  then freed in reverse), by address and by handle. **OffsetAllocator (C++)**:
  the same workloads against the C++ source of the tlsfallocator sdist, which
  `make -C benchmarks/c peer` downloads with pip (none of it is kept here).
- **threads**: `benchmarks/c/bench_threads.c`: 1, 2 and all CPUs' threads on
  one pool or Device, and a producer-consumer pair; on a 2-core virtual
  machine the second core is shared with the host's other work.
- **efficiency** = peak live bytes / the smallest arena in which the whole
  trace replays without a failure (bisection in 64 KiB steps); 1.0 is the
  limit. `bestfit` is `ascmem.reference.BestFit`, best fit with immediate
  coalescing written plainly. **physical efficiency** of a paged pool = peak
  live / peak mapped bytes at each granule.
- **instructions** (valgrind): exact counts per pair for the C workloads;
  they do not move with the host's load, so two builds can be compared on a
  noisy machine. Instructions are not time: quote both.
"""

OTHER_COMMANDS = """\
## Other benchmarks

```sh
make -C benchmarks/c run                  # the C core alone (locked and single-threaded pool)
make -C benchmarks/c peer                 # the C core against OffsetAllocator, alternating runs
make -C benchmarks/c batch-wait           # a single allocation's wait beside another thread's batches
python benchmarks/cimport_pair.py         # a pair through `cimport` against the Python methods
python benchmarks/python_instructions.py  # instructions per Python pair: floor, Pool, Device (valgrind)
pytest benchmarks/                        # the pytest-benchmark suite
python scripts/frugality_table.py         # frugality on shipped, held-out and given traces
python benchmarks/torch_allocator.py      # torch's CPU allocator against ascmem's (ascmem.torch)
python benchmarks/ipc_share.py            # export, import and close of a 1 GiB block
```
"""


def _machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cc = shutil.which(os.environ.get("CC", "cc"))
    cc_version = (subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
                  .splitlines() or ["?"])[0] if cc else "no C compiler"
    return (f"{os.cpu_count()} CPUs ({model}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, {cc_version}")


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kw)
    if r.returncode:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}")
    return r.stdout.rstrip()


KEPT = "## Figures from other commands"


def _kept_section(path):
    """The section of figures other commands gave, as the file has it: this
    script does not run those commands, so it must not drop their figures."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    if KEPT not in text:
        return ""
    return KEPT + text.split(KEPT, 1)[1].split("\n## How to read it", 1)[0].rstrip("\n") + "\n\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny counts")
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "BENCHMARKS.md"))
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    bench = _run([sys.executable, "-m", "ascmem", "bench"] + (["--quick"] if args.quick else []))
    if shutil.which("valgrind") and shutil.which("make"):
        instructions = _run(["make", "-s", "-C", "benchmarks/c", "instructions"])
    else:
        instructions = "(not measured: needs valgrind and make)"
    load = (f" The host's load average (1 minute) was {load_before:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end; on a busy host every time is longer and "
            "the threads' figures are the first to suffer." if load_before is not None else "")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = f"""# Benchmarks

The current figures, written by one command (except the section "Figures
from other commands", which names its own commands and which it keeps):

```sh
pip install '.[bench]'                  # tlsfallocator, pytest-benchmark, Cython
python scripts/write_benchmarks.py      # runs the two commands below, writes this file
```

which runs `ascmem bench` (the same as `python benchmarks/compare.py`) and
`make -C benchmarks/c instructions`. Run {when}{" (--quick: a smoke run)" if args.quick else ""} on
{_machine()}.{load} Earlier figures and the measurements behind each design choice
are in git history.

## `ascmem bench`

```
{bench}
```

## `make -C benchmarks/c instructions`

```
{instructions}
```

{_kept_section(args.output)}{HOW_TO_READ}
{OTHER_COMMANDS}"""
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
