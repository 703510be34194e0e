"""A short run through every layer, for valgrind memcheck (CI):
    PYTHONMALLOC=malloc valgrind --error-exitcode=1 python scripts/smoke.py"""
import os

import numpy as np

import ascmem
from ascmem import trace as tr

pool = ascmem.Pool(64 << 20, base=1 << 32, page_size=2 << 20)
addrs = pool.alloc_many(np.random.default_rng(0).integers(1, 100_000, size=500))
for a in addrs[::2]:
    pool.free(int(a))
for bad in (int(addrs[0]), 12345, int(addrs[1]) + 64):
    try:
        pool.free(bad)
    except ascmem.InvalidFreeError:
        pass
pool.free_many(addrs[1::2])
pool.trim()
pool.check()

buddy = ascmem.BuddyAllocator(12 << 20, base=1 << 32)
b = [buddy.alloc(n) for n in (1, 5000, 3 << 20, 100)]
for a in b:
    buddy.free(a)
buddy.check()

dev = ascmem.Device("atlas-inference")
f = dev.dvpp_malloc(3_110_400)
dev.as_model_input(f, 3_110_400)
w = dev.malloc(5 << 20, ascmem.Policy.HUGE_ONLY)
dev.free(f and w)
dev.dvpp_free(f, stream="s")
dev.synchronize()
dev.reset()
dev.check()

here = os.path.dirname(ascmem.__file__)
t = tr.load(os.path.join(here, "examples", "batch_inference.csv.gz"))
tr.replay(t, ascmem.Device("atlas-training"))
print("smoke ok")
