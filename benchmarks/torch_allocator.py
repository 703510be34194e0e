"""torch's CPU allocator against ascmem's, A/B in one process (see
ascmem.torch.bench):  python benchmarks/torch_allocator.py [--steps N] [--json]"""
from ascmem.torch.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
