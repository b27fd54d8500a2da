// Device capability queries, cached per device (cudaGetDeviceProperties is slow; kernels need the SM count).
#pragma once

#include <string>

namespace coda::runtime {

struct DeviceInfo {
  int ordinal = -1;
  int major = 0, minor = 0;
  int sm_count = 0;
  int l2_bytes = 0;
  size_t smem_optin_bytes = 0;
  std::string name;
};

/// Info of the current CUDA device. Throws coda::detail::Error(CODA_ERROR_ARCH) when there is no device/driver.
DeviceInfo const& current_device_info();
/// Info of device `ordinal` (same errors; CODA_ERROR_DEVICE for an ordinal out of range).
DeviceInfo const& device_info(int ordinal);

}  // namespace coda::runtime
