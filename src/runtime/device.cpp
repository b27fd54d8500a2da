#include "runtime/device.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>

#include "common/error.hpp"

namespace coda::runtime {

namespace {
int device_count_or_throw() {
  int count = 0;
  cudaError_t const err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    // The runtime reports a machine without any NVIDIA driver as an "insufficient" one: say what it means.
    char const* meaning = "the CUDA runtime failed";
    if (err == cudaErrorInsufficientDriver) {
      meaning = "no NVIDIA driver is loaded on this machine, or it is older than the CUDA runtime of libcoda";
    } else if (err == cudaErrorNoDevice) {
      meaning = "no CUDA device is visible";
    }
    detail::fail(CODA_ERROR_ARCH, "no usable CUDA device: ", meaning, " (cudaGetDeviceCount: ", cudaGetErrorName(err),
                 ", ", cudaGetErrorString(err), "); CODA kernels need an sm_90 GPU (H100/H200) and its driver");
  }
  if (count == 0) detail::fail(CODA_ERROR_ARCH, "no CUDA device found; CODA kernels need an sm_90 GPU (H100/H200)");
  return count;
}
}  // namespace

DeviceInfo const& device_info(int ordinal) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<DeviceInfo>> cache;
  int const count = device_count_or_throw();
  if (ordinal < 0 || ordinal >= count) {
    detail::fail(CODA_ERROR_DEVICE, "device: ordinal ", ordinal, " is out of range (", count, " CUDA devices)");
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(ordinal);
  if (it != cache.end()) return *it->second;
  cudaDeviceProp prop{};
  CODA_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  auto info = std::make_unique<DeviceInfo>();
  info->ordinal = ordinal;
  info->major = prop.major;
  info->minor = prop.minor;
  info->sm_count = prop.multiProcessorCount;
  info->l2_bytes = prop.l2CacheSize;
  info->smem_optin_bytes = prop.sharedMemPerBlockOptin;
  info->name = prop.name;
  return *cache.emplace(ordinal, std::move(info)).first->second;
}

DeviceInfo const& current_device_info() {
  device_count_or_throw();
  int ordinal = -1;
  CODA_CUDA_CHECK(cudaGetDevice(&ordinal));
  return device_info(ordinal);
}

}  // namespace coda::runtime
