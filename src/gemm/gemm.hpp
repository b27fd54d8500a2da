// The plain GEMM behind coda_gemm (and the weight gradients): D = alpha * A B^T (+ D), fp32 accumulation.
// Host-only header: no CUTLASS here (CUTLASS lives in the src/gemm/*.cu translation units).
#pragma once

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace coda::gemm {

/// One GEMM problem. Arguments are already validated by src/api (dtypes, 16-byte alignment, no overlap).
/// A is logically [M,K], B is logically [N,K] (nn.Linear layout), D is [M,N] row-major with row stride ldd.
struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  coda_dtype dtype_ab = CODA_BF16;  ///< bf16 or fp16
  coda_dtype dtype_d = CODA_BF16;   ///< bf16, fp16 or fp32
  void const* A = nullptr;
  int64_t lda = 0;
  bool a_col_major = false;  ///< false: A(m,k) = A[m*lda + k] (K-major); true: A(m,k) = A[m + k*lda] (M-major)
  void const* B = nullptr;
  int64_t ldb = 0;
  bool b_col_major = false;  ///< false: B(n,k) = B[n*ldb + k] (K-major); true: B(n,k) = B[n + k*ldb] (N-major)
  void* D = nullptr;
  int64_t ldd = 0;
  float alpha = 1.0f;
  bool accumulate = false;  ///< D += alpha * A B^T (read D as C with beta = 1)
};

/// Bytes of workspace `run` needs for this problem (upper bound over the candidate kernels).
size_t workspace_size(GemmArgs const& args);

/// Runs the GEMM on `stream` with the autotuned (or pinned) kernel. Throws coda::detail::Error on failure.
void run(GemmArgs const& args, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace coda::gemm
