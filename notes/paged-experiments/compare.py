import json, sys
a = json.load(open(sys.argv[1]))
bs = [json.load(open(x)) for x in sys.argv[2:]]
for name, r in a.items():
    cells = []
    for k, v in r.items():
        vs = [b[name][k] for b in bs]
        mark = "".join("+" if x > v + 0.0005 else "-" if x < v - 0.0005 else "." for x in vs)
        cells.append(f"{k}:{v:.3f}>" + "/".join(f"{x:.3f}" for x in vs) + mark)
    print(f"{name:20s} " + "  ".join(cells))
