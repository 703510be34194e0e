// Plays torch_npu for the stream shim's test: NPUStream's out-of-line
// members over a pretend runtime (a busy flag per stream), and the calls
// NPUPluggableAllocator makes (torch_npu/csrc/npu/NPUPluggableAllocator.cpp
// lines 96-165, 230-247): alloc and free with the allocation's stream, and
// the record/erase hooks held as std::function<void(void*, NPUStream)> cast
// from a raw address, as Module.cpp lines 397-410 set them.
#include "npu_stream.h"

#include <cstddef>
#include <functional>
#include <sys/types.h>
#include <unordered_map>

namespace {
constexpr int kStreams = 8;
bool busy[kStreams];
int syncs = 0;

std::function<void *(size_t, int, aclrtStream)> alloc_fn;
std::function<void(void *, size_t, int, aclrtStream)> free_fn;
std::function<void(void *, c10_npu::NPUStream)> record_fn, erase_fn;
struct Meta { size_t size; int device; aclrtStream stream; };
std::unordered_map<void *, Meta> meta;

aclrtStream handle(int64_t id) { return reinterpret_cast<aclrtStream>(0x5000 + id); }
c10_npu::NPUStream npu_stream(int id) {
    c10::Stream s;
    s.id = id;
    return c10_npu::NPUStream(c10_npu::NPUStream::UNCHECKED, s);
}
}  // namespace

namespace c10_npu {
bool NPUStream::query() const { return !busy[stream_.id]; }
void NPUStream::synchronize() const { busy[stream_.id] = false; ++syncs; }
aclrtStream NPUStream::stream() const { return handle(stream_.id); }
}  // namespace c10_npu

extern "C" {
void standin_set_hooks(uint64_t alloc, uint64_t free, uint64_t record, uint64_t erase) {
    alloc_fn = reinterpret_cast<void *(*)(size_t, int, aclrtStream)>(alloc);
    free_fn = reinterpret_cast<void (*)(void *, size_t, int, aclrtStream)>(free);
    using FuncType = void(void *, c10_npu::NPUStream);
    record_fn = reinterpret_cast<FuncType *>(record);
    erase_fn = reinterpret_cast<FuncType *>(erase);
}
void standin_set_busy(int stream, int value) { busy[stream] = value != 0; }
int standin_syncs(void) { return syncs; }
void *standin_malloc(size_t size, int device, int stream) {
    void *p = alloc_fn(size, device, handle(stream));
    if (p) meta[p] = Meta{size, device, handle(stream)};
    return p;
}
void standin_free(void *p) {
    Meta m = meta.at(p);
    meta.erase(p);
    free_fn(p, m.size, m.device, m.stream);
}
void standin_record_stream(void *p, int stream) { record_fn(p, npu_stream(stream)); }
void standin_erase_stream(void *p, int stream) { erase_fn(p, npu_stream(stream)); }
}
