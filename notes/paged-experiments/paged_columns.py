# paged columns only, for named shipped/scale traces (never the held-out dir)
import sys, os, time, json
import ascmem.trace as tr
from ascmem.emulations.reference import bestfit_unmapped_peak
args = sys.argv[1:]
gr = [(2 << 20, "2M"), (64 << 10, "64K")]
if os.environ.get("G2"): gr = gr[:1]
out = {}
for a in args:
    t = tr.load(a) if os.path.exists(a) else tr.example(a)
    peak = t.peak_live(); r = {}
    t0 = time.time()
    for g, label in gr:
        r[f"{label}@4x"] = tr.physical_efficiency(t, g, range_size=4 * peak)[0]
        if not os.environ.get("NO64G"):
            r[f"{label}@64G"] = tr.physical_efficiency(t, g, range_size=64 << 30)[0]
    out[t.name] = r
    print(f"{t.name:22s}" + "".join(f" {k}={v:.4f}" for k, v in r.items()) + f"  ({time.time()-t0:.0f}s)", flush=True)
if os.environ.get("JSON"): json.dump(out, open(os.environ["JSON"], "w"), indent=1)
