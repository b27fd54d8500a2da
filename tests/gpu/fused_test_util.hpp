// Shared helpers of the fused-op GPU tests: config pinning (CODA_OP_CONFIG), problem shapes, buffer sizes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace coda::test {

/// The mainloop configs every fused forward op compiles, plus nullptr = the default path (CODA_OP_CONFIG unset).
inline char const* const kFusedConfigs[] = {"coop_128x256x64_c2x1", "pp_128x128x64_c2x1", nullptr};

inline std::string config_name(char const* config) { return config != nullptr ? config : "default"; }

/// Sets CODA_OP_CONFIG (or unsets it for nullptr) for the lifetime of the object.
class PinConfig {
 public:
  explicit PinConfig(char const* config) {
    if (config != nullptr) {
      setenv("CODA_OP_CONFIG", config, 1);
    } else {
      unsetenv("CODA_OP_CONFIG");
    }
  }
  ~PinConfig() { unsetenv("CODA_OP_CONFIG"); }
  PinConfig(PinConfig const&) = delete;
  PinConfig& operator=(PinConfig const&) = delete;
};

struct Shape {
  int64_t M, N, K;
  std::string name() const {
    return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
  }
};

/// Bytes of a 16-bit [rows, ld] matrix plus 16 bytes of slack.
inline size_t bytes16(int64_t rows, int64_t ld) { return static_cast<size_t>(rows * ld) * 2 + 16; }

}  // namespace coda::test
