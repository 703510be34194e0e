"""ascmem plan: the fit of a workload on every product, per allocator."""
import json
import subprocess
import sys

import pytest

import ascmem
from ascmem import planner
from ascmem import trace as tr
from ascmem.trace_data import Event, Trace
from conftest import GiB, MiB


def one_block(size, kind=""):
    return Trace([Event("a", 1, size, kind), Event("f", 1, size, kind)], name="one")


def test_footprints_per_allocator():
    t = one_block(100 * MiB)
    prints = {fp.allocator: fp for fp in planner.footprints(t)}
    assert prints["ascmem"].peak == prints["cann-raw"].peak == 102 * MiB  # +64 B: one more 2 MiB page
    assert prints["torch-caching"].peak == 102 * MiB  # +32, 512 rounding, then 2 MiB
    assert all(fp.media_peak == 0 for fp in prints.values())


def test_need_is_per_instance_plus_what_the_first_job_takes():
    t = one_block(100 * MiB)
    p = ascmem.plan(t, weights=300 * MiB, instances=3, headroom=GiB, models=["atlas-a2-training"])
    f = next(f for f in p.fits if f.allocator == "ascmem")
    assert f.first_job == 300 * MiB  # the A2 system package [S][G]
    assert f.need == 3 * (102 * MiB + 300 * MiB + GiB) + 300 * MiB
    assert f.fits and f.headroom == 64 * GiB - f.need and f.limit == "device memory"
    training = ascmem.plan(t, models=["atlas-training"]).fits[0]
    assert training.first_job == 200 * MiB  # the AI CPU operator cache's upper bound [P]


def test_too_big_says_by_how_much_and_the_smallest_card_that_fits():
    t = one_block(10 * GiB)
    p = ascmem.plan(t, instances=2)
    small = next(f for f in p.fits if f.model == "atlas-inference" and f.allocator == "ascmem")
    assert not small.fits and small.headroom < 0 and small.limit == "device memory"
    assert p.smallest["ascmem"] == "atlas-inference-series EP"  # 22.4 GiB: the smallest for 2 x 10
    huge = ascmem.plan(one_block(200 * GiB))  # beyond the reference device: fits nowhere
    assert huge.smallest == dict.fromkeys(ascmem.planner.ALLOCATORS)
    assert not any(fp.complete for fp in huge.footprints)


def test_the_media_window_is_a_limit_of_its_own():
    t = one_block(3 * GiB, "dvpp")
    p = ascmem.plan(t, dvpp=2 * GiB, models=["atlas-training", "atlas-a2-training"])
    by_model = {f.model: f for f in p.fits if f.allocator == "ascmem"}
    assert not by_model["atlas-training"].fits  # 5 GB of media memory, a 4 GB window
    assert by_model["atlas-training"].limit == "media window"
    assert by_model["atlas-a2-training"].fits    # 16 GB


def test_bad_arguments():
    t = one_block(MiB)
    for kw in ({"weights": -1}, {"instances": 0}, {"headroom": 1.5}, {"dvpp": True}):
        with pytest.raises(ascmem.InvalidArgumentError):
            ascmem.plan(t, **kw)
    with pytest.raises(ascmem.InvalidArgumentError):
        planner.footprints(t, allocators=["mimalloc"])


def test_the_command_table_json_and_plot(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "ascmem", "plan", *args],
                              capture_output=True, text=True)
    r = run("--example", "video_pipeline", "--weights", "300MiB", "--instances", "2")
    assert r.returncode == 0, r.stderr
    assert "smallest card that fits with torch-caching" in r.stdout and "atlas-a3 EP" in r.stdout
    doc = json.loads(run("--example", "video_pipeline", "--json", "--model", "atlas-inference").stdout)
    assert doc["schema"] == "ascmem.plan/1" and doc["instances"] == 1
    assert {f["allocator"] for f in doc["fits"]} == set(planner.ALLOCATORS)
    assert all("curve" not in fp for fp in doc["footprints"])
    assert run("--example", "video_pipeline", "--instances", "0").returncode == 2
    big = tmp_path / "big.csv"
    big.write_text("op,id,size\na,1,200000000000\n")
    assert run(str(big)).returncode == 1  # fits nowhere
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert run("--example", "decoder_kvcache", "--plot", str(png)).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
