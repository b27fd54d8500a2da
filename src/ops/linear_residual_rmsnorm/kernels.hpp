// coda_linear_residual_rmsnorm: x = a w^T + residual, h = x * gamma, per-(row, N-tile) partial sums of squares of x,
// then rstd (kernels::rmsnorm_rstd). CUTLASS-free interface: the epilogue arguments and the dispatch (the compiled
// kernels: op.cmake). docs/OPS.md.
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the residual + RMSNorm-prep epilogue (besides Operands: A = a, B = w, C = residual,
/// D = x; C and D may be the same matrix).
struct ResidualRmsnormArgs {
  void const* gamma = nullptr;  ///< [N] bf16, contiguous
  void* h = nullptr;            ///< [M, N] bf16, row stride ldh (TMA: 16-byte aligned, ldh % 8 == 0)
  int64_t ldh = 0;
  float* partials = nullptr;    ///< [T, Mpad] fp32: partials[m + Mpad * t] = sum over N-tile t of x[m, n]^2
                                ///< (x in fp32, before its bf16 rounding: docs/OPS.md)
};

/// Shape of a kernel's partials buffer: T = ceil(N / tile_n) rows of Mpad = round_up(M, tile_m) floats.
struct PartialsLayout {
  int64_t tiles = 0;  ///< T
  int64_t m_pad = 0;  ///< Mpad (row stride of the [T, Mpad] buffer)
  size_t bytes() const { return static_cast<size_t>(tiles * m_pad) * sizeof(float); }
};
PartialsLayout partials_layout(gemm::KernelInfo const& info, int64_t M, int64_t N);

/// linear_residual_rmsnorm on bf16 (fp16 = false) or fp16 tensors (all row-major with the given row strides; x may
/// alias residual). `partials` is the caller's workspace (at least coda_linear_residual_rmsnorm_workspace_size(M, N)
/// bytes, 16-byte aligned). M, N, K >= 1. Enqueues the GEMM, then the rstd finishing kernel, on `stream`. Throws
/// coda::detail::Error.
void linear_residual_rmsnorm(int64_t M, int64_t N, int64_t K, void const* a, int64_t lda, void const* w,
                             int64_t ldw, void const* residual, int64_t ldr, void const* gamma, float eps, void* x,
                             int64_t ldx, void* h, int64_t ldh, float* rstd, void* workspace,
                             size_t workspace_bytes, bool fp16, cudaStream_t stream);

}  // namespace coda::ops
