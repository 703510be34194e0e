"""Property-based: under random policies and sizes the device budget never
goes negative or over its total, free + used == total for every attribute,
and the device stays consistent."""
import warnings

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import ascmem
from ascmem import MemAttr, Policy
from ascmem.rules import MiB

policies = st.sampled_from([0, 1, 2, 3, 6, 0x100, 0x1000, 1 | 0x1000, 2 | 0x100, 99])
sizes = st.one_of(st.integers(1, 4096), st.integers(4097, 2 * MiB), st.integers(2 * MiB, 90 * MiB))


class DeviceMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.model = None

    @precondition(lambda self: self.model is None)
    @rule(model=st.sampled_from(["atlas-inference", "atlas-200", "atlas-training",
                                 "atlas-a2-training"]),
          mode=st.sampled_from(["EP", "RC"]))
    def make(self, model, mode):
        if mode not in ascmem.profiles.get(model).modes:
            mode = "EP"
        mem = 512 * MiB
        self.d = ascmem.Device(model, mode=mode, memory=mem, free_os_memory=mem * 15 // 16)
        self.model = model
        self.live = {}

    @precondition(lambda self: self.model is not None)
    @rule(size=sizes, policy=policies, call=st.sampled_from(["malloc", "malloc_align32", "dvpp_malloc"]))
    def alloc(self, size, policy, call):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ascmem.PrecautionWarning)
            try:
                if call == "dvpp_malloc":
                    a = self.d.dvpp_malloc(size)
                else:
                    a = getattr(self.d, call)(size, policy)
            except (ascmem.OutOfMemoryError, ascmem.UnsupportedError):
                return
        self.live[a] = call

    @precondition(lambda self: self.model is not None and self.live)
    @rule(data=st.data())
    def free(self, data):
        a = data.draw(st.sampled_from(sorted(self.live)))
        (self.d.dvpp_free if self.live.pop(a) == "dvpp_malloc" else self.d.free)(a)

    @precondition(lambda self: self.model is not None)
    @rule()
    def job(self):
        try:
            self.d.begin_job()
        except ascmem.OutOfMemoryError:
            pass

    @precondition(lambda self: self.model is not None)
    @rule()
    def reset(self):
        self.d.reset()
        self.live.clear()

    @invariant()
    def budget_holds(self):
        if self.model is None:
            return
        b = self.d.budget()
        assert 0 <= b["huge_used"] and 0 <= b["normal_used"]
        assert b["huge_used"] + b["normal_used"] + b["fixed"] <= b["total"]
        if not b["huge_grows"]:
            assert b["huge_used"] <= b["reserve"]
        for attr in MemAttr:
            try:
                free, total = self.d.get_mem_info(attr)
            except ascmem.UnsupportedError:  # 1 GiB pages where there are none
                assert not self.d.profile.huge1g and "1G" in attr.name
                continue
            assert 0 <= free <= total
        free, total = self.d.get_mem_info(MemAttr.HBM_MEM if self.d.profile.memory_type == "HBM"
                                          else MemAttr.DDR_MEM)
        assert total - free == b["huge_used"] + b["normal_used"] + b["fixed"]
        self.d.check()


TestDevice = DeviceMachine.TestCase
TestDevice.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
