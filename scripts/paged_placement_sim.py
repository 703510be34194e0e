"""A model of a paged pool's placement, for trying placement rules in minutes
before writing them in C (issue 16).  It replays traces with the C pool's
rules as they are -- slabs for requests up to 32 KiB (the same 36 classes,
slabs of max(8 KiB, 4 slots), no spares), best fit over 4 KiB units, lowest
address among equal holes, blocks at the low end of their hole -- and counts
the granules that hold a live byte.  Physical efficiency = peak live bytes /
peak mapped bytes, as `ascmem fit --paged` reports it.

    python scripts/paged_placement_sim.py [--rule NAME ...] [trace ...]
    python scripts/paged_placement_sim.py --worst 65536 [--rule NAME] [trace ...]

Rules:
  bestfit  the C pool's placement, with exact best fit where C looks at no
           more than 4 blocks of a size bin (agrees with `ascmem fit --paged`
           to 0.002 on every shipped trace; on a CNN training trace recorded
           with the profiler, 0.982 against C's 0.971 at 2 MiB)
  classes  one virtual region per size class: below a granule (slabs
           included), then [1, 2), [2, 4), ... granules; best fit inside it
  exact    as classes, but each exact size below a granule gets a region of
           its own
  minnew   best fit's candidates, choosing the placement that maps the fewest
           new granules (ends of the hole and granule-aligned starts)
  granules classes, and where in its hole a block goes (the C pool's rules
           since the sixth session, fit.c): a block that fills its last
           granule all but a sixteenth starts at a granule boundary (best
           fit among the holes that hold it so); one of 1-16 granules takes,
           in the hole best fit chose, whichever of the hole's ends and its
           first and last granule boundaries spans the fewest granules
  mapped   granules, and a block of a quarter granule or more, under a
           granule, of a size freed before goes where it maps no granule (at
           either end of the smallest free block that allows it), as the C
           pool since the fifteenth session (pool.c, take_paged).  The model
           has no kept last freed block, which C no longer reuses in place
           for such sizes once its granules went: bert_train reads 0.966
           here, 0.962 in C

Traces: the shipped examples and ../shared/traces/pipeline.csv.gz by
default, or any file `ascmem fit` reads.  It is a model, in pure Python
(about a second per trace): figures that matter are measured again in C.
"""
import argparse
import bisect
import math
import os
import sys

import ascmem.trace as tr

UNIT = 4096
SLAB_MAX = 32768
SLAB_SIZES = [32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
              1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240,
              12288, 14336, 16384, 20480, 24576, 28672, 32768]
REGION = 1 << 24  # units per class region (64 GiB): far more than any trace needs


class Space:
    """Free holes of a virtual range (start -> length, in units) and the live
    bytes' granules (granule -> number of live blocks touching it)."""

    def __init__(self, granule, regions):
        self.gu = granule // UNIT
        self.holes, self.starts = {}, []
        for r in range(regions):  # regions never merge: each is a hole of its own
            self.holes[r * REGION] = REGION - 1
            self.starts.append(r * REGION)
        self.refs, self.mapped, self.peak = {}, 0, 0

    def place(self, start, n):
        j = bisect.bisect_right(self.starts, start) - 1
        h = self.starts[j]
        length = self.holes.pop(h)
        assert h + length >= start + n, "placement outside its hole"
        self.starts.pop(j)
        if start > h:
            self.holes[h] = start - h
            bisect.insort(self.starts, h)
        if start + n < h + length:
            self.holes[start + n] = h + length - start - n
            bisect.insort(self.starts, start + n)
        self._ref(start, n, 1)

    def give(self, start, n):
        self._ref(start, n, -1)
        i = bisect.bisect_left(self.starts, start)
        if i > 0 and self.starts[i - 1] + self.holes[self.starts[i - 1]] == start:
            prev = self.starts.pop(i - 1)
            n += start - prev
            start = prev
            del self.holes[prev]
            i -= 1
        if i < len(self.starts) and self.starts[i] == start + n:
            n += self.holes.pop(self.starts.pop(i))
        self.holes[start] = n
        bisect.insort(self.starts, start)

    def granules(self, start, n):
        return range(start // self.gu, (start + n - 1) // self.gu + 1)

    def new_granules(self, start, n):
        return sum(1 for g in self.granules(start, n) if g not in self.refs)

    def _ref(self, start, n, d):
        for g in self.granules(start, n):
            c = self.refs.get(g, 0) + d
            if c == 0:
                del self.refs[g]
                self.mapped -= 1
            else:
                if c == 1 and d == 1:
                    self.mapped += 1
                self.refs[g] = c
        self.peak = max(self.peak, self.mapped)

    def holes_in(self, region=None):
        if region is None:
            return ((h, self.holes[h]) for h in self.starts)
        i = bisect.bisect_left(self.starts, region * REGION)
        out = []
        while i < len(self.starts) and self.starts[i] < (region + 1) * REGION:
            out.append((self.starts[i], self.holes[self.starts[i]]))
            i += 1
        return out


def best_fit(holes, n):
    best = None
    for h, length in holes:
        if length >= n and (best is None or length < best[1]):
            best = (h, length)
    return best[0]


class BestFit:
    regions = 1

    def place(self, space, n):
        return best_fit(space.holes_in(), n)


class Classes(BestFit):
    regions = 64

    def region(self, space, n):
        g = n / space.gu
        return 0 if g < 1 else 1 + int(math.log2(g))

    def place(self, space, n):
        return best_fit(space.holes_in(self.region(space, n)), n)


class Exact(Classes):
    regions = 1024

    def __init__(self):
        self.of_size = {}

    def region(self, space, n):
        if n <= 8 or n >= space.gu:  # slabs (up to 8 units), and whole granules: as Classes
            return super().region(space, n)
        return self.of_size.setdefault(n, 64 + len(self.of_size))


class MinNew(BestFit):
    def place(self, space, n):
        best = None
        for h, length in space.holes_in():
            if length < n:
                continue
            aligned = -(-h // space.gu) * space.gu
            end_aligned = (h + length) // space.gu * space.gu - n
            for s in {h, h + length - n, aligned, end_aligned}:
                if h <= s and s + n <= h + length:
                    key = (space.new_granules(s, n), length, s)
                    if best is None or key < best[0]:
                        best = (key, s)
        return best[1]


def candidates(space, h, length, n):
    """Starts for n units in the hole [h, h + length): its two ends and its
    first and last granule boundaries, those that fit."""
    gu = space.gu
    up, down = -(-h // gu) * gu, (h + length) // gu * gu - n
    return {s for s in (h, h + length - n, up, down) if h <= s and s + n <= h + length}


class Granules(Classes):
    def place(self, space, n):
        gu = space.gu
        r = self.region(space, n)
        if n >= gu and -(-n // gu) * gu - n <= gu // 16:  # whole granules, all but a sixteenth
            best = None
            for h, length in space.holes_in(r):
                s = -(-h // gu) * gu
                if s + n <= h + length and (best is None or length < best[1]):
                    best = (s, length)
            return best[0]
        h = super().place(space, n)
        if n < gu or n >= 16 * gu:
            return h
        length = space.holes[h]
        return min(candidates(space, h, length, n),
                   key=lambda s: ((s + n - 1) // gu - s // gu, s))


class Mapped(Granules):
    def __init__(self):
        self.freed = set()

    def place(self, space, n):
        gu = space.gu
        if n < gu and 4 * n >= gu and n in self.freed:
            best = None
            for h, length in space.holes_in(0):
                if length < n or (best is not None and length >= best[1]):
                    continue
                for s in (h, h + length - n):
                    if space.new_granules(s, n) == 0:
                        best = (s, length)
                        break
            if best is not None:
                return best[0]
        return super().place(space, n)

    def freed_block(self, n):
        self.freed.add(n)


RULES = {"bestfit": BestFit, "classes": Classes, "exact": Exact, "minnew": MinNew,
         "granules": Granules, "mapped": Mapped}


def physical_efficiency(trace, granule, rule, worst=None):
    """Peak live / peak mapped.  With a dict as worst, it is filled with the
    moment the mapped granules first reach their peak: the row, the live
    blocks (id -> placement, as in live below) and the slabs."""
    space = Space(granule, rule.regions)
    partial = [[] for _ in SLAB_SIZES]  # per class, slabs with a free slot (last = current)
    slabs, next_slab = {}, 0
    live, cur, peak, worst_mapped = {}, 0, 0, 0
    for row, (is_alloc, ident, size, _kind, _policy) in enumerate(trace.rows()):
        if is_alloc:
            if size <= SLAB_MAX:
                c = next(i for i, s in enumerate(SLAB_SIZES) if s >= max(size, 1))
                if not partial[c]:
                    slab_bytes = -(-max(SLAB_SIZES[c] * 4, 8192) // 8192) * 8192
                    n = slab_bytes // UNIT
                    start = rule.place(space, n)
                    space.place(start, n)
                    next_slab += 1
                    count = min(slab_bytes // SLAB_SIZES[c], 2048)
                    slabs[next_slab] = [start, n, c, count, count]  # ..., free slots, slots
                    partial[c].append(next_slab)
                s = slabs[partial[c][-1]]
                s[3] -= 1  # which slot does not matter: the slab maps as one block
                live[ident] = ("slab", partial[c][-1], size)
                if not s[3]:
                    partial[c].pop()
            else:
                n = -(-size // UNIT)
                start = rule.place(space, n)
                space.place(start, n)
                live[ident] = ("block", start, n, size)
            cur += size
            peak = max(peak, cur)
        elif ident in live:
            v = live.pop(ident)
            cur -= v[-1]
            if v[0] == "block":
                space.give(v[1], v[2])
                getattr(rule, "freed_block", lambda n: None)(v[2])
            else:
                s = slabs[v[1]]
                if not s[3]:
                    partial[s[2]].append(v[1])
                s[3] += 1
                if s[3] == s[4]:
                    partial[s[2]].remove(v[1])
                    del slabs[v[1]]
                    space.give(s[0], s[1])
                    getattr(rule, "freed_block", lambda n: None)(s[1])
        if worst is not None and space.mapped > worst_mapped:
            worst_mapped = space.mapped  # copies only at a new peak: a few dozen times a trace
            worst.update(row=row, mapped=space.mapped, live=dict(live),
                         slabs={k: list(v) for k, v in slabs.items()})
    return peak / (space.peak * granule)


def print_worst(trace, granule, rule):
    """The layout at the moment the mapped granules first reach their peak:
    where the granules a placement rule wastes are (how the 64 KiB miss on
    seq2seq_generate was found: blocks of 8.6 granules straddling a tenth)."""
    w = {}
    eff = physical_efficiency(trace, granule, RULES[rule](), w)
    gu = granule // UNIT
    blocks = [(v[1], v[2], v[3], ident) for ident, v in w["live"].items() if v[0] == "block"]
    # a slab leaves `slabs` when its last slot is freed: every one there holds a live block
    blocks += [(s[0], s[1], None, f"slab {k}") for k, s in w["slabs"].items()]
    live = sum(v[-1] for v in w["live"].values())
    print(f"{trace.name}, {granule >> 10} KiB granules, rule {rule}: efficiency {eff:.3f}; "
          f"worst moment at row {w['row']}: {w['mapped']} granules mapped, "
          f"{live / granule:.2f} granules of live bytes")
    print(f"{'start in region':>17s} {'length':>8s} {'spans':>6s} {'region':>7s}  block (bytes)")
    for start, n, size, what in sorted(blocks):
        spans = (start + n - 1) // gu - start // gu + 1
        label = what if size is None else f"{what} ({size})"
        print(f"{start % REGION / gu:17.3f} {n / gu:8.3f} {spans:6d} {start // REGION:7d}  {label}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--rule", action="append", choices=sorted(RULES))
    ap.add_argument("--worst", metavar="GRANULE", type=int,
                    help="print each trace's layout at its worst moment for this granule "
                         "(bytes), under the first --rule (default mapped)")
    args = ap.parse_args(argv)
    rules = args.rule or ["bestfit", "classes", "granules", "mapped"]
    traces = [tr.load(p) for p in args.traces]
    if args.worst:
        for t in traces or [tr.example(n) for n in tr.example_names()]:
            print_worst(t, args.worst, (args.rule or ["mapped"])[0])
        return 0
    if not traces:
        shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces",
                              "pipeline.csv.gz")
        if os.path.exists(shared):
            traces.append(tr.load(shared))
        traces += [tr.example(n) for n in tr.example_names()]
    print(f"{'trace':22s}" + "".join(f"{r + ' 2MiB':>16s}{r + ' 64KiB':>16s}" for r in rules))
    for t in traces:
        cells = []
        for r in rules:
            for g in (2 << 20, 64 << 10):
                cells.append(f"{physical_efficiency(t, g, RULES[r]()):16.3f}")
        print(f"{t.name:22s}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
