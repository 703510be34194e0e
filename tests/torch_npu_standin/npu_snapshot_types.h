// A stand-in for the part of torch_npu's NPUCachingAllocator.h that the
// snapshot shim uses (torch_npu is not installed here): the three structs,
// with the members torch_npu's builds that have set_snapshot_fn declare.
#pragma once
#include <cstdint>
#include <vector>

namespace c10_npu {
namespace NPUCachingAllocator {

struct BlockInfo {
    int64_t size = 0;
    int64_t requested_size = 0;
    int32_t gc_counter = 0;
    bool allocated = false;
    bool active = false;
};

struct SegmentInfo {
    int64_t device = 0;
    uintptr_t address = 0;
    int64_t total_size = 0;
    int64_t requested_size = 0;
    int64_t allocated_size = 0;
    int64_t active_size = 0;
    bool is_large = false;
    bool is_expandable = false;
    std::vector<BlockInfo> blocks;
};

struct SnapshotInfo {
    std::vector<SegmentInfo> segments;
    std::vector<std::vector<int>> device_traces;  // trace entries: not filled by ascmem
};

}  // namespace NPUCachingAllocator
}  // namespace c10_npu
