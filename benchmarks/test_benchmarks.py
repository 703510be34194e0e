"""pytest-benchmark suite: pytest benchmarks/ (CI runs it once per case with
--benchmark-disable, only to keep it from rotting).  The side-by-side
comparison with ratios is benchmarks/compare.py."""
import os

import numpy as np
import pytest

import ascmem
from ascmem import trace as tr
from ascmem.tools.bench import floor_module

MiB = 1 << 20
SIZES = [64, 256, 4096, 32 * 1024, MiB, 64 * MiB]
EXAMPLES = os.path.join(os.path.dirname(ascmem.__file__), "examples")


@pytest.fixture(scope="module")
def pool():
    return ascmem.Pool(1 << 30, base=1 << 32)


@pytest.mark.parametrize("size", SIZES)
def test_pool_pair(benchmark, pool, size):
    benchmark(lambda: pool.free(pool.alloc(size)))


@pytest.mark.parametrize("size", SIZES)
def test_buddy_pair(benchmark, size):
    b = ascmem.BuddyAllocator(1 << 30, base=1 << 32)
    benchmark(lambda: b.free(b.alloc(size)))


def test_floor_pair(benchmark):
    floor = floor_module()
    if floor is None:
        pytest.skip("the floor needs Cython and a C compiler")
    f = floor.NoopPool()
    benchmark(lambda: f.free(f.alloc(64)))


@pytest.mark.parametrize("size", [100, 4 * MiB])
def test_device_pair(benchmark, size):
    d = ascmem.Device("atlas-training")
    benchmark(lambda: d.free(d.malloc(size)))


def test_dvpp_pair(benchmark):
    d = ascmem.Device("atlas-inference")
    benchmark(lambda: d.dvpp_free(d.dvpp_malloc(3_110_400)))


@pytest.mark.skipif(not tr.tlsf_available(), reason="tlsfallocator not installed")
@pytest.mark.parametrize("size", [64, MiB])
def test_tlsf_pair(benchmark, size):
    import TLSFAllocator
    t = TLSFAllocator.OffsetAllocator(1 << 30, 1 << 17)
    benchmark(lambda: t.free(t.allocate(size)))


def test_batch_100k(benchmark):
    rng = np.random.default_rng(1)
    sizes = np.exp(rng.uniform(np.log(64), np.log(4 * MiB), size=100_000)).astype(np.uint64)
    p = ascmem.Pool(64 << 30, base=1 << 40)
    benchmark(lambda: p.free_many(p.alloc_many(sizes)))


@pytest.mark.parametrize("name", ["video_pipeline", "batch_inference", "many_small"])
def test_replay_example_on_device(benchmark, name):
    t = tr.load(os.path.join(EXAMPLES, f"{name}.csv.gz"))
    model = "atlas-inference" if name == "video_pipeline" else "atlas-training"
    d = ascmem.Device(model)
    report = benchmark(lambda: tr.replay(t, d))
    assert report["failures"] == 0


def test_host_buffer_from_pool(benchmark):
    d = ascmem.Device("atlas-inference", backend="host")
    n = 8 * MiB

    benchmark(lambda: d.free_host(d.malloc_host(n)))


def test_host_buffer_numpy_empty(benchmark):
    def run():
        a = np.empty(8 * MiB, dtype=np.uint8)
        a[::4096] = 1
    benchmark(run)
