"""slab_max (Pool, Device): the largest request served from slabs, 0 for
none (docs/ARCHITECTURE.md, Note [Slabs or best fit]), and the plans that
try each placement and unit with slabs and without (issue 42): on
beam_search_shrinking slabs cost what best fit would not, and the plan
without them reaches the best-fit peers, as deployed."""
from pathlib import Path

import pytest

import ascmem
import ascmem.trace as tr
from ascmem.errors import ArgumentTypeError, InvalidArgumentError
from ascmem.reference import bestfit_unmapped_peak

HELDOUT = Path(__file__).resolve().parents[1] / "data" / "heldout"
BASE = 1 << 32


def test_the_default_is_the_largest_slab_class():
    assert ascmem.Pool(1 << 24).slab_max == tr.SLAB_MAX == 32 << 10
    assert ascmem.Pool(1 << 24, slab_max=1 << 40).slab_max == tr.SLAB_MAX
    with ascmem.Device() as d:
        assert d.slab_max == tr.SLAB_MAX
    assert tr.SLAB_MAXES == (tr.SLAB_MAX, 0)


@pytest.mark.parametrize("paged", [False, True])
def test_with_none_a_small_request_takes_a_whole_unit_from_best_fit(paged):
    kw = {"granule": 64 << 10} if paged else {}
    pool = ascmem.Pool(1 << 24, base=BASE, min_block=1024, slab_max=0, **kw)
    a, b = pool.alloc(4), pool.alloc(100)
    assert pool.usable_size(a) == pool.usable_size(b) == 1024
    assert abs(b - a) == 1024  # end to end, as best fit places them
    pool.check()
    pool.free(a)
    pool.free(b)
    assert pool.stats()["used"] == 0
    pool.check()


def test_a_limit_under_the_largest_class_splits_the_paths_there():
    pool = ascmem.Pool(1 << 24, base=BASE, slab_max=2048)
    a, b = pool.alloc(2048), pool.alloc(2049)
    assert pool.usable_size(a) == 2048  # a slab slot
    assert pool.usable_size(b) == 4096  # a unit of best fit
    pool.free(a)
    pool.free(b)
    pool.check()


@pytest.mark.parametrize("bad, error", [(-1, InvalidArgumentError), ("0", ArgumentTypeError),
                                        (1.5, ArgumentTypeError)])
def test_a_bad_slab_max_is_refused_with_a_typed_error(bad, error):
    with pytest.raises(error):
        ascmem.Pool(1 << 24, slab_max=bad)
    with pytest.raises(error):
        ascmem.Device(slab_max=bad)


def test_a_device_gives_it_to_every_pool_and_keeps_it_over_a_reset():
    def stride(d):
        """The distance between two small blocks: a slot's with slabs, a unit's without."""
        a, b = (d.malloc(100, ascmem.Policy.NORMAL_ONLY) for _ in range(2))
        d.free(a)
        d.free(b)
        return abs(b - a)
    with ascmem.Device("atlas-a2-training", backend="host",
                       pool_sizes={"normal": 8 << 20}) as d:
        assert stride(d) < d.min_block
    with ascmem.Device("atlas-a2-training", backend="host", slab_max=0,
                       pool_sizes={"normal": 8 << 20}) as d:
        assert stride(d) == d.min_block
        d.reset()
        assert d.slab_max == 0 and stride(d) == d.min_block
        d.check()


def beam():
    return tr.load(HELDOUT / "beam_search_shrinking.csv.gz")


def test_the_contiguous_plan_without_slabs_reaches_best_fit_end_last():
    """beam_search_shrinking: every placement and unit with slabs needs at
    least 54.7 MiB (0.911); best-fit-end-last in 1 KiB units without slabs
    needs 51.4, where textbook best fit with the wilderness rule needs 51.3
    (0.972).  Deployed as printed, a Pool replays it in that arena and in
    no smaller one."""
    t = beam()
    plan = tr.choose_contiguous_plan(t)
    assert (plan.placement, plan.min_block, plan.slab_max) == ("best-fit-end-last", 1024, 0)
    assert plan.efficiency >= tr.efficiency(t, "bestfit-wilderness")[0] - 0.005
    figures = tr.contiguous_plan_efficiencies(t)
    with_slabs = max(e for (_, _, s), (e, _) in figures.items() if s == tr.SLAB_MAX)
    assert plan.efficiency > with_slabs + 0.05
    pool = tr.contiguous_pool(plan.placement, plan.min_block, plan.slab_max)
    assert tr.fits(t, pool, plan.arena) and not tr.fits(t, pool, plan.arena - (64 << 10))


def test_without_slabs_the_pool_places_as_the_reference_best_fit_in_its_unit():
    """No slabs, best-fit-end-last: the Pool is textbook best fit with the
    wilderness rule, so its arena is the reference's in the same unit."""
    from ascmem.emulations.reference import BestFitWilderness
    t = beam()
    for unit in (4096, 1024):
        ref = BestFitWilderness(1 << 34, granule=unit)
        live = {}
        for is_alloc, ident, size, _kind, _policy in t.rows():
            if is_alloc:
                live[ident] = ref.alloc(size)
            elif ident in live:
                ref.free(live.pop(ident))
        arena = tr.min_capacity(t, tr.contiguous_pool("best-fit-end-last", unit, 0), unit)
        assert arena == ref.high_water


def test_the_paged_plan_without_slabs_maps_what_best_fit_with_unmapping_maps():
    """beam_search_shrinking at 2 MiB: 28 granules under every placement
    and unit with slabs, 26 without, as bf+unmap; a Device deployed with
    the plan takes all three settings."""
    t, g = beam(), 2 << 20
    plan = tr.choose_paged_plan(t, g)
    assert plan.slab_max == 0
    assert plan.peak_mapped == bestfit_unmapped_peak(t, g) == 26 * g
    figures = tr.paged_plan_efficiencies(t, g)
    assert min(m for (_, _, s), (_, m) in figures.items() if s == tr.SLAB_MAX) == 28 * g
    with ascmem.Device("atlas-a3", paged=True, placement=plan.placement,
                       min_block=plan.min_block, slab_max=plan.slab_max) as dev:
        assert (dev.placement, dev.min_block, dev.slab_max) == plan[:2] + (0,)


@pytest.mark.parametrize("slab_max", [None, 0])
def test_a_torch_sleep_takes_every_large_block_whatever_its_size(slab_max):
    """ascmem.torch.sleep's walk (_sleep_handed_out) asks the pool which
    blocks are large: with slabs a 100-byte block is a slot and stays; with
    none it is a large block and sleeps (before, every block of 32 KiB or
    less was taken for a slot and stayed resident)."""
    from ascmem import _core
    with ascmem.Device("atlas-a2-training", backend="host", paged=True, slab_max=slab_max,
                       pool_sizes={"normal": 64 << 20}) as d:
        small = d.malloc(100, ascmem.Policy.NORMAL_ONLY)
        large = d.malloc(40 << 10, ascmem.Policy.NORMAL_ONLY)
        _, saved = _core._sleep_handed_out(d, None)
        assert large in saved
        assert (small in saved) == (slab_max == 0)
        _core._wake_handed_out(d, saved, None)
        d.free(small)
        d.free(large)
        d.check()
