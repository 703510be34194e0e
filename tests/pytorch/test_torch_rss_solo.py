"""benchmarks/torch_rss_solo.py: each allocator alone in a fresh process
gives its own peak and idle RSS (a smoke run: one step of one workload)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("ninja")  # torch.utils.cpp_extension builds the shim with it

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "torch_rss_solo.py")


def test_each_allocator_alone_reports_its_peak_and_idle_rss():
    r = subprocess.run([sys.executable, SCRIPT, "--steps", "1", "--json", "mlp_serving"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)["mlp_serving"]
    assert set(row) == {"torch_peak_mib", "torch_idle_mib", "ascmem_peak_mib", "ascmem_idle_mib"}
    for who in ("torch", "ascmem"):  # the step's activations were resident at its peak
        # (the kernel updates VmHWM lazily: the RSS read after it may be a few pages above)
        assert row[f"{who}_peak_mib"] > 0 and row[f"{who}_idle_mib"] <= row[f"{who}_peak_mib"] + 1
