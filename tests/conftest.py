import pytest

import ascmem


MiB = 1 << 20
BASE = 1 << 32  # a non-zero base, so that address 0 is never a valid block


def make_pool(size=64 * MiB):
    return ascmem.Pool(size, base=BASE)


def make_buddy(size=64 * MiB):
    return ascmem.BuddyAllocator(size, base=BASE)


@pytest.fixture(params=["pool", "buddy"])
def allocator(request):
    """One contract suite over every allocator variant."""
    return make_pool() if request.param == "pool" else make_buddy()
