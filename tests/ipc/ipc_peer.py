"""The other process of tests/ipc/test_ipc.py: a host-backend Device driven by
one command a line on stdin, one answer a line on stdout.

    python ipc_peer.py export SIZE [any]   -> "KEY <key> <pid> <addr>"
    python ipc_peer.py import              -> "PID <pid>"

Commands: import KEY, read N, write BYTE, allow PID, close KEY, free, fds,
exit.  Answers: "OK ...", or "ERR <class> <code> <message>".
"""
import os
import sys

import ascmem

MiB = 1 << 20


def say(*words):
    print(*words, flush=True)


def main():
    dev = ascmem.Device(backend="host")
    dev.align_tag("shared", 2 * MiB, shareable=True)
    addr = key = None
    imported = {}
    if sys.argv[1] == "export":
        size = int(sys.argv[2])
        addr = dev.malloc(size, tag="shared")
        arr = dev.as_array(addr, size)
        arr[:] = 7
        del arr
        key = dev.ipc_export(addr, size, any_process="any" in sys.argv[3:])
        say("KEY", key, os.getpid(), addr)
    else:
        say("PID", os.getpid())
    for line in sys.stdin:
        cmd, *args = line.split()
        try:
            if cmd == "import":
                imported[args[0]] = dev.ipc_import(args[0])
                say("OK", imported[args[0]])
            elif cmd == "read":  # the first N bytes of the (only) imported or exported block
                a = next(iter(imported.values()), addr)
                say("OK", bytes(dev.buffer(a, int(args[0]))).hex())
            elif cmd == "write":
                a = next(iter(imported.values()), addr)
                view = dev.buffer(a, 1)
                view[0] = int(args[0])
                view.release()
                say("OK")
            elif cmd == "allow":
                dev.ipc_allow(key, [int(args[0])])
                say("OK")
            elif cmd == "close":
                dev.ipc_close(args[0])
                imported.pop(args[0], None)
                say("OK")
            elif cmd == "free":
                dev.free(addr)
                say("OK")
            elif cmd == "fds":
                say("OK", len(os.listdir("/proc/self/fd")))
            elif cmd == "exit":
                dev.close()
                say("OK")
                return
        except ascmem.AscmemError as e:
            say("ERR", type(e).__name__, e.code, str(e).replace("\n", " "))


if __name__ == "__main__":
    main()
