// Host buffers dressed as device tensors for the validation tests: every byte starts as a sentinel, so a test can
// prove that a rejected call wrote nothing (validation runs before any CUDA call, so host memory is safe here).
#pragma once

#include <coda/coda.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

namespace coda::test {

class TensorPool {
 public:
  static constexpr unsigned char kSentinel = 0x5A;

  /// A contiguous tensor of `sizes` on (pretend) CUDA device `device`, 256-byte aligned, filled with the sentinel.
  coda_tensor make(coda_dtype dtype, std::initializer_list<int64_t> sizes, int device = 0) {
    coda_tensor t{};
    t.dtype = dtype;
    t.rank = static_cast<int32_t>(sizes.size());
    t.device = device;
    int i = 0;
    for (int64_t s : sizes) t.sizes[i++] = s;
    int64_t stride = 1, n = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.strides[d] = stride;
      stride *= t.sizes[d];
      n *= t.sizes[d];
    }
    size_t const bytes = static_cast<size_t>(n) * coda_dtype_size(dtype) + 64;  // slack for offset views
    size_t const padded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, padded);
    std::memset(p, kSentinel, padded);
    blocks_.push_back({std::unique_ptr<void, decltype(&std::free)>(p, &std::free), padded});
    t.data = p;
    return t;
  }

  /// Raw scratch (workspace) of `bytes`, 256-byte aligned, sentinel-filled.
  void* bytes(size_t n) {
    coda_tensor t = make(CODA_FP32, {static_cast<int64_t>((n + 3) / 4)});
    return t.data;
  }

  /// True when no byte of any buffer changed.
  bool untouched() const {
    for (auto const& b : blocks_) {
      auto const* p = static_cast<unsigned char const*>(b.ptr.get());
      for (size_t i = 0; i < b.bytes; ++i) {
        if (p[i] != kSentinel) return false;
      }
    }
    return true;
  }

 private:
  struct Block {
    std::unique_ptr<void, decltype(&std::free)> ptr;
    size_t bytes;
  };
  std::vector<Block> blocks_;
};

}  // namespace coda::test
