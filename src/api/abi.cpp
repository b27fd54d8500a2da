// Library-level C ABI: errors, versions, dtypes, device capability.
#include <coda/coda.h>

#include <string>

#include "api/guard.hpp"
#include "ops/op_config.hpp"
#include "runtime/device.hpp"

namespace coda::api {
namespace {
thread_local std::string g_last_error;
}
void set_last_error(std::string message) { g_last_error = std::move(message); }
void clear_last_error() { g_last_error.clear(); }
}  // namespace coda::api

extern "C" {

CODA_API const char* coda_last_error(void) { return coda::api::g_last_error.c_str(); }

CODA_API const char* coda_status_string(coda_status status) {
  switch (status) {
    case CODA_SUCCESS: return "CODA_SUCCESS";
    case CODA_ERROR_INVALID_ARGUMENT: return "CODA_ERROR_INVALID_ARGUMENT";
    case CODA_ERROR_DTYPE: return "CODA_ERROR_DTYPE";
    case CODA_ERROR_SHAPE: return "CODA_ERROR_SHAPE";
    case CODA_ERROR_LAYOUT: return "CODA_ERROR_LAYOUT";
    case CODA_ERROR_MISALIGNED: return "CODA_ERROR_MISALIGNED";
    case CODA_ERROR_DEVICE: return "CODA_ERROR_DEVICE";
    case CODA_ERROR_ALIASING: return "CODA_ERROR_ALIASING";
    case CODA_ERROR_WORKSPACE: return "CODA_ERROR_WORKSPACE";
    case CODA_ERROR_ARCH: return "CODA_ERROR_ARCH";
    case CODA_ERROR_NOT_IMPLEMENTED: return "CODA_ERROR_NOT_IMPLEMENTED";
    case CODA_ERROR_CUDA: return "CODA_ERROR_CUDA";
    case CODA_ERROR_INTERNAL: return "CODA_ERROR_INTERNAL";
  }
  return "CODA_ERROR_UNKNOWN_STATUS";
}

CODA_API int coda_version(void) {
  return CODA_VERSION_MAJOR * 10000 + CODA_VERSION_MINOR * 100 + CODA_VERSION_PATCH;
}

CODA_API size_t coda_dtype_size(coda_dtype dtype) {
  switch (dtype) {
    case CODA_BF16:
    case CODA_FP16: return 2;
    case CODA_FP32:
    case CODA_INT32: return 4;
    case CODA_INT64: return 8;
  }
  return 0;
}

CODA_API const char* coda_fused_op_configs(const char* op, coda_dtype dtype) {
  if (dtype != CODA_BF16 && dtype != CODA_FP16) return nullptr;
  return coda::ops::fused_op_configs(op, dtype == CODA_FP16);
}

CODA_API const char* coda_fused_op_choice(const char* op, coda_dtype dtype, int64_t M, int64_t N, int64_t K) {
  thread_local std::string choice;
  coda_status const status = coda::api::guarded("coda_fused_op_choice", [&] {
    if (dtype != CODA_BF16 && dtype != CODA_FP16) {
      coda::detail::fail(CODA_ERROR_DTYPE, "dtype: must be CODA_BF16 or CODA_FP16, got ", static_cast<int>(dtype));
    }
    choice = coda::ops::fused_op_choice(op, dtype == CODA_FP16, M, N, K);
  });
  return status == CODA_SUCCESS ? choice.c_str() : nullptr;
}

CODA_API coda_ce_options coda_ce_options_default(void) {
  coda_ce_options o{};
  o.ignore_index = -100;
  o.reduction = CODA_REDUCTION_MEAN;
  o.label_smoothing = 0.0f;
  o.z_loss = 0.0f;
  o.softcap = 0.0f;
  return o;
}

CODA_API coda_status coda_device_supported(int device, int* supported, int* major, int* minor) {
  if (supported != nullptr) *supported = 0;
  return coda::api::guarded("coda_device_supported", [&] {
    CODA_REQUIRE(supported != nullptr, CODA_ERROR_INVALID_ARGUMENT, "supported: output pointer is NULL");
    coda::runtime::DeviceInfo const& info =
        device < 0 ? coda::runtime::current_device_info() : coda::runtime::device_info(device);
    if (major != nullptr) *major = info.major;
    if (minor != nullptr) *minor = info.minor;
    *supported = (info.major == 9 && info.minor == 0) ? 1 : 0;
  });
}

}  // extern "C"
