// ascmem's snapshot hook for torch_npu's NPUPluggableAllocator.
//
// The hook returns c10_npu::NPUCachingAllocator::SnapshotInfo, whose members
// are std::vectors and whose fields differ between torch_npu releases, so it
// is built here, in C++, against the user's own torch_npu headers: the
// compiler lays the structs out, nothing is guessed, and a release whose
// fields differ fails to compile instead of corrupting memory.  Build and
// install it with ascmem.pluggable.build_snapshot_shim() and
// set_hooks(..., snapshot_shim=path), or by hand:
//
//   c++ -O2 -std=c++17 -shared -fPIC ascmem_npu_snapshot.cpp -o libascmem_npu_snapshot.so \
//       -I<torch include dirs> -I<torch_npu include dir>
//
// It reads ascmem's devices through ascmem_pluggable_walk (exported by
// ascmem's extension), whose address Python hands over once (bind below).
#ifndef ASCMEM_NPU_HEADER
#define ASCMEM_NPU_HEADER "torch_npu/csrc/core/npu/NPUCachingAllocator.h"
#endif
#include ASCMEM_NPU_HEADER

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

namespace npu = c10_npu::NPUCachingAllocator;

using SegmentFn = void (*)(void *, int, uint64_t, uint64_t);
using BlockFn = void (*)(void *, uint64_t, uint64_t, uint64_t, int);
using WalkFn = int (*)(int, SegmentFn, BlockFn, void *);

WalkFn walk = nullptr;
constexpr int kMaxDevices = 64;  // as ascmem's pluggable registry
constexpr int kNormalKind = 1;   // ascmem's NORMAL pages: torch's small pool

struct Piece {
    uint64_t addr, size, requested;
    bool allocated;
};

struct Segment {
    int kind;
    uint64_t base, size;
    std::vector<Piece> pieces;
};

void on_segment(void *ctx, int kind, uint64_t base, uint64_t size) {
    static_cast<std::vector<Segment> *>(ctx)->push_back(Segment{kind, base, size, {}});
}

void on_block(void *ctx, uint64_t addr, uint64_t size, uint64_t requested, int allocated) {
    static_cast<std::vector<Segment> *>(ctx)->back().pieces.push_back(
        Piece{addr, size, requested, allocated != 0});
}

// Blocks in address order covering the whole segment, as torch's memory
// viewer expects (it places blocks by adding up their sizes): what the walk
// does not list (free slots inside slabs) becomes unallocated blocks.
npu::SegmentInfo convert(int device, Segment &seg) {
    std::sort(seg.pieces.begin(), seg.pieces.end(),
              [](const Piece &a, const Piece &b) { return a.addr < b.addr; });
    npu::SegmentInfo out;
    out.device = device;
    out.address = seg.base;
    out.total_size = static_cast<int64_t>(seg.size);
    out.is_large = seg.kind != kNormalKind;
    uint64_t at = seg.base, end = seg.base + seg.size;
    auto add = [&](uint64_t size, uint64_t requested, bool allocated) {
        npu::BlockInfo b;
        b.size = static_cast<int64_t>(size);
        b.requested_size = static_cast<int64_t>(requested);
        b.allocated = allocated;
        b.active = allocated;
        out.blocks.push_back(b);
        if (allocated) {
            out.allocated_size += static_cast<int64_t>(size);
            out.active_size += static_cast<int64_t>(size);
            out.requested_size += static_cast<int64_t>(requested);
        }
    };
    for (const Piece &p : seg.pieces) {
        if (p.addr > at) add(p.addr - at, 0, false);
        add(p.size, p.requested, p.allocated);
        at = p.addr + p.size;
    }
    if (end > at) add(end - at, 0, false);
    return out;
}

npu::SnapshotInfo snapshot() {
    npu::SnapshotInfo info;
    if (!walk) return info;
    for (int device = 0; device < kMaxDevices; device++) {
        std::vector<Segment> segs;
        if (walk(device, on_segment, on_block, &segs) != 0) continue;
        for (Segment &seg : segs) info.segments.push_back(convert(device, seg));
    }
    return info;
}

}  // namespace

extern "C" {
__attribute__((visibility("default"))) void ascmem_npu_snapshot_bind(uint64_t walk_fn) {
    walk = reinterpret_cast<WalkFn>(walk_fn);
}
// The address to hand to NPUPluggableAllocator.set_snapshot_fn.
__attribute__((visibility("default"))) uint64_t ascmem_npu_snapshot_fn(void) {
    return reinterpret_cast<uint64_t>(&snapshot);
}
}
