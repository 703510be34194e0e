"""Weights shared between two processes with no copy (host backend).

A producer process (a weight-sync job) allocates a block in a shareable,
2 MiB-aligned tag, fills it with a small MLP's weights and exports it to the
consumer's pid only.  The consumer process (a serving job) imports the key,
runs the MLP on the producer's bytes in place, and reports what it saw.  The
producer then updates one weight in place, and the consumer sees the new
value at the same address: one copy of the weights, two processes.

    python examples/ipc_weights.py
"""
import multiprocessing as mp
import os
import time
from typing import Any, Tuple

import numpy as np
import numpy.typing as npt

import ascmem
import ascmem._ipc_host  # noqa: F401  (modules loaded up front: the timings are the calls')
import ascmem.ipc  # noqa: F401

MiB = 1 << 20
D_IN, D_HID, D_OUT = 1024, 4096, 256
SHAPES = [(D_IN, D_HID), (D_HID, D_OUT)]
NBYTES = sum(a * b for a, b in SHAPES) * 4  # float32


def rss_mib() -> Tuple[float, ...]:
    """(private, shared) resident MiB: a copy would show as private memory."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return tuple(int(fields[f].split()[0]) / 1024 for f in ("RssAnon", "RssShmem"))


def weights_on(dev: ascmem.Device, addr: int) -> Tuple[npt.NDArray[Any], ...]:
    """The two weight matrices as arrays on the block's memory (no copy)."""
    flat = dev.as_array(addr, NBYTES // 4, "float32")
    w1 = flat[: D_IN * D_HID].reshape(D_IN, D_HID)
    w2 = flat[D_IN * D_HID:].reshape(D_HID, D_OUT)
    return flat, w1, w2


def consumer(keys: "mp.Queue[str]", answers: "mp.Queue[Any]") -> None:
    """The serving process: its own Device, the producer's memory."""
    answers.put(os.getpid())
    dev = ascmem.Device(backend="host")
    key = keys.get(timeout=60)
    rss_before = rss_mib()
    t0 = time.process_time()
    addr = dev.ipc_import(key)
    import_us = (time.process_time() - t0) * 1e6
    flat, w1, w2 = weights_on(dev, addr)
    x = np.ones((8, D_IN), np.float32)
    y = np.maximum(x @ w1, 0) @ w2                   # runs on the producer's bytes
    rss_after = rss_mib()
    growth = tuple(a - b for a, b in zip(rss_after, rss_before))
    answers.put(("ran", float(y[0, 0]), import_us, growth, float(w2[0, 0])))
    keys.get(timeout=60)                             # the producer updated a weight in place
    answers.put(("updated", float(w2[0, 0])))
    del flat, w1, w2
    dev.ipc_close(key)                               # importers close first
    answers.put(("closed",))
    dev.close()


def main() -> int:
    ctx = mp.get_context("spawn")
    keys: "mp.Queue[str]" = ctx.Queue()
    answers: "mp.Queue[Any]" = ctx.Queue()
    proc = ctx.Process(target=consumer, args=(keys, answers))
    proc.start()
    consumer_pid = answers.get(timeout=60)

    dev = ascmem.Device(backend="host")
    dev.align_tag("weights", 2 * MiB, shareable=True)   # HCCL-style alignment, exportable
    addr = dev.malloc(NBYTES, tag="weights")
    flat, w1, w2 = weights_on(dev, addr)
    rng = np.random.default_rng(0)
    w1[:] = rng.standard_normal(w1.shape, dtype=np.float32) / 32
    w2[:] = rng.standard_normal(w2.shape, dtype=np.float32) / 64
    expect = float((np.maximum(np.ones((8, D_IN), np.float32) @ w1, 0) @ w2)[0, 0])
    t0 = time.process_time()
    key = dev.ipc_export(addr, pids=[consumer_pid])  # only the consumer may import
    export_us = (time.process_time() - t0) * 1e6
    print(f"producer {os.getpid()}: {NBYTES / MiB:.1f} MiB of weights at {addr:#x}, "
          f"aligned to 2 MiB: {addr % (2 * MiB) == 0}")
    print(f"producer: exported to pid {consumer_pid} as {key!r} ({len(key)} chars, "
          f"{export_us:.0f} us CPU)")
    keys.put(key)

    _, y00, import_us, rss_growth, w_seen = answers.get(timeout=60)
    print(f"consumer {consumer_pid}: imported in {import_us:.0f} us CPU; after running on "
          f"{NBYTES / MiB:.1f} MiB of weights its private memory grew {rss_growth[0]:+.1f} MiB, "
          f"the shared pages it maps {rss_growth[1]:+.1f} MiB (the producer's, no copy)")
    print(f"consumer: y[0,0] = {y00:.6f} (producer computes {expect:.6f}: "
          f"{'same' if abs(y00 - expect) < 1e-4 else 'DIFFERENT'})")
    w2[0, 0] = 123.0                                  # an in-place weight update
    keys.put("go")
    _, w_after = answers.get(timeout=60)
    print(f"consumer: w2[0,0] was {w_seen:.4f}, after the producer's update {w_after:.1f}")
    assert answers.get(timeout=60) == ("closed",)
    del flat, w1, w2
    try:
        dev.free(addr)
    except ascmem.AscmemError as e:
        print(f"producer: free before ipc_close -> {type(e).__name__}")
    dev.ipc_close(key)
    dev.free(addr)
    dev.close()
    proc.join(60)
    print(f"done: consumer exit code {proc.exitcode}")
    return proc.exitcode or 0


if __name__ == "__main__":
    raise SystemExit(main())
