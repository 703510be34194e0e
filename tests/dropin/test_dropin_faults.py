"""The ascmem.acl drop-in under bad input: it answers codes as pyACL does
and never raises, and install() on a module it cannot patch does nothing
half-way."""
import types

import pytest

from ascmem import acl as aacl
from ascmem.errors import InvalidArgumentError


@pytest.fixture
def fresh_dropin(monkeypatch):
    monkeypatch.setattr(aacl, "_device", None)
    monkeypatch.setattr(aacl, "_devices", {})
    yield
    aacl.uninstall()


def test_the_acl_drop_in_returns_codes_and_never_raises(fresh_dropin, monkeypatch):
    monkeypatch.setenv("ASCMEM_MODEL", "no-such-product")
    ptr, ret = aacl.rt.malloc(100, 0)
    assert ptr == 0 and ret != 0
    assert aacl.rt.free(0x1000) != 0
    assert aacl.rt.get_mem_info(0)[2] != 0
    monkeypatch.setenv("ASCMEM_MODEL", "atlas-inference")
    monkeypatch.setenv("ASCMEM_BACKEND", "acl")  # no pyACL here
    assert aacl.rt.malloc(100, 0) == (0, 207000)
    monkeypatch.setenv("ASCMEM_BACKEND", "host")
    assert aacl.rt.reset_device([1]) == 100000
    assert aacl.rt.set_device(0) == 0
    p, ret = aacl.rt.malloc(100, 0)
    view = aacl.device().buffer(p)
    assert aacl.rt.reset_device(0) == 100000  # a live view: refused with a code
    del view
    assert aacl.rt.reset_device(0) == 0
    for bad in ("x", None, -1, True):
        assert aacl.himpi.dvpp_malloc(bad, 100) == (0, 100000)
    assert aacl.himpi.dvpp_malloc(0, 100) == (0, 207000)  # not on this product (profiles [D])
    event, _ = aacl.rt.create_event()
    for bad in ([1], {}):  # unhashable handles: a code, not a TypeError
        assert aacl.rt.destroy_event(bad) == aacl.rt.destroy_stream(bad) == 100000
        assert aacl.rt.synchronize_event(bad) == aacl.rt.query_event_status(bad)[1] == 100000
        assert aacl.rt.record_event(event, bad) == aacl.rt.stream_wait_event(bad, event) == 100000
    assert aacl.rt.destroy_event(event) == 0
    # install on a namespace that refuses new attributes: nothing half-done
    class Frozen:
        __slots__ = ()
        malloc = staticmethod(lambda size, policy: (0, 0))
        free = staticmethod(lambda ptr: 0)
    module = types.SimpleNamespace(rt=Frozen(), media=types.SimpleNamespace(
        dvpp_malloc=lambda size: (0, 0), dvpp_free=lambda ptr: 0))
    original = module.media.dvpp_malloc
    with pytest.raises(InvalidArgumentError):
        aacl.install(module)
    assert module.media.dvpp_malloc is original
    aacl.uninstall()  # nothing to undo, no error
