// coda_linear_rowscale: y = diag(rstd) (h w^T). CUTLASS-free interface: the epilogue arguments and the dispatch
// (the compiled kernels: op.cmake). docs/OPS.md.
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the rowscale epilogue (besides Operands: A = h, B = w, D = y, no C).
struct RowscaleArgs {
  float const* rstd = nullptr;  ///< [M] fp32, contiguous
};

/// y[M,N] (bf16, or fp16 when fp16; row stride ldy) = rstd[m] * (h[M,K] (row stride ldh) w[N,K]^T (row stride ldw)),
/// fp32 product, one rounding. Picks a config (CODA_OP_CONFIG pins one: op_config.hpp) and enqueues on `stream`. M, N,
/// K >= 1. Throws coda::detail::Error.
void linear_rowscale(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w, int64_t ldw,
                     float const* rstd, void* y, int64_t ldy, bool fp16, cudaStream_t stream);

}  // namespace coda::ops
