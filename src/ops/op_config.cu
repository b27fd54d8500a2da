// Config pinning shared by the fused ops (host only, no CUTLASS).
#include "ops/op_config.hpp"

#include "common/error.hpp"
#include "gemm/knobs.hpp"
#include "ops/fused_ops_policy.hpp"
#include "ops/fused_ops_table.hpp"
#include "runtime/autotune.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace coda::ops {

namespace {

// The fused ops CODA_OP_CONFIG can pin and the configs each compiles for bf16: generated from src/ops/*/op.cmake
// (src/ops/registry.cmake), the one list of what is compiled. The per-op form of CODA_OP_CONFIG is checked against
// it, and coda_fused_op_configs() hands it to the GPU tests (which pin every config of every op) and the benchmarks.
using registry::FusedOp;
using registry::kFusedOps;
constexpr int kFusedOpCount = static_cast<int>(sizeof(kFusedOps) / sizeof(kFusedOps[0]));

/// "a,b,c": the op's bf16 configs as coda_fused_op_configs and the error messages list them.
std::string joined(FusedOp const& op) {
  std::string out;
  for (char const* c : op.bf16) {
    if (c != nullptr) out += (out.empty() ? "" : ",") + std::string(c);
  }
  return out;
}

/// "a,b,c": every config some op compiles for bf16 (fp16: for fp16), each once, in first-listed order.
std::string every_config(bool fp16) {
  std::vector<std::string> seen;
  for (FusedOp const& f : kFusedOps) {
    auto const add = [&seen](char const* c) {
      if (c != nullptr && std::find(seen.begin(), seen.end(), c) == seen.end()) seen.emplace_back(c);
    };
    if (fp16) {
      add(f.fp16);
    } else {
      for (char const* c : f.bf16) add(c);
    }
  }
  std::string out;
  for (std::string const& c : seen) out += (out.empty() ? "" : ",") + c;
  return out;
}

bool compiles(FusedOp const& op, std::string const& config) {
  for (char const* c : op.bf16) {
    if (c != nullptr && config == c) return true;
  }
  return false;
}

/// The index of a fused op's name in kFusedOps ("coda_" optional), -1 for any other name.
int find_op(std::string const& name) {
  std::string const full = name.rfind("coda_", 0) == 0 ? name : "coda_" + name;
  for (int i = 0; i < kFusedOpCount; ++i) {
    if (full == kFusedOps[i].name) return i;
  }
  return -1;
}

[[noreturn]] void bad_spec(std::string const& spec, std::string const& why) {
  coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "CODA_OP_CONFIG=", spec, ": ", why);
}

/// "<config>[:<knobs>]" of `op` (nullptr: the global form, any fused op): the config must be one the op compiles
/// for bf16 (global form: one that some fused op compiles; an op without it refuses the pin when called), the knobs
/// must parse.
void check_pin(std::string const& spec, FusedOp const* op, std::string const& pin) {
  size_t const colon = pin.find(':');
  std::string const config = pin.substr(0, colon);
  bool ok = false;
  for (FusedOp const& f : kFusedOps) ok = ok || ((op == nullptr || op == &f) && compiles(f, config));
  if (!ok) {
    std::string const compiled = op != nullptr ? joined(*op) : every_config(false);
    std::string const fp16 = op != nullptr ? (op->fp16 != nullptr ? op->fp16 : "none") : every_config(true);
    bad_spec(spec, (op != nullptr ? std::string(op->name) + " compiles" : std::string("the fused ops compile")) +
                       " no config '" + config + "' (compiled for bf16: " + compiled + "; fp16: " + fp16 + ")");
  }
  if (colon != std::string::npos) {
    gemm::Knobs k;
    std::string why;
    if (!gemm::parse_knobs(pin.substr(colon + 1), k, &why)) bad_spec(spec, why);
  }
}

/// Parses and checks the whole value; returns the "<config>[:<knobs>]" that applies to `op` (nullptr: none asked):
/// the whole value in the global form, the op's entry in the per-op form, "" when the per-op form does not name
/// it. The per-op form is recognised by an '=' before the first ':' (config names contain none; knobs, which do,
/// come after the ':'). Every entry is checked whichever op asks, so a bad value fails on the first fused call,
/// before anything is launched (check_op_config runs with the C ABI's argument checks).
std::string parse_spec(std::string const& spec, char const* op) {
  size_t const colon = spec.find(':');
  size_t const eq = spec.find('=');
  if (eq == std::string::npos || (colon != std::string::npos && eq > colon)) {  // global form
    check_pin(spec, nullptr, spec);
    return spec;
  }
  std::string mine;
  bool named[kFusedOpCount] = {};
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(';', begin);
    if (end == std::string::npos) end = spec.size();
    std::string const entry = spec.substr(begin, end - begin);
    begin = end + 1;
    if (entry.empty()) continue;  // tolerate ";a=x", "a=x;" and ";;"
    size_t const e = entry.find('=');
    size_t const c = entry.find(':');
    if (e == std::string::npos || e == 0 || (c != std::string::npos && c < e)) {
      bad_spec(spec, "entry '" + entry + "' is not <op>=<config>[:<knobs>] (the per-op form; the global form is " +
                         "one <config>[:<knobs>] for every fused op)");
    }
    int const i = find_op(entry.substr(0, e));
    if (i < 0) {
      std::string ops;
      for (FusedOp const& f : kFusedOps) ops += std::string(ops.empty() ? "" : ", ") + f.name;
      bad_spec(spec, "'" + entry.substr(0, e) + "' is not a fused op (ops: " + ops + ", 'coda_' optional)");
    }
    FusedOp const& o = kFusedOps[i];
    if (named[i]) bad_spec(spec, std::string(o.name) + " is named twice");
    named[i] = true;
    if (e + 1 == entry.size()) bad_spec(spec, std::string(o.name) + " has no config after '='");
    check_pin(spec, &o, entry.substr(e + 1));
    if (op != nullptr && std::string(o.name) == op) mine = entry.substr(e + 1);
  }
  return mine;
}

}  // namespace

char const* fused_op_configs(char const* op, bool fp16) {
  if (op == nullptr) return nullptr;
  int const i = find_op(op);
  if (i < 0) return nullptr;
  if (fp16) return kFusedOps[i].fp16;
  static std::string const* const lists = [] {  // built once, thread-safe (static initialisation)
    static std::string all[kFusedOpCount];
    for (int k = 0; k < kFusedOpCount; ++k) all[k] = joined(kFusedOps[k]);
    return all;
  }();
  return lists[i].c_str();
}

std::string fused_op_choice(char const* op, bool fp16, int64_t M, int64_t N, int64_t K) {
  std::string const name = op == nullptr ? "" : std::string(op).rfind("coda_", 0) == 0 ? std::string(op + 5) : op;
  for (registry::Policy const& p : registry::kPolicies) {
    if (name != p.name) continue;
    if (fp16 && !p.has_fp16) {
      coda::detail::fail(CODA_ERROR_DTYPE, "dtype: ", p.name, " compiles no fp16 kernel (bf16 only)");
    }
    if (M < 0 || N < 0 || K < 0) {
      coda::detail::fail(CODA_ERROR_SHAPE, "M, N, K: must be >= 0, got ", M, ", ", N, ", ", K);
    }
    registry::Choice const c = p.choose(fp16, M, N, K);
    std::string const knobs = gemm::knobs_string(c.knobs);
    return knobs.empty() ? std::string(c.config) : std::string(c.config) + ":" + knobs;
  }
  std::string known;
  for (registry::Policy const& p : registry::kPolicies) known += (known.empty() ? "" : ", ") + std::string(p.name);
  coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "op: no fused op or kernel kind named '", op == nullptr ? "NULL" : op,
                     "' (known: ", known, ")");
}

void check_op_config() {
  std::string const spec = runtime::env_string("CODA_OP_CONFIG");
  if (!spec.empty()) parse_spec(spec, nullptr);
}

int pinned_config(char const* op, gemm::KernelInfo const* const* infos, int count, gemm::Knobs* knobs) {
  std::string const spec = runtime::env_string("CODA_OP_CONFIG");
  if (spec.empty()) return -1;
  std::string const pinned = parse_spec(spec, op);
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
  bad_spec(spec, std::string(op) + " has no kernel for config '" + config + "' in this dtype (compiled: " + compiled +
                     ")");
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
