"""The registry of backends: the name a Device is given -> the module that
makes its upstream (each an _Upstream subclass, the contract of
_upstream.pyx).  A backend is one module and one line here; nothing else in
ascmem compares a backend's name."""

from ascmem import _backend_acl, _backend_host, _backend_sim

BACKENDS = {"sim": _backend_sim.upstream,
            "host": _backend_host.upstream,
            "acl": _backend_acl.upstream}


def make_upstream(backend, device_id, acl_module):
    """The upstream of a new Device; backend must be a name of BACKENDS."""
    return BACKENDS[backend](device_id, acl_module)


def backends():
    """Each backend's name and what its upstream declares it can do (the
    capabilities at the top of _upstream.pyx); the acl backend's with a
    stand-in for pyACL (nothing is called on it)."""
    out = {}
    for name, make in BACKENDS.items():
        up = make(0, object())
        out[name] = {"holds_memory": up.holds_memory, "readable": up.readable,
                     "from_runtime": up.from_runtime, "paging": up.paging,
                     "chunk_alignment": up.chunk_alignment, "sharing": up.sharing}
        up.close()
    return out
