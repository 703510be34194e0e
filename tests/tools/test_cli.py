"""The ascmem command, run as a subprocess."""
import json
import subprocess
import sys

import pytest
from conftest import ROOT


def run(*args):
    return subprocess.run([sys.executable, "-m", "ascmem", *args], capture_output=True, text=True,
                          timeout=300)


def test_replay_example_is_the_main_job():
    r = run("replay", "--example", "video_pipeline")
    assert r.returncode == 0, r.stderr
    assert "peak live, dvpp" in r.stdout and "failures" in r.stdout


def test_replay_json():
    r = run("replay", "--example", "batch_inference", "--json")
    assert r.returncode == 0
    rep = json.loads(r.stdout)
    assert rep["failures"] == 0 and rep["peak_live"] > 0


def test_replay_with_failures_exits_1(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("op,id,size\na,1,1048576\na,2,1048576\n")
    r = run("replay", str(t), "--allocator", "pool", "--capacity", "1MiB")
    assert r.returncode == 1 and "first failure" in r.stdout


def test_info():
    r = run("info", "--model", "atlas-training")
    assert r.returncode == 0 and "AI CPU" in r.stdout and "HBM_MEM" in r.stdout


def test_fit_side_by_side():
    r = run("fit", "--example", "batch_inference", "--allocator", "pool", "--allocator", "buddy",
            "--resolution", "1MiB")
    assert r.returncode == 0 and "pool" in r.stdout and "buddy" in r.stdout


@pytest.mark.parametrize("args,code,text", [
    (("info", "--model", "atlas-9000"), 2, "unknown product"),
    (("replay", "--example", "nope"), 2, "unknown example"),
    (("replay",), 2, "give a trace"),
    (("frobnicate",), 2, "invalid choice"),
])
def test_errors_are_one_clear_line(args, code, text):
    r = run(*args)
    assert r.returncode == code and text in r.stderr
    assert "Traceback" not in r.stderr


def test_malformed_trace_exits_2(tmp_path):
    t = tmp_path / "bad.csv"
    t.write_text("op,id,size\nz,1,1\n")
    r = run("replay", str(t))
    assert r.returncode == 2 and "bad.csv:2" in r.stderr and "Traceback" not in r.stderr


def test_bench_quick_smoke():
    r = run("bench", "--quick")
    assert r.returncode == 0, r.stderr
    assert "efficiency" in r.stdout and "floor" in r.stdout


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.png"
    r = run("replay", "--example", "batch_inference", "--plot", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_version_and_the_product_list():
    import ascmem
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"ascmem {ascmem.__version__}"
    r = run("info", "--list")
    assert r.returncode == 0
    names = {line.split()[0] for line in r.stdout.splitlines()[2:]}
    assert set(ascmem.profiles.names()) <= names


def test_shipped_examples_come_through_importlib_resources():
    from ascmem import trace
    assert {"video_pipeline", "batch_inference", "many_small"} <= set(trace.example_names())
    assert len(trace.example("video_pipeline").events) == 4313
    with pytest.raises(trace.TraceError, match="shipped"):
        trace.example("no_such_workload")


def test_the_stubs_cover_the_compiled_classes():
    """_core.pyi names every public method of the compiled classes (mypy and
    editors read it; scripts/typecheck.py runs mypy --strict in CI)."""
    import ast
    import os
    import ascmem
    here = os.path.dirname(ascmem.__file__)
    tree = ast.parse(open(os.path.join(here, "_core.pyi"), encoding="utf-8").read())
    stubbed = {c.name: {f.name for f in c.body if isinstance(f, ast.FunctionDef)}
               for c in tree.body if isinstance(c, ast.ClassDef)}
    assert os.path.exists(os.path.join(here, "py.typed"))
    for cls in (ascmem.Pool, ascmem.BuddyAllocator, ascmem.Device):
        public = {n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))}
        assert public <= stubbed[cls.__name__], public - stubbed[cls.__name__]


def test_signatures_docstrings_and_warnings_point_at_the_caller():
    import inspect
    import warnings
    import ascmem
    assert "host_memory" in inspect.signature(ascmem.Device).parameters
    assert list(inspect.signature(ascmem.Pool).parameters)[0] == "size"
    for cls in (ascmem.Pool, ascmem.BuddyAllocator, ascmem.Device):
        for name, fn in vars(cls).items():
            if not name.startswith("_") and callable(getattr(cls, name)):
                assert getattr(cls, name).__doc__, f"{cls.__name__}.{name} has no docstring"
    for kw in inspect.signature(ascmem.Device).parameters:
        assert f"``{kw}``" in ascmem.Device.__doc__, f"Device docstring does not document {kw}"
    d = ascmem.Device("atlas-200", mode="RC")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(100):
            try:
                d.malloc(64 << 20, 1)  # this line is the warning's
            except ascmem.OutOfMemoryError:
                break
    assert got and got[0].filename == __file__


def test_sizes_take_units_and_a_trace_comes_from_stdin(tmp_path):
    r = run("replay", "--example", "batch_inference", "--allocator", "pool",
            "--capacity", "400MiB", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["failures"] == 0
    r = run("fit", "--example", "video_pipeline", "--allocator", "pool", "--resolution", "256KiB")
    assert r.returncode == 0 and "256 KiB" in r.stdout
    r = run("replay", "--example", "video_pipeline", "--allocator", "pool", "--capacity", "12 parsecs")
    assert r.returncode == 2 and "not a size" in r.stderr
    text = "op,id,size\na,1,5000\nf,1,\n"
    r = subprocess.run([sys.executable, "-m", "ascmem", "replay", "-", "--json"], input=text,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["peak_live"] == 5000


def test_flags_that_do_nothing_are_usage_errors():
    r = run("replay", "--example", "video_pipeline", "--capacity", "1GiB")  # device target
    assert r.returncode == 2 and "--capacity" in r.stderr
    r = run("info", "--model", "atlas-training", "--mode", "RC")  # no RC on training products
    assert r.returncode == 2 and "no RC mode" in r.stderr


def test_fit_paged_reports_physical_efficiency():
    r = run("fit", "--example", "encoder_varlen", "--allocator", "pool", "--paged",
            "--granule", "2MiB", "--granule", "64KiB", "--resolution", "1MiB")
    assert r.returncode == 0, r.stderr
    assert "paged pool, 2 MiB granules" in r.stdout and "paged pool, 64 KiB granules" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("paged pool")]
    effs, bounds = [float(w[-2]) for w in rows], [float(w[-1]) for w in rows]
    assert len(effs) == 2 and all(0.9 < e <= b <= 1.0 for e, b in zip(effs, bounds))


def test_fit_paged_bound_is_the_peak_in_whole_granules():
    """decoder_kvcache: 22.46 MiB live at its peak needs 12 granules of 2 MiB,
    so 0.936 is the most any placement reaches (and the pool reaches it)."""
    r = run("fit", "--example", "decoder_kvcache", "--allocator", "pool", "--granule", "2MiB",
            "--resolution", "4MiB", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (paged,) = doc["paged"]
    assert 22 << 20 < doc["peak_live"] <= 24 << 20
    assert paged["bound"] == doc["peak_live"] / (24 << 20)
    assert paged["physical_efficiency"] == paged["bound"]


def test_replay_paged_json():
    r = run("replay", "--example", "decoder_kvcache", "--paged", "--granule", "64KiB", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["granule"] == 64 << 10 and rep["peak_mapped"] >= rep["peak_live"]
    assert rep["physical_efficiency"] > 0.95


@pytest.mark.parametrize("args,text", [
    (("replay", "--example", "encoder_varlen", "--paged", "--capacity", "1GiB"), "--paged"),
    (("replay", "--example", "encoder_varlen", "--paged", "--allocator", "buddy"), "--paged"),
    (("fit", "--example", "encoder_varlen", "--granule", "3000B"), "power of two"),
])
def test_paged_usage_errors(args, text):
    r = run(*args)
    assert r.returncode == 2 and text in r.stderr


def test_real_traces_ship_as_examples():
    from ascmem import trace
    from ascmem.cli import EXAMPLE_MODELS
    assert set(EXAMPLE_MODELS) == set(trace.example_names())  # each has a default product
    real = sorted(set(trace.example_names()) - {"video_pipeline", "batch_inference", "many_small"})
    assert len(real) == 17  # the built examples aside, each is a recording (record_traces.py)
    for name in real:
        t = trace.example(name)
        allocs = sum(e.op == "a" for e in t.events)
        frees = sum(e.op == "f" for e in t.events)
        assert allocs > 500 and frees <= allocs and t.peak_live() > 4 << 20


def test_snapshot_at_peak_and_uncapped_history(tmp_path):
    import pickle
    t = tmp_path / "t.csv"
    lines = ["op,id,size"] + [f"a,{i},4096" for i in range(6000)] + \
        [f"f,{i},4096" for i in range(6000)]  # frees everything: the end is empty
    t.write_text("\n".join(lines) + "\n")
    out = tmp_path / "peak.pickle"
    r = run("snapshot", str(t), "--at-peak", "-o", str(out))
    assert r.returncode == 0, r.stderr
    snap = pickle.loads(out.read_bytes())
    live = sum(b["size"] for s in snap["segments"] for b in s["blocks"]
               if b["state"] == "active_allocated")
    assert live >= 6000 * 4096
    assert len(snap["device_traces"][0]) == 6000  # the allocations up to the peak, none dropped
    end = tmp_path / "end.pickle"
    assert run("snapshot", str(t), "-o", str(end)).returncode == 0
    assert len(pickle.loads(end.read_bytes())["device_traces"][0]) == 6000 + 2 * 6000  # > 10,000
    capped = tmp_path / "capped.pickle"
    assert run("snapshot", str(t), "--max-entries", "100", "-o", str(capped)).returncode == 0
    assert len(pickle.loads(capped.read_bytes())["device_traces"][0]) <= 200


def test_exit_codes_are_the_same_for_every_command(tmp_path):
    missing = str(tmp_path / "missing.csv")
    for cmd in ("replay", "fit", "snapshot"):
        assert run(cmd, missing).returncode == 2  # input error
    assert run("info", "--model", "atlas-200", "--mode", "RC").returncode == 0
    assert run("replay", "--example", "many_small", "--model", "atlas-training",
               "--mode", "RC").returncode == 2  # a mode the product lacks: usage


def test_plot_checks_matplotlib_first_and_leaves_its_backend_alone(tmp_path, monkeypatch, capsys):
    import sys
    from ascmem import cli
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert cli.main(["replay", "--example", "batch_inference", "--plot",
                     str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr()
    assert "pip install matplotlib" in err.err and "ascmem replay:" not in err.out
    monkeypatch.undo()
    mpl = pytest.importorskip("matplotlib")
    before = mpl.get_backend()
    assert cli.main(["replay", "--example", "batch_inference", "--plot",
                     str(tmp_path / "p.png")]) == 0
    assert mpl.get_backend() == before and (tmp_path / "p.png").stat().st_size > 1000


@pytest.mark.parametrize("args", [("info",), ("info", "--list"),
                                  ("replay", "--example", "many_small"),
                                  ("fit", "--example", "encoder_varlen", "--allocator", "pool",
                                   "--resolution", "4MiB", "--paged"),
                                  ("replay", "--example", "encoder_varlen", "--paged")])
def test_every_command_speaks_versioned_json(args):
    r = run(*args, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == f"ascmem.{args[0]}/1" and doc["command"] == args[0]
    import ascmem
    assert doc["ascmem"] == ascmem.__version__
    if args[0] == "replay":
        assert set(doc["timing"]) == {"seconds", "ops_per_sec"} and "ops_per_sec" not in doc
        again = json.loads(run(*args, "--json").stdout)
        del doc["timing"], again["timing"]
        assert doc == again  # no run-to-run noise outside timing


def test_snapshot_json(tmp_path):
    r = run("snapshot", "--example", "many_small", "-o", str(tmp_path / "s.pickle"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "ascmem.snapshot/1" and doc["snapshot"].endswith("s.pickle")


@pytest.mark.parametrize("args,text", [
    (("replay", "--example", "many_small", "--at-peak"), "--snapshot"),
    (("replay", "--example", "many_small", "--allocator", "pool", "--model", "atlas-training"),
     "--model and --mode"),
    (("replay", "--example", "many_small", "--paged", "--mode", "EP"), "--model and --mode"),
    (("replay", "--example", "many_small", "--device", "cuda"), "--device"),
    (("fit", "--example", "many_small", "--device", "cpu"), "--device"),
])
def test_flags_that_would_do_nothing_are_usage_errors(args, text):
    r = run(*args)
    assert r.returncode == 2 and text in r.stderr


def test_the_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    """Every ```python block of README.md runs as written (mypy checks them
    too: scripts/typecheck.py)."""
    import importlib.util
    import os
    import re
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)  # the trace example saves a file
    for i, block in enumerate(blocks):
        if "ascmem.torch" in block and importlib.util.find_spec("torch") is None:
            continue  # PyTorch's block needs PyTorch (the ASan run has none)
        exec(compile(block, f"README.md python block {i}", "exec"), {})
