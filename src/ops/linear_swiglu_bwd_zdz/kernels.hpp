// coda_linear_swiglu_bwd_zdz (MATH.md): dgrad GEMM dy = dx w_down with the SwiGLU backward in its epilogue
// (src/epilogue/swiglu_bwd_pair.hpp). CUTLASS-free interface: the epilogue arguments and the dispatch (the compiled
// kernels: op.cmake).
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the linear_swiglu_bwd_zdz epilogue (besides Operands: A = dx [M,d] K-major,
/// B = w_down [d,F] N-major, D = y [M,F], C = the saved interleaved z [M,2F] as [M,F] 32-bit words with
/// ldc = ldz / 2).
struct SwigluBwdArgs {
  void* dz = nullptr;               ///< [M, 2F] out, row stride lddz; may be z (same stride): in place
  int64_t lddz = 0;
  float* zdz_partials = nullptr;    ///< [ceil(F/CTA_N), round_up(M,CTA_M)] fp32 row partials of g dg + u du
};

/// linear_swiglu_bwd_zdz on row-major bf16|fp16 tensors (row strides given): dx [M,d], w_down [d,F], z [M,2F],
/// dz [M,2F] (may be z), y [M,F], zdz [M] fp32 = (1/d) sum_i (g dz[2i] + u dz[2i+1]). `workspace` holds the row
/// partials (at least coda_linear_swiglu_bwd_zdz_workspace_size(M, F) bytes, 16-byte aligned). Enqueues the fused
/// dgrad GEMM and the zdz finishing reduce on `stream`. Throws coda::detail::Error.
void linear_swiglu_bwd_zdz(int64_t M, int64_t F, int64_t d, void const* dx, int64_t ldx, void const* w_down,
                           int64_t ldw, void const* z, int64_t ldz, void* dz, int64_t lddz, void* y, int64_t ldy,
                           float* zdz, bool fp16, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace coda::ops
