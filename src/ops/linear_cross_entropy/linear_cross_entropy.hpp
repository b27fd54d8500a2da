// The LM head + cross-entropy forward without logits in memory (coda_linear_cross_entropy): linear_rowscale_lse per
// chunk of rows (fused GEMM keeping per-row statistics, then lse_finish), then one loss kernel over all rows
// (kernels::cross_entropy_from_stats). Host only, no CUTLASS.
#pragma once

#include <coda/types.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace coda::ops {

/// Default rows per chunk: large enough that each chunk's GEMM (chunk x V x K) runs at full speed, small enough
/// that the tile statistics stay ~66 MB at V = 128256.
inline constexpr int64_t kDefaultChunkRows = 8192;

/// Workspace of linear_cross_entropy: linear_rowscale_lse partials for one chunk, then lse (when not given), target
/// logit and logit sum [M] fp32, then the cross_entropy_from_stats workspace; each part 256-byte aligned.
size_t linear_cross_entropy_workspace_bytes(int64_t M, int64_t V, int64_t chunk_rows);

struct LinearCrossEntropyArgs {
  int64_t M = 0, V = 0, K = 0;
  void const* h = nullptr;  ///< [M,K] bf16 (or fp16 when fp16), row stride ldh
  int64_t ldh = 0;
  void const* w = nullptr;  ///< [V,K] same dtype, row stride ldw
  int64_t ldw = 0;
  float const* rstd = nullptr;
  void const* targets = nullptr;
  bool targets_int64 = false;
  coda_ce_options options{};
  int64_t chunk_rows = 0;   ///< 0 = kDefaultChunkRows
  bool fp16 = false;
  float* loss = nullptr;    ///< [] (mean/sum) or [M] (none)
  float* lse = nullptr;     ///< [M] or nullptr
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

/// Enqueues the chunks' linear_rowscale_lse kernels and the loss kernel on `stream`. Throws coda::detail::Error.
void linear_cross_entropy(LinearCrossEntropyArgs const& args, cudaStream_t stream);

}  // namespace coda::ops
