// torch's CPU allocator over ascmem: compiled against the user's torch on
// first use (ascmem.torch.shim), loaded as a plain library and driven
// through ctypes.  It links against nothing of ascmem's: bind() hands it the
// addresses of ascmem's exported allocation functions (csrc/pluggable.c).
//
// Why C++ at all: c10::SetAllocator takes a c10::Allocator object, whose
// allocate() returns a c10::DataPtr (data, context, deleter).  The deleter
// is a plain function of the context; the context is the data pointer
// itself, so raw_deallocate (oneDNN frees torch's raw allocations by
// address) works too.  A tensor keeps its deleter for life: one made here
// is freed here after uninstall(), and one made before by torch's own
// allocator is freed there.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

namespace {

// ascmem_pluggable_try_alloc_cpu / _free_requested / ascmem_status_message
typedef int (*alloc_fn)(int64_t size, int device, void **out);
typedef int (*free_fn)(void *ptr, int device, int64_t *requested);
typedef const char *(*message_fn)(int status, int device);

alloc_fn ascm_alloc = nullptr;
free_fn ascm_free = nullptr;
message_fn ascm_message = nullptr;
std::atomic<int> default_index{0};
thread_local int tag_index = -1; // use_tag(): this thread's device index, -1: the default
// the profiler's totals: bytes torch asked for through this allocator
std::atomic<int64_t> allocated_total{0};

constexpr int kClosed = 8; // ASCM_ERR_CLOSED
constexpr int kNoMem = 1, kBudget = 6;

inline int current_index() {
    int t = tag_index;
    return t >= 0 ? t : default_index.load(std::memory_order_relaxed);
}

void report(void *ptr, int64_t delta) {
    if (!c10::memoryProfilingEnabled()) return;
    int64_t total = allocated_total.fetch_add(delta, std::memory_order_relaxed) + delta;
    c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(total), 0,
                                     c10::Device(c10::DeviceType::CPU));
}

void release(void *ptr) {
    if (!ptr) return;
    int64_t requested = 0;
    if (ascm_free(ptr, current_index(), &requested) != 0) return; // not ours: refused, nothing changed
    if (c10::memoryProfilingEnabled()) report(ptr, -requested);
    else allocated_total.fetch_sub(requested, std::memory_order_relaxed);
}

struct AscmemCPUAllocator final : public c10::Allocator {
    c10::DataPtr allocate(size_t n) override {
        void *p = nullptr;
        if (n) {
            int index = current_index();
            int st = ascm_alloc(static_cast<int64_t>(n), index, &p);
            if (st != 0) {
                std::string why = ascm_message(st, index);
                if (st == kNoMem || st == kBudget)
                    TORCH_CHECK_WITH(OutOfMemoryError, false, "ascmem: CPU allocation of ", n,
                                     " bytes failed: ", why);
                TORCH_CHECK(false, "ascmem: CPU allocation of ", n, " bytes failed: ", why,
                            st == kClosed ? " (ascmem.torch.uninstall() gives allocations back to torch)" : "");
            }
            if (c10::memoryProfilingEnabled()) report(p, static_cast<int64_t>(n));
            else allocated_total.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
        }
        return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &release; }
    // pure virtual from torch 2.3 on; no `override`, so older torch builds it too
    void copy_data(void *dest, const void *src, std::size_t count) const {
        default_copy_data(dest, src, count);
    }
};

AscmemCPUAllocator the_allocator;
// above torch's own CPU allocator (priority 0) and its mobile caching ones
constexpr uint8_t kPriority = 10;

} // namespace

extern "C" {

void ascmem_torch_bind(uint64_t alloc, uint64_t free, uint64_t message) {
    ascm_alloc = reinterpret_cast<alloc_fn>(alloc);
    ascm_free = reinterpret_cast<free_fn>(free);
    ascm_message = reinterpret_cast<message_fn>(message);
}

void ascmem_torch_set_index(int index) { default_index.store(index); }

// this thread's device index for new allocations (-1: the default); returns the previous one
int ascmem_torch_use_index(int index) {
    int old = tag_index;
    tag_index = index;
    return old;
}

// SetAllocator keeps the allocator of the highest priority it was given, so
// uninstall hands torch's own back at the same priority.
void ascmem_torch_install(void) { c10::SetAllocator(c10::DeviceType::CPU, &the_allocator, kPriority); }

void ascmem_torch_uninstall(void) {
    c10::SetAllocator(c10::DeviceType::CPU, c10::GetDefaultCPUAllocator(), kPriority);
}

int ascmem_torch_installed(void) { return c10::GetCPUAllocator() == &the_allocator; }

int64_t ascmem_torch_allocated(void) { return allocated_total.load(); }

} // extern "C"
