// Config selection shared by the fused ops' dispatchers (CUTLASS-free).
#pragma once

#include "common/error.hpp"
#include "gemm/kernel_api.hpp"
#include "gemm/tile_grid.hpp"

#include <cstdint>
#include <string>

namespace coda::ops {

/// CODA_OP_CONFIG pins the mainloop config, and optionally the scheduler knobs (syntax as gemm/knobs.hpp), of the
/// fused ops. Two forms:
///   global  "<config>[:<knobs>]", e.g. "pp_128x128x64_c2x1" or "coop_128x256x64_c2x1:raster=m,swizzle=4": every
///           fused op;
///   per op  "<op>=<config>[:<knobs>][;<op>=...]", e.g.
///           "linear_rowscale_swiglu=coop_128x256x64_c2x1:raster=m,swizzle=8;coda_linear_rowscale=pp_128x128x64_c2x1":
///           only the named ops (C ABI names, "coda_" optional); the others keep their defaults. This is what lets
///           a block benchmark A/B one op's config in place.
/// Returns the index of the pinned config among the op's `count` compiled kernels and sets *knobs when knobs are
/// given; -1 when the variable is unset or empty or does not name this op. A config the op does not have
/// compiled, a malformed knob, an unknown or repeated op name is an error (CODA_ERROR_INVALID_ARGUMENT) naming the
/// variable — never a silent fallback. Read on every call, so tests and benchmarks can switch it with setenv.
int pinned_config(char const* op, gemm::KernelInfo const* const* infos, int count, gemm::Knobs* knobs = nullptr);

/// Checks the whole CODA_OP_CONFIG value (syntax, op names, each entry's config among the op's compiled bf16
/// configs, knobs) and throws CODA_ERROR_INVALID_ARGUMENT naming the variable on the first problem; nothing when it
/// is unset or empty. The C ABI's fused entry points call it with their argument checks, so a bad value is refused
/// before a composite call (the block, the LM head) launches anything. What it cannot know ahead, a global pin that one
/// of the ops does not compile (pp_128x192x64_c2x1 is linear_rowscale_swiglu's only, pp_128x192x64_c2x1_e16
/// linear_swiglu_bwd_zdz's; fp16 has one pingpong 128x128 config per kind, _e128 for linear_rowscale_qk_norm_rope), is
/// refused by that op when it runs.
void check_op_config();

/// The kernel a fused op runs: the pinned one (CODA_OP_CONFIG) or the op's default, and its scheduler knobs.
template <class Args>
struct KernelChoice {
  gemm::KernelOps<Args> const* ops = nullptr;
  gemm::Knobs knobs;    ///< the pinned knobs, or the defaults (the op sets its own when !pinned)
  bool pinned = false;  ///< CODA_OP_CONFIG named the config
};

/// The comma-separated mainloop configs a fused op (its C ABI name, "coda_" optional) compiles for the dtype (fp16:
/// pp_128x128x64_c2x1 only), in its dispatcher's order; nullptr for a name that is not a fused op. Static storage.
char const* fused_op_configs(char const* op, bool fp16);

/// "<config>[:<knobs>]" of the kernel the fused op (or "<op>/<variant>" kind; "coda_" optional) runs for an M x N x K
/// GEMM: its generated tile policy after any pin (coda_fused_op_choice). Throws CODA_ERROR_INVALID_ARGUMENT for an
/// unknown name (listing the known ones), CODA_ERROR_SHAPE for a negative extent.
std::string fused_op_choice(char const* op, bool fp16, int64_t M, int64_t N, int64_t K);

/// The kernel among an op's compiled ones: `bf16` in the order of its op.cmake's BF16 list, and its one fp16 kernel
/// (pingpong 128x128; nullptr: a bf16-only kind, and fp16 is then CODA_ERROR_INTERNAL, the validation's to refuse).
/// Returns the pinned kernel of the dtype with its knobs, else bf16[Fallback] (fp16: the fp16 one), unpinned; the
/// caller, a generated choose*() of ops/<op>/instances.hpp (src/ops/registry.cmake), then applies the op's tile
/// policy (its op.cmake's RULE and DEFAULT lines).
template <int Fallback, class Args, int N>
KernelChoice<Args> choose_kernel(char const* op, bool fp16, gemm::KernelOps<Args> const* const (&bf16)[N],
                                 gemm::KernelOps<Args> const* fp16_pp) {
  static_assert(Fallback >= 0 && Fallback < N, "choose_kernel: the fallback indexes the bf16 list");
  if (fp16 && fp16_pp == nullptr) coda::detail::fail(CODA_ERROR_INTERNAL, op, ": this kernel kind has no fp16 build");
  gemm::KernelOps<Args> const* const fp16_list[] = {fp16_pp};
  gemm::KernelOps<Args> const* const* const list = fp16 ? fp16_list : bf16;
  int const count = fp16 ? 1 : N;
  gemm::KernelInfo const* infos[N] = {};
  for (int i = 0; i < count; ++i) infos[i] = &list[i]->info;
  KernelChoice<Args> c;
  int const pick = pinned_config(op, infos, count, &c.knobs);
  c.pinned = pick >= 0;
  c.ops = list[c.pinned ? pick : (fp16 ? 0 : Fallback)];
  return c;
}

/// Scheduler knobs raster = along N with the given swizzle: the best-measured setting of the pingpong fused
/// kernels on the LLaMA shapes (bench/results/fused_h200_*: the default heuristic raster lost up to 25 %).
gemm::Knobs raster_n(int swizzle);
/// The same along M.
gemm::Knobs raster_m(int swizzle);

}  // namespace coda::ops
