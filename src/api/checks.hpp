// Composite argument checks shared by the op entry points (built from validate.hpp's single rules).
#pragma once

#include "api/validate.hpp"

namespace coda::api {

struct LinearShape {
  int64_t M, N, K;
};

/// `a` [M,K] bf16|fp16 row-major and `w` [N,K] same dtype row-major, both TMA-aligned, K > 0 and N > 0.
LinearShape check_linear(Arg a, Arg w);
/// The row-scaled forward GEMMs' inputs: `h` and `w` as check_linear, `rstd` [M] fp32.
LinearShape check_rowscale_inputs(Arg h, Arg w, Arg rstd);
/// A dgrad GEMM's inputs (dz w): `dz` [M,K] bf16|fp16 and `w` [K,N] same dtype, both row-major and TMA-aligned,
/// K > 0 and N > 0. Returns (M, N, K).
LinearShape check_dgrad(Arg dz, Arg w);
/// A [rows, cols] activation output or input of the same dtype as `like`, row-major, TMA-aligned.
void check_activation(Arg t, Arg like, int64_t rows, int64_t cols, char const* rows_what, char const* cols_what);
/// A contiguous rank-1 vector of `n` elements of one of `dtypes`.
void check_vector(Arg t, int64_t n, std::initializer_list<coda_dtype> dtypes, char const* what, char const* source);
/// Every pair in `outs` disjoint, and every output disjoint from every input.
void check_disjoint(std::initializer_list<Arg> outs, std::initializer_list<Arg> ins);
/// RoPE arguments shared by linear_rowscale_rope and rope_bwd_zdz (and their QK-norm twins): head_dim 64|128, head
/// counts (n_kv_heads divides n_q_heads), positions [M] int32, inv_freq [head_dim/2] fp32. Returns the qkv width
/// (n_q_heads + 2 n_kv_heads) * head_dim.
int64_t check_rope_args(Arg positions, Arg inv_freq, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                        int64_t M);
/// The per-head norm's arguments of linear_rowscale_qk_norm_rope: q_gamma and k_gamma [head_dim] fp32, 8-byte
/// aligned (read as float pairs); eps (named `eps_name`) finite and > 0.
void check_qk_norm_args(Arg q_gamma, Arg k_gamma, int32_t head_dim, float eps, char const* eps_name);
/// Cross-entropy options: a known reduction, label_smoothing in [0, 1], z_loss and softcap finite and >= 0.
void check_ce_options(coda_ce_options const& o);
/// The upstream gradient of a cross-entropy loss, when given: [M] fp32 for reduction none (per_row), else a rank-0
/// fp32 scalar.
void check_grad_loss(Arg grad_loss, int64_t M, bool per_row, char const* source);
/// The loss output of a cross-entropy op: fp32, [M] for reduction none (per_row), else a rank-0 scalar.
void check_loss_out(Arg loss, int64_t M, bool per_row, char const* source);
/// An epsilon (named `name`): > 0 and finite.
void check_eps(float eps, char const* name = "eps");
/// The last checks of a fused op's entry point, after its argument rules: every tensor on one device, a valid
/// CODA_OP_CONFIG (refused before any launch, so a composite call fails before its first step), and a device that
/// runs CODA's kernels. Returns the device.
int require_fused_launch(std::initializer_list<Arg> tensors);
/// A [M, (n_q_heads + 2 n_kv_heads) head_dim] bf16|fp16 q/k/v-shaped input (row-major, TMA-aligned) with the RoPE
/// arguments check_rope_args checks. Returns M.
int64_t check_rope_input(Arg t, Arg positions, Arg inv_freq, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim);

/// Bytes of a per-(row, N-tile) fp32 partials buffer, an upper bound over the tile configs (N tile >= 128, M
/// padded to 256), rounded up to 256 bytes.
size_t row_partials_bytes(int64_t M, int64_t N);
/// The same for one CTA tile: round_up_256(ceil(N / tile_n) * round_up(M, tile_m) * 4); 0 for M <= 0 or N <= 0.
size_t row_partials_bytes(int64_t M, int64_t N, int64_t tile_m, int64_t tile_n);
/// Bytes of a per-(M-tile, column) fp32 partials buffer (dgamma), an upper bound over the tile configs (M tile >=
/// 64, N padded to 256), rounded up to 256 bytes; 0 for M <= 0 or N <= 0.
size_t col_partials_bytes(int64_t M, int64_t N);
size_t round_up_256(size_t bytes);

/// The row stride a kernel takes for a row-major [rows, cols] tensor (cols when there is one row: its stride is
/// then free).
inline int64_t row_stride(coda_tensor const& t, int64_t cols) { return t.sizes[0] > 1 ? t.strides[0] : cols; }
inline int64_t row_stride(Arg t, int64_t cols) { return row_stride(*t.t, cols); }

}  // namespace coda::api
