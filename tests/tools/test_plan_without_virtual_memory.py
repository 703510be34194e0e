"""`ascmem plan` on products without virtual memory management: torch_npu
turns expandable segments off there (it tries aclrtReserveMemAddress at
start-up and falls back to "expandable_segments:False": Ascend/pytorch
torch_npu/csrc/core/npu/NPUAllocatorConfig.cpp lines 306-323), so the
expandable columns count its caching allocator's peak and say so; where the
runtime has virtual memory they count their own."""
import json
import subprocess
import sys

from ascmem import profiles
from ascmem.tools import planner
from ascmem import trace as tr


def fits_of(p):
    return {(f.model, f.mode, f.allocator): f for f in p.fits}


def test_expandable_segments_run_as_the_caching_allocator_without_virtual_memory():
    t = tr.example("decoder_kvcache")
    p = planner.plan(t, allocators=["torch-caching", "torch-expandable",
                                    "torch-expandable-eager"])
    peaks = {fp.allocator: fp.peak for fp in p.footprints}
    assert peaks["torch-expandable-eager"] < peaks["torch-caching"]  # so the swap shows
    fits = fits_of(p)
    seen = set()
    for model in profiles.names():
        prof = profiles.get(model)
        for mode in prof.modes:
            caching = fits[(prof.name, mode, "torch-caching")]
            assert caching.runs_as == "torch-caching"
            for name in ("torch-expandable", "torch-expandable-eager"):
                f = fits[(prof.name, mode, name)]
                virtual = prof.virtual_memory_in(mode)
                seen.add(virtual)
                assert f.runs_as == (name if virtual else "torch-caching")
                if not virtual:
                    assert (f.need, f.fits, f.headroom) == \
                        (caching.need, caching.fits, caching.headroom)
    assert seen == {True, False}  # the profiles have both kinds of product


def test_the_caching_footprint_is_measured_when_not_asked_for():
    t = tr.example("decoder_kvcache")
    p = planner.plan(t, allocators=["torch-expandable-eager"], models=["atlas-inference"])
    (f,) = p.fits
    (caching,) = planner.footprints(t, ["torch-caching"])
    assert f.runs_as == "torch-caching"
    assert f.need == caching.peak + f.first_job > p.footprints[0].peak + f.first_job
    assert [fp.allocator for fp in p.footprints] == ["torch-expandable-eager"]


def test_the_command_marks_the_fallback_in_text_and_json():
    args = [sys.executable, "-m", "ascmem", "plan", "--example", "decoder_kvcache",
            "--model", "atlas-inference", "--model", "atlas-a2-training",
            "--allocator", "torch-expandable"]
    text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    row = next(line for line in text.splitlines() if line.startswith("atlas-inference"))
    assert "(as torch-caching)" in row
    a2 = next(line for line in text.splitlines() if line.startswith("atlas-a2-training"))
    assert "(as " not in a2
    assert "turns expandable segments off" in text
    doc = json.loads(subprocess.run(args + ["--json"], capture_output=True, text=True,
                                    check=True).stdout)
    assert {f["model"]: f["runs_as"] for f in doc["fits"]} == {
        "atlas-inference": "torch-caching", "atlas-a2-training": "torch-expandable"}
