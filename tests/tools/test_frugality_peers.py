"""torch_npu's expandable segments in the frugality tables (issue 42, item 3):
`ascmem bench`'s physical-efficiency table and scripts/frugality_table.py."""
import ascmem.trace as tr
from ascmem.tools.bench import expandable_eager_efficiency
from conftest import load_script


def test_eager_expandable_segments_are_peak_live_over_peak_mapped():
    t = tr.example("decoder_static_cache")
    eff = expandable_eager_efficiency(t)
    report = tr.replay(t, "torch-expandable-eager", capacity=1 << 44)
    assert eff == report["peak_live"] / report["peak_reserved"]
    # whole pages of 2 MiB (small pool) and 20 MiB (large pool): below one
    assert 0 < eff < 1
    # unmapping eagerly never maps more than the smallest capacity it replays in
    assert eff >= tr.efficiency(t, "torch-expandable-eager", resolution=1 << 20)[0] - 1e-9


def test_the_frugality_table_has_both_expandable_columns():
    table = load_script("frugality_table")
    assert {"expandable", "expandable-eager"} <= set(table.COLUMNS)
    t = tr.example("seq2seq_generate")
    row = table.row(t, 1 << 20)
    assert row["expandable"] == tr.efficiency(t, "torch-expandable", 1 << 20)[0]
    assert row["expandable-eager"] == expandable_eager_efficiency(t)


def test_the_markdown_table_bolds_what_misses_a_peer_and_daggers_the_absolute_target():
    table = load_script("frugality_table")
    row = {c: 0.99 for c in table.COLUMNS}
    row.update(trace="t", peak_live=64 << 20, held_out=True, bestfit=0.99,
               **{"pool": 0.98, "pool@planned": 0.986,       # 0.010 and 0.004 below best fit
                  "paged2M@4x": 0.93, "bf+unmap2M": 0.93,     # level with its peers ...
                  "expandable": 0.93, "expandable-eager": 0.93,
                  "bound2M": 0.99})                           # ... yet below 0.95 - 0.005
    bold, dagger = table.misses(row)
    assert bold == {"pool"}
    assert dagger == {"paged2M@4x"}
    md = table.markdown([row]).splitlines()
    assert md[0].count("|") == md[2].count("|") == len(table.COLUMNS) + 3
    assert md[2].startswith("| \\*t | 64.0 | **0.980** | 0.986 |")
    assert "0.930\u2020" in md[2]


def test_heldout_traces_a_rule_was_chosen_on_are_not_starred():
    table = load_script("frugality_table")
    held = {t.name: h for t, h in table.traces([])}
    for name in table.SEEN:
        assert held[name] is False
    assert held["swin_windows"] is True
