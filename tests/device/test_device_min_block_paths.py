"""Device(min_block=) beside the Device's other options and paths: a refused
unit takes nothing from the runtime; numpy integers are integers and values
past 64 bits are refused with a typed error; the chunks of a kind that grows
(its first one included, when it starts with none), a paged device with a
release threshold across a reset, thread caches, the media window and a
forked child all keep the unit (tests/device/test_device_min_block.py has
the plain cases)."""
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ascmem
import fake_acl
from ascmem.errors import ArgumentTypeError, InvalidArgumentError
from test_device_min_block import SIZE, SPAN, span

NORMAL = ascmem.Policy.NORMAL_ONLY


@pytest.mark.parametrize("bad, error", [
    (2 ** 64, InvalidArgumentError),
    (2 ** 63, InvalidArgumentError),
    (2 ** 64 + 1024, InvalidArgumentError),  # 1024 modulo 2**64: refused, not wrapped
    (1 << 100, InvalidArgumentError),
    (np.int8(-1), InvalidArgumentError),
    (np.bool_(True), ArgumentTypeError),
    (None, ArgumentTypeError),
])
def test_a_unit_past_the_range_or_of_no_integer_type_is_refused(bad, error):
    with pytest.raises(error, match="min_block"):
        ascmem.Device("atlas-a2-training", memory=8 << 30, min_block=bad)


@pytest.mark.parametrize("unit", [np.int64(1024), np.uint32(2048), np.uint64(512)])
def test_numpy_integers_are_units(unit):
    with ascmem.Device("atlas-a2-training", memory=8 << 30, min_block=unit) as dev:
        assert dev.min_block == int(unit) and type(dev.min_block) is int


def test_a_refused_unit_takes_nothing_from_the_runtime():
    acl = fake_acl.make()
    with pytest.raises(InvalidArgumentError, match="min_block"):
        ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, min_block=3000)
    assert acl.calls == [] and acl.live == {}
    with ascmem.Device("atlas-a2-training", backend="acl", acl_module=acl, min_block=1024) as dev:
        assert dev.min_block == 1024 and span(dev) == SPAN[1024]
    assert acl.live == {}


@pytest.mark.parametrize("unit", sorted(SPAN))
@pytest.mark.parametrize("initial", [0, 2 << 20])
def test_a_chunk_added_later_takes_the_unit(unit, initial):
    """The first chunk nearly full, the two blocks come from the second;
    initial 0: the kind has no chunk until the first request, so both are
    added later."""
    with ascmem.Device("atlas-a2-training", backend="host", memory=8 << 30, min_block=unit,
                       pool_sizes={"normal": (initial, 64 << 20)},
                       placement="kept-to-best-fit") as dev:
        first = dev.malloc((2 << 20) - 40000, NORMAL)
        a, b = dev.malloc(SIZE, NORMAL), dev.malloc(SIZE, NORMAL)
        chunks = dev.chunks("normal")
        assert len(chunks) == 2
        base, size = chunks[-1]
        assert base <= a < b < base + size and b - a == SPAN[unit]
        for x in (a, b, first):
            dev.free(x)
        dev.check()
        assert dev.min_block == unit


def test_a_paged_device_with_a_release_threshold_keeps_the_unit_across_a_reset():
    with ascmem.Device("atlas-a2-training", memory=8 << 30, paged=True, min_block=512,
                       release_threshold=1 << 20, release_threshold_max=4 << 20) as dev:
        assert span(dev) == SPAN[1024] - (1 << 9)  # 41472: whole 512-byte units
        dev.reset()
        assert span(dev) == 41472 and dev.min_block == 512


@pytest.mark.parametrize("unit", [512, 1024])
def test_thread_caches_and_the_media_window_in_a_small_unit_stay_intact(unit):
    rnd = random.Random(unit)
    with ascmem.Device("atlas-a2-training", memory=8 << 30, min_block=unit,
                       thread_caches="on") as dev:
        live, media = [], []
        for _ in range(5000):
            if live and rnd.random() < 0.45:
                dev.free(live.pop(rnd.randrange(len(live))))
            else:
                live.append(dev.malloc(rnd.choice([1, 100, 513, 1000, 3000, 5000, 70000, 1 << 20]),
                                       rnd.choice([0, 1, 2])))
            if rnd.random() < 0.05:
                media.append(dev.dvpp_malloc(rnd.choice([1000, 70000])))
        dev.check()
        for a in live:
            dev.free(a)
        for a in media:
            dev.dvpp_free(a)
        dev.check()
        assert dev.min_block == unit


def test_a_forked_child_keeps_the_unit():
    code = textwrap.dedent(f"""
        import os, ascmem
        dev = ascmem.Device("atlas-a2-training", memory=8 << 30, min_block=1024)
        pid = os.fork()
        if pid == 0:
            a = dev.malloc({SIZE}, ascmem.Policy.NORMAL_ONLY)
            b = dev.malloc({SIZE}, ascmem.Policy.NORMAL_ONLY)
            dev.check()
            os._exit(0 if (b - a, dev.min_block) == ({SPAN[1024]}, 1024) else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"
