// Host buffers dressed as device tensors for the validation tests, and the EXPECT_REJECTED check: every byte starts as a sentinel, so a test can
// prove that a rejected call wrote nothing (validation runs before any CUDA call, so host memory is safe here).
#pragma once

#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
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

/// Checks a rejected call: its status, that the message contains every part (the argument name and the rule),
/// and that no buffer of `pool` was written.
inline ::testing::AssertionResult Rejected(TensorPool const& pool, coda_status got, coda_status want,
                                           std::initializer_list<char const*> parts) {
  std::string const msg = coda_last_error();
  if (got != want) {
    return ::testing::AssertionFailure() << "status " << coda_status_string(got) << ", expected "
                                         << coda_status_string(want) << " (message: " << msg << ")";
  }
  for (char const* p : parts) {
    if (msg.find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "message \"" << msg << "\" does not contain \"" << p << "\"";
    }
  }
  if (!pool.untouched()) return ::testing::AssertionFailure() << "a rejected call wrote memory";
  return ::testing::AssertionSuccess();
}

/// True when the current CUDA device is sm_90 (false without a GPU or driver).
inline bool has_sm90() {
  int supported = 0;
  return coda_device_supported(-1, &supported, nullptr, nullptr) == CODA_SUCCESS && supported == 1;
}

}  // namespace coda::test

/// EXPECT_REJECTED(call, status, "message part", ...): needs a TensorPool named `pool` in scope.
#define EXPECT_REJECTED(call, want, ...) EXPECT_TRUE(::coda::test::Rejected(pool, (call), (want), {__VA_ARGS__}))

/// Valid arguments in host memory (labelled as device 0) pass validation and reach the kernel's device stage:
/// without an sm_90 GPU it refuses with CODA_ERROR_ARCH; with one, it finds that the first "device" pointer
/// (`first`, e.g. "x:") is host memory. Either way nothing is written.
#define EXPECT_DEVICE_STAGE(call, first)                                 \
  do {                                                                   \
    if (::coda::test::has_sm90()) {                                      \
      EXPECT_REJECTED(call, CODA_ERROR_DEVICE, first, "host memory");    \
    } else {                                                             \
      EXPECT_REJECTED(call, CODA_ERROR_ARCH, "sm_90");                   \
    }                                                                    \
  } while (0)
