"""torch's default CPU allocator against ascmem's, A/B in one process:
the allocator is swapped before every step (install / uninstall), the order
alternating, so machine noise falls on both alike.

    ascmem bench --torch            (also: python benchmarks/torch_allocator.py)

Per workload: the median step time of each and the median of the paired
ratios (ascmem / torch), of wall time and of CPU time (the process's user +
system time: on a machine shared with other work, wall time also counts
the time spent waiting for a core), the median page faults of a step, the
median peak RSS during a step (VmHWM, reset before each step through
/proc/self/clear_refs) and the median RSS after a step, once its tensors
are freed (idle), with no empty_cache() call.

free_1GiB_once: free_1GiB's step run once, in a fresh process for each
allocator (one step, no pairs: its ratio is of the two single steps).  What
an allocator keeps after a large free depends on whether it has seen it
before: glibc's malloc (torch's) gives the first 1 GiB back and keeps it
from then on, ascmem's default Device keeps what it was asked for again
(its adaptive release threshold); free_1GiB shows the repeated case, this
row the first time.
"""

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import time

import torch  # absolute: the real torch

import ascmem.torch as at

MiB = 1 << 20


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _cnn():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1, stride=2), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(m.parameters())
    x, y = torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return step


def _transformer(train):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
    m = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    opt = torch.optim.AdamW(m.parameters())
    x = torch.randn(8, 128, 256)

    def step():
        if train:
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
        else:
            with torch.no_grad():
                m(x)
    return step


def _serving():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    batches = [torch.randn(b, 1024) for b in (1, 3, 8, 17, 32, 64)]

    def step():
        with torch.no_grad():
            for x in batches:
                m(x)
    return step


def _big_tensors():
    """1 GiB of tensors made and freed: what stays resident afterwards."""
    def step():
        xs = [torch.ones(4 << 20) for _ in range(64)]  # 64 x 16 MiB
        del xs
    return step


WORKLOADS = {"cnn_train": _cnn, "transformer_infer": lambda: _transformer(False),
             "transformer_train": lambda: _transformer(True), "mlp_serving": _serving,
             "free_1GiB": _big_tensors}
ONCE = "free_1GiB_once"  # free_1GiB's step once, in a fresh process per allocator


def _one(step, use_ascmem, dev):
    if use_ascmem:
        at.install(dev)
    try:
        gc.collect()
        peaked = _reset_peak()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t, cpu = time.perf_counter(), time.process_time()
        step()
        dt, cpu = time.perf_counter() - t, time.process_time() - cpu
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        gc.collect()
        return dt, _status("VmHWM") if peaked else 0, _status("VmRSS"), cpu, faults
    finally:
        if use_ascmem:
            at.uninstall()


def _setup():
    """The default Device (the shim built and loaded), torch's allocator
    installed again, one thread."""
    dev = at.install()
    at.uninstall()
    torch.set_num_threads(1)  # two cores shared: threads would measure the neighbours
    return dev


def once(use_ascmem):
    """free_1GiB's step once in this process (a fresh one): _one's figures."""
    dev = _setup()
    return _one(_big_tensors(), use_ascmem, dev)


def _once_row():
    """free_1GiB_once: once() in a fresh process for each allocator."""
    got = {}
    for use in (False, True):
        r = subprocess.run([sys.executable, "-m", "ascmem.torch.bench", "--once-child",
                            "ascmem" if use else "torch"],
                           capture_output=True, text=True, timeout=600, check=True)
        got[use] = json.loads(r.stdout.splitlines()[-1])
    t, a = got[False], got[True]
    return {"torch_ms": t[0] * 1e3, "ascmem_ms": a[0] * 1e3, "paired_ratio": a[0] / t[0],
            "paired_cpu_ratio": a[3] / max(t[3], 1e-9), "torch_faults": t[4], "ascmem_faults": a[4],
            "torch_peak_rss_mib": t[1] / MiB, "ascmem_peak_rss_mib": a[1] / MiB,
            "torch_idle_rss_mib": t[2] / MiB, "ascmem_idle_rss_mib": a[2] / MiB}


def run(steps=20, warmup=2, names=None):
    dev = _setup()
    out = {}
    for name in names or list(WORKLOADS) + [ONCE]:
        if name == ONCE:
            out[name] = _once_row()
            continue
        # the model and its inputs are made with torch's allocator, for both
        step = WORKLOADS[name]()
        for i in range(warmup):
            _one(step, False, dev)
            _one(step, True, dev)
        rows = {False: [], True: []}
        for i in range(steps):
            for use in ((False, True) if i % 2 == 0 else (True, False)):
                rows[use].append(_one(step, use, dev))
        med = {use: [statistics.median(r[k] for r in rows[use]) for k in range(5)] for use in rows}
        ratio = statistics.median(a[0] / t[0] for t, a in zip(rows[False], rows[True]))
        cpu_ratio = statistics.median(a[3] / max(t[3], 1e-9) for t, a in zip(rows[False], rows[True]))
        out[name] = {"torch_ms": med[False][0] * 1e3, "ascmem_ms": med[True][0] * 1e3,
                     "paired_ratio": ratio, "paired_cpu_ratio": cpu_ratio,
                     "torch_faults": med[False][4], "ascmem_faults": med[True][4],
                     "torch_peak_rss_mib": med[False][1] / MiB, "ascmem_peak_rss_mib": med[True][1] / MiB,
                     "torch_idle_rss_mib": med[False][2] / MiB, "ascmem_idle_rss_mib": med[True][2] / MiB}
        del step
    return out


def table(res):
    lines = [f"{'workload':<18} {'torch ms':>9} {'ascmem ms':>10} {'ratio':>6} {'cpu':>6} "
             f"{'faults torch':>13} {'ascmem':>7} "
             f"{'peak RSS torch':>15} {'ascmem':>8} {'idle RSS torch':>15} {'ascmem':>8}"]
    for name, r in res.items():
        lines.append(f"{name:<18} {r['torch_ms']:>9.2f} {r['ascmem_ms']:>10.2f} {r['paired_ratio']:>6.3f} "
                     f"{r['paired_cpu_ratio']:>6.3f} {r['torch_faults']:>13.0f} {r['ascmem_faults']:>7.0f} "
                     f"{r['torch_peak_rss_mib']:>11.0f} MiB {r['ascmem_peak_rss_mib']:>4.0f} MiB "
                     f"{r['torch_idle_rss_mib']:>11.0f} MiB {r['ascmem_idle_rss_mib']:>4.0f} MiB")
    lines.append("ratio, cpu: median over paired steps of ascmem's wall time / torch's and of its CPU "
                 "time / torch's (below 1: ascmem faster); faults: page faults per step (a huge page "
                 "is one); RSS: the whole process's; free_1GiB_once: one step in a fresh process "
                 "for each, no pairs")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="3 steps: a smoke run")
    p.add_argument("--json", action="store_true")
    p.add_argument("--once-child", choices=["torch", "ascmem"], help=argparse.SUPPRESS)
    p.add_argument("workloads", nargs="*", choices=[[]] + list(WORKLOADS) + [ONCE], default=None)
    a = p.parse_args(argv)
    if a.once_child:  # a fresh process for free_1GiB_once
        print(json.dumps(once(a.once_child == "ascmem")))
        return 0
    res = run(3 if a.quick else a.steps, 1 if a.quick else 2, a.workloads or None)
    print(json.dumps(res, indent=1) if a.json else table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
