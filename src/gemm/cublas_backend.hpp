// cuBLAS path of the plain GEMM: a tuning candidate for every problem and the only kernel for dtype/layout
// combinations that CODA does not compile (fp16, fp32 output outside wgrad, A M-major with B K-major, ...).
#pragma once

#include "gemm/gemm.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace coda::gemm {

/// "" if cublasGemmEx with fp32 compute takes this dtype combination (A/B bf16 -> D bf16|fp32, A/B fp16 ->
/// D fp16|fp32), else the reason.
std::string cublas_check(GemmArgs const& args);

/// D = alpha * A B^T (+ D) through cublasGemmEx (CUBLAS_COMPUTE_32F, reduced-precision split-K reductions
/// disallowed, cuBLAS's own workspace) on `stream`, with this thread's handle for the current device.
void cublas_run(GemmArgs const& args, cudaStream_t stream);

}  // namespace coda::gemm
