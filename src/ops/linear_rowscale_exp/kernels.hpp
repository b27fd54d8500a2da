// The LM head's backward logits GEMM in exponential form (MATH.md, cross_entropy's "exponential form"):
// E = s (.) exp(c - K) per element with one offset K per row (epilogue/exp_ce.hpp), plus per-(row, N-tile) sums for
// kernels::ce_exp_finish. Internal to coda_linear_cross_entropy_bwd (no C entry point). CUTLASS-free interface: the
// epilogue arguments, the partials' layout and the dispatch (the compiled kernels: op.cmake).
#pragma once

#include "gemm/kernel_api.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace coda::ops {

/// Run-time arguments of the ExpCe epilogue (besides Operands: A = h, B = w, D = E bf16, no C).
struct ExpCeArgs {
  float const* rstd = nullptr;    ///< [M] fp32
  float softcap = 0.0f;           ///< c >= 0 (0 = off)
  float const* offset = nullptr;  ///< [M] K fp32 (+inf: an ignored row, E = 0)
  int64_t vocab = 0;              ///< the masked kernel: columns >= vocab (of its problem) out of the sums, stored 0
  int64_t tile_base = 0;          ///< N-tile index of the problem's first column in the partials
  int64_t m_pad = 0;              ///< Mpad of the partials
  float* part_sumexp = nullptr;   ///< [T, Mpad] (ExpCeWorkspace)
  float* part_dot = nullptr;
  float* target_e = nullptr;      ///< [M] e = exp(c_t - K) at the target column, as the sums hold it
  void const* targets = nullptr;  ///< [M] int32 or int64
  bool targets_int64 = false;
  int64_t col_base = 0;           ///< set by linear_rowscale_exp: vocabulary column of the problem's first column
};

/// The partials of one run: two fp32 [T, Mpad] buffers (sumexp, dot), each on a 256-byte boundary; element (t, m)
/// at m + m_pad * t; T = Vm / Tm + ceil((N - Vm) / 64) tiles (Tm the main kernel's tile width, 256 without softcap
/// and 128 with it, Vm = vocab rounded down to Tm), Mpad = round_up(M, 128).
struct ExpCeWorkspace {
  int64_t tiles = 0;
  int64_t m_pad = 0;
  size_t slot = 0;
  size_t bytes() const { return 2 * slot; }
  float* buffer(void* base, int k) const {
    return reinterpret_cast<float*>(static_cast<char*>(base) + static_cast<size_t>(k) * slot);
  }
};
/// The workspace of linear_rowscale_exp for M rows, N GEMM columns and the vocabulary V <= N (the larger of the two
/// main kernels' layouts, so one size serves both).
ExpCeWorkspace exp_ce_workspace(int64_t M, int64_t N, int64_t V);

/// E [M, N] bf16 (row stride ld_e) = s (.) exp(c - K) of l = diag(rstd) h w^T, h [M, K] (ldh), w [N, K] (ldw),
/// bf16; columns >= V (args.vocab) stored as 0 and left out of the partials; the partials into `workspace`
/// (exp_ce_workspace(M, N, V).bytes(), 16-byte aligned). Columns [0, Vm) run on the unmasked main kernel,
/// [Vm, N) on the masked 128x64 one. M, N, K >= 1, V <= N. Enqueues the GEMMs on `stream`; returns the partials'
/// layout. Throws coda::detail::Error.
ExpCeWorkspace linear_rowscale_exp(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w,
                                   int64_t ldw, ExpCeArgs args, void* e, int64_t ld_e, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);

}  // namespace coda::ops
