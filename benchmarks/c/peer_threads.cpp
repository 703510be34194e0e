// The multi-thread workloads of threads.h against OffsetAllocator behind one
// std::mutex, the way a caller shares it between threads.  Its source comes
// from the tlsfallocator sdist (make peer downloads it), as peer_offset.cpp.
#include OFFSET_SRC
#include "threads.h"

#include <mutex>

static const uint32 UNIT_SHIFT = 8;  // 256-byte units, as peer_offset.cpp

struct Locked {
    Allocator a{0xFFFFFFFFu, 256 * 1024};
    std::mutex m;
};

static void *make() { return new Locked; }
static int alloc(void *p, uint64_t size, uint64_t *h) {
    Locked *l = static_cast<Locked *>(p);
    uint32 units = (uint32)((size + (1u << UNIT_SHIFT) - 1) >> UNIT_SHIFT);
    std::lock_guard<std::mutex> g(l->m);
    Allocation x = l->a.allocate(units);
    if (x.offset == Allocation::NO_SPACE) return 1;
    *h = ((uint64_t)x.offset << 32) | x.metadata;  // the caller keeps the node: no lookup
    return 0;
}
static void release(void *p, uint64_t h, uint64_t) {
    Locked *l = static_cast<Locked *>(p);
    std::lock_guard<std::mutex> g(l->m);
    l->a.free(Allocation{(uint32)(h >> 32), (uint32)h});
}
static void destroy(void *p) { delete static_cast<Locked *>(p); }

static const backend offset_backend = {"OffsetAllocator + mutex", make, alloc, release, destroy};

int main(int argc, char **argv) { return run_threads(&offset_backend, argc, argv); }
