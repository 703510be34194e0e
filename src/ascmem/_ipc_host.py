"""The host backend's sharing between processes: memory that another process
can map, and the exporter's door to it.

Memory.  A block of a shareable tag (``Device.align_tag(tag, alignment,
shareable=True)``) is backed from its allocation on by a memfd of its own,
mapped ``MAP_SHARED`` over the block's range of the pool's chunk; freeing it
puts anonymous memory back first.  Anonymous memory cannot be shared after
the fact, so only such blocks can be exported, and each memfd holds exactly
one block: the descriptor an importer receives reaches that block's bytes
and nobody else's.

The door.  Each exporting process serves one abstract Unix socket (no file
left behind, gone when the process dies), named by its pid and a random
nonce.  An importer connects, sends the key's 128-bit random token, and gets
the memfd through ``SCM_RIGHTS``.  The exporter decides with the kernel's
word on who is asking (``SO_PEERCRED``): the allow-list is checked against
the connecting process's pid, not against anything the importer says.  The
importer checks the same way that the socket is served by the pid in the key
(a process that squatted the name cannot collect tokens).  The connection
stays open while the import lives: when the importer closes the import, or
dies, the exporter knows it has one importer fewer.
"""

import ctypes
import mmap
import os
import secrets
import select
import selectors
import socket
import struct
import threading

from ascmem.errors import IpcKeyError, IpcPermissionError, UnsupportedError

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_RW = mmap.PROT_READ | mmap.PROT_WRITE
PAGE = mmap.PAGESIZE

# request: an operation byte and the 16-byte token; reply: status and size
_OPEN, _CLOSE = b"O", b"X"
_REQUEST = 17
_REPLY = struct.Struct("!iQ")
OK, UNKNOWN, NOT_ALLOWED = 0, 1, 2
_REQUEST_DEADLINE = 1.0  # seconds the door waits for the rest of a request
_TIMEOUT = 10.0  # seconds an importer waits for the exporter: a stopped exporter is an error, not a hang


def _mmap(addr, size, prot, flags, fd):
    got = _libc.mmap(addr, size, prot, flags, fd, 0)
    if got == _MAP_FAILED or got is None:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return got


def back(addr, size):
    """Replaces [addr, addr + size) -- a fresh block, contents undefined --
    with a memfd of its own, mapped shared; returns the descriptor."""
    if addr % PAGE or size % PAGE:
        raise UnsupportedError(f"a shareable block must cover whole pages of {PAGE} bytes "
                               f"(align the tag to at least {PAGE})")
    fd = os.memfd_create("ascmem-ipc", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        _mmap(addr, size, _RW, mmap.MAP_SHARED | _MAP_FIXED, fd)
    except OSError as e:
        os.close(fd)
        raise UnsupportedError(f"the OS refused shared memory for {addr:#x} ({size} bytes): "
                               f"{e.strerror}; a chunk on explicit huge pages needs the tag "
                               f"aligned to 2 MiB") from None
    return fd


def unback(addr, size, fd):
    """The block goes back to private anonymous memory (what the pool's
    chunk is made of) and its memfd is closed: the memory stays only as long
    as importers still map it."""
    try:
        _mmap(addr, size, _RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE,
              -1)
    finally:
        os.close(fd)


def map_shared(fd, size):
    """An importer's mapping of the exporter's memfd (a new address)."""
    return _mmap(None, size, _RW, mmap.MAP_SHARED, fd)


def unmap(addr, size):
    _libc.munmap(addr, size)


def _peer_pid(sock):
    pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return pid


def _recv_exact(sock, n, deadline=None):
    """n bytes, or fewer if the peer hung up (or, with a deadline in
    seconds, was too slow: a client that sends half a request does not hold
    the door)."""
    data = b""
    while len(data) < n:
        if deadline is not None and not select.select([sock], [], [], deadline)[0]:
            return data
        got = sock.recv(n - len(data))
        if not got:
            return data
        data += got
    return data


class _Entry:
    """One exported block as the door sees it."""

    __slots__ = ("fd", "size", "pids", "any_process", "importers")

    def __init__(self, fd, size, pids, any_process):
        self.fd = fd
        self.size = size
        self.pids = set(pids)
        self.any_process = any_process
        self.importers = {}  # connection -> importer pid


class Door:
    """The process's one exporter socket and the thread that serves it.  The
    thread touches only this object's table, under its lock; it never calls
    into a Device."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries = {}  # token (bytes) -> _Entry
        self.pid = os.getpid()
        self.nonce = secrets.token_hex(4)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind(self.address(self.pid, self.nonce))
        self.sock.listen(64)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ)
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, name="ascmem-ipc-door", daemon=True)
        self.thread.start()

    @staticmethod
    def address(pid, nonce):
        return f"\0ascmem-ipc-{pid}-{nonce}".encode()

    def add(self, fd, size, pids, any_process):
        token = secrets.token_bytes(16)
        with self.lock:
            self.entries[token] = _Entry(fd, size, pids, any_process)
        return token

    def allow(self, token, pids):
        with self.lock:
            entry = self.entries.get(token)
            if entry is not None:
                entry.pids.update(pids)

    def importers(self, token):
        """The pids that hold an import of token now (a dead one's
        connection has reached its end and is dropped first).  A token this
        door never served (a Device copied by fork(): its parent's door
        served it) has none."""
        with self.lock:
            entry = self.entries.get(token)
            if entry is None:
                return []
            for conn in list(entry.importers):
                try:
                    gone = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self._drop(entry, conn)
            return sorted(entry.importers.values())

    def remove(self, token):
        """The export is closed: the token opens nothing any more."""
        with self.lock:
            entry = self.entries.pop(token, None)
            for conn in list(entry.importers if entry is not None else ()):
                self._drop(entry, conn)

    def _drop(self, entry, conn):
        entry.importers.pop(conn, None)
        self._hang_up(conn)

    def _serve(self):
        while not self.stopping:
            for key, _ in self.sel.select():
                if key.fileobj is self.sock:
                    self._accept()
                elif key.fileobj == self.wake_r:
                    try:
                        os.read(self.wake_r, 64)
                    except OSError:
                        pass
                else:
                    self._request(key.fileobj)

    def _accept(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        # blocking, without a timeout: importers() peeks with MSG_DONTWAIT,
        # and reads wait through select with a deadline (_recv_exact)
        conn.settimeout(None)
        with self.lock:
            self.sel.register(conn, selectors.EVENT_READ)

    def _request(self, conn):
        try:
            req = _recv_exact(conn, _REQUEST, _REQUEST_DEADLINE)
        except OSError:
            req = b""
        with self.lock:
            owner = next((e for e in self.entries.values() if conn in e.importers), None)
            if len(req) != _REQUEST:  # the importer closed or died (or was too slow)
                if owner is not None:
                    self._drop(owner, conn)
                else:
                    self._hang_up(conn)
                return
            op, token = req[:1], req[1:]
            entry = self.entries.get(token)
            if owner is not None:  # a held import: the only request left is its close
                self._answer(conn, OK if op == _CLOSE else UNKNOWN)
                self._drop(owner, conn)
            elif op != _OPEN or entry is None:
                self._answer(conn, UNKNOWN)
                self._hang_up(conn)
            elif not entry.any_process and _peer_pid(conn) not in entry.pids:
                self._answer(conn, NOT_ALLOWED)
                self._hang_up(conn)
            else:
                try:
                    socket.send_fds(conn, [_REPLY.pack(OK, entry.size)], [entry.fd])
                    entry.importers[conn] = _peer_pid(conn)
                except OSError:  # the importer went away mid-answer
                    self._hang_up(conn)

    @staticmethod
    def _answer(conn, status):
        try:
            conn.sendall(_REPLY.pack(status, 0))
        except OSError:
            pass  # the other side went away: hanging up is all that is left

    def _hang_up(self, conn):
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def stop(self):
        self.stopping = True
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass
        self.thread.join(_TIMEOUT)
        with self.lock:
            for token in list(self.entries):
                entry = self.entries.pop(token)
                for conn in list(entry.importers):
                    self._drop(entry, conn)
            self.sel.close()
            self.sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)


_door = None
_door_lock = threading.Lock()


def door():
    """This process's door, opened on the first export."""
    global _door
    with _door_lock:
        if _door is None or _door.pid != os.getpid():
            _door = Door()
        return _door


def close_door():
    """Stops serving (no export left in the process)."""
    global _door
    with _door_lock:
        d, _door = _door, None
    if d is not None and d.pid == os.getpid():
        d.stop()


def _after_fork_in_child():
    global _door, _door_lock
    _door_lock = threading.Lock()
    _door = None  # the parent's door and thread are the parent's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def make_key(door_, token):
    return f"ascm1-{door_.pid}-{door_.nonce}-{token.hex()}"


def parse_key(key):
    """(pid, nonce, token) of a host key; IpcKeyError for anything else."""
    parts = key.split("-") if isinstance(key, str) else ()
    try:
        tag, pid, nonce, token = parts
        if tag != "ascm1" or len(nonce) != 8 or len(token) != 32 or not pid.isdigit():
            raise ValueError
        int(nonce, 16)
        return int(pid), nonce, bytes.fromhex(token)
    except ValueError:
        raise IpcKeyError(f"{key!r} is not an ascmem IPC key of the host backend (forged or "
                          f"truncated)") from None


class Connection:
    """An importer's open import: the mapping and the connection that tells
    the exporter it is still held."""

    def __init__(self, key):
        pid, nonce, token = parse_key(key)
        self.token = token
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(_TIMEOUT)
        try:
            try:
                sock.connect(Door.address(pid, nonce))
            except (ConnectionRefusedError, FileNotFoundError):
                raise IpcKeyError(f"{key!r}: the exporting process {pid} is gone or no longer "
                                  f"exports (stale key)") from None
            if _peer_pid(sock) != pid:
                raise IpcKeyError(f"{key!r}: the socket is not served by process {pid}")
            sock.sendall(_OPEN + token)
            msg, fds, _flags, _addr = socket.recv_fds(sock, _REPLY.size, 1)
            if len(msg) != _REPLY.size:
                raise IpcKeyError(f"{key!r}: the exporter closed the connection")
            status, size = _REPLY.unpack(msg)
            if status == NOT_ALLOWED:
                raise IpcPermissionError(f"process {os.getpid()} is not on the allow-list of "
                                         f"{key!r} (the exporter adds it with ipc_allow)")
            if status != OK or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise IpcKeyError(f"{key!r} is not exported (never, or closed since: stale "
                                  f"key)")
            try:
                self.size = size
                self.mapped = (size + PAGE - 1) // PAGE * PAGE
                self.addr = map_shared(fds[0], self.mapped)
            finally:
                os.close(fds[0])  # the mapping keeps the memory
        except socket.timeout:
            sock.close()
            raise IpcKeyError(f"{key!r}: process {pid} did not answer within {_TIMEOUT} s") from None
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def close(self):
        """Unmaps, and tells the exporter (if it is alive) before hanging up."""
        unmap(self.addr, self.mapped)
        try:
            self.sock.sendall(_CLOSE + self.token)
            _recv_exact(self.sock, _REPLY.size)
        except OSError:
            pass  # the exporter died: its memory went when the mapping did
        finally:
            self.sock.close()
