import pytest

import ascmem


MiB = 1 << 20
BASE = 1 << 32  # a non-zero base, so that address 0 is never a valid block


def make_pool(size=64 * MiB):
    return ascmem.Pool(size, base=BASE)


def make_buddy(size=64 * MiB):
    return ascmem.BuddyAllocator(size, base=BASE)


@pytest.fixture
def acl_a2_device():
    """An Atlas A2 training Device behind the ascmem.acl drop-in (stream pools
    exist on A2 only), taken off again after the test."""
    from ascmem import acl
    d = ascmem.Device("atlas-a2-training")
    acl.use(d)
    yield d
    acl.use(None)


@pytest.fixture(params=["pool", "buddy"])
def allocator(request):
    """One contract suite over every allocator variant."""
    return make_pool() if request.param == "pool" else make_buddy()


def pytest_collection_modifyitems(config, items):
    """Marks the tests slow_tests.py lists as slow (see pyproject's markers)."""
    from slow_tests import SLOW_FILES, SLOW_TESTS
    for item in items:
        path = item.nodeid.split("::")[0]
        test = "::".join(item.nodeid.split("[")[0].split("::")[:2])
        if path in SLOW_FILES or test in SLOW_TESTS:
            item.add_marker("slow")
