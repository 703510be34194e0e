"""The raw-CANN accounting (each request as a runtime call, in whole pages)
and Device.route, which it and the replay share."""
import json
import subprocess
import sys

import pytest

import ascmem
from ascmem import MemKind, Policy, raw_cann
from ascmem import trace as tr
from ascmem.rules import GiB, MiB


def test_route_says_where_a_request_goes_without_allocating():
    d = ascmem.Device("atlas-a2-training")
    assert d.route(100) == {"rounded": 160, "align": 64, "pad": 0, "kinds": [MemKind.NORMAL]}
    assert d.route(2 * MiB)["kinds"] == [MemKind.HUGE, MemKind.NORMAL]   # huge first, fallback
    assert d.route(2 * MiB, Policy.HUGE_ONLY)["kinds"] == [MemKind.HUGE]
    assert d.route(100, Policy.HUGE1G_ONLY) == {"rounded": 128, "align": 64, "pad": 32,
                                               "kinds": [MemKind.HUGE1G]}
    assert d.route(100, call="malloc_align32")["rounded"] == 128
    assert d.route(100, call="dvpp_malloc")["align"] == 128
    assert d.route(100, call="malloc_host") == {"rounded": 100, "align": 64, "pad": 0,
                                                "kinds": [MemKind.HOST]}
    assert d.stats()["normal"]["alloc_count"] == 0
    with pytest.raises(ascmem.InvalidArgumentError):
        d.route(0)
    with pytest.raises(ascmem.InvalidArgumentError):
        d.route(64, call="free")
    with pytest.raises(ascmem.UnsupportedError):
        ascmem.Device("atlas-training").route(64, Policy.HUGE1G_ONLY)


def trace_of(*events):
    return tr.Trace([tr.Event(*e) for e in events], name="t")


def test_each_call_takes_whole_pages_of_its_kind():
    d = ascmem.Device("atlas-a2-training")
    t = trace_of(("a", 1, 100, "normal"), ("a", 2, 100, "normal"),    # two pages, not one
                 ("a", 3, 3 * MiB, "huge"),                            # two 2 MiB pages
                 ("a", 4, 1000, "dvpp"),                               # one 2 MiB page
                 ("a", 5, 100, "huge", int(Policy.HUGE1G_ONLY)),       # a whole 1 GiB page
                 ("f", 5, 100, "huge", int(Policy.HUGE1G_ONLY)),
                 ("a", 6, 100, "host"),                                 # host memory: not counted
                 ("f", 1, 100, "normal"), ("f", 2, 100, "normal"))
    got = raw_cann.peak(t, d)
    assert got["per_kind_peak"] == {"normal": 8192, "huge": 4 * MiB, "dvpp": 2 * MiB,
                                    "huge1g": GiB, "host": 4096}
    assert got["peak"] == 8192 + 4 * MiB + 2 * MiB + GiB


def test_rc_mode_counts_host_memory_as_the_devices():
    t = trace_of(("a", 1, 100, "host"))
    assert raw_cann.peak(t, ascmem.Device("atlas-200", mode="EP"))["peak"] == 0
    assert raw_cann.peak(t, ascmem.Device("atlas-200", mode="RC"))["peak"] == 4096


def test_ascmem_packs_below_raw_calls_on_a_small_block_workload():
    t = tr.example("many_small")
    d = ascmem.Device("atlas-training")
    raw = raw_cann.peak(t, d)["peak"]
    rep = tr.replay(t, d, curve=True)
    assert rep["peak_live"] <= max(rep["curve_used"]) <= raw


def test_replay_json_has_the_raw_figure():
    out = subprocess.run([sys.executable, "-m", "ascmem", "replay", "--example", "video_pipeline",
                          "--json"], capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    assert doc["cann_raw"]["peak"] >= doc["device"]["peak_huge"]
    assert set(doc["cann_raw"]["per_kind_peak"]) == {"huge", "normal", "dvpp", "host"}
