// The plain GEMM behind coda_gemm (and the weight gradients): D = alpha * A B^T (+ D), fp32 accumulation.
// Host-only header: no CUTLASS here (CUTLASS lives in the src/gemm/*.cu translation units).
#pragma once

#include <coda/types.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// ---- Candidates, tuning and test hooks (src/gemm/gemm.cu; docs/GEMM.md) -------------------------------------------
//
// A candidate is "cublas" or "<config>[:knob=value,...]" with config one of candidate_configs() and knobs
// raster=h|m|n, swizzle=1|2|4|8, mode=h|dp|sk|splitk, splits=<n> (e.g. "sk_128x256x64_c2x1:mode=sk,raster=n").
// run() uses, in order: the candidate pinned by CODA_GEMM_CONFIG (error if it cannot run the problem), the tuned
// winner cached for (M, N, K, dtypes, layouts, accumulate, cuBLAS allowed, device), or tunes now. Environment:
// CODA_GEMM_CONFIG=<candidate>, CODA_GEMM_NO_CUBLAS=1 (CODA kernels only), CODA_GEMM_AUTOTUNE=0 (no timing: a
// fixed default), =settled, =burst or =sustained (other timing methods: docs/GEMM.md), CODA_AUTOTUNE_LOG=1 (each
// tuning's times on stderr), CODA_AUTOTUNE_CACHE=<file> (runtime/autotune.hpp).

/// Upper bound of workspace_size() over every dtype and layout of an M x N x K problem (for callers that do not
/// know them yet, e.g. coda_gemm_workspace_size(M, N, K)).
size_t workspace_size_for_shape(int64_t M, int64_t N, int64_t K);

/// Names of the compiled configs (each may be compiled for several layouts/dtypes), then "cublas".
std::vector<std::string> const& candidate_configs();

/// "" if `candidate` can run `args`, else the reason.
std::string check_candidate(std::string const& candidate, GemmArgs const& args);

/// Workspace bytes `candidate` needs for `args` (0 when it cannot run them).
size_t candidate_workspace_size(std::string const& candidate, GemmArgs const& args);

/// Runs exactly `candidate`, no tuning. Throws coda::detail::Error (CODA_ERROR_INVALID_ARGUMENT for an unknown
/// name or a candidate that cannot run the problem, with the reason).
void run_candidate(std::string const& candidate, GemmArgs const& args, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream);

/// The candidate the last run() / run_candidate() on this thread used ("" before the first).
std::string const& last_choice();

/// Forgets this process's tuned winners (a CODA_AUTOTUNE_CACHE file is read again on next use).
void clear_tuning();

}  // namespace coda::gemm
