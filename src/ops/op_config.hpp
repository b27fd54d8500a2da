// Config selection shared by the fused ops' dispatchers (CUTLASS-free).
#pragma once

#include "gemm/kernel_api.hpp"

#include <cstdint>

namespace coda::ops {

/// CODA_OP_CONFIG=<config name>[:<knobs>] (e.g. "pp_128x128x64_c2x1" or "coop_128x256x64_c2x1:raster=m,swizzle=4",
/// knobs as gemm/knobs.hpp) pins the mainloop config, and optionally the scheduler knobs, of every fused op.
/// Returns the index of the pinned config among the op's `count` compiled kernels and sets *knobs when knobs are
/// given; -1 when the variable is unset or empty. A config the op does not have compiled, or a malformed knob, is
/// an error (CODA_ERROR_INVALID_ARGUMENT) naming the variable, the op and the compiled configs — never a silent
/// fallback. Read on every call, so tests and benchmarks can switch it with setenv.
int pinned_config(char const* op, gemm::KernelInfo const* const* infos, int count, gemm::Knobs* knobs = nullptr);

/// Scheduler knobs raster = along N with the given swizzle: the best-measured setting of the pingpong fused
/// kernels on the LLaMA shapes (bench/results/fused_h200_*: the default heuristic raster lost up to 25 %).
gemm::Knobs raster_n(int swizzle);

/// Output tiles of a kernel's CTA tile on an M x N output.
int64_t tile_count(gemm::KernelInfo const& info, int64_t M, int64_t N);

}  // namespace coda::ops
