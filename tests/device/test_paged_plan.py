"""A paged pool's plan from a recorded run (issue 42, item 2): the placement
("granules", "packed" or "best-fit") and the unit (min_block 4096, 2048 or
1024, ascmem.trace.PAGED_UNITS) that map the fewest bytes at the peak, the
default on a tie -- as the contiguous plan chooses its unit
(docs/ARCHITECTURE.md, Note [Best-fit placement]).  The plan is deployable
as it says: a Pool or a paged Device made with its placement and unit maps
what it reports."""
import json
import subprocess
import sys
from pathlib import Path

import ascmem
import ascmem.trace as tr

HELDOUT = Path(__file__).resolve().parents[1] / "data" / "heldout"
M = 1 << 20


def test_the_plan_tries_every_placement_in_every_unit_the_default_first():
    figures = tr.paged_plan_efficiencies(tr.example("decoder_kvcache"), 64 << 10)
    assert list(figures) == [(p, u, s) for s in tr.SLAB_MAXES for u in tr.PAGED_UNITS
                             for p in tr.PLACEMENTS]
    assert tr.PAGED_UNITS[0] == 4096
    assert {p: figures[(p, 4096, tr.SLAB_MAX)] for p in tr.PLACEMENTS} == \
        tr.placement_efficiencies(tr.example("decoder_kvcache"), 64 << 10)
    assert {p: figures[(p, 2048, 0)] for p in tr.PLACEMENTS} == \
        tr.placement_efficiencies(tr.example("decoder_kvcache"), 64 << 10, min_block=2048,
                                  slab_max=0)


def test_a_unit_over_the_granule_is_not_tried():
    figures = tr.paged_plan_efficiencies(tr.example("decoder_kvcache"), 2048)
    assert {u for _, u, _ in figures} == {2048, 1024}


def test_the_unit_closes_the_gap_to_best_fit_with_unmapping():
    """ssm_chunked_scan at 2 MiB: every placement in 4 KiB units maps a
    granule more than the reference best fit (165 against 164); best-fit in
    1 KiB units maps its 164."""
    t = tr.load(HELDOUT / "ssm_chunked_scan.csv.gz")
    four_k = tr.choose_placement(t)
    plan = tr.choose_paged_plan(t)
    assert (plan.placement, plan.min_block) == ("best-fit", 1024)
    assert plan.peak_mapped == four_k[2] - (2 << 20)
    assert plan.peak_mapped == 164 * (2 << 20)


def test_the_plan_is_deployable_as_it_says():
    t = tr.example("vit_train")
    plan = tr.choose_paged_plan(t)
    pool = ascmem.Pool(64 << 30, base=1 << 44, granule=2 << 20, release_threshold=0,
                       placement=plan.placement, min_block=plan.min_block, slab_max=plan.slab_max)
    assert tr.replay(t, pool)["peak_mapped"] == plan.peak_mapped
    pool.check()
    with ascmem.Device("atlas-a3", paged=True, placement=plan.placement,
                       min_block=plan.min_block, slab_max=plan.slab_max) as dev:
        assert (dev.placement, dev.min_block, dev.slab_max) == (
            plan.placement, plan.min_block, plan.slab_max)


def test_a_tie_keeps_the_default():
    whole = tr.Trace([tr.Event("a", 0, 4 * M)], name="whole")
    assert len({m for _, m in tr.paged_plan_efficiencies(whole).values()}) == 1
    assert tr.choose_paged_plan(whole)[:2] == ("granules", 4096)


def test_fit_names_the_paged_placement_and_unit_to_deploy():
    cmd = [sys.executable, "-m", "ascmem", "fit", "--example", "decoder_kvcache",
           "--allocator", "bestfit", "--granule", "64KiB"]
    doc = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True,
                                    check=True).stdout)
    (paged,) = doc["paged"]
    want = tr.choose_paged_plan(tr.example("decoder_kvcache"), 64 << 10)
    assert paged["plan"] == {"placement": want.placement, "min_block": want.min_block,
                             "slab_max": want.slab_max, "peak_mapped": want.peak_mapped,
                             "efficiency": want.efficiency}
    assert len(paged["plans"]) == len(tr.PLACEMENTS) * len(tr.PAGED_UNITS) * len(tr.SLAB_MAXES)
    assert paged["placements"]["granules"]["peak_mapped"] == paged["peak_mapped"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert (f"deploy with placement={want.placement!r}, min_block={want.min_block}, "
            f"slab_max={want.slab_max}") in text
