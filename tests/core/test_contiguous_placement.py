"""A contiguous Pool's placement choice (issue 42, item 1): where a large
request of the last large block freed's size goes.  "kept-in-place" (the
default) reuses that kept block in place unless a smaller hole just below it
would be stranded; "kept-to-best-fit" never reuses it in place;
"lowest-equal" reuses it unless a free block of its size lies lower, which
the request takes; "best-fit-end-last" never reuses it in place and takes
the free end of the range last for every request (the wilderness rule).  ascmem.trace.choose_contiguous_placement keeps whichever
replays a recorded run in the smallest arena, choose_contiguous_plan the
placement and unit (min_block) that do (docs/ARCHITECTURE.md, Note
[Contiguous placements])."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ascmem
import ascmem.trace as tr
from ascmem.errors import InvalidArgumentError

M = 1 << 20
BASE = 1 << 30

# (sizes allocated in a row, indexes freed in this order: the last is the
# kept block) -> where a request of 1 MiB lands, in MiB from the base, under
# each placement.  The C test contiguous_placements has the same three.
LAYOUTS = {
    # a free block of the kept block's size lies lower
    "equal below": (([M] * 4, [0, 2]),
                    {"kept-in-place": 2, "kept-to-best-fit": 0, "lowest-equal": 0,
                     "best-fit-end-last": 0}),
    # a larger free block lies lower and the kept block's upper neighbour is
    # free: merged with it, the kept block is no longer the best fit
    "free above": (([M * 5 // 4] + [M] * 4, [0, 3, 2]),
                   {"kept-in-place": 2.25, "kept-to-best-fit": 0, "lowest-equal": 2.25,
                    "best-fit-end-last": 0}),
    # a hole of half its size lies just below: the default moves it down
    "hole below": (([M, M // 2, M, M], [1, 2]),
                   {"kept-in-place": 1, "kept-to-best-fit": 1, "lowest-equal": 1.5,
                    "best-fit-end-last": 1}),
}


def place_after_kept(placement, sizes, frees):
    pool = ascmem.Pool(64 << 20, base=BASE, placement=placement)
    addrs = [pool.alloc(s) for s in sizes]
    for i in frees:
        pool.free(addrs[i])
    got = pool.alloc(M)
    pool.check()
    assert pool.placement == placement
    return (got - BASE) / M


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_placement_does_what_it_says(layout):
    (sizes, frees), want = LAYOUTS[layout]
    got = {p: place_after_kept(p, sizes, frees) for p in tr.CONTIGUOUS_PLACEMENTS}
    assert got == want


def test_only_best_fit_end_last_takes_the_end_last():
    """3, 1 and 3 MiB from 0 in an 8 MiB pool, the first freed: the free end
    (1 MiB at 7 MiB) is best fit's choice for 0.5 MiB and the default's (an
    end under six times the request is not spared, Note [Sparing the end]);
    the wilderness rule takes the 3 MiB hole at 0 first.  The C test
    contiguous_placements has the same layout."""
    got = {}
    for p in tr.CONTIGUOUS_PLACEMENTS:
        pool = ascmem.Pool(8 << 20, base=BASE, placement=p)
        first = pool.alloc(3 * M)
        pool.alloc(M)
        pool.alloc(3 * M)
        pool.free(first)
        got[p] = (pool.alloc(M // 2) - BASE) / M
        pool.check()
    assert got == {"kept-in-place": 7, "kept-to-best-fit": 7, "lowest-equal": 7,
                   "best-fit-end-last": 0}


def test_the_default_is_kept_in_place_and_survives_a_reset():
    assert ascmem.Pool(64 << 20).placement == "kept-in-place"
    pool = ascmem.Pool(64 << 20, base=BASE, placement="kept-to-best-fit")
    pool.reset()
    (sizes, frees), want = LAYOUTS["equal below"]
    addrs = [pool.alloc(s) for s in sizes]
    for i in frees:
        pool.free(addrs[i])
    assert (pool.alloc(M) - BASE) / M == want["kept-to-best-fit"]
    pool.check()


@pytest.mark.parametrize("kwargs", [
    {"placement": "granules"},  # a paged pool's, on a contiguous one
    {"placement": "packed"},
    {"granule": 64 << 10, "placement": "kept-to-best-fit"},  # a contiguous pool's, on a paged one
    {"granule": 64 << 10, "placement": "lowest-equal"},
    {"granule": 64 << 10, "placement": "kept-in-place"},
    {"placement": "best-fit"},
    {"placement": 3},
    {"placement": b"lowest-equal"},
])
def test_a_placement_of_the_other_kind_or_none_is_refused(kwargs):
    with pytest.raises(InvalidArgumentError, match="placement"):
        ascmem.Pool(64 << 20, **kwargs)


def test_a_contiguous_device_takes_a_contiguous_placement_only():
    # named before a Device that is not paged took the contiguous placements,
    # as docs/RELIABILITY.md cites it (notes/wiring.md: to be renamed
    # test_a_contiguous_device_takes_a_contiguous_placement_only); it takes
    # them for every pool it has (tests/device/test_device_placement.py) and
    # refuses a paged one
    with ascmem.Device(memory=1 << 30, placement="kept-to-best-fit") as d:
        assert d.placement == "kept-to-best-fit"
    with pytest.raises(InvalidArgumentError, match="paged"):
        ascmem.Device(memory=1 << 30, placement="packed")


@pytest.mark.parametrize("name, figure", [
    ("speech_to_text", 0.802), ("resnet50_multires", 1.000), ("vit_train", 0.980),
    ("decoder_kvcache", 0.890), ("seq2seq_generate", 0.697),
])
def test_the_default_places_as_before(name, figure):
    """The default's figures on shipped traces are those of the Pool before
    placements existed (notes/pool.md's table, 64 KiB bisection)."""
    eff, cap = tr.efficiency(tr.example(name), "pool")
    assert round(eff, 3) == figure
    assert tr.contiguous_placement_efficiencies(tr.example(name))["kept-in-place"] == (eff, cap)


def test_choose_contiguous_placement_keeps_the_smallest_arena():
    # speech_to_text: never reusing the kept block in place needs 7% less
    placement, eff, cap = tr.choose_contiguous_placement(tr.example("speech_to_text"))
    assert placement == "kept-to-best-fit" and round(eff, 3) == 0.861
    # vit_train: the lower equal block
    assert tr.choose_contiguous_placement(tr.example("vit_train"))[0] == "lowest-equal"
    # a multi-resolution CNN whose layout repeats: the default
    assert tr.choose_contiguous_placement(tr.example("resnet50_multires"))[0] == "kept-in-place"


def test_a_tie_keeps_the_default():
    whole = tr.Trace([tr.Event("a", 0, 4 * M)], name="whole")
    figures = tr.contiguous_placement_efficiencies(whole)
    assert len({c for _, c in figures.values()}) == 1
    assert tr.choose_contiguous_placement(whole)[0] == "kept-in-place"
    plans = tr.contiguous_plan_efficiencies(whole)
    assert len({c for _, c in plans.values()}) == 1
    assert tr.choose_contiguous_plan(whole)[:2] == ("kept-in-place", 4096)


HELDOUT = Path(__file__).resolve().parents[1] / "data" / "heldout"


@pytest.mark.parametrize("name, plan", [
    # its 4 KiB unit was the gap: best fit in 4 KiB units reads 0.790 too
    ("conformer_ctc", ("kept-to-best-fit", 1024, 0.808)),
    # best fit's choice in 2 KiB units; no placement reached it in 4 KiB (0.922)
    ("speculative_decoding", ("kept-to-best-fit", 2048, 0.948)),
])
def test_the_plan_chooses_the_unit_too(name, plan):
    """On the two traces no placement in 4 KiB units brought within 0.005
    of best fit, the plan's unit does; the plan is deployable as it says:
    a Pool made with its placement and unit replays the run in its arena
    and in no smaller one."""
    t = tr.load(HELDOUT / f"{name}.csv.gz")
    got = tr.choose_contiguous_plan(t)
    assert (got.placement, got.min_block, round(got.efficiency, 3)) == plan
    assert got.efficiency > tr.choose_contiguous_placement(t)[1] + 0.015
    assert got.arena == tr.min_capacity(t, tr.contiguous_pool(got.placement, got.min_block))
    assert tr.fits(t, tr.contiguous_pool(got.placement, got.min_block), got.arena)
    assert not tr.fits(t, tr.contiguous_pool(got.placement, got.min_block), got.arena - (64 << 10))


def test_the_plan_tries_every_placement_in_every_unit_the_default_first():
    figures = tr.contiguous_plan_efficiencies(tr.example("vit_train"))
    assert list(figures) == [(p, u, s) for s in tr.SLAB_MAXES for u in tr.CONTIGUOUS_UNITS
                             for p in tr.CONTIGUOUS_PLACEMENTS]
    assert tr.CONTIGUOUS_UNITS[0] == 4096 and tr.SLAB_MAXES == (tr.SLAB_MAX, 0)
    assert {p: figures[(p, 4096, tr.SLAB_MAX)] for p in tr.CONTIGUOUS_PLACEMENTS} == \
        tr.contiguous_placement_efficiencies(tr.example("vit_train"))
    assert {p: figures[(p, 1024, 0)] for p in tr.CONTIGUOUS_PLACEMENTS} == \
        tr.contiguous_placement_efficiencies(tr.example("vit_train"), min_block=1024, slab_max=0)
    # the lower equal block in 4 KiB units stays vit_train's plan
    assert tr.choose_contiguous_plan(tr.example("vit_train"))[:2] == ("lowest-equal", 4096)


def test_a_pool_in_a_smaller_unit_places_in_it():
    for unit in tr.CONTIGUOUS_UNITS:
        pool = ascmem.Pool(64 << 20, base=BASE, min_block=unit, placement="kept-to-best-fit")
        a, b = pool.alloc(40 << 10 | 1), pool.alloc(40 << 10 | 1)
        assert b - a == (40 << 10) + unit
        pool.check()


def test_fit_names_the_placement_with_the_smallest_arena():
    r = subprocess.run([sys.executable, "-m", "ascmem", "fit", "--example", "speech_to_text",
                        "--allocator", "pool", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    (pool,) = json.loads(r.stdout)["allocators"]
    assert pool["placement"] == "kept-to-best-fit"
    assert list(pool["placements"]) == list(tr.CONTIGUOUS_PLACEMENTS)
    assert pool["placements"]["kept-in-place"]["min_capacity"] == pool["min_capacity"]
    assert pool["placements"]["kept-to-best-fit"]["efficiency"] > pool["efficiency"]
    r = subprocess.run([sys.executable, "-m", "ascmem", "fit", "--example", "speech_to_text",
                        "--allocator", "pool"], capture_output=True, text=True, timeout=300)
    assert "smallest arena here: kept-to-best-fit" in r.stdout


def test_fit_names_the_placement_and_unit_to_deploy():
    path = str(HELDOUT / "speculative_decoding.csv.gz")
    r = subprocess.run([sys.executable, "-m", "ascmem", "fit", path, "--allocator", "pool",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (pool,) = json.loads(r.stdout)["allocators"]
    assert (pool["plan"]["placement"], pool["plan"]["min_block"]) == ("kept-to-best-fit", 2048)
    assert [(p["placement"], p["min_block"], p["slab_max"]) for p in pool["plans"]] == [
        (p, u, s) for s in tr.SLAB_MAXES for u in tr.CONTIGUOUS_UNITS
        for p in tr.CONTIGUOUS_PLACEMENTS]
    assert pool["plan"]["min_capacity"] == min(p["min_capacity"] for p in pool["plans"])
    assert pool["plan"]["efficiency"] > pool["efficiency"]  # the default's, the pool's row
    r = subprocess.run([sys.executable, "-m", "ascmem", "fit", path, "--allocator", "pool"],
                       capture_output=True, text=True, timeout=300)
    assert "deploy with placement='kept-to-best-fit', min_block=2048, slab_max=32768" in r.stdout


@pytest.mark.parametrize("placement", tr.CONTIGUOUS_PLACEMENTS)
def test_random_work_leaves_every_placement_intact(placement):
    """Allocations and frees of mixed sizes, many of one repeated size (the
    kept block's reuse and its alternatives), with check() throughout:
    blocks never overlap and the pool's books balance."""
    import random
    rng = random.Random(42)
    pool = ascmem.Pool(256 << 20, base=BASE, placement=placement)
    live = {}
    for step in range(4000):
        if live and (rng.random() < 0.5 or len(live) > 200):
            addr = rng.choice(list(live))
            pool.free(addr)
            del live[addr]
        else:
            size = rng.choice([M, M, 3 * M // 2, 64 << 10, rng.randrange(1, 4 * M)])
            try:
                addr = pool.alloc(size)
            except ascmem.OutOfMemoryError:
                continue
            assert all(addr + size <= a or a + s <= addr for a, s in live.items())
            live[addr] = size
        if step % 500 == 0:
            pool.check()
    for addr in live:
        pool.free(addr)
    pool.check()
    assert pool.stats()["used"] == 0
