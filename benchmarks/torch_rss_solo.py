"""Peak and idle RSS of each allocator alone: every workload of
ascmem.torch.bench runs in a fresh process per allocator (torch's CPU
allocator, or ascmem's default Device installed before the model is made),
for --steps steps.  Reported: the process's peak RSS during the steps and
its RSS after them, both above its RSS before the first step.

Why beside the A/B bench: there both allocators share one process, so what
one keeps idle is in the other's baseline.  glibc's malloc keeps torch's
working set in its heap, so torch's steps grow RSS by nearly nothing while
ascmem's steps map on top of that kept heap what they gave back past their
release threshold; the A/B peak then counts memory ascmem gave back
against it.  Alone, each allocator's peak is its own.

    python benchmarks/torch_rss_solo.py [--steps N] [--json] [workload ...]
"""
import argparse
import gc
import json
import subprocess
import sys

MiB = 1 << 20


def child(name, use_ascmem, steps):
    """In the fresh process: (peak, idle) bytes above the RSS before the first step."""
    import torch  # absolute: the real torch
    import ascmem.torch as at
    from ascmem.torch import bench
    torch.set_num_threads(1)  # as the A/B bench: two cores shared
    if use_ascmem:
        at.install()
    step = bench.WORKLOADS[name]()
    gc.collect()
    start = bench._status("VmRSS")
    if not bench._reset_peak():
        raise SystemExit("needs /proc/self/clear_refs to reset the peak")
    for _ in range(steps):
        step()
        gc.collect()
    return bench._status("VmHWM") - start, bench._status("VmRSS") - start


def run(names, steps):
    out = {}
    for name in names:
        row = {}
        for who in ("torch", "ascmem"):
            r = subprocess.run([sys.executable, __file__, "--child", who, "--steps", str(steps), name],
                               capture_output=True, text=True, timeout=900, check=True)
            peak, idle = json.loads(r.stdout.splitlines()[-1])
            row[f"{who}_peak_mib"], row[f"{who}_idle_mib"] = peak / MiB, idle / MiB
        out[name] = row
    return out


def main(argv=None):
    from ascmem.torch import bench
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=["torch", "ascmem"], help=argparse.SUPPRESS)
    p.add_argument("workloads", nargs="*", choices=[[]] + list(bench.WORKLOADS), default=None)
    a = p.parse_args(argv)
    if a.child:
        (name,) = a.workloads
        print(json.dumps(child(name, a.child == "ascmem", a.steps)))
        return 0
    res = run(a.workloads or list(bench.WORKLOADS), a.steps)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{'workload':<18} {'peak torch':>11} {'ascmem':>8} {'idle torch':>11} {'ascmem':>8}")
    for name, r in res.items():
        print(f"{name:<18} {r['torch_peak_mib']:>7.0f} MiB {r['ascmem_peak_mib']:>4.0f} MiB "
              f"{r['torch_idle_mib']:>7.0f} MiB {r['ascmem_idle_mib']:>4.0f} MiB")
    print(f"RSS above the process's before the first of {a.steps} steps; a fresh process per "
          f"allocator and workload")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
