// ascmem's record/erase-stream hooks for torch_npu's NPUPluggableAllocator,
// with the alloc and free functions that honour them.
//
// torch_npu hands these hooks a c10_npu::NPUStream by value
// (torch_npu/csrc/npu/Module.cpp lines 400 and 407 in Ascend/pytorch).
// NPUStream declares its own destructor (NPUStream.h line 27), so the Itanium
// C++ ABI passes it by hidden reference: the hook receives the address of a
// copy, not an aclrtStream.  Only C++ compiled against torch_npu's header
// reads it right, so this file is built against the user's torch_npu
// (ascmem.pluggable.build_stream_shim) and loaded into the same process.
//
// What it does with the streams, as torch_npu's own caching allocator does
// with record_stream (NPUCachingAllocator.cpp, insert_events and
// process_events): a block freed while another stream recorded on it may
// still read it is not given back to ascmem at once.  It waits in a list
// until each of those streams reports its queued work done
// (NPUStream::query), checked at every allocation and free; an allocation
// that ascmem cannot serve first waits for those streams
// (NPUStream::synchronize) and gives the waiting blocks back, then retries.
// A stream's query covers all its queued work, not only the work before the
// free: conservative, never early.
//
//   c++ -O2 -std=c++17 -shared -fPIC ascmem_npu_streams.cpp -o libascmem_npu_streams.so
//       -I<torch include dirs> -I<torch_npu include dir>    (one command)
#ifndef ASCMEM_NPU_STREAM_HEADER
#define ASCMEM_NPU_STREAM_HEADER "torch_npu/csrc/core/npu/NPUStream.h"
#endif
#include ASCMEM_NPU_STREAM_HEADER

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <sys/types.h>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using Stream = c10_npu::NPUStream;
using AllocFn = void *(*)(ssize_t, int, aclrtStream);  // ascmem_pluggable_alloc
using FreeFn = void (*)(void *, ssize_t, int, aclrtStream);  // ascmem_pluggable_free

AllocFn ascmem_alloc = nullptr;
FreeFn ascmem_free = nullptr;

struct Waiting {  // a freed block that other streams may still read
    void *ptr;
    size_t size;
    int device;
    aclrtStream stream;
    std::vector<Stream> users;
};

std::mutex mu;  // guards the two tables; never held while calling out
// live block -> the streams recorded on it, each with its aclrtStream, read
// at the record (not in free, which torch_npu may call where a stream's
// task queue must not be flushed)
std::unordered_map<void *, std::vector<std::pair<Stream, aclrtStream>>> recorded;
std::vector<Waiting> waiting;

bool all_done(const std::vector<Stream> &users) {
    return std::all_of(users.begin(), users.end(), [](const Stream &s) { return s.query(); });
}

// Gives back the waiting blocks whose streams are done (all of them if
// wait: after synchronizing their streams).  True if any went back.
bool give_back(bool wait) {
    std::vector<Waiting> mine;
    {
        std::lock_guard<std::mutex> g(mu);
        if (waiting.empty()) return false;
        mine.swap(waiting);
    }
    std::vector<Waiting> keep;
    bool gave = false;
    for (auto &w : mine) {
        if (wait)
            for (const auto &s : w.users) s.synchronize();
        if (wait || all_done(w.users)) {
            ascmem_free(w.ptr, static_cast<ssize_t>(w.size), w.device, w.stream);
            gave = true;
        } else {
            keep.push_back(std::move(w));
        }
    }
    if (!keep.empty()) {
        std::lock_guard<std::mutex> g(mu);
        for (auto &w : keep) waiting.push_back(std::move(w));
    }
    return gave;
}

}  // namespace

extern "C" {

// Points the shim at ascmem's exported alloc and free (addresses from
// ascmem.pluggable.load_stream_shim).
__attribute__((visibility("default"))) void ascmem_npu_streams_bind(uint64_t alloc, uint64_t free) {
    ascmem_alloc = reinterpret_cast<AllocFn>(alloc);
    ascmem_free = reinterpret_cast<FreeFn>(free);
}

// NPUPluggableAllocator's alloc and free (its constructor takes their names).
__attribute__((visibility("default"))) void *ascmem_npu_alloc(ssize_t size, int device,
                                                               aclrtStream stream) {
    give_back(false);
    void *p = ascmem_alloc(size, device, stream);
    if (!p && give_back(true)) p = ascmem_alloc(size, device, stream);
    return p;
}

__attribute__((visibility("default"))) void ascmem_npu_free(void *ptr, ssize_t size, int device,
                                                             aclrtStream stream) {
    std::vector<Stream> users;
    {
        std::lock_guard<std::mutex> g(mu);
        auto it = recorded.find(ptr);
        if (it != recorded.end()) {
            // the allocating stream orders its own work: only the others are waited for
            for (const auto &r : it->second)
                if (r.second != stream) users.push_back(r.first);
            recorded.erase(it);
        }
    }
    if (users.empty() || all_done(users)) {
        ascmem_free(ptr, size, device, stream);
    } else {
        std::lock_guard<std::mutex> g(mu);
        waiting.push_back(Waiting{ptr, static_cast<size_t>(size), device, stream, std::move(users)});
    }
    give_back(false);
}

// set_record_stream_fn / set_erase_stream_fn: void(void *, c10_npu::NPUStream).
__attribute__((visibility("default"))) void ascmem_npu_record_stream(void *ptr, Stream stream) {
    aclrtStream handle = stream.stream();
    std::lock_guard<std::mutex> g(mu);
    auto &users = recorded[ptr];
    for (const auto &r : users)
        if (r.first == stream) return;
    users.emplace_back(stream, handle);
}

__attribute__((visibility("default"))) void ascmem_npu_erase_stream(void *ptr, Stream stream) {
    std::lock_guard<std::mutex> g(mu);
    auto it = recorded.find(ptr);
    if (it == recorded.end()) return;
    auto &users = it->second;
    users.erase(std::remove_if(users.begin(), users.end(),
                               [&](const std::pair<Stream, aclrtStream> &r) { return r.first == stream; }),
                users.end());
    if (users.empty()) recorded.erase(it);
}

// How many freed blocks wait for other streams (for tests and diagnostics).
__attribute__((visibility("default"))) uint64_t ascmem_npu_streams_waiting(void) {
    std::lock_guard<std::mutex> g(mu);
    return waiting.size();
}

}  // extern "C"
