"""Blocks handed out to C callers are marked one by one, and a block's free
unmarks it whichever path frees it (csrc/device.c, ascm_device_hand_out_block):
close() and reset() refuse exactly while a C caller's block is live."""
import random

import pytest

import ascmem
from ascmem import pluggable
from ascmem._core import _handed_out

INDEX = 6


@pytest.fixture
def dev_and_raw():
    dev = ascmem.Device("atlas-a2-training", backend="host", memory=1 << 30)
    pluggable.configure(dev, INDEX)
    try:
        yield dev, pluggable.functions()
    finally:
        pluggable.unconfigure(INDEX)
        dev.close()


def test_a_c_block_freed_by_python_no_longer_blocks_close(dev_and_raw):
    dev, raw = dev_and_raw
    c_block = raw[pluggable.ALLOC](4096, INDEX, None)
    assert _handed_out(dev) == 1
    dev.free(c_block)          # freed through Python: the mark goes with it
    assert _handed_out(dev) == 0
    dev.reset()                # a count per path stayed at 1 and refused this
    dev.check()


def test_the_count_is_the_live_c_blocks_whatever_the_paths(dev_and_raw):
    dev, raw = dev_and_raw
    rng = random.Random(7)
    live = {}  # addr -> allocated by C
    for _ in range(2000):
        if live and rng.random() < 0.5:
            addr = rng.choice(list(live))
            del live[addr]
            if rng.random() < 0.5:
                raw[pluggable.FREE](addr, 0, INDEX, None)
            else:
                dev.free(addr)
        else:
            by_c = rng.random() < 0.5
            n = rng.choice((rng.randrange(1, 40000), rng.randrange(1, 4 << 20)))
            addr = raw[pluggable.ALLOC](n, INDEX, None) if by_c else dev.malloc(n)
            live[addr] = by_c
        assert _handed_out(dev) == sum(live.values())
    assert any(live.values())
    with pytest.raises(ascmem.InUseError):
        dev.close()
    for addr in live:
        dev.free(addr)
    assert _handed_out(dev) == 0
    dev.check()
