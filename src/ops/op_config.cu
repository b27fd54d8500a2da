// Config pinning shared by the fused ops (host only, no CUTLASS).
#include "ops/op_config.hpp"

#include "common/error.hpp"
#include "gemm/knobs.hpp"
#include "runtime/autotune.hpp"

#include <string>

namespace coda::ops {

namespace {

// The fused ops' C ABI names (choose_kernel's `op`): the per-op form of CODA_OP_CONFIG may name only these, with or
// without the "coda_" prefix, so that a misspelt name is an error instead of a pin that silently does nothing.
constexpr char const* kFusedOps[] = {"coda_linear_rowscale",         "coda_linear_residual_rmsnorm",
                                     "coda_linear_rowscale_swiglu",  "coda_linear_rowscale_rope",
                                     "coda_linear_rowscale_lse",     "coda_linear_residual_rmsnorm_bwd",
                                     "coda_linear_swiglu_bwd_zdz"};

std::string canonical_op(std::string const& name) {
  std::string const full = name.rfind("coda_", 0) == 0 ? name : "coda_" + name;
  for (char const* op : kFusedOps) {
    if (full == op) return full;
  }
  return {};
}

[[noreturn]] void bad_spec(std::string const& spec, std::string const& why) {
  coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "CODA_OP_CONFIG=", spec, ": ", why);
}

/// The "<config>[:<knobs>]" that applies to `op`: the whole value in the global form, the op's entry in the
/// per-op form, "" when the per-op form does not name the op. The per-op form is recognised by an '=' before the
/// first ':' or ';' (config names contain none; knobs come after the ':'). Every entry is checked on every call,
/// whichever op asks, so a malformed value fails on the first fused call.
std::string pin_for(std::string const& spec, char const* op) {
  size_t const head_end = spec.find_first_of(":;");
  size_t const eq = spec.find('=');
  if (eq == std::string::npos || (head_end != std::string::npos && eq > head_end)) return spec;  // global form
  std::string mine, seen;
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(';', begin);
    if (end == std::string::npos) end = spec.size();
    std::string const entry = spec.substr(begin, end - begin);
    begin = end + 1;
    if (entry.empty()) continue;  // tolerate "a=x;" and ";;"
    size_t const e = entry.find('=');
    size_t const colon = entry.find(':');
    if (e == std::string::npos || e == 0 || (colon != std::string::npos && colon < e)) {
      bad_spec(spec, "entry '" + entry + "' is not <op>=<config>[:<knobs>] (the per-op form; the global form is " +
                         "one <config>[:<knobs>] for every fused op)");
    }
    std::string const name = canonical_op(entry.substr(0, e));
    if (name.empty()) {
      std::string ops;
      for (char const* o : kFusedOps) ops += std::string(ops.empty() ? "" : ", ") + o;
      bad_spec(spec, "'" + entry.substr(0, e) + "' is not a fused op (ops: " + ops + ", 'coda_' optional)");
    }
    if (("," + seen + ",").find("," + name + ",") != std::string::npos) {
      bad_spec(spec, name + " is named twice");
    }
    seen += (seen.empty() ? "" : ",") + name;
    if (e + 1 == entry.size()) bad_spec(spec, name + " has no config after '='");
    if (name == op) mine = entry.substr(e + 1);
  }
  return mine;
}

}  // namespace

int pinned_config(char const* op, gemm::KernelInfo const* const* infos, int count, gemm::Knobs* knobs) {
  std::string const spec = runtime::env_string("CODA_OP_CONFIG");
  if (spec.empty()) return -1;
  std::string const pinned = pin_for(spec, op);
  if (pinned.empty()) return -1;
  size_t const colon = pinned.find(':');
  std::string const config = pinned.substr(0, colon);
  std::string compiled;
  for (int i = 0; i < count; ++i) {
    if (config == infos[i]->config) {
      if (colon != std::string::npos) {
        gemm::Knobs k = knobs != nullptr ? *knobs : gemm::Knobs{};
        std::string why;
        if (!gemm::parse_knobs(pinned.substr(colon + 1), k, &why)) bad_spec(spec, why);
        if (knobs != nullptr) *knobs = k;
      }
      return i;
    }
    compiled += (i == 0 ? "" : ", ");
    compiled += infos[i]->config;
  }
  bad_spec(spec, std::string(op) + " has no kernel for config '" + config + "' (compiled: " + compiled + ")");
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
