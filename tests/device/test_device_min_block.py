"""A Device's unit (issue 42): Device(min_block=...) gives every pool of
every kind that unit, as Pool(min_block=...), those a reset makes included,
so that a plan's unit (ascmem.trace.choose_contiguous_plan, `ascmem plan`)
can be deployed.  A unit that is not a power of two from 512 to 4096 is
refused with a typed error before anything is made (docs/ARCHITECTURE.md,
Note [Contiguous placements])."""
import pytest

import ascmem
from ascmem.errors import ArgumentTypeError, InvalidArgumentError

# 41000 bytes are 41472 after the runtime's padding and rounding: whole
# units of 1, 2 and 4 KiB make 41, 42 and 44 KiB of them
SIZE = 41000
SPAN = {1024: 41 << 10, 2048: 42 << 10, 4096: 44 << 10}


def span(dev, **kw):
    """The distance between two blocks of SIZE allocated in a row."""
    a = dev.malloc(SIZE, ascmem.Policy.NORMAL_ONLY, **kw)
    b = dev.malloc(SIZE, ascmem.Policy.NORMAL_ONLY, **kw)
    dev.check()
    dev.free(b)
    dev.free(a)
    dev.check()
    return b - a


@pytest.mark.parametrize("unit", sorted(SPAN))
def test_the_pools_take_the_unit_and_keep_it_after_a_reset(unit):
    with ascmem.Device("atlas-a2-training", memory=8 << 30, min_block=unit,
                       placement="kept-to-best-fit") as dev:
        assert dev.min_block == unit and dev.placement == "kept-to-best-fit"
        assert span(dev) == SPAN[unit]
        dev.reset()
        assert span(dev) == SPAN[unit]
        assert dev.min_block == unit


def test_the_default_unit_is_4096():
    with ascmem.Device("atlas-a2-training", memory=8 << 30) as dev:
        assert dev.min_block == 4096 and span(dev) == SPAN[4096]


def test_a_paged_device_takes_a_unit_too():
    with ascmem.Device("atlas-a2-training", memory=8 << 30, paged=True, min_block=1024) as dev:
        assert dev.min_block == 1024 and span(dev) == SPAN[1024]


@pytest.mark.parametrize("bad, error", [
    (3000, InvalidArgumentError),   # not a power of two
    (256, InvalidArgumentError),    # below 512
    (8192, InvalidArgumentError),   # above the normal page
    (0, InvalidArgumentError),
    (-1024, InvalidArgumentError),
    ("1024", ArgumentTypeError),
    (1024.0, ArgumentTypeError),
    (True, ArgumentTypeError),
])
def test_a_bad_unit_is_refused(bad, error):
    with pytest.raises(error, match="min_block"):
        ascmem.Device("atlas-a2-training", memory=8 << 30, min_block=bad)
