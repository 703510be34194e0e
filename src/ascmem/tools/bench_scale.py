"""The trace-scale benchmark (issue 44): a large trace of a serving-like
workload, generated, written as a PyTorch profiler Chrome trace (JSON) or
an ascmem CSV, and `ascmem replay`, `fit` and `plan` run on it, each in a
child process, measuring CPU seconds, events per second and peak memory
(the child's maximum resident set size).  `ascmem bench` runs it small;
benchmarks/trace_scale.py at a million events or more.

The workload: a few long-lived blocks (weights, a KV cache), and per step
activations of many sizes freed mostly in reverse order, with a share that
outlives a few steps.  Seeded: the same events every run.
"""

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

COMMANDS = {
    "replay": ["replay", "--allocator", "pool"],
    "replay-device": ["replay"],                      # through a Device, as by default
    "fit": ["fit", "--allocator", "pool", "--paged"],
    "fit-all": ["fit"],                               # every allocator and peer
    "plan": ["plan"],
}


def workload(n_events, seed=7):
    """(is_alloc, id, size) arrays of n_events events, every free after its
    allocation, everything freed by the end."""
    rng = np.random.default_rng(seed)
    n_allocs = n_events // 2
    sizes = np.where(rng.random(n_allocs) < 0.7,
                     rng.integers(1, 64, n_allocs) * 512,                 # small activations
                     rng.integers(1, 256, n_allocs) * 65536).astype(np.int64)  # large ones
    sizes[:8] = 256 << 20  # long-lived: weights and a cache
    ops, ids = [], []
    live = []
    nid = 0
    # a stack of live blocks: each step pushes a few and pops a few, keeping it bounded
    for step in range(n_allocs):
        ops.append(1)
        ids.append(nid)
        live.append(nid)
        nid += 1
        if len(live) > 8 + 48 or (len(live) > 8 and rng.random() < 0.45):
            k = len(live) - 1 if rng.random() < 0.8 else int(rng.integers(8, len(live)))
            ops.append(0)
            ids.append(live.pop(k))
    for ident in reversed(live):
        ops.append(0)
        ids.append(ident)
    ops = np.array(ops, np.uint8)
    ids = np.array(ids, np.int64)
    return ops, ids, sizes[ids]


def write_csv(path, ops, ids, sizes):
    with open(path, "w") as f:
        f.write("op,id,size\n")
        for lo in range(0, len(ops), 1 << 16):
            hi = lo + (1 << 16)
            f.write("".join(f"a,{i},{s}\n" if o else f"f,{i},\n" for o, i, s in
                            zip(ops[lo:hi].tolist(), ids[lo:hi].tolist(),
                                sizes[lo:hi].tolist())))


def write_chrome(path, ops, ids, sizes):
    """The profiler's Chrome trace: [memory] instant events (Addr, Bytes
    signed), an operator event before every fourth one, as the profiler
    interleaves them."""
    addr = 0x7F0000000000 + ids * 4096 * 1024  # a distinct address per block
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "traceEvents": [\n')
        ts = 1700000000000.0
        first = True
        for lo in range(0, len(ops), 1 << 16):
            hi = lo + (1 << 16)
            out = []
            for k, (o, a, s) in enumerate(zip(ops[lo:hi].tolist(), addr[lo:hi].tolist(),
                                              sizes[lo:hi].tolist())):
                ts += 1.5
                if k % 4 == 0:
                    out.append('{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, '
                               f'"tid": 1, "ts": {ts:.3f}, "dur": 1.2, "args": '
                               '{"External id": 1, "Record function id": 0, "Ev Idx": 0}}')
                out.append('{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",'
                           f' "pid": 1, "tid": 1, "ts": {ts:.3f}, "args": {{"Total Reserved": 0,'
                           f' "Total Allocated": 0, "Bytes": {s if o else -s}, "Addr": {a},'
                           ' "Device Id": 0, "Device Type": 20}}')
            f.write(("" if first else ",\n") + ",\n".join(out))
            first = False
        f.write("\n]}\n")


def run(command, path, extra=()):
    """(CPU seconds, peak RSS bytes, wall seconds, exit code, output) of one
    command in a child process (os.wait4: that child's own usage)."""
    return _child([sys.executable, "-m", "ascmem", *command, str(path), *extra, "--quiet"])


def startup():
    """(CPU seconds, peak RSS bytes) of a child that only starts and imports
    the command line: what every row's figures include besides the work."""
    cpu, rss, _, _, _ = _child([sys.executable, "-c", "import ascmem.tools.cli, ascmem.trace"])
    return cpu, rss


def _child(argv):
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    wall = time.perf_counter() - t0
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, wall, child.returncode, text


def rows(n_events, formats=("csv",), commands=tuple(COMMANDS), directory=None):
    """One figure dict per format and command: format, command, events,
    bytes (of the trace file), cpu_s, wall_s, events_per_s (per CPU
    second), peak_rss_mb, exit, and output (the child's last lines).  The
    traces are written to directory (default: a temporary one, removed)."""
    with tempfile.TemporaryDirectory(prefix="ascmem-scale-") as tmp:
        out = directory or tmp
        ops, ids, sizes = workload(n_events)
        n = len(ops)
        results = []
        for fmt in formats:
            path = os.path.join(out, f"scale_{n}.{'json' if fmt == 'json' else 'csv'}")
            if not os.path.exists(path):
                (write_chrome if fmt == "json" else write_csv)(path, ops, ids, sizes)
            for name in commands:
                cpu, rss, wall, code, text = run(COMMANDS[name], path)
                results.append({"format": fmt, "command": name, "events": n,
                                "bytes": os.path.getsize(path), "cpu_s": round(cpu, 2),
                                "wall_s": round(wall, 2),
                                "events_per_s": round(n / cpu) if cpu else None,
                                "peak_rss_mb": round(rss / 1e6), "exit": code,
                                "output": text[-2000:]})
        return results
