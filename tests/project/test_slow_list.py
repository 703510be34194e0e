"""Every entry of slow_tests.py names a test file or a test that exists, so
the quick subset (`pytest -m "not slow"`) leaves out what it says."""
import os
import re

from slow_tests import SLOW_FILES, SLOW_TESTS
from conftest import ROOT


def test_every_slow_entry_exists():
    missing = [f for f in SLOW_FILES if not os.path.exists(os.path.join(ROOT, f))]
    for entry in SLOW_TESTS:
        path, name = entry.split("::")
        full = os.path.join(ROOT, path)
        if not os.path.exists(full):
            missing.append(entry)
            continue
        with open(full, encoding="utf-8") as f:
            if not re.search(rf"^(def {name}\(|class {name}\b|{name} = )", f.read(), re.M):
                missing.append(entry)
    assert not missing, missing
