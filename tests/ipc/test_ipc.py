"""Sharing blocks between processes (issue 49): real processes on the host
backend, the simulated bookkeeping, the acl backend against the recording
stand-in, and the pyACL drop-in.  Every other process is a fresh interpreter
(tests/ipc/ipc_peer.py) driven line by line with a time limit, so that a crash
or a hang fails the test instead of the suite."""
import os
import re
import signal
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import ascmem
from ascmem import acl as aacl
from ascmem import ipc
from ascmem.errors import (ArgumentTypeError, InvalidArgumentError, IpcBusyError, IpcKeyError,
                           IpcPermissionError, UnsupportedError)

import fake_acl
from conftest import MiB

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ipc_peer.py")
TIMEOUT = 60

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd, SO_PEERCRED")


class Peer:
    """Another process with a host Device (tests/ipc/ipc_peer.py)."""

    def __init__(self, *args):
        self.p = subprocess.Popen([sys.executable, PEER, *map(str, args)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.first = self._line()

    def _line(self):
        import select
        ready, _, _ = select.select([self.p.stdout], [], [], TIMEOUT)
        if not ready:
            self.p.kill()
            raise AssertionError("the peer did not answer in time")
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"the peer exited {self.p.wait()}: {self.p.stderr.read()}")
        return line.split()

    def ask(self, *words):
        self.p.stdin.write(" ".join(map(str, words)) + "\n")
        self.p.stdin.flush()
        return self._line()

    @property
    def pid(self):
        return self.p.pid

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(TIMEOUT)

    def end(self):
        if self.p.poll() is None:
            assert self.ask("exit") == ["OK"]
            assert self.p.wait(TIMEOUT) == 0


def exporter(size=4 * MiB, any_process=False):
    peer = Peer("export", size, "any" if any_process else "")
    tag, key, pid, addr = peer.first
    assert tag == "KEY" and int(pid) == peer.pid
    return peer, key


def host_device():
    d = ascmem.Device(backend="host")
    d.align_tag("shared", 2 * MiB, shareable=True)
    return d


def os_state():
    """What this process holds in the OS that sharing could leave behind."""
    maps = open("/proc/self/maps").read()
    return (sorted(os.listdir("/proc/self/fd")), maps.count("memfd:ascmem-ipc"),
            sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else [],
            open("/proc/net/unix").read().count(f"ascmem-ipc-{os.getpid()}-"))


# ---- real processes -----------------------------------------------------------------

def test_bytes_written_by_one_process_are_seen_by_the_other():
    """The importer reads the exporter's bytes and writes back; no copy."""
    d = host_device()
    a = d.malloc(8 * MiB, tag="shared")
    arr = d.as_array(a, 8 * MiB)
    arr[:] = 5
    peer = Peer("import")
    key = d.ipc_export(a, pids=[peer.pid])
    assert len(key) <= 64 and isinstance(key, str)
    assert peer.ask("import", key)[0] == "OK"
    assert peer.ask("read", 4) == ["OK", "05050505"]
    arr[0] = 9                                    # exporter writes, importer sees
    assert peer.ask("read", 2) == ["OK", "0905"]
    assert peer.ask("write", 42) == ["OK"]       # importer writes, exporter sees
    assert arr[0] == 42
    del arr
    assert peer.ask("close", key) == ["OK"]
    d.ipc_close(key)
    d.free(a)
    d.check()
    peer.end()
    d.close()


def test_a_process_not_allowed_cannot_import():
    """Allow-list on import, checked by the exporter against the kernel's
    word on who connects (SO_PEERCRED): a third process is refused with the
    runtime's code until ipc_allow adds it."""
    d = host_device()
    a = d.malloc(2 * MiB, tag="shared")
    allowed, third = Peer("import"), Peer("import")
    key = d.ipc_export(a, pids=[allowed.pid])
    assert allowed.ask("import", key)[0] == "OK"
    refused = third.ask("import", key)
    assert refused[:3] == ["ERR", "IpcPermissionError", str(IpcPermissionError.code)]
    assert IpcPermissionError.code == 207006
    with pytest.raises(IpcPermissionError):  # this process is not on the list either
        host_device().ipc_import(key)
    d.ipc_allow(key, [third.pid])
    assert third.ask("import", key)[0] == "OK"
    for p in (allowed, third):
        assert p.ask("close", key) == ["OK"]
        p.end()
    d.ipc_close(key)
    d.free(a)
    d.close()


def test_any_process_may_import_without_a_list():
    peer, key = exporter(any_process=True)
    d = host_device()
    addr = d.ipc_import(key)
    assert bytes(d.buffer(addr, 3)) == b"\x07\x07\x07"
    d.ipc_close(key)
    assert peer.ask("close", key) == ["OK"]
    peer.end()
    d.close()


def test_forged_truncated_and_stale_keys_are_clear_errors():
    peer, key = exporter(any_process=True)
    d = host_device()
    pid, nonce, token = key.split("-")[1:]
    forged = f"ascm1-{pid}-{nonce}-{os.urandom(16).hex()}"
    for bad in (key[:-1], key[:20], forged, key.replace("ascm1", "ascm2"), "x" * 65, "",
                f"ascm1-1-{nonce}-{token}", f"ascm1-{pid}-00000000-{token}"):
        with pytest.raises(IpcKeyError) as e:
            d.ipc_import(bad)
        assert e.value.code == 107000
    with pytest.raises(ArgumentTypeError):
        d.ipc_import(b"bytes")
    # stale: the exporter closed it (and freed the block)
    assert peer.ask("close", key) == ["OK"] and peer.ask("free") == ["OK"]
    with pytest.raises(IpcKeyError, match="stale|not exported"):
        d.ipc_import(key)
    peer.end()
    # stale: the exporter is gone
    with pytest.raises(IpcKeyError, match="gone"):
        d.ipc_import(key)
    d.check()
    d.close()


def test_exporter_killed_leaves_the_importers_mapping_valid():
    """SIGKILL of the exporter: the importer's mapping stays valid (as shared
    memory does) until it closes; then nothing is left in this process."""
    d = host_device()
    peer, key = exporter(any_process=True)
    before = os_state()  # the peer's pipes included
    addr = d.ipc_import(key)
    peer.kill()
    view = d.buffer(addr, 16)
    assert bytes(view) == b"\x07" * 16
    view[0] = 1                        # still writable, still ours
    assert view[0] == 1
    view.release()
    d.ipc_close(key)
    assert os_state() == before
    with pytest.raises(IpcKeyError):
        d.ipc_import(key)
    d.close()


def test_exporter_close_and_free_refused_while_imported():
    """Every importer closes first (aclrtIpcMemClose); an exported block is
    not freed until its key is closed; a dead importer holds nothing."""
    d = host_device()
    a = d.malloc(2 * MiB, tag="shared")
    key = d.ipc_export(a, any_process=True)
    peer = Peer("import")
    assert peer.ask("import", key)[0] == "OK"
    with pytest.raises(IpcBusyError, match=str(peer.pid)):
        d.ipc_close(key)
    with pytest.raises(IpcBusyError, match="exported"):
        d.free(a)
    d.check()
    peer.kill()                        # an importer that dies lets go
    d.ipc_close(key)
    d.free(a)
    d.check()
    d.close()


def test_nothing_left_in_the_os_once_all_closed():
    """No descriptor, memfd mapping, /dev/shm entry or socket stays behind,
    on either side."""
    d = host_device()
    peer = Peer("import")
    before = os_state()  # the peer's pipes included
    a = d.malloc(4 * MiB, tag="shared")
    fds_before = int(peer.ask("fds")[1])
    key = d.ipc_export(a, pids=[peer.pid])
    assert os_state() != before
    assert peer.ask("import", key)[0] == "OK"
    assert peer.ask("close", key) == ["OK"]
    assert int(peer.ask("fds")[1]) == fds_before
    d.ipc_close(key)
    d.free(a)
    assert os_state() == before
    peer.end()
    d.close()


def test_two_exports_get_unpredictable_keys():
    d = host_device()
    a = d.malloc(2 * MiB, tag="shared")
    k1, k2 = d.ipc_export(a, any_process=True), d.ipc_export(a, any_process=True)
    t1, t2 = k1.rsplit("-", 1)[1], k2.rsplit("-", 1)[1]
    assert t1 != t2 and len(t1) == 32 and re.fullmatch("[0-9a-f]{32}", t1)  # 128 random bits
    assert str(a) not in k1 and f"{a:x}" not in k1
    d.ipc_close(k1)
    with pytest.raises(IpcBusyError):  # still exported under k2
        d.free(a)
    d.ipc_close(k2)
    d.free(a)
    d.close()


# ---- bad input, one process -------------------------------------------------------------

def test_export_needs_a_live_block_of_a_shareable_tag_on_host():
    d = host_device()
    plain = d.malloc(1 * MiB)
    with pytest.raises(UnsupportedError, match="shareable"):
        d.ipc_export(plain)
    a = d.malloc(2 * MiB, tag="shared")
    with pytest.raises(InvalidArgumentError):
        d.ipc_export(a + 64)                     # interior
    with pytest.raises(InvalidArgumentError):
        d.ipc_export(a, d.usable_size(a) + 1)    # larger than the block
    with pytest.raises(ArgumentTypeError):
        d.ipc_export(a, pids=[1.5])
    with pytest.raises(ArgumentTypeError):
        d.ipc_export(a, pids=3)
    h = d.malloc_host(4096)
    with pytest.raises(InvalidArgumentError, match="host"):
        d.ipc_export(h)
    with pytest.raises(IpcKeyError):
        d.ipc_close("ascm1-1-00000000-" + "0" * 32)
    key = d.ipc_export(a, any_process=True)
    with pytest.raises(InvalidArgumentError, match="own export"):
        d.ipc_import(key)
    with pytest.raises(IpcKeyError):
        d.ipc_allow("nope", [1])
    d.ipc_close(key)
    for p in (plain, a):
        d.free(p)
    d.free_host(h)
    d.check()
    d.close()


def test_import_closed_with_a_live_view_is_refused():
    peer, key = exporter(any_process=True)
    d = host_device()
    addr = d.ipc_import(key)
    arr = d.as_array(addr, (4, 4), "uint8")
    with pytest.raises(IpcBusyError, match="view"):
        d.ipc_close(key)
    with pytest.raises(InvalidArgumentError):
        d.close()
    del arr
    d.ipc_close(key)
    assert peer.ask("close", key) == ["OK"]
    peer.end()
    d.close()


def test_close_and_reset_end_exports_and_imports():
    """A device closed (or reset) with exports open: the exports end, its
    descriptors and socket go; the importers keep their mappings."""
    before = os_state()
    d = host_device()
    a = d.malloc(2 * MiB, tag="shared")
    key = d.ipc_export(a, any_process=True)
    d.reset()
    assert os_state()[1:] == before[1:]
    a = d.malloc(2 * MiB, tag="shared")
    d.ipc_export(a, any_process=True)
    d.close()
    assert os_state() == before


def test_shareable_blocks_need_page_alignment_and_no_paging():
    d = ascmem.Device(backend="host")
    with pytest.raises(InvalidArgumentError, match="page"):
        d.align_tag("s", 256, shareable=True)
    d.close()
    d = ascmem.Device("atlas-a2-training", backend="host", paged=True, memory=2 << 30)
    with pytest.raises(UnsupportedError):
        d.align_tag("s", 2 * MiB, shareable=True)
    d.close()


def test_a_client_that_sends_half_a_request_does_not_hold_the_door():
    """The door reads a request with a deadline: a stalled or garbage client
    is hung up on, and others are served meanwhile."""
    import socket
    d = host_device()
    a = d.malloc(2 * MiB, tag="shared")
    key = d.ipc_export(a, any_process=True)
    pid, nonce = key.split("-")[1:3]
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(f"\0ascmem-ipc-{pid}-{nonce}".encode())
    stalled.sendall(b"O12345")                  # half a request, then nothing
    garbage = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    garbage.connect(f"\0ascmem-ipc-{pid}-{nonce}".encode())
    garbage.sendall(b"Z" * 17)                  # a whole request, but nonsense
    peer = Peer("import")
    assert peer.ask("import", key)[0] == "OK"   # served regardless
    stalled.settimeout(TIMEOUT)
    assert stalled.recv(64) == b""              # hung up on after the deadline
    garbage.settimeout(TIMEOUT)
    assert garbage.recv(64)[:4] == b"\x00\x00\x00\x01"  # UNKNOWN, then hung up
    stalled.close()
    garbage.close()
    assert peer.ask("close", key) == ["OK"]
    peer.end()
    d.ipc_close(key)
    d.free(a)
    d.close()


def test_gil_free_frees_refuse_an_exported_block():
    """The pluggable free (no GIL, no Python) cannot free an exported block."""
    from ascmem import pluggable as pl
    d = ascmem.Device("atlas-training", backend="sim", device_id=49)
    pl.configure(d)
    try:
        p = d.malloc(4 * MiB)
        key = d.ipc_export(p, any_process=True)
        pl.functions()[pl.FREE](p, 4 * MiB, 49, None)   # refused: guarded
        assert d.usable_size(p)
        d.ipc_close(key)
        d.free(p)
        d.check()
    finally:
        pl.unconfigure(49)


def test_an_exported_block_cannot_sleep():
    d = ascmem.Device("atlas-a2-training", backend="sim", paged=True)
    p = d.malloc(4 * MiB, tag="kv")
    key = d.ipc_export(p, any_process=True)
    with pytest.raises(IpcBusyError):
        d.sleep("kv")
    d.ipc_close(key)
    assert d.sleep("kv") > 0
    d.wake("kv")
    d.free(p)
    d.check()


def test_a_forked_child_closes_its_copy_of_an_export_cleanly():
    """A host Device copied by fork(): the child's door is its own (the
    parent's thread is not in the child); closing the copied export raises
    nothing raw, and the parent's export is untouched."""
    d = host_device()
    a = d.malloc(2 * MiB, tag="shared")
    key = d.ipc_export(a, any_process=True)
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, an exit code only
        code = 1
        try:
            d.ipc_close(key)
            d.free(a)
            code = 0
        except BaseException:
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    peer = Peer("import")
    assert peer.ask("import", key)[0] == "OK"   # the parent still serves it
    assert peer.ask("close", key) == ["OK"]
    peer.end()
    d.ipc_close(key)
    d.free(a)
    d.close()


# ---- sim and acl ------------------------------------------------------------------------------

def test_sim_tracks_keys_and_addresses():
    a, b = ascmem.Device(backend="sim"), ascmem.Device(backend="sim", device_id=1)
    p = a.malloc(4 * MiB)
    key = a.ipc_export(p)
    with pytest.raises(IpcPermissionError):
        b.ipc_import(key)
    a.ipc_allow(key, [os.getpid()])
    x = b.ipc_import(key)
    assert b.ipc_import.__doc__ and x and x != p
    with pytest.raises(InvalidArgumentError, match="already"):
        b.ipc_import(key)
    with pytest.raises(IpcBusyError):
        a.ipc_close(key)
    with pytest.raises(IpcBusyError):
        a.free(p)
    b.ipc_close(key)
    a.ipc_close(key)
    with pytest.raises(IpcKeyError):
        b.ipc_import(key)
    a.free(p)
    a.check()


def test_acl_backend_calls_the_runtime_in_cann_order():
    f = fake_acl.make()
    sizes = {"normal": 64 * MiB, "huge": 64 * MiB}
    a = ascmem.Device(backend="acl", acl_module=f, pool_sizes=sizes)
    b = ascmem.Device(backend="acl", acl_module=f, pool_sizes=sizes)
    a.align_tag("w", 2 * MiB)
    p = a.malloc(3 * MiB, tag="w")
    key = a.ipc_export(p, pids=[4242])
    f.pid = 5151                          # another process, not on the list
    with pytest.raises(IpcPermissionError) as e:
        b.ipc_import(key)
    assert e.value.code == 207006
    f.pid = os.getpid()
    a.ipc_allow(key, [5151])
    f.pid = 5151
    x = b.ipc_import(key)
    assert x
    b.ipc_close(key)
    f.pid = os.getpid()
    a.ipc_close(key)
    a.free(p)
    ipc_calls = [c[0] for c in f.calls if "ipc" in c[0]]
    assert ipc_calls == ["rt.ipc_mem_get_export_key", "rt.ipc_mem_set_import_pid",
                         "rt.ipc_mem_import_by_key", "rt.ipc_mem_set_import_pid",
                         "rt.ipc_mem_import_by_key", "rt.ipc_mem_close", "rt.ipc_mem_close"]
    assert f.calls[[c[0] for c in f.calls].index("rt.ipc_mem_get_export_key")][3] == 0
    with pytest.raises(IpcKeyError) as e:
        b.ipc_import("no-such-name")
    assert e.value.code == 107000
    a.check()


def test_acl_any_process_uses_cannes_flag():
    f = fake_acl.make()
    a = ascmem.Device(backend="acl", acl_module=f, pool_sizes={"normal": 64 * MiB})
    p = a.malloc(1 * MiB)
    key = a.ipc_export(p, any_process=True)
    call = next(c for c in f.calls if c[0] == "rt.ipc_mem_get_export_key")
    assert call[3] == ipc.EXPORT_FLAG_DISABLE_PID_VALIDATION == 1
    a.ipc_close(key)
    a.free(p)


def test_stand_in_refuses_what_the_runtime_refuses():
    f = fake_acl.make()
    ptr, _ = f.rt.malloc(4 * MiB, 0)
    assert f.rt.ipc_mem_get_export_key(0, 1, 0)[1] == 100000
    assert f.rt.ipc_mem_get_export_key(ptr, 0, 0)[1] == 107000
    assert f.rt.ipc_mem_get_export_key(ptr, 1, 2)[1] == 107000
    key, ret = f.rt.ipc_mem_get_export_key(ptr, 4 * MiB, 0)
    assert ret == 0 and len(key) < ipc.KEY_LEN
    assert f.rt.ipc_mem_set_import_pid(key, []) == 107000
    assert f.rt.ipc_mem_import_by_key(key, 2)[1] == 107000
    assert f.rt.ipc_mem_close("unknown") == 107000
    assert f.rt.ipc_mem_close(key) == 0


def test_pyacl_drop_in():
    dev = ascmem.Device(backend="sim")
    aacl.use(dev)
    try:
        ptr, ret = aacl.rt.malloc(1 * MiB, 0)
        assert aacl.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION == 1
        assert aacl.rt.ipc_mem_get_export_key(0, 1, 0) == ("", 100000)
        assert aacl.rt.ipc_mem_get_export_key(ptr, 1, 5) == ("", 107000)
        key, ret = aacl.rt.ipc_mem_get_export_key(ptr, 1 * MiB, 0)
        assert ret == 0 and 0 < len(key) <= 64
        assert aacl.rt.ipc_mem_set_import_pid(key, []) == 107000
        assert aacl.rt.ipc_mem_set_import_pid(key, [os.getpid()]) == 0
        other = ascmem.Device(backend="sim", device_id=2)
        aacl.use(other)
        imp, ret = aacl.rt.ipc_mem_import_by_key(key, 0)
        assert ret == 0 and imp
        assert aacl.rt.ipc_mem_import_by_key("forged", 0) == (0, 107000)
        assert aacl.rt.ipc_mem_import_by_key(key, 3) == (0, 107000)
        assert aacl.rt.ipc_mem_close(key) == 0
        aacl.use(dev)
        assert aacl.rt.free(ptr) == IpcBusyError.code
        assert aacl.rt.ipc_mem_close(key) == 0
        assert aacl.rt.free(ptr) == 0
    finally:
        aacl.use(None)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), max_size=40))
def test_sim_bookkeeping_under_any_order_of_calls(ops):
    """Any order of allocate / export / import / close / free on two
    simulated devices: a free is refused exactly while the block is
    exported, an exporter's close exactly while it is imported; the
    allocator stays intact and ends empty."""
    a, b = ascmem.Device(backend="sim"), ascmem.Device(backend="sim", device_id=3)
    a.align_tag("t", 2 * MiB)
    blocks, keys_of, imported = [], {}, set()     # keys_of: block -> its open keys
    for op, i in ops:
        try:
            if op == 0:
                blocks.append(a.malloc((i + 1) * 100_000, tag="t" if i % 2 else None))
                keys_of[blocks[-1]] = []
            elif op == 1 and blocks:
                p = blocks[i % len(blocks)]
                keys_of[p].append(a.ipc_export(p, pids=[os.getpid()] if i % 3 else ()))
            elif op == 2 and blocks:
                p = blocks[i % len(blocks)]
                if keys_of[p]:
                    with pytest.raises(IpcBusyError):
                        a.free(p)
                else:
                    a.free(p)
                    blocks.remove(p)
                    del keys_of[p]
            else:
                keys = [k for ks in keys_of.values() for k in ks]
                if not keys:
                    continue
                k = keys[i % len(keys)]
                if op == 3 and k not in imported:
                    b.ipc_import(k)
                    imported.add(k)
                elif op == 4 and k in imported:
                    b.ipc_close(k)
                    imported.discard(k)
                elif op == 5:
                    if k in imported:
                        with pytest.raises(IpcBusyError):
                            a.ipc_close(k)
                    else:
                        a.ipc_close(k)
                        for ks in keys_of.values():
                            if k in ks:
                                ks.remove(k)
        except IpcPermissionError:
            pass  # exported with no pid: nobody may import
        a.check()
    for k in list(imported):
        b.ipc_close(k)
    for p, ks in keys_of.items():
        for k in ks:
            a.ipc_close(k)
        a.free(p)
    a.check()
    assert a.stats()["normal"]["live_count"] == a.stats()["huge"]["live_count"] == 0
