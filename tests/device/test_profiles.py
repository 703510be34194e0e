"""The product record: every capability is a named field of profiles.Profile,
so a new product is one record and nothing elsewhere tests a product's name."""
import dataclasses
import pathlib
import re

import pytest

import ascmem
from ascmem import profiles
from ascmem.rules import GiB

CAPABILITIES = ("p2p", "huge1g", "himpi", "virtual_memory", "virtual_memory_in_rc",
                "stream_pools", "external_allocator", "huge_pages_reserved_in_advance")
PACKAGE = pathlib.Path(ascmem.__file__).parent


def test_a_new_product_is_one_record_and_gets_no_capability_by_default():
    p = profiles.Profile(name="test-new-product", title="A product under test",
                         memory_type="DDR", memory=8 * GiB, free_os_memory=8 * GiB,
                         source="[H] a test record")
    for cap in CAPABILITIES:
        assert getattr(p, cap) is False, cap
    assert not p.virtual_memory_in("EP") and p.modes == ("EP",)
    d = ascmem.Device(p)  # a record is enough to build a device from
    assert d.profile is p and d.mode == "EP"
    assert any("P2P allocation policies are not supported" in s for s in d.precautions())
    d.close()


@pytest.mark.parametrize("name", profiles.names())
def test_capabilities_follow_the_record_not_the_name(name):
    p = profiles.get(name)
    renamed = dataclasses.replace(p, name="renamed-" + name, aliases=())
    for cap in CAPABILITIES:
        assert getattr(renamed, cap) == getattr(p, cap), cap
    for mode in p.modes:
        assert renamed.virtual_memory_in(mode) == p.virtual_memory_in(mode)
        assert profiles.precautions(renamed, mode) == profiles.precautions(p, mode)


def test_every_capability_is_a_field():
    fields = {f.name for f in dataclasses.fields(profiles.Profile)}
    assert set(CAPABILITIES) <= fields


def test_no_product_name_is_tested_outside_the_records():
    """Product names appear in profiles.py's records and as defaults or example
    choices elsewhere, never in a comparison or a membership test."""
    names = {n for p in map(profiles.get, profiles.names()) for n in (p.name,) + p.aliases}
    quoted = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    compare = re.compile(rf"(==|!=|\bin\b|\bnot in\b)\s*[\(\[{{]?\s*[\"']({quoted})[\"']"
                         rf"|[\"']({quoted})[\"']\s*(==|!=)")
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")) + sorted(PACKAGE.glob("*.p[yx][xi]")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if compare.search(line):
                offenders.append(f"{path.name}:{i}: {line.strip()}")
    assert not offenders, offenders
    src = (PACKAGE / "profiles.py").read_text()
    assert "frozenset" not in src  # no name sets beside the records
