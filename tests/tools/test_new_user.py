"""What a new user meets (issue 47): a live Device's snapshot, the
out-of-memory message, statistics that agree with each other, torch's
names, the bench and the command line."""
import os
import pickle
import random
import re

import pytest

import ascmem
from ascmem import Policy, snapshot, stats
from ascmem.rules import MiB


# ---- 47.1: a snapshot of a live Device holds what the device holds ----------------


def _reserved_by_kind(dev):
    """What memory_stats counts as reserved, per kind (stats._reserved)."""
    return {name: stats._reserved(k)[0] for name, k in dev.stats().items() if name != "device"}


def _segment_bytes_by_kind(snap):
    out = {}
    for seg in snap["segments"]:
        out[seg["memory_kind"]] = out.get(seg["memory_kind"], 0) + seg["total_size"]
    return out


def _check_snapshot(dev, asleep=()):
    snap = snapshot.to_torch(dev)
    by_kind = _segment_bytes_by_kind(snap)
    for name, reserved in _reserved_by_kind(dev).items():
        assert by_kind.get(name, 0) == reserved, name
    live = {b["address"]: b for b in dev.snapshot()}
    seen = set()
    for seg in snap["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        at = seg["address"]
        for b in seg["blocks"]:  # contiguous, in order, inside the segment
            assert b["address"] == at
            at += b["size"]
            if b["state"] == "active_allocated":
                assert live[b["address"]]["size"] == b["size"]
                seen.add(b["address"])
    assert seen == set(live) - set(asleep)  # every awake live block is in a segment
    return snap


@pytest.mark.parametrize("model", ["atlas-a2-training", "atlas-inference"])
def test_live_snapshot_reserved_is_memory_stats(model, tmp_path):
    mv = pytest.importorskip("torch.cuda._memory_viz")
    dev = ascmem.Device(model)
    dev.malloc(4096)
    path = snapshot.save_torch(dev, tmp_path / "s.pickle")
    data = pickle.loads(path.read_bytes())
    reserved = dev.memory_stats()["reserved_bytes.all.current"]
    assert reserved == 24576 if model == "atlas-a2-training" else reserved > 0
    assert sum(s["total_size"] for s in data["segments"]) == reserved
    # torch's own reading of the file (was 64.0GiB: base of the range to the block)
    assert f"total_reserved: {mv.Bytes(reserved)}\n" in mv.segsum(data)
    _check_snapshot(dev)


@pytest.mark.parametrize("paged", [False, True])
def test_live_snapshot_follows_a_random_workload(paged):
    mv = pytest.importorskip("torch.cuda._memory_viz")
    rng = random.Random(47)
    kw = dict(backend="host", paged=True, release_threshold=8 * MiB) if paged else {}
    dev = ascmem.Device("atlas-a2-training", **kw)
    live = []
    for step in range(400):
        if live and rng.random() < 0.45:
            dev.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randint(1, 4096), rng.randint(4096, 1 << 20),
                               rng.randint(1 << 20, 24 * MiB)])
            live.append(dev.malloc(size, rng.choice([Policy.HUGE_FIRST, Policy.NORMAL_ONLY])))
        if step % 50 == 0:
            mv.segsum(_check_snapshot(dev))  # torch checks each segment's blocks add up
    for p in live:
        dev.free(p)
    snap = _check_snapshot(dev)
    if paged:  # freed granules kept under the release threshold are still mapped
        assert sum(s["total_size"] for s in snap["segments"]) == \
            dev.memory_stats()["reserved_bytes.all.current"]
    dev.close()


def test_snapshot_leaves_out_a_sleeping_block():
    dev = ascmem.Device("atlas-a2-training", backend="host", paged=True)
    a = dev.malloc(6 * MiB, tag="kv")
    b = dev.malloc(3 * MiB)
    dev.sleep("kv")
    snap = _check_snapshot(dev, asleep={a})
    active = [blk["address"] for s in snap["segments"] for blk in s["blocks"]
              if blk["state"] == "active_allocated"]
    assert active == [b]
    dev.wake("kv")
    _check_snapshot(dev)
    dev.free(a)
    dev.free(b)
    dev.close()


# ---- 47.3: statistics that agree with each other ------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_METRICS = ("allocated_bytes", "requested_bytes", "active_bytes", "inactive_split_bytes",
            "reserved_bytes", "allocation", "active", "inactive_split", "segment")
_GROUPS = ("all", "small_pool", "large_pool")
_BYTES_AND_BLOCKS = (("allocated_bytes", "allocation"), ("active_bytes", "active"),
                     ("inactive_split_bytes", "inactive_split"), ("reserved_bytes", "segment"))


def check_stats_agree(dev):
    s = dev.memory_stats()
    for m in _METRICS:
        for g in _GROUPS:
            cur, peak, alloc, freed = (s[f"{m}.{g}.{x}"] for x in
                                       ("current", "peak", "allocated", "freed"))
            assert min(cur, peak, alloc, freed) >= 0, (m, g)
            assert peak >= cur, (m, g, cur, peak)
            assert alloc - freed == cur, (m, g, cur, alloc, freed)
        for x in ("current", "allocated", "freed"):
            assert s[f"{m}.all.{x}"] == s[f"{m}.small_pool.{x}"] + s[f"{m}.large_pool.{x}"], (m, x)
    for g in _GROUPS:
        for size, count in _BYTES_AND_BLOCKS:
            if s[f"{size}.{g}.current"]:
                assert s[f"{count}.{g}.current"], (size, g)
        for size, count in _BYTES_AND_BLOCKS[:3]:  # a block has bytes
            if s[f"{count}.{g}.current"]:
                assert s[f"{size}.{g}.current"], (count, g)
        assert s[f"requested_bytes.{g}.current"] <= s[f"allocated_bytes.{g}.current"]
        # what is held is either allocated or an inactive split block
        assert s[f"reserved_bytes.{g}.current"] == \
            s[f"allocated_bytes.{g}.current"] + s[f"inactive_split_bytes.{g}.current"], g
    # memory_summary shows the same figures: its peak column is never below the current one
    rows = [r for r in dev.memory_summary().splitlines() if r.startswith("| Non-releasable")]
    assert len(rows) == 1
    return s


_OPS = st.lists(st.tuples(st.sampled_from(["malloc", "free", "reset"]),
                          st.sampled_from([1, 512, 4096, 5000, 70_000, 1 << 20, 3 * MiB,
                                           9 * MiB + 17]),
                          st.sampled_from([Policy.HUGE_FIRST, Policy.HUGE_ONLY,
                                           Policy.NORMAL_ONLY]),
                          st.integers(0, 1 << 16)), max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, model=st.sampled_from(["atlas-a2-training", "atlas-inference"]),
       paged=st.booleans())
def test_memory_stats_invariants_over_random_workloads(ops, model, paged):
    kw = dict(paged=True, release_threshold=4 * MiB) if paged and model == "atlas-a2-training" \
        else {}
    dev = ascmem.Device(model, **kw)
    live = []
    for op, size, policy, pick in ops:
        if op == "malloc":
            live.append(dev.malloc(size, policy))
        elif op == "free" and live:
            dev.free(live.pop(pick % len(live)))
        elif op == "reset":
            dev.reset_peaks()
        check_stats_agree(dev)
    for p in live:
        dev.free(p)
    s = check_stats_agree(dev)
    assert s["allocated_bytes.all.current"] == 0
    dev.check()


def test_issue_report_non_releasable_memory_has_blocks_and_a_peak():
    """The report: 2,106,368 inactive bytes with a peak of 0 and a count of 0."""
    dev = ascmem.Device("atlas-a2-training")
    dev.malloc(4096)
    dev.malloc(3 * MiB, Policy.HUGE_ONLY)
    s = check_stats_agree(dev)
    assert s["inactive_split_bytes.all.current"] > 0
    assert s["inactive_split.all.current"] >= 1
    row = next(r for r in dev.memory_summary().splitlines() if r.startswith("| Non-releasable"))
    cells = [c.strip() for c in row.split("|")[2:4]]
    assert cells[0] == cells[1] and cells[0] != "0 B"


# ---- 47.2: the out-of-memory message names the limit that refused -----------------


def _oom(dev, size, policy=Policy.HUGE_FIRST):
    with pytest.raises(ascmem.OutOfMemoryError) as e:
        dev.malloc(size, policy)
    dev.check()
    return str(e.value)


def test_oom_names_the_memory_fraction_cap_and_the_request():
    dev = ascmem.Device("atlas-a2-training")
    dev.set_memory_fraction(0.01)
    msg = _oom(dev, 1 << 30)
    cap = dev.get_limit()
    assert cap == 687_194_767
    assert "memory cap set by set_memory_fraction / set_limit refused" in msg
    assert f"{cap:,} bytes" in msg and "fraction of 0.01" in msg
    assert "asked 1.00 GiB (1,073,741,824 bytes) with policy HUGE_FIRST" in msg
    assert "which tries HUGE, then NORMAL" in msg
    assert "range free" in msg  # the figures it said before stay
    assert dev.memory_stats()["num_oom_rejections"] == 1


def test_oom_names_the_device_memory_when_no_cap():
    dev = ascmem.Device("atlas-a2-training")
    big = dev.malloc(dev.budget()["total"] - (64 << 20), Policy.HUGE_ONLY)
    msg = _oom(dev, 256 << 20, Policy.NORMAL_ONLY)
    assert "the device's memory of 64.00 GiB is exhausted" in msg
    assert "memory cap" not in msg and "with policy NORMAL_ONLY, which tries NORMAL;" in msg
    assert dev.memory_stats()["num_oom_rejections"] == 0
    dev.free(big)


def test_oom_names_a_range_too_small_full_or_fragmented():
    dev = ascmem.Device("atlas-a2-training")
    msg = _oom(dev, 1 << 40, Policy.NORMAL_ONLY)
    assert "larger than the whole NORMAL range of 64.00 GiB" in msg
    pool = ascmem.Device("atlas-inference", backend="host",
                         pool_sizes={"normal": (64 * MiB, 64 * MiB)}, memory=1 << 30)
    blocks = []
    with pytest.raises(ascmem.OutOfMemoryError) as e:
        while True:
            blocks.append(pool.malloc(4 * MiB - 4096, Policy.NORMAL_ONLY))
    assert "the NORMAL range is full" in str(e.value)
    for b in blocks[::2]:
        pool.free(b)
    frag = _oom(pool, 8 * MiB, Policy.NORMAL_ONLY)
    assert re.search(r"the NORMAL range is fragmented: \S+ MiB free, but the largest free "
                     r"block is 4.00 MiB", frag), frag
    pool.close()


# ---- 47.9: torch's names ----------------------------------------------------------


def test_torch_names_on_device():
    dev = ascmem.Device("atlas-a2-training")
    a = dev.malloc(3 * MiB, Policy.HUGE_ONLY)
    dev.malloc(1000)
    s = dev.memory_stats()
    assert dev.memory_allocated() == s["allocated_bytes.all.current"] >= 3 * MiB + 1000
    assert dev.memory_reserved() == s["reserved_bytes.all.current"] > dev.memory_allocated()
    dev.free(a)
    assert dev.max_memory_allocated() == s["allocated_bytes.all.current"] > dev.memory_allocated()
    assert dev.max_memory_reserved() == s["reserved_bytes.all.peak"]
    dev.reset_peak_memory_stats()
    assert dev.max_memory_allocated() == dev.memory_allocated()
    assert dev.memory_allocated(0) == dev.memory_allocated(device=0)
    with pytest.raises(ascmem.InvalidArgumentError):
        dev.memory_allocated(1)
    free, total = dev.mem_get_info()
    assert (free, total) == dev.get_mem_info(ascmem.MemAttr.HBM_MEM)
    assert total == dev.budget()["total"] and free == total - dev.memory_reserved()
    dev.set_per_process_memory_fraction(0.5)
    assert dev.get_memory_fraction() == 0.5
    assert dev.mem_get_info()[1] == total // 2  # aclrtGetMemInfo reports the cap
    with pytest.raises(ascmem.InvalidArgumentError):
        dev.set_per_process_memory_fraction(0.5, device=3)
    assert "num_oom_rejections" in dev.memory_stats()


def test_ddr_chip_answers_mem_get_info_with_ddr():
    dev = ascmem.Device("atlas-inference")
    assert dev.mem_get_info() == dev.get_mem_info(ascmem.MemAttr.DDR_MEM)


def test_out_of_memory_is_caught_as_torch_s_is():
    dev = ascmem.Device("atlas-inference")
    for catch in (RuntimeError, MemoryError, ascmem.AscmemError, ascmem.OutOfMemoryError):
        with pytest.raises(catch):
            dev.malloc(1 << 45)
    try:
        dev.malloc(1 << 45)
    except RuntimeError as e:  # torch code: `except RuntimeError` around an allocation
        assert e.code == 207001
    torch = pytest.importorskip("torch")
    assert issubclass(torch.OutOfMemoryError, RuntimeError)


# ---- 47.8: the command line -------------------------------------------------------

from ascmem import cli  # noqa: E402


def test_bare_ascmem_prints_help(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ascmem") and "replay" in out and "info" in out


def test_every_command_help_has_a_description(capsys):
    for command in ("info", "replay", "snapshot", "fit", "plan", "bench"):
        with pytest.raises(SystemExit) as e:
            cli.main([command, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        paragraphs = out.split("\n\n")
        assert not paragraphs[1].lstrip().startswith(("positional", "options")), command
    with pytest.raises(SystemExit):
        cli.main(["info", "--help"])
    assert "memory profile" in capsys.readouterr().out


@pytest.mark.parametrize("argv,text", [
    (["plan", "--example", "video_pipeline", "--weights", "300"], "'300' has no unit: write 300MiB"),
    (["plan", "--example", "video_pipeline", "--headroom", "1024"], "has no unit"),
    (["plan", "--example", "video_pipeline", "--dvpp", "12"], "has no unit"),
    (["replay", "--example", "video_pipeline", "--allocator", "pool", "--capacity", "400"],
     "has no unit"),
    (["fit", "--example", "video_pipeline", "--resolution", "65536"], "has no unit"),
    (["fit", "--example", "video_pipeline", "--granule", "2"], "has no unit"),
    (["plan", "--example", "video_pipeline", "--weights", "-5MiB"], "is not a size"),
    (["replay", "--example", "video_pipeline", "--allocator", "pool", "--capacity", "-1GiB"],
     "is not a size"),
])
def test_sizes_need_a_unit_and_negative_ones_are_named(argv, text, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and text in err, err
    assert "expected one argument" not in err


def test_sizes_with_units_and_zero_still_parse():
    assert cli._positive_int("300MiB") == 300 << 20
    assert cli._positive_int("4096B") == 4096 and cli._positive_int("0x1000") == 4096
    assert cli._positive_int("1.5 GiB") == 3 << 29 and cli._positive_int("2GB") == 2 * 10**9
    p = cli.build_parser()
    args = p.parse_args(cli._negative_sizes_as_values(
        p, ["plan", "--example", "x", "--weights", "0", "--headroom", "1GiB"]))
    assert args.weights == 0 and args.headroom == 1 << 30
    args = p.parse_args(["snapshot", "--example", "x", "--max-entries", "100"])
    assert args.max_entries == 100  # a count, not a size


# ---- 47.6: the bench says what is missing and when a run was noisy ---------------

from ascmem import bench  # noqa: E402
from conftest import ROOT


def _rows(spread=0.0, fast=1.0):
    """Synthetic Python pair figures: the floor at 50 ns, the rest above it
    (fast: a factor on ascmem Pool's time, below 1/2 it beats the floor)."""
    rows = []
    for n in bench.SIZES:
        for peer, ns in ((bench.FLOOR, 50.0), ("floor, hand-parsed", 60.0), ("ascmem Pool", 100.0 * fast),
                         ("ascmem Pool, paged", 110.0), ("ascmem BuddyAllocator", 120.0),
                         ("ascmem Device.malloc", 130.0)):
            samples = [ns * (1 + spread * ((i % 7) - 3) / 3) for i in range(21)]
            rows.append({"peer": peer, "size": n, "ns": ns, "samples": samples})
    return rows


def test_noise_is_seen_in_the_figures():
    assert bench.noise(_rows()) == []
    assert bench.noise(_rows(spread=0.05)) == []
    noisy = bench.noise(_rows(spread=0.5))
    assert len(noisy) == 1 and "spread by" in noisy[0]
    below = bench.noise(_rows(fast=0.3))
    assert len(below) == 1 and "faster than the floor" in below[0] and "ascmem Pool" in below[0]


def test_bench_report_names_a_missing_tlsfallocator_and_warns_of_noise(monkeypatch, capsys):
    from ascmem import trace as tr
    monkeypatch.setattr(tr, "tlsf_available", lambda: False)
    monkeypatch.setattr(bench, "python_pairs", lambda number, repeat: _rows(spread=0.6, fast=0.3))
    monkeypatch.setattr(bench, "batch_pairs", lambda count, repeat: 50.0)
    monkeypatch.setattr(bench, "host_buffers", lambda number, repeat:
                        {"pool": 1000.0, "numpy": 9000.0, "pool+view": 2000.0})
    monkeypatch.setattr(bench, "_traces", lambda quick: [])
    monkeypatch.setattr(bench, "_CPUS", set(bench._CPUS))
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        assert bench.main(["--quick", "--no-c"]) == 0
    finally:
        if affinity:
            os.sched_setaffinity(0, affinity)
    out = capsys.readouterr().out
    assert "to tlsfallocator" not in out
    assert "tlsfallocator is not installed" in out and "pip install '.[bench]'" in out
    assert "WARNING: this run was noisy" in out and "faster than the floor" in out


# ---- 47.10: the README installs what a user needs in one command ----------------

def test_readme_installs_the_extras_its_commands_need_in_one_command():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"])
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    installs = re.findall(r"pip install '\.\[([a-z,]+)\]'", readme)
    assert installs, "the README installs nothing"
    for named in installs:
        assert set(named.split(",")) <= extras, named
    # the first command installs what "Run it" goes on to use (--plot, ascmem bench)
    assert {"plot", "bench"} <= set(installs[0].split(","))
    assert "pip install '.[plot]'" not in readme  # an extra alone builds the C core again
    assert "two-core machine" in readme and "every `pip install`" in readme.lower()
