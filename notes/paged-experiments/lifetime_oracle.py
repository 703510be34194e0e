"""Oracle experiment: blocks that will live longer than L events are placed plain (low end,
no top), others by the granule rules.  Prints peak-mapped efficiency."""
import sys, os, ctypes
import ascmem, ascmem._core as core, ascmem.trace as tr
lib = ctypes.CDLL(core.__file__)
flag = ctypes.c_int.in_dll(lib, "ascm_exp_oracle_plain")
name, gran = sys.argv[1], int(sys.argv[2]) << 10
Ls = [float(x) for x in sys.argv[3:]]
t = tr.load(name) if os.path.exists(name) else tr.example(name)
rows = list(t.rows())
n = len(rows)
free_at = {}
for i, (a, ident, size, _k, _p) in enumerate(rows):
    if not a: free_at[ident] = i
peak = t.peak_live()
out = []
for L in Ls:
    p = tr.paged_pool(t, gran, range_size=4 * peak)
    addr = {}
    for i, (a, ident, size, _k, _p) in enumerate(rows):
        if a:
            life = free_at.get(ident, n) - i
            flag.value = 1 if (L >= 0 and life > L * n) else 0
            addr[ident] = p.alloc(size)
        elif ident in addr:
            p.free(addr.pop(ident))
    flag.value = 0
    out.append(f"L={L}: {peak / p.stats()['peak_mapped']:.4f}")
print(f"{t.name:20s} " + "  ".join(out))
