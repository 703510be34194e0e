"""Layout of the C paged pool at its first peak-mapped moment: waste per granule."""
import sys, collections, os
import ascmem, ascmem.trace as tr
name, gran = sys.argv[1], int(sys.argv[2]) << 10
t = tr.load(name) if os.path.exists(name) else tr.example(name)
rows = list(t.rows())
peak = t.peak_live()
p = tr.paged_pool(t, gran, range_size=4 * peak)
base = 1 << 44
live = {}; addr = {}; best = -1; snap = None; cur = 0
for i, (a, ident, size, _k, _pol) in enumerate(rows):
    if a:
        x = p.alloc(size); addr[ident] = x; live[x] = (size, p.usable_size(x)); cur += size
        m = p.stats()["mapped"]
        if m > best: best, snap = m, (i, dict(live), cur)
    elif ident in addr:
        x = addr.pop(ident); p.free(x); cur -= live.pop(x)[0]
i, lv, cur = snap
print(f"peak live {peak/gran:.2f} granules; pool peak mapped {best/gran:.0f} at event {i}/{len(rows)}, live then {cur/gran:.2f} g")
g = collections.defaultdict(list)
for x, (s, u) in lv.items():
    o = x - base
    for q in range(o // gran, (o + u - 1) // gran + 1):
        lo, hi = max(o, q * gran), min(o + s, (q + 1) * gran)
        g[q].append((max(hi - lo, 0), s, o))
print("granules touched", len(g), "waste (granules)", len(g) - cur / gran)
region = collections.Counter((q * gran) >= p.stats()["capacity"] // 4 for q in g)
lim = int(sys.argv[3]) if len(sys.argv) > 3 else 40
qs = sorted(g)
for q in qs:
    v = g[q]; fill = sum(b for b, _, _ in v) / gran
    if fill < 0.97:
        print(f"  g{q:6d} fill {fill:.3f}: " + ", ".join(f"[{(o - q*gran)/gran:+.3f} {s/gran:.3f}g]" for b, s, o in sorted(v, key=lambda z: z[2])[:8]))
