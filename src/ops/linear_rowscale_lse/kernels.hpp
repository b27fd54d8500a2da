// coda_linear_rowscale_lse: LM-head logits l = diag(rstd) (h w^T), optional softcap, and per-row log-sum-exp and target
// logit from per-(row, N-tile) partials written by the GEMM epilogue (epilogue/online_lse.hpp), then finished by
// kernels::lse_finish. CUTLASS-free interface: the epilogue arguments, the workspace layout and the dispatch (the
// compiled kernels: op.cmake). docs/OPS.md.
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the LSE epilogue (besides Operands: A = h, B = w, D = logits or none, no C).
struct LseArgs {
  float const* rstd = nullptr;    ///< [M] fp32, contiguous
  float softcap = 0.0f;           ///< c >= 0 (0 = off), applied before the LSE, not to the stored logits
  void const* targets = nullptr;  ///< [M] int32 or int64
  bool targets_int64 = false;
  float* part_max = nullptr;      ///< [T, Mpad] partials (LseWorkspace)
  float* part_sumexp = nullptr;
  float* part_sum = nullptr;
  float* part_target = nullptr;
};

/// The workspace of linear_rowscale_lse: four fp32 [T, Mpad] partial buffers (max, sumexp, sum, target) of a kernel
/// with CTA tile tile_m x tile_n, each starting on a 256-byte boundary. Element (t, m) of a buffer is at m + m_pad * t.
struct LseWorkspace {
  int64_t tiles = 0;   ///< T = ceil(V / tile_n)
  int64_t m_pad = 0;   ///< Mpad = round_up(M, tile_m)
  size_t slot = 0;     ///< bytes per buffer (T * Mpad * 4 rounded up to 256)
  size_t bytes() const { return 4 * slot; }
  /// Buffer k (0 max, 1 sumexp, 2 sum, 3 target) inside a workspace starting at `base`.
  float* buffer(void* base, int k) const {
    return reinterpret_cast<float*>(static_cast<char*>(base) + static_cast<size_t>(k) * slot);
  }
};
inline LseWorkspace lse_workspace(int64_t M, int64_t V, int64_t tile_m, int64_t tile_n) {
  LseWorkspace w;
  if (M <= 0 || V <= 0) return w;
  w.tiles = (V + tile_n - 1) / tile_n;
  w.m_pad = (M + tile_m - 1) / tile_m * tile_m;
  w.slot = (static_cast<size_t>(w.tiles * w.m_pad) * sizeof(float) + 255) / 256 * 256;
  return w;
}
/// The CTA tile the workspace is sized for: the smallest M and N tiles of the compiled linear_rowscale_lse kernels
/// (coop 128x256, pingpong 128x128), so coda_linear_rowscale_lse_workspace_size covers every kernel; a kernel with a
/// wider N tile uses a prefix of it. The partials of a run are laid out for the kernel that ran (lse_workspace of its
/// tile).
inline constexpr int64_t kLseTileM = 128, kLseTileN = 128;

/// linear_rowscale_lse on bf16 (fp16 = false) or fp16 tensors: h [M,K] (row stride ldh), w [V,K] (ldw), rstd [M]
/// fp32, targets [M] int32|int64.
/// logits: nullptr, or [M,V] in the input dtype with row stride ld_logits (raw, before softcap). lse, target_logit: [M]
/// fp32. `workspace` holds the partials (LseWorkspace of the chosen kernel, 16-byte aligned). M, V, K >= 1. logit_sum:
/// nullptr, or [M] fp32 receiving the row sum of the (capped) logits (label smoothing). Enqueues the fused GEMM, then
/// the finishing kernel, on `stream`. Throws coda::detail::Error.
void linear_rowscale_lse(int64_t M, int64_t V, int64_t K, void const* h, int64_t ldh, void const* w, int64_t ldw,
                         float const* rstd, void const* targets, bool targets_int64, float softcap,
                         int64_t ignore_index, float* lse, float* target_logit, void* logits, int64_t ld_logits,
                         void* workspace, size_t workspace_bytes, bool fp16, cudaStream_t stream,
                         float* logit_sum = nullptr);

}  // namespace coda::ops
