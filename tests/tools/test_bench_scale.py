"""The trace-scale row of `ascmem bench` (ascmem.tools.bench_scale): every
command runs on the generated trace and reports its figures."""

import numpy as np

from ascmem.tools import bench_scale


def test_the_workload_frees_every_block_after_its_allocation():
    ops, ids, sizes = bench_scale.workload(5000)
    live = set()
    for op, ident in zip(ops.tolist(), ids.tolist()):
        if op:
            assert ident not in live
            live.add(ident)
        else:
            live.remove(ident)
    assert not live and np.all(sizes > 0)


def test_each_command_runs_on_the_generated_trace_and_reports_its_figures(tmp_path):
    rows = bench_scale.rows(4000, ("csv", "json"), ("replay-device", "plan"), str(tmp_path))
    assert [(r["format"], r["command"]) for r in rows] == [
        ("csv", "replay-device"), ("csv", "plan"), ("json", "replay-device"), ("json", "plan")]
    for r in rows:
        assert r["exit"] == 0, r["output"]
        assert r["events"] == 4000 and r["cpu_s"] > 0 and r["peak_rss_mb"] > 0
        assert r["events_per_s"] > 0


def test_the_startup_a_row_includes_is_measured_apart():
    cpu, rss = bench_scale.startup()
    assert cpu > 0 and rss > 0
