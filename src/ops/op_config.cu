// Config pinning shared by the fused ops (host only, no CUTLASS).
#include "ops/op_config.hpp"

#include "common/error.hpp"
#include "gemm/knobs.hpp"
#include "runtime/autotune.hpp"

#include <string>

namespace coda::ops {

int pinned_config(char const* op, gemm::KernelInfo const* const* infos, int count, gemm::Knobs* knobs) {
  std::string const pinned = runtime::env_string("CODA_OP_CONFIG");
  if (pinned.empty()) return -1;
  size_t const colon = pinned.find(':');
  std::string const config = pinned.substr(0, colon);
  std::string compiled;
  for (int i = 0; i < count; ++i) {
    if (config == infos[i]->config) {
      if (colon != std::string::npos) {
        gemm::Knobs k = knobs != nullptr ? *knobs : gemm::Knobs{};
        std::string why;
        if (!gemm::parse_knobs(pinned.substr(colon + 1), k, &why)) {
          coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "CODA_OP_CONFIG=", pinned, ": ", why);
        }
        if (knobs != nullptr) *knobs = k;
      }
      return i;
    }
    compiled += (i == 0 ? "" : ", ");
    compiled += infos[i]->config;
  }
  coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "CODA_OP_CONFIG=", pinned, ": ", op, " has no kernel for this",
                     " config (compiled: ", compiled, ")");
}

gemm::Knobs raster_n(int swizzle) {
  gemm::Knobs k;
  k.raster = gemm::Raster::kAlongN;
  k.swizzle = swizzle;
  return k;
}

gemm::Knobs raster_m(int swizzle) {
  gemm::Knobs k;
  k.raster = gemm::Raster::kAlongM;
  k.swizzle = swizzle;
  return k;
}

}  // namespace coda::ops
