"""A Device's placement (issue 42): a device that is not paged takes a
contiguous Pool's placements ("kept-in-place", the default,
"kept-to-best-fit", "lowest-equal", "best-fit-end-last") for every pool of every kind, those of
chunks added later and those a reset makes included, as a paged one takes
the paged placements (tests/device/test_paged_placement.py).  A placement of
the other kind, or none, is refused (docs/ARCHITECTURE.md, Note [Contiguous
placements])."""
import pytest

import ascmem
import ascmem.trace as tr
from ascmem.errors import InvalidArgumentError

M = 1 << 20

# (sizes allocated in a row, indexes freed in this order: the last is the
# kept block) -> the index of the freed block whose address a request of
# the kept block's size takes, under each placement: the layouts of
# tests/core/test_contiguous_placement.py, on a device's normal pool
LAYOUTS = {
    "equal below": (([M] * 4, [0, 2]),
                    {"kept-in-place": 2, "kept-to-best-fit": 0, "lowest-equal": 0,
                     "best-fit-end-last": 0}),
    "free above": (([M * 5 // 4] + [M] * 4, [0, 3, 2]),
                   {"kept-in-place": 2, "kept-to-best-fit": 0, "lowest-equal": 2,
                    "best-fit-end-last": 0}),
    "hole below": (([M, M // 2, M, M], [1, 2]),
                   {"kept-in-place": 1, "kept-to-best-fit": 1, "lowest-equal": 2,
                    "best-fit-end-last": 1}),
}


def place_after_kept(dev, sizes, frees):
    """The index of the block whose address the request takes; everything
    freed again after."""
    addrs = [dev.malloc(s, ascmem.Policy.NORMAL_ONLY) for s in sizes]
    for i in frees:
        dev.free(addrs[i])
    got = dev.malloc(sizes[frees[-1]], ascmem.Policy.NORMAL_ONLY)
    dev.check()
    dev.free(got)
    for i, a in enumerate(addrs):
        if i not in frees:
            dev.free(a)
    dev.check()
    return addrs.index(got)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_device_places_as_the_pool_of_its_placement(layout):
    (sizes, frees), want = LAYOUTS[layout]
    got = {}
    for placement in tr.CONTIGUOUS_PLACEMENTS:
        with ascmem.Device("atlas-a2-training", memory=8 << 30, placement=placement) as dev:
            assert dev.placement == placement
            got[placement] = place_after_kept(dev, sizes, frees)
    assert got == want


def test_the_default_is_kept_in_place():
    with ascmem.Device("atlas-a2-training", memory=8 << 30) as dev:
        assert dev.placement == "kept-in-place"
        assert place_after_kept(dev, *LAYOUTS["equal below"][0]) == 2


def test_a_reset_keeps_the_placement():
    (sizes, frees), want = LAYOUTS["equal below"]
    with ascmem.Device("atlas-a2-training", memory=8 << 30, placement="kept-to-best-fit") as dev:
        for _ in range(2):
            dev.malloc(3 * M, ascmem.Policy.NORMAL_ONLY)  # a live block the reset drops
            dev.reset()
            assert dev.placement == "kept-to-best-fit"
            assert place_after_kept(dev, sizes, frees) == want["kept-to-best-fit"]


@pytest.mark.parametrize("placement", tr.CONTIGUOUS_PLACEMENTS)
def test_a_chunk_added_later_takes_the_placement(placement):
    """A pool that grows by chunks: its first chunk of 2 MiB nearly full, the
    layout's blocks all come from the 8 MiB chunk added after it."""
    (sizes, frees), want = LAYOUTS["equal below"]
    with ascmem.Device("atlas-a2-training", backend="host", memory=8 << 30,
                       pool_sizes={"normal": (2 << 20, 64 << 20)}, placement=placement) as dev:
        first = dev.malloc(3 * M // 2, ascmem.Policy.NORMAL_ONLY)
        dev.free(dev.malloc(8 * M, ascmem.Policy.NORMAL_ONLY))  # the chunk the layout takes
        assert dev.stats()["normal"]["chunks"] == 2
        assert place_after_kept(dev, sizes, frees) == want[placement]
        assert dev.stats()["normal"]["chunks"] == 2
        dev.free(first)
        dev.check()


@pytest.mark.parametrize("name", ["resnet18_train", "video_pipeline"])
def test_a_device_replays_a_shipped_trace_under_each_placement(name):
    """Each placement replays a recorded run through a Device with no
    failure and leaves it intact: the figures `ascmem plan` compares.  On
    resnet18_train best fit's choice holds 6 MiB fewer pages at the peak
    than reuse in place; on video_pipeline the three tie."""
    t = tr.example(name)
    peaks = {}
    for placement in tr.CONTIGUOUS_PLACEMENTS:
        with ascmem.Device("atlas-a2-training", memory=120 << 30, placement=placement) as dev:
            peak, failures, _ = tr.device_footprint(t, dev)
            assert not failures and peak >= t.peak_live()
            dev.check()
        peaks[placement] = peak
    if name == "resnet18_train":
        assert peaks["kept-to-best-fit"] == peaks["kept-in-place"] - 6 * M
    else:
        assert len(set(peaks.values())) == 1


@pytest.mark.parametrize("kwargs", [
    {"placement": "packed"},  # a paged device's, on one that is not paged
    {"placement": "granules"},
    {"paged": True, "placement": "kept-to-best-fit"},  # a contiguous one, on a paged device
    {"paged": True, "placement": "lowest-equal"},
    {"paged": True, "placement": "kept-in-place"},
    {"placement": "best-fit"},
    {"placement": 3},
    {"placement": b"lowest-equal"},
])
def test_a_placement_the_device_cannot_take_is_refused(kwargs):
    with pytest.raises(InvalidArgumentError, match="placement"):
        ascmem.Device("atlas-a3", memory=8 << 30, **kwargs)
