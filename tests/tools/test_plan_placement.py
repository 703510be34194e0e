"""ascmem plan under each placement the reference Device takes (a device
that is not paged: a contiguous Pool's, tests/device/test_device_placement.py),
in each unit of ascmem.trace.CONTIGUOUS_UNITS, with and without slabs
(SLAB_MAXES): the ascmem footprint is the setting's whose replay holds the
fewest pages at its peak,
named so that a user deploys with it; the default keeps its figures when it
wins or ties."""
import json
import subprocess
import sys

import ascmem
from ascmem import planner
from ascmem import trace as tr
from conftest import MiB


def reference_peak(t, placement=None, min_block=4096):
    with ascmem.Device(planner.REFERENCE, memory=planner.REFERENCE_MEMORY,
                       placement=placement, min_block=min_block) as dev:
        return tr.device_footprint(t, dev)[0]


def ascmem_print(t):
    (fp,) = planner.footprints(t, allocators=["ascmem"])
    return fp


def test_the_placement_with_the_smallest_peak_is_named():
    """resnet18_train: best fit's choice holds 6 MiB fewer pages at the peak
    than reuse in place (390.6 MiB against 396.6) in 4 KiB units, and 92 KiB
    fewer again in 1 KiB units."""
    t = tr.example("resnet18_train")
    fp = ascmem_print(t)
    assert list(fp.placements) == list(tr.CONTIGUOUS_PLACEMENTS)
    assert fp.placements == {p: reference_peak(t, p) for p in tr.CONTIGUOUS_PLACEMENTS}
    assert fp.placements["kept-to-best-fit"] == fp.placements["kept-in-place"] - 6 * MiB
    assert [(p["placement"], p["min_block"], p["slab_max"]) for p in fp.plans] == [
        (p, u, s) for s in tr.SLAB_MAXES for u in tr.CONTIGUOUS_UNITS
        for p in tr.CONTIGUOUS_PLACEMENTS]
    assert (fp.placement, fp.min_block, fp.slab_max) == ("kept-to-best-fit", 1024, tr.SLAB_MAX)
    assert fp.peak == reference_peak(t, "kept-to-best-fit", 1024) == \
        fp.placements["kept-to-best-fit"] - 92 * 1024
    assert fp.peak == min(p["peak"] for p in fp.plans)
    assert fp.complete


def test_the_default_keeps_its_figures_when_it_ties():
    t = tr.example("video_pipeline")  # in 4 KiB units all three hold the same pages at the peak
    fp = ascmem_print(t)
    assert fp.placement == "kept-in-place"
    assert set(fp.placements.values()) == {reference_peak(t)}
    whole = tr.Trace([tr.Event("a", 0, 4 * MiB), tr.Event("f", 0, 4 * MiB)], name="whole")
    fp = ascmem_print(whole)  # every placement and unit alike
    assert len({p["peak"] for p in fp.plans}) == 1
    assert (fp.placement, fp.min_block, fp.slab_max, fp.peak) == (
        "kept-in-place", 4096, tr.SLAB_MAX, reference_peak(whole))


def test_a_failed_replay_never_wins():
    """Over the reference device under every placement: no complete one, so
    the default's, marked incomplete, as before."""
    t = tr.Trace([tr.Event("a", 1, 200 << 30), tr.Event("f", 1, 200 << 30)], name="huge")
    fp = ascmem_print(t)
    assert fp.placement == "kept-in-place" and not fp.complete


def test_other_allocators_have_no_placement():
    t = tr.example("video_pipeline")
    for fp in planner.footprints(t, allocators=["torch-caching", "cann-raw"]):
        assert fp.placement is None and fp.placements == {}
        assert fp.min_block is None and fp.slab_max is None and fp.plans == []


def test_the_command_names_the_placement_in_text_and_json():
    def run(*args):
        r = subprocess.run([sys.executable, "-m", "ascmem", "plan", "--example", "resnet18_train",
                            "--model", "atlas-a2-training", *args],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert "deploy with placement='kept-to-best-fit', min_block=1024, slab_max=32768" in run()
    doc = json.loads(run("--json"))
    fp = next(fp for fp in doc["footprints"] if fp["allocator"] == "ascmem")
    assert (fp["placement"], fp["min_block"]) == ("kept-to-best-fit", 1024)
    assert fp["placements"]["kept-to-best-fit"] == fp["placements"]["kept-in-place"] - 6 * MiB
    assert fp["peak"] == min(p["peak"] for p in fp["plans"]) < fp["placements"]["kept-to-best-fit"]
    assert all(f["placement"] is None for f in doc["footprints"] if f["allocator"] != "ascmem")
