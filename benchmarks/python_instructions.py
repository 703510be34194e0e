"""Instructions per alloc + free pair from Python, counted by valgrind
(cachegrind): the floor (NoopPool, built by ascmem.tools.bench.floor_module), Pool
and Device.malloc at each size, and their ratios.  Counts do not depend on the host's
load, so two builds can be compared on a shared machine where the timed ratios of
`ascmem bench` move by a tenth from run to run.  Instructions are not time
(an atomic exchange or a cache miss counts as one): quote both.

    python benchmarks/python_instructions.py [--pairs N] [--in-function]

Each figure is (count with N pairs - count with none) / N, the interpreter's
start-up and the loop's set-up cancelling out.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

SIZES = (64, 4096, 1 << 20, 64 << 20)
LOOPS = {
    "floor": "a.free(a.alloc(n))",
    "pool": "a.free(a.alloc(n))",
    "device": "a.free(a.malloc(n))",
}
MAKE = {
    "floor": "import sys; sys.path.insert(0, {floor_dir!r}); from ascmem_floor import NoopPool; "
             "a = NoopPool()",
    "pool": "import ascmem; a = ascmem.Pool(1 << 30, base=1 << 32)",
    "device": "import ascmem; a = ascmem.Device('atlas-training')",
}
FLOOR_DIR = []


def instructions(peer, size, pairs, in_function=False):
    make = MAKE[peer].format(floor_dir=FLOOR_DIR[0]) if peer == "floor" else MAKE[peer]
    if in_function:  # local variables, as timeit's loop (and most callers) have them
        code = (f"{make}\ndef run(a, n):\n    for _ in range({pairs}):\n"
                f"        {LOOPS[peer]}\nrun(a, {size})\n")
    else:
        code = f"{make}\nn = {size}\nfor _ in range({pairs}):\n    {LOOPS[peer]}\n"
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
    from ascmem.tools.bench import floor_module
    floor = floor_module()
    if floor is None:
        print("the floor needs Cython and a C compiler")
        return 2
    FLOOR_DIR.append(os.path.dirname(floor.__file__))
    print(f"{'size':>10s} {'floor':>8s} {'Pool':>8s} {'Device':>8s} {'Pool/floor':>11s} "
          f"{'Device/Pool':>12s}")
    for size in SIZES:
        per = {peer: (instructions(peer, size, args.pairs, args.in_function) -
                      instructions(peer, size, 0, args.in_function)) / args.pairs
               for peer in LOOPS}
        print(f"{size:>10d} {per['floor']:8.0f} {per['pool']:8.0f} {per['device']:8.0f} "
              f"{per['pool'] / per['floor']:11.3f} {per['device'] / per['pool']:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
