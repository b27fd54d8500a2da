// A compile-time check of a mainloop config's name (no includes: the generated kernel instances use it).
#pragma once

namespace coda::gemm::config {

/// Whether Config::kName is `name`: the generated kernel instances (src/ops/registry.cmake) name a config by its
/// string and derive the struct's name from it (gemm/configs.hpp); this keeps the two in step at compile time.
template <class Config>
constexpr bool is_named(char const* name) {
  char const* own = Config::kName;
  while (*own != '\0' && *own == *name) {
    ++own;
    ++name;
  }
  return *own == *name;
}

}  // namespace coda::gemm::config
