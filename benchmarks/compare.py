"""The comparison benchmark: ascmem against its peers, in one run.
Same as `ascmem bench`; see src/ascmem/bench.py."""
import sys

from ascmem.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
