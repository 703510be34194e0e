"""The comparison benchmark: ascmem against its peers, in one run.
Same as `ascmem bench`; see src/ascmem/bench.py."""
import os
import sys

# numpy's OpenBLAS threads spin after use and take a core from a 2-core host
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ascmem.tools.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
