"""Exporting and importing a 1 GiB block between two processes (host
backend): CPU time of each side's call, and the resident memory of the
importer before and after it maps the block -- no copy, so it does not grow
by the block's size until the importer touches pages (and then by what it
touches: the pages are the exporter's).

    python benchmarks/ipc_share.py [--size-gib 1] [--repeat 5]
"""
import argparse
import subprocess
import sys
import time

import ascmem
import ascmem._ipc_host  # noqa: F401  (module loading is not the calls' cost)

MiB = 1 << 20

IMPORTER = r"""
import os, sys, time, ascmem, ascmem._ipc_host, ascmem.ipc
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
d = ascmem.Device(backend="host")
print(os.getpid(), flush=True)
for line in sys.stdin:
    key = line.strip()
    before = rss()
    t0 = time.process_time()
    addr = d.ipc_import(key)
    import_cpu = time.process_time() - t0
    mapped = rss()
    view = d.buffer(addr, 4096)
    first = view[0]
    view.release()
    t0 = time.process_time()
    d.ipc_close(key)
    close_cpu = time.process_time() - t0
    print(import_cpu, close_cpu, before, mapped, first, flush=True)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    size = int(args.size_gib * (1 << 30))
    dev = ascmem.Device(backend="host", pool_sizes={"huge": size + 64 * MiB})
    dev.align_tag("weights", 2 * MiB, shareable=True)
    t0 = time.process_time()
    addr = dev.malloc(size, tag="weights")
    alloc_cpu = time.process_time() - t0
    page = dev.buffer(addr, 4096)
    page[0] = 42  # one page written: the importer reads it
    page.release()
    child = subprocess.Popen([sys.executable, "-c", IMPORTER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    child_pid = int(child.stdout.readline())
    print(f"block: {size / (1 << 30):.2f} GiB; allocation with its memfd: "
          f"{alloc_cpu * 1e6:.0f} us CPU")
    print("(the first export starts the process's door thread; later ones reuse it)")
    print("export_us  import_us  close_imp_us  close_exp_us  importer_rss_growth_MiB  byte")
    for _ in range(args.repeat):
        t0 = time.process_time()
        key = dev.ipc_export(addr, pids=[child_pid])
        export_cpu = time.process_time() - t0
        child.stdin.write(key + "\n")
        child.stdin.flush()
        imp, close_imp, before, mapped, first = child.stdout.readline().split()
        t0 = time.process_time()
        dev.ipc_close(key)
        close_exp = time.process_time() - t0
        print(f"{export_cpu * 1e6:9.0f}  {float(imp) * 1e6:9.0f}  {float(close_imp) * 1e6:12.0f}  "
              f"{close_exp * 1e6:12.0f}  {(int(mapped) - int(before)) / MiB:23.2f}  {first:>4}")
    child.stdin.close()
    child.wait()
    dev.free(addr)
    dev.close()


if __name__ == "__main__":
    main()
