#!/usr/bin/env bash
# valgrind memcheck of scripts/smoke.py.  CPython and numpy report errors of
# their own under memcheck (uninitialised reads in int.from_bytes, dlopen...),
# so this fails only on errors and definite leaks whose stack passes through
# ascmem's extension.
set -uo pipefail
PY=${PYTHON:-python3}
log=$(mktemp)
PYTHONMALLOC=malloc valgrind --leak-check=full --errors-for-leak-kinds=definite \
    --num-callers=30 --log-file="$log" "$PY" "$(dirname "$0")/smoke.py" || { cat "$log"; exit 1; }
"$PY" - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.split(r"\n==\d+== \n", text)
ours = [b for b in blocks if ("_core.cpython" in b or " ascm_" in b)
        and ("Invalid" in b or "uninitialised" in b or "definitely lost" in b
             or "Mismatched" in b or "overlap" in b)]
summary = re.findall(r"ERROR SUMMARY: .*", text)
print(f"valgrind: {summary[-1] if summary else '?'}; errors in ascmem's code: {len(ours)}")
for b in ours[:5]:
    print(b)
sys.exit(1 if ours else 0)
PY
