"""The contiguous plan as a user meets it (ascmem.trace.choose_contiguous_plan,
`ascmem fit`, `ascmem plan`): the arguments printed after "deploy with"
reproduce the figure printed beside them; a workload that fails every replay
gets the default named, not whichever failed replay got furthest; and the
JSON fields are the ones docs/CLI_JSON.md describes."""
import json
import os
import re
import subprocess
import sys

import ascmem
from ascmem import planner
from ascmem import trace as tr
from conftest import ROOT

DEPLOY = re.compile(r"deploy with (placement='[a-z-]+', min_block=\d+, slab_max=\d+)")


def run(*args):
    r = subprocess.run([sys.executable, "-m", "ascmem", *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def printed_arguments(text):
    """The keyword arguments of the "deploy with ..." line, as printed."""
    (found,) = DEPLOY.findall(text)
    return eval(f"dict({found})")  # the printed text is Python keyword syntax


def test_deploying_a_device_with_what_plan_prints_holds_its_peak():
    """resnet18_train: the Device made with the printed arguments holds the
    printed peak; the printed placement without the printed unit does not
    (both arguments are needed)."""
    args = ("plan", "--example", "resnet18_train", "--model", "atlas-a2-training")
    kw = printed_arguments(run(*args))
    doc = json.loads(run(*args, "--json"))
    (fp,) = [f for f in doc["footprints"] if f["allocator"] == "ascmem"]
    assert kw == {"placement": fp["placement"], "min_block": fp["min_block"],
                  "slab_max": fp["slab_max"]}
    t = tr.example("resnet18_train")
    with ascmem.Device(planner.REFERENCE, memory=planner.REFERENCE_MEMORY, **kw) as dev:
        assert tr.device_footprint(t, dev)[0] == fp["peak"]
    assert kw["min_block"] != 4096
    with ascmem.Device(planner.REFERENCE, memory=planner.REFERENCE_MEMORY,
                       placement=kw["placement"]) as dev:
        assert tr.device_footprint(t, dev)[0] == fp["placements"][kw["placement"]] > fp["peak"]


def test_deploying_a_pool_with_what_fit_prints_replays_in_its_arena():
    args = ("fit", "--example", "speech_to_text", "--allocator", "pool")
    kw = printed_arguments(run(*args))
    (pool,) = json.loads(run(*args, "--json"))["allocators"]
    plan = pool["plan"]
    assert kw == {"placement": plan["placement"], "min_block": plan["min_block"],
                  "slab_max": plan["slab_max"]}
    t = tr.example("speech_to_text")
    assert tr.fits(t, lambda cap: ascmem.Pool(cap, **kw), plan["min_capacity"])


def test_every_replay_failing_keeps_the_default_plan():
    """Over the 120 GiB reference device at the end of a real run: every
    placement and unit fails, their peaks before the failure differ, and no
    replay finished to say which holds less; the default is named, as with
    a tie (the figure is the bound, the same for all)."""
    t = tr.example("resnet18_train")
    over = tr.Trace(list(t.events) + [tr.Event("a", 10 ** 9, planner.REFERENCE_MEMORY + (1 << 30))],
                    name="over")
    (fp,) = planner.footprints(over, allocators=["ascmem"])
    assert not fp.complete
    assert len({p["peak"] for p in fp.plans}) > 1  # the failed replays' partial figures differ
    assert (fp.placement, fp.min_block, fp.slab_max) == (
        tr.CONTIGUOUS_PLACEMENTS[0], tr.CONTIGUOUS_UNITS[0], tr.SLAB_MAXES[0])


def _section(schema):
    with open(os.path.join(ROOT, "docs", "CLI_JSON.md"), encoding="utf-8") as f:
        return f.read().split(f"## `{schema}`", 1)[1].split("\n## ", 1)[0]


def _named(key, text):
    return re.search(rf"(?<![\w.]){re.escape(key)}(?![\w/])", text) is not None


def test_cli_json_names_every_field_of_the_contiguous_plan():
    (pool,) = json.loads(run("fit", "--example", "video_pipeline", "--allocator", "pool",
                             "--json"))["allocators"]
    fit = _section("ascmem.fit/1")
    assert [k for k in pool if not _named(k, fit)] == []
    assert [k for k in pool["plan"] if not _named(k, fit)] == []
    assert [k for k in pool["plans"][0] if not _named(k, fit)] == []
    doc = json.loads(run("plan", "--example", "video_pipeline", "--model", "atlas-a2-training",
                         "--json"))
    (fp,) = [f for f in doc["footprints"] if f["allocator"] == "ascmem"]
    plan = _section("ascmem.plan/1")
    assert [k for k in fp if not _named(k, plan)] == []
    assert [k for k in fp["plans"][0] if not _named(k, plan)] == []
