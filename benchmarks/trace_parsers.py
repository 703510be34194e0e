"""The parser comparison behind ascmem's JSON scanner (docs/ARCHITECTURE.md,
Note [Trace import]): each way of reading a PyTorch
profiler trace into ascmem's columns, in a child process of its own (CPU
seconds and peak RSS are that child's).

    python benchmarks/trace_parsers.py TRACE.json [BASE_SRC]

BASE_SRC: a source tree of ascmem before the scanner (its streaming reader
is ijson's); "parse" is the parser's own call, "columns" the whole read into
a Trace (the same per-event checks and pairing for every library parser)."""
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import resource, sys, time, json
which, path = sys.argv[1], sys.argv[2]
t0 = time.process_time()
parse = None
if which in ("scanner", "ijson"):
    from ascmem import trace as tr
    tr.MAX_WHOLE_BYTES = 1 << 40
    trace = tr.load(path)
else:
    from ascmem import trace_import as ti
    from ascmem.trace import _imported
    data = open(path, "rb").read()
    if which == "json":
        doc = json.loads(data)
    elif which == "orjson":
        import orjson
        doc = orjson.loads(data)
    elif which == "simdjson":
        import simdjson
        # lazy document: the memory events are made Python objects, the rest skipped
        doc = simdjson.Parser().parse(data)
        events = doc["traceEvents"]
        doc = {"traceEvents": [e.as_dict() if e.get("name") == "[memory]" else None
                               for e in events]}
    elif which == "orjson-batches":
        import orjson
        # the events cut out by lines (this benchmark's layout: an event a line), a batch
        # of them given to orjson at a time; only [memory] ones kept as dicts
        kept = []
        with open(path, "rb") as f:
            f.readline()
            while True:
                lines = f.readlines(8 << 20)
                if not lines:
                    break
                batch = b"[" + b"".join(lines).rstrip().rstrip(b"]}").rstrip().rstrip(b",") + b"]"
                kept.extend(e if e.get("name") == "[memory]" else None
                            for e in orjson.loads(batch))
        doc = {"traceEvents": kept}
    parse = time.process_time() - t0
    trace = _imported(ti.from_chrome_doc(doc, path), path, "chrome")
cpu = time.process_time() - t0
print(which, len(trace), round(parse, 2) if parse is not None else "-", round(cpu, 2),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
'''


def main():
    path = sys.argv[1]
    base = sys.argv[2] if len(sys.argv) > 2 else None
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
    print(f"{'parser':16} {'events':>9} {'parse s':>8} {'columns s':>10} {'peak MB':>8}")
    for which in os.environ.get("PARSERS", "ijson,json,orjson,orjson-batches,simdjson,scanner").split(","):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        if which == "ijson":
            if not base:
                continue
            env["PYTHONPATH"] = base
        out = subprocess.run([sys.executable, f.name, which, path], env=env,
                             capture_output=True, text=True)
        if out.returncode:
            print(which, "failed:", out.stderr.strip().splitlines()[-1])
            continue
        name, n, parse, cpu, rss = out.stdout.split()
        print(f"{name:16} {int(n):>9,} {parse:>8} {cpu:>10} {rss:>8}", flush=True)
    os.unlink(f.name)


if __name__ == "__main__":
    main()
