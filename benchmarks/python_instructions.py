"""Instructions per alloc + free pair from Python, counted by valgrind
(cachegrind): the floor (NoopPool), Pool and Device.malloc at each size,
and their ratios; and a second floor, FastcallNoopPool, whose calls skip
Cython's argument parsing as Pool's and Device's do (src/ascmem/_fastcall.pxi),
for reading Pool / floor like for like.  Counts do not depend on the host's
load, so two builds can be compared on a shared machine where the timed ratios of
`ascmem bench` move by a tenth from run to run.  Instructions are not time
(an atomic exchange or a cache miss counts as one): quote both.

    python benchmarks/python_instructions.py [--pairs N] [--in-function]

Each figure is (count with N pairs - count with none) / N, the interpreter's
start-up and the loop's set-up cancelling out.
"""
import argparse
import re
import shutil
import subprocess
import sys

SIZES = (64, 4096, 1 << 20, 64 << 20)
LOOPS = {
    "floor": "a.free(a.alloc(n))",
    "floor2": "a.free(a.alloc(n))",
    "pool": "a.free(a.alloc(n))",
    "device": "a.free(a.malloc(n))",
}
MAKE = {
    "floor": "from ascmem._core import NoopPool; a = NoopPool()",
    "floor2": "from ascmem._core import FastcallNoopPool; a = FastcallNoopPool()",
    "pool": "import ascmem; a = ascmem.Pool(1 << 30, base=1 << 32)",
    "device": "import ascmem; a = ascmem.Device('atlas-training')",
}


def instructions(peer, size, pairs, in_function=False):
    if in_function:  # local variables, as timeit's loop (and most callers) have them
        code = (f"{MAKE[peer]}\ndef run(a, n):\n    for _ in range({pairs}):\n"
                f"        {LOOPS[peer]}\nrun(a, {size})\n")
    else:
        code = f"{MAKE[peer]}\nn = {size}\nfor _ in range({pairs}):\n    {LOOPS[peer]}\n"
    out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                          "--cachegrind-out-file=/dev/null", sys.executable, "-c", code],
                         capture_output=True, text=True, check=True).stderr
    return int(re.search(r"I\s+refs:\s+([\d,]+)", out).group(1).replace(",", ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--in-function", action="store_true",
                    help="loop in a function (local names) instead of at module level")
    args = ap.parse_args(argv)
    if not shutil.which("valgrind"):
        print("needs valgrind")
        return 2
    print(f"{'size':>10s} {'floor':>8s} {'Pool':>8s} {'Device':>8s} {'Pool/floor':>11s} "
          f"{'Device/Pool':>12s} {'floor2':>8s} {'Pool/floor2':>12s}")
    for size in SIZES:
        per = {peer: (instructions(peer, size, args.pairs, args.in_function) -
                      instructions(peer, size, 0, args.in_function)) / args.pairs
               for peer in LOOPS}
        print(f"{size:>10d} {per['floor']:8.0f} {per['pool']:8.0f} {per['device']:8.0f} "
              f"{per['pool'] / per['floor']:11.3f} {per['device'] / per['pool']:12.3f} "
              f"{per['floor2']:8.0f} {per['pool'] / per['floor2']:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
