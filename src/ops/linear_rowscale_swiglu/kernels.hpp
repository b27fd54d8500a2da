// coda_linear_rowscale_swiglu: z = diag(rstd) (h w_gu^T) [M,2F] and y = silu(z[:,2i]) * z[:,2i+1] [M,F] from
// the interleaved gate/up weight. CUTLASS-free interface: the epilogue arguments and the dispatch (the compiled
// kernels: op.cmake). docs/OPS.md.
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the rowscale + SwiGLU epilogue (besides Operands: A = h, B = w_gu, D = z, no C).
struct SwigluArgs {
  float const* rstd = nullptr;  ///< [M] fp32, contiguous
  void* y = nullptr;            ///< [M, N/2] bf16, row stride ldy; 8-byte aligned, ldy % 4 == 0
  int64_t ldy = 0;
};

/// z[M,N] (bf16 or fp16; row stride ldz) = rstd[m] * (h[M,K] w_gu[N,K]^T), y[M,N/2] (row stride ldy) = silu(z even
/// columns) * z odd columns, both from the fp32 z, each rounded once. N % 16 == 0. Picks a config (CODA_OP_CONFIG
/// pins one) and enqueues one GEMM on `stream`. Throws coda::detail::Error.
void linear_rowscale_swiglu(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_gu,
                            int64_t ldw, float const* rstd, void* z, int64_t ldz, void* y, int64_t ldy, bool fp16,
                            cudaStream_t stream);

}  // namespace coda::ops
