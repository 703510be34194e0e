// The workloads of workload.h against OffsetAllocator, the C++ allocator that
// the PyPI package tlsfallocator binds, so the C core is compared with it in
// the same run.  Its source is not part of ascmem: `make peer` downloads the
// package's sdist and compiles its main.cpp into this driver (OFFSET_SRC).
//
// OffsetAllocator offsets are 32-bit, so sizes are counted in 256-byte units
// (4 TiB of range would not fit in bytes; 10,000 blocks of up to 4 MiB do
// not fit in 4 GiB either).  The caller keeps the node index it returns, so
// its free needs no lookup by address -- ascmem's does.
#include OFFSET_SRC
#include "workload.h"

#include <unordered_map>

static const uint32 UNIT_SHIFT = 8;

static uint32 units(uint64_t bytes) { return (uint32)((bytes + (1u << UNIT_SHIFT) - 1) >> UNIT_SHIFT); }

static double steady() {
    static uint32 sizes[STEPS], victims[STEPS];
    static Allocation live[LIVE];
    for (int i = 0; i < STEPS; i++) {
        sizes[i] = units(log_uniform());
        victims[i] = (uint32)(next_rand() % LIVE);
    }
    Allocator a(0xFFFFFFFFu, 128 * 1024);
    for (int i = 0; i < LIVE; i++)
        if ((live[i] = a.allocate(units(log_uniform()))).offset == Allocation::NO_SPACE) exit(2);
    double t0 = now();
    for (int i = 0; i < STEPS; i++) {
        uint32 v = victims[i];
        a.free(live[v]);
        if ((live[v] = a.allocate(sizes[i])).offset == Allocation::NO_SPACE) exit(3);
    }
    return (now() - t0) * 1e9 / STEPS;
}

// The steady workload again, for a caller that frees by offset, as ascmem's
// callers do: it must keep offset -> metadata itself (std::unordered_map, what
// such a caller would reach for).  Shows what the lookup costs OffsetAllocator.
static double steady_by_offset() {
    static uint32 sizes[STEPS], victims[STEPS], live[LIVE];
    for (int i = 0; i < STEPS; i++) {
        sizes[i] = units(log_uniform());
        victims[i] = (uint32)(next_rand() % LIVE);
    }
    Allocator a(0xFFFFFFFFu, 128 * 1024);
    std::unordered_map<uint32, uint32> meta;
    meta.reserve(2 * LIVE);
    for (int i = 0; i < LIVE; i++) {
        Allocation x = a.allocate(units(log_uniform()));
        if (x.offset == Allocation::NO_SPACE) exit(2);
        meta.emplace(x.offset, x.metadata);
        live[i] = x.offset;
    }
    double t0 = now();
    for (int i = 0; i < STEPS; i++) {
        uint32 v = victims[i];
        auto it = meta.find(live[v]);
        a.free(Allocation{it->first, it->second});
        meta.erase(it);
        Allocation x = a.allocate(sizes[i]);
        if (x.offset == Allocation::NO_SPACE) exit(3);
        meta.emplace(x.offset, x.metadata);
        live[v] = x.offset;
    }
    return (now() - t0) * 1e9 / STEPS;
}

static double lifo() {
    static uint32 sizes[LIFO_N];
    static Allocation got[LIFO_N];
    for (int i = 0; i < LIFO_N; i++) sizes[i] = units(log_uniform());
    Allocator a(0xFFFFFFFFu, 128 * 1024);
    double t0 = now();
    for (int r = 0; r < LIFO_ROUNDS; r++) {
        for (int i = 0; i < LIFO_N; i++)
            if ((got[i] = a.allocate(sizes[i])).offset == Allocation::NO_SPACE) exit(4);
        for (int i = LIFO_N - 1; i >= 0; i--) a.free(got[i]);
    }
    return (now() - t0) * 1e9 / ((double)LIFO_N * LIFO_ROUNDS);
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : RUNS;
    if (runs < 1 || runs > 99) runs = RUNS;
    double s[99], l[99], b[99];
    for (int i = 0; i < runs; i++) {
        s[i] = steady();
        l[i] = lifo();
        b[i] = steady_by_offset();
    }
    printf("steady_ns_per_pair %.2f\nlifo_ns_per_pair %.2f\n", median(s, runs), median(l, runs));
    printf("steady_by_offset_ns_per_pair %.2f\n", median(b, runs));
    return 0;
}
