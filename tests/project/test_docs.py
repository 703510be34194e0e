"""The documentation names only what exists: every test and every file of this
repository that README.md, BENCHMARKS.md, CHANGELOG.md and docs/*.md cite,
and every entry of ARCHITECTURE.md's file list."""
import glob
import os
import re

import pytest
from conftest import ROOT

DOCS = ["README.md", "BENCHMARKS.md", "CHANGELOG.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
# folders of this repository a cited path may start with; src/ only as
# src/ascmem (other src/ paths the docs cite are hicann/runtime's and
# hicann/driver's), docs/ not docs/zh (hicann/runtime's documentation)
PATH = re.compile(r"(?<![\w/.-])((?:csrc|src/ascmem|tests|scripts|benchmarks|docs(?!/zh/)|fuzz|"
                  r"examples|\.ci)/[\w.*/-]*\w)")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
TEST_NAME = re.compile(r"(?<![\w:/])(test_\w+)(?![\w.])")  # not a file's name


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _code_spans(text):
    """The text inside `backticks` (not fenced blocks)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def _defined_test_names():
    names = set()
    for pattern in ("tests/**/*.py", "benchmarks/*.py"):
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            names.update(re.findall(r"def (\w+)\(", _read(os.path.relpath(path, ROOT))))
    for path in glob.glob(os.path.join(ROOT, "csrc", "tests", "*.c")):
        names.update(re.findall(r"^static \w+ (\w+)\(", _read(os.path.relpath(path, ROOT)), re.M))
    return names


def _existing_docs():
    return [d for d in DOCS if os.path.exists(os.path.join(ROOT, d))]


@pytest.mark.parametrize("doc", _existing_docs())
def test_every_cited_test_exists(doc):
    defined = _defined_test_names()
    missing = []
    for span in _code_spans(_read(doc)):
        for path, name in TEST_REF.findall(span):
            if not os.path.exists(os.path.join(ROOT, path)):
                missing.append(path)
            elif not re.search(rf"def {name}\(", _read(path)):
                missing.append(f"{path}::{name}")
        for name in TEST_NAME.findall(TEST_REF.sub("", span)):
            if name not in defined:
                missing.append(name)
    assert not missing, f"{doc} cites tests that do not exist: {missing}"


@pytest.mark.parametrize("doc", _existing_docs())
def test_every_cited_file_exists(doc):
    missing = []
    for span in _code_spans(_read(doc)):
        for path in PATH.findall(TEST_REF.sub(lambda m: m.group(1), span)):
            if not glob.glob(os.path.join(ROOT, path)):
                missing.append(path)
    assert not missing, f"{doc} cites files that do not exist: {missing}"


def test_the_architecture_file_list_is_the_tree():
    """Each entry of the Files block under csrc/ and src/ascmem/ exists."""
    text = _read("docs/ARCHITECTURE.md")
    block = text.split("## Files", 1)[1].split("```")[1]
    folder, missing = None, []
    for line in block.splitlines():
        top = re.match(r"^(\S+/)\s", line + " ")
        if top:
            folder = top.group(1) if top.group(1) in ("csrc/", "src/ascmem/") else None
            continue
        entry = re.match(r"^  (\S+)", line)
        if folder and entry:
            for name in entry.group(1).rstrip(",").split(","):
                if name and not os.path.exists(os.path.join(ROOT, folder, name)):
                    missing.append(folder + name)
    assert not missing, missing


def test_the_docs_do_not_point_outside_the_repository():
    """A clone has only the repository: no doc reads ../shared or the like."""
    for doc in _existing_docs():
        assert "../shared" not in _read(doc), doc


def test_every_reliability_row_names_its_test():
    """docs/RELIABILITY.md is a table of faults and bad input: each row's last
    cell cites the test that checks it (a test, a test file, a fuzz
    reproducer or the CI step), or says plainly that no test injects it.
    That the cited tests exist is test_every_cited_test_exists's part."""
    rows = [line for line in _read("docs/RELIABILITY.md").splitlines()
            if line.startswith("|") and not re.match(r"\|\s*(-|fault or bad input\b|what\b)", line)]
    assert len(rows) > 100
    uncited = []
    for row in rows:
        last = row.strip().strip("|").split(" | ")[-1]
        spans = re.findall(r"`([^`]+)`", last)
        if not any(re.search(r"(^|/)test_\w+|tests/|fuzz/|\.ci/run|scripts/", s) for s in spans) \
                and not last.startswith("not injected by a test"):
            uncited.append(row[:100])
    assert not uncited, uncited
