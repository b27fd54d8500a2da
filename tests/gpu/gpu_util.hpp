// Helpers for the GPU tests: the sm_90 skip guard, device buffers, upload/download, NaN poisoning.
#pragma once

#include <coda/coda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace coda::test {

/// Empty when an sm_90 device is present, else the reason to skip.
inline std::string sm90_skip_reason() {
  int supported = 0, major = 0, minor = 0;
  coda_status const s = coda_device_supported(-1, &supported, &major, &minor);
  if (s != CODA_SUCCESS) return std::string("no CUDA device: ") + coda_last_error();
  if (!supported) return "device is sm_" + std::to_string(major) + std::to_string(minor) + ", CODA kernels need sm_90";
  return "";
}

#define CODA_REQUIRE_SM90()                                                      \
  do {                                                                           \
    std::string const coda_skip_reason_ = ::coda::test::sm90_skip_reason();      \
    if (!coda_skip_reason_.empty()) GTEST_SKIP() << coda_skip_reason_;           \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

/// A cudaMalloc'd buffer (256-byte aligned), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
      ADD_FAILURE() << "cudaMalloc(" << bytes << ") failed";
    }
  }
  DeviceBuffer(DeviceBuffer const&) = delete;
  DeviceBuffer& operator=(DeviceBuffer const&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  void upload(std::vector<T> const& host) {
    ASSERT_LE(host.size() * sizeof(T), bytes_);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  template <typename T>
  std::vector<T> download(size_t count) const {
    std::vector<T> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  /// Fills every byte with 0xFF: NaN for bf16/fp16/fp32, so an unwritten element never passes a check.
  void poison() { EXPECT_EQ(cudaMemset(ptr_, 0xFF, bytes_), cudaSuccess); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A contiguous coda_tensor over `ptr` on the current device.
inline coda_tensor device_tensor(void* ptr, coda_dtype dtype, std::initializer_list<int64_t> sizes) {
  coda_tensor t{};
  t.data = ptr;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(sizes.size());
  int i = 0;
  for (int64_t s : sizes) t.sizes[i++] = s;
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.sizes[d];
  }
  int device = 0;
  cudaGetDevice(&device);
  t.device = device;
  return t;
}

/// Sets the environment variable `name` to `value` (or unsets it for nullptr) for the lifetime of the object, then
/// restores the previous value (one set from outside, or none).
class ScopedEnv {
 public:
  ScopedEnv(char const* name, char const* value) : name_(name) {
    if (char const* outer = std::getenv(name)) outer_ = outer;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (outer_) {
      setenv(name_.c_str(), outer_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(ScopedEnv const&) = delete;
  ScopedEnv& operator=(ScopedEnv const&) = delete;

 private:
  std::string name_;
  std::optional<std::string> outer_;
};

}  // namespace coda::test
