"""scripts/bestfit_units.py: best fit's efficiency at each rounding unit beside
the Pool's (issue 42: how far the reference itself moves with its unit)."""
import json
import os

import pytest

import ascmem.trace as tr
from ascmem.emulations.reference import BestFit
from conftest import ROOT, load_script



def test_rows_are_the_pool_and_best_fit_at_each_unit():
    script = load_script("bestfit_units")
    t = tr.example("seq2seq_generate")
    row = script.row(t, [64, 4096])
    res = script.RESOLUTION
    assert row["pool"] == tr.efficiency(t, "pool", res)[0]
    assert row["bestfit64"] == tr.efficiency(t, "bestfit", res)[0]  # issue 42's reference
    # the compiled peer at 4 KiB is the readable reference at 4 KiB
    cap = tr.min_capacity(t, lambda c: BestFit(c, 4096), res)
    assert row["bestfit4096"] == t.peak_live() / cap


def test_main_prints_and_writes_the_rows_asked_for(tmp_path, capsys):
    script = load_script("bestfit_units")
    out = tmp_path / "rows.json"
    assert script.main(["--units", "64,512", "--only", "seq2seq_generate", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["trace"] for r in rows] == ["seq2seq_generate"]
    assert set(rows[0]) >= {"pool", "bestfit64", "bestfit512", "heldout"}
    assert "seq2seq_generate" in capsys.readouterr().out


@pytest.mark.parametrize("units", ["64,x", "0", "-64"])
def test_bad_units_are_a_usage_error(units):
    with pytest.raises(SystemExit) as e:
        load_script("bestfit_units").main(["--units", units, "--only", "none"])
    assert e.value.code == 2
