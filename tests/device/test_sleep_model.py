"""A Hypothesis state machine for sleep and wake on a paged host Device:
tagged and untagged blocks of every size class, sleep with and without
keep, wake, frees of sleeping blocks, empty_cache and views, with and
without a release threshold, against a model that knows which blocks are
live, which tags sleep, and what bytes each block holds."""
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import ascmem
from conftest import MiB

TAGS = ("kv", "weights", None)
sizes = st.one_of(st.integers(1, 32 << 10), st.integers((32 << 10) + 1, 3 * MiB),
                  st.integers(3 * MiB, 9 * MiB))


def in_a_slab(size):
    """Whether malloc(size) lands in a slab slot: the Device adds the
    runtime's 32 bytes and rounds to 32 (aclrtMalloc's rule), and slabs
    take up to 32 KiB."""
    return (size + 31) // 32 * 32 + 32 <= 32 << 10


class SleepModel(RuleBasedStateMachine):
    threshold = 0
    blocks = Bundle("blocks")

    def __init__(self):
        super().__init__()
        self.d = ascmem.Device("atlas-a2-training", memory=512 * MiB, backend="host",
                               paged=True, release_threshold=self.threshold)
        self.live = {}      # addr -> [size, tag, marker byte or None (contents discarded)]
        self.asleep = {}    # tag -> keep
        self.known = set()  # tags some block was allocated with: only those may sleep
        self.marker = 0

    def _mark(self, addr):
        size = self.live[addr][0]
        self.marker = self.marker % 250 + 1
        arr = self.d.as_array(addr, size)
        arr[0] = arr[size - 1] = arr[size // 2] = self.marker
        del arr
        self.live[addr][2] = self.marker

    def _expect(self, addr):
        size, _, marker = self.live[addr]
        arr = self.d.as_array(addr, size)
        got = (int(arr[0]), int(arr[size // 2]), int(arr[size - 1]))
        del arr
        assert got == (marker,) * 3, (hex(addr), size, got, marker)

    def _charged(self):
        b = self.d.budget()
        return b["huge_used"] + b["normal_used"]

    @rule(target=blocks, size=sizes, tag=st.sampled_from(TAGS))
    def malloc(self, size, tag):
        if tag in self.asleep:
            with pytest.raises(ascmem.InvalidArgumentError, match="asleep"):
                self.d.malloc(size, tag=tag)
            return None
        try:
            addr = self.d.malloc(size, tag=tag)
        except ascmem.OutOfMemoryError:
            return None
        for other, (n, _, _) in self.live.items():
            assert addr + size <= other or other + n <= addr, "overlap"
        self.live[addr] = [size, tag, None]
        self.known.add(tag)
        self._mark(addr)
        return addr

    @rule(addr=consumes(blocks))
    def free(self, addr):
        if addr is None:
            return
        self.d.free(addr)  # asleep or not
        del self.live[addr]

    @rule(tag=st.sampled_from(TAGS[:2]), keep=st.booleans())
    def sleep(self, tag, keep):
        if tag in self.asleep:
            with pytest.raises(ascmem.InvalidArgumentError, match="asleep already"):
                self.d.sleep(tag, keep=keep)
            return
        if tag not in self.known:
            with pytest.raises(ascmem.InvalidArgumentError, match="no block was ever allocated"):
                self.d.sleep(tag, keep=keep)
            return
        before = self._charged()
        released = self.d.sleep(tag, keep=keep)
        assert released == before - self._charged()  # one thread: the budget's drop, exactly
        self.asleep[tag] = keep

    @rule(tag=st.sampled_from(TAGS[:2]))
    def wake(self, tag):
        if tag not in self.asleep:
            with pytest.raises(ascmem.InvalidArgumentError, match="not asleep"):
                self.d.wake(tag)
            return
        before = self._charged()
        try:
            mapped = self.d.wake(tag)
        except ascmem.OutOfMemoryError:
            self.d.check()  # all or nothing: still asleep
            return
        assert 0 <= self._charged() - before <= mapped  # kept granules are charged already
        keep = self.asleep.pop(tag)
        for addr, (size, t, _) in self.live.items():
            if t == tag:
                if keep or in_a_slab(size):  # slab slots stay resident, contents in place
                    self._expect(addr)
                self._mark(addr)

    @rule(addr=blocks)
    def view(self, addr):
        if addr is None or addr not in self.live:
            return
        if self.live[addr][1] in self.asleep:
            with pytest.raises(ascmem.InvalidArgumentError, match="asleep"):
                self.d.buffer(addr)
            return
        self._expect(addr)

    @rule()
    def empty_cache(self):
        self.d.empty_cache()

    @invariant()
    def device_is_whole(self):
        s = self.d.stats()
        live = sum(s[k]["live_count"] for k in ("huge", "normal"))
        assert live == len(self.live)
        self.d.check()

    def teardown(self):
        for tag in list(self.asleep):
            self.d.wake(tag)
        for addr in list(self.live):
            self.d.free(addr)
        self.d.empty_cache()
        self.d.check()
        assert self.d.budget()["huge_used"] == 0
        self.d.close()


class KeptGranulesModel(SleepModel):
    threshold = 32 * MiB


TestSleep = SleepModel.TestCase
TestSleep.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestSleepWithAThreshold = KeptGranulesModel.TestCase
TestSleepWithAThreshold.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
