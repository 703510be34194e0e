// A stand-in for the part of torch_npu's NPUStream.h that the stream shim
// uses (torch_npu is not installed here).  As in torch_npu (Ascend/pytorch
// torch_npu/csrc/core/npu/NPUStream.h lines 21-108): a class holding a
// c10::Stream (device type, device index, stream id), with a user-declared
// destructor -- which makes the Itanium C++ ABI pass it by hidden reference
// -- and query(), synchronize() and stream() defined out of line, in the
// library that plays torch_npu (npu_stream_caller.cpp).
#pragma once
#include <cstdint>

typedef void *aclrtStream;

namespace c10 {
struct Stream {
    int8_t device_type = 20;  // PrivateUse1
    int8_t device_index = 0;
    int64_t id = 0;
};
}  // namespace c10

namespace c10_npu {

class NPUStream {
 public:
    enum Unchecked { UNCHECKED };
    explicit NPUStream(Unchecked, c10::Stream stream) : stream_(stream) {}
    ~NPUStream() {}

    bool operator==(const NPUStream &other) const noexcept { return stream_.id == other.stream_.id; }
    bool operator!=(const NPUStream &other) const noexcept { return !(*this == other); }
    operator aclrtStream() const { return stream(); }
    int64_t id() const { return stream_.id; }

    bool query() const;
    void synchronize() const;
    aclrtStream stream() const;

 private:
    c10::Stream stream_;
};

}  // namespace c10_npu
