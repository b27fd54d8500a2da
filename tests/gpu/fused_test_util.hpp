// Shared helpers of the fused-op GPU tests: config pinning (CODA_OP_CONFIG), problem shapes, buffer sizes.
#pragma once

#include <coda/coda.h>
#include <coda/types.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpu/gpu_util.hpp"

namespace coda::test {

/// The configs `op` (its C ABI name, "coda_" optional) compiles for `dtype`, as libcoda lists them
/// (coda_fused_op_configs: the list CODA_OP_CONFIG is checked against), plus nullptr = the default path
/// (CODA_OP_CONFIG unset). Aborts the test binary on a name libcoda does not know: a test must not pass by running
/// no config.
inline std::vector<char const*> fused_configs(coda_dtype dtype, char const* op) {
  static std::set<std::string> names;  // each config name stored once for the process (tests pin them by pointer)
  char const* list = coda_fused_op_configs(op, dtype);
  if (list == nullptr) {
    std::fprintf(stderr, "fused_configs: coda_fused_op_configs(\"%s\") is NULL\n", op);
    std::abort();
  }
  std::vector<char const*> out;
  std::string const all = list;
  for (size_t begin = 0; begin <= all.size();) {
    size_t end = all.find(',', begin);
    if (end == std::string::npos) end = all.size();
    out.push_back(names.insert(all.substr(begin, end - begin)).first->c_str());
    begin = end + 1;
  }
  out.push_back(nullptr);
  return out;
}

/// Switches a test file's dtype variable to fp16 for the object's lifetime; restores bf16 after.
class UseFp16 {
 public:
  explicit UseFp16(coda_dtype& dtype) : dtype_(dtype) { dtype_ = CODA_FP16; }
  ~UseFp16() { dtype_ = CODA_BF16; }
  UseFp16(UseFp16 const&) = delete;
  UseFp16& operator=(UseFp16 const&) = delete;

 private:
  coda_dtype& dtype_;
};

inline std::string config_name(char const* config) { return config != nullptr ? config : "default"; }

/// Sets CODA_OP_CONFIG (or unsets it for nullptr) for the lifetime of the object.
class PinConfig : public ScopedEnv {
 public:
  explicit PinConfig(char const* config) : ScopedEnv("CODA_OP_CONFIG", config) {}
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
