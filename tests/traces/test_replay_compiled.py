"""The compiled replays (ascmem._core.replay_device, ascmem._replay_peers,
raw_cann over columns) give the figures of the Python loop with the Python
references, on every shipped trace; bad columns get typed errors."""

import glob
import os
import warnings

import numpy as np
import pytest

import ascmem
from ascmem import _replay_peers
from ascmem.emulations import raw_cann
from ascmem.emulations import reference
from ascmem.emulations import torch_caching
from ascmem.emulations import torch_expandable
from ascmem import trace as tr
from ascmem.errors import ArgumentTypeError, InvalidArgumentError
from conftest import TESTS

HELDOUT = sorted(glob.glob(os.path.join(TESTS, "data", "heldout", "*.csv.gz")))
TRACES = tr.example_names() + HELDOUT

REFERENCES = {
    "bestfit": reference.BestFit,
    "bestfit-wilderness": reference.BestFitWilderness,
    "torch-caching": torch_caching.TorchCachingAllocator,
    "torch-expandable": torch_expandable.TorchExpandableSegments,
    "torch-expandable-eager": lambda cap: torch_expandable.TorchExpandableSegments(cap, eager=True),
}

_loaded = {}


def _trace(name):
    if name not in _loaded:
        _loaded[name] = tr.load(name) if name.endswith(".gz") else tr.example(name)
    return _loaded[name]


def _figures(report):
    return {k: v for k, v in report.items() if k not in ("ops_per_sec", "seconds", "curve_live")}


def _python_device_replay(trace, dev, **kw):
    """The Python loop through a Device (curve=True keeps replay() off the
    compiled loop), without the per-kind curve the compiled one has not."""
    rep = tr.replay(trace, dev, curve=True, **kw)
    rep.pop("curve_live")
    return rep


@pytest.mark.parametrize("name", TRACES)
@pytest.mark.parametrize("peer", sorted(REFERENCES))
def test_a_compiled_peer_gives_its_python_references_figures(monkeypatch, name, peer):
    monkeypatch.delenv("PYTORCH_NPU_ALLOC_CONF", raising=False)
    t = _trace(name)
    peak = t.peak_live()
    # roomy: no failure; tight: failures, the retries and cache releases before them
    for cap, stop in ((4 * peak + (1 << 30), False), (peak * 11 // 10, False),
                      (peak * 11 // 10, True)):
        ref, compiled = REFERENCES[peer](cap), tr.make_allocator(peer, cap)
        assert isinstance(compiled, _replay_peers._Peer)
        a = tr.replay(t, ref, stop_at_failure=stop, curve="used")
        b = tr.replay(t, compiled, stop_at_failure=stop, curve="used")
        assert _figures(a) == _figures(b), (peer, cap, stop)
        assert list(a.get("per_kind_peak_live", {})) == list(b.get("per_kind_peak_live", {}))
        assert getattr(ref, "high_water", None) == getattr(compiled, "high_water", None)
        if hasattr(ref, "stats"):
            assert ref.stats() == compiled.stats()


@pytest.mark.parametrize("name", TRACES)
def test_the_compiled_device_replay_gives_the_python_loops_figures(name):
    t = _trace(name)
    for memory in (120 << 30, max(t.peak_live() // 2, 64 << 20)):
        for stop in (False, True):
            a_dev = ascmem.Device("atlas-a2-training", memory=memory)
            b_dev = ascmem.Device("atlas-a2-training", memory=memory)
            with warnings.catch_warnings(record=True) as wa:
                warnings.simplefilter("always")
                a = _python_device_replay(t, a_dev, stop_at_failure=stop)
            with warnings.catch_warnings(record=True) as wb:
                warnings.simplefilter("always")
                b = tr.replay(t, b_dev, stop_at_failure=stop, curve="used")
            assert _figures(a) == _figures(b), (memory, stop)
            assert list(a.get("per_kind_peak_live", {})) == list(b.get("per_kind_peak_live", {}))
            assert a_dev.budget() == b_dev.budget()
            assert a_dev.stats() == b_dev.stats()
            assert sorted(map(str, (w.message for w in wa))) == \
                sorted(map(str, (w.message for w in wb)))
            b_dev.check()
            peak, failures, _ = tr.device_footprint(t, ascmem.Device("atlas-a2-training",
                                                                     memory=memory))
            if not stop:
                assert (peak, failures) == (max(a["curve_used"], default=0), a["failures"])


@pytest.mark.parametrize("name", TRACES)
def test_raw_cann_over_columns_gives_the_event_by_event_figures(name):
    t = _trace(name)
    for model, mode in (("atlas-a2-training", None), ("atlas-200", "RC")):
        dev = ascmem.Device(model, mode=mode)
        a, b = raw_cann.peak_by_event(t, dev, curve=True), raw_cann.peak(t, dev, curve=True)
        assert a == b
        assert list(a["per_kind_peak"]) == list(b["per_kind_peak"])


@pytest.mark.parametrize("name", TRACES)
def test_bestfit_unmapped_peak_compiled_is_the_references(name):
    t = _trace(name)
    c = t.columns
    for granule in (64 << 10, 2 << 20):
        assert reference.bestfit_unmapped_peak(t, granule) == \
            _replay_peers.bestfit_unmapped_peak(c.alloc, t.slots(), c.size, granule)


def test_every_allocator_stops_a_bisection_step_at_the_first_failure():
    t = tr.example("gru_lm")
    names = [n for n in tr.ALLOCATORS if n != "tlsf" or tr.tlsf_available()]
    for name in names:
        rep = tr.replay(t, name, capacity=max(t.peak_live() // 3, 1 << 20), stop_at_failure=True)
        assert rep["failures"] == 1, name
        assert rep["first_failure"] is not None


def test_fit_finds_the_same_capacity_with_the_compiled_peers():
    t = tr.load(HELDOUT[0])
    for name, ref in REFERENCES.items():
        assert tr.min_capacity(t, name) == tr.min_capacity(t, ref), name


def test_a_caching_conf_the_compiled_peer_lacks_keeps_the_reference(monkeypatch):
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:64")
    assert isinstance(tr.make_allocator("torch-caching", 1 << 30),
                      torch_caching.TorchCachingAllocator)
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "roundup_power2_divisions:4")
    got = tr.make_allocator("torch-caching", 1 << 30)
    assert isinstance(got, _replay_peers.TorchCachingAllocator) and got.divisions == 4
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    assert isinstance(tr.make_allocator("torch-caching", 1 << 30),
                      _replay_peers.TorchExpandableSegments)


def test_rounding_with_divisions_is_the_references():
    compiled = _replay_peers.TorchCachingAllocator(1 << 40, roundup_power2_divisions=4)
    for size in list(range(1, 5000, 37)) + [1 << k for k in range(10, 40)] + [3 << 30, 5 << 20]:
        assert compiled.round_size(size) == torch_caching.round_request(size, 32, 4), size


# ---- bad input ----------------------------------------------------------------------------

def _columns(n=4):
    alloc = np.array([1, 1, 0, 0], np.uint8)[:n]
    slot = np.array([0, 1, 0, 1], np.int64)[:n]
    size = np.array([100, 200, 100, 200], np.uint64)[:n]
    kind = np.zeros(n, np.uint8)
    return alloc, slot, size, kind


@pytest.mark.parametrize("bad", ["dtype", "length", "slot", "strided"])
def test_bad_columns_get_typed_errors_and_leave_the_allocators_intact(bad):
    from ascmem._core import replay_device
    alloc, slot, size, kind = _columns()
    if bad == "dtype":
        size = size.astype(np.float64)
    elif bad == "length":
        size = size[:3]
    elif bad == "slot":
        slot = np.array([0, 7, 0, 1], np.int64)
    else:
        size = np.repeat(size, 2)[::2]
    expected = ArgumentTypeError if bad in ("dtype", "strided") else InvalidArgumentError
    peer = _replay_peers.BestFit(1 << 20)
    with pytest.raises(expected):
        _replay_peers.replay_peer(peer, alloc, slot, size, kind)
    assert peer.alloc(1 << 20) == 0  # everything it handed out was given back
    dev = ascmem.Device("atlas-a2-training")
    with pytest.raises(expected):
        replay_device(dev, alloc, slot, size, kind, np.zeros(len(kind), np.uint32))
    dev.check()
    with pytest.raises(expected):
        _replay_peers.bestfit_unmapped_peak(alloc, slot, size, 2 << 20)


def test_the_compiled_peers_refuse_what_their_references_refuse():
    for peer in (_replay_peers.BestFit(1 << 20), _replay_peers.TorchCachingAllocator(1 << 30),
                 _replay_peers.TorchExpandableSegments(1 << 30)):
        with pytest.raises(InvalidArgumentError):
            peer.free(12345)
        with pytest.raises(InvalidArgumentError):
            peer.alloc(-1)
        with pytest.raises(InvalidArgumentError):
            peer.usable_size(12345)
        with pytest.raises(ascmem.OutOfMemoryError):
            peer.alloc(1 << 41)
    for peer in (_replay_peers.TorchCachingAllocator(1 << 30),
                 _replay_peers.TorchExpandableSegments(1 << 30)):
        with pytest.raises(InvalidArgumentError):
            peer.alloc(0)


def test_a_closed_device_raises_as_it_does_through_the_api():
    t = tr.example("gru_lm")
    dev = ascmem.Device("atlas-a2-training")
    dev.close()
    with pytest.raises(ascmem.DeviceClosedError):
        tr.replay(t, dev)
