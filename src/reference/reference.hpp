// coda::ref — the float64 CPU reference of every CODA op (ground truth of all tests), plus the "unfused"
// same-dtype pipeline that the numerical acceptance rule compares against.
//
// Plain C++20: no CUDA, no CUTLASS. An op's reference carries the op's name (docs/MATH.md); argument meanings and
// shapes follow the matching coda_<op> in include/coda/coda.h. Everything works on host copies of tensors:
//   - Matrix: dense row-major [rows, cols] of doubles (activations [M, features], weights [out, in]).
//   - Vector: std::vector<double> (gamma [N], rstd [M], inv_freq [head_dim/2], ...).
//   - Positions: int32 per row; Targets: int64 per row (convert int32 targets on the caller's side).
// Tile partials are stored tile-major, [T, M] (one row per tile), as coda_rmsnorm_rstd takes them.
//
// Reference functions compute in double and round nothing. The *_unfused functions compute "what PyTorch would
// compute" in a given dtype (see the block comment above them). Shape mismatches throw std::invalid_argument.
#pragma once

#include <coda/coda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace coda::ref {

using Vector = std::vector<double>;
using Positions = std::vector<int32_t>;
using Targets = std::vector<int64_t>;
using Rng = std::mt19937_64;

// ================================================================================================================
// Matrix
// ================================================================================================================

/// Dense row-major matrix of doubles: element (i, j) is data[i * cols + j].
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> data;

  Matrix() = default;
  /// rows x cols, every element `fill`.
  Matrix(int64_t n_rows, int64_t n_cols, double fill = 0.0);
  /// rows x cols from row-major `values` (values.size() must be rows * cols).
  Matrix(int64_t n_rows, int64_t n_cols, std::vector<double> values);

  double& operator()(int64_t i, int64_t j) { return data[static_cast<size_t>(i * cols + j)]; }
  double operator()(int64_t i, int64_t j) const { return data[static_cast<size_t>(i * cols + j)]; }
  double* row(int64_t i) { return data.data() + i * cols; }
  const double* row(int64_t i) const { return data.data() + i * cols; }
  int64_t size() const { return rows * cols; }
  bool same_shape(const Matrix& other) const { return rows == other.rows && cols == other.cols; }
};

/// t[j, i] = m[i, j].
Matrix transpose(const Matrix& m);
/// [top; bottom] (same column count).
Matrix vstack(const Matrix& top, const Matrix& bottom);
/// sum of a[i] * b[i] over all elements (same shape).
double dot(const Matrix& a, const Matrix& b);
double dot(const Vector& a, const Vector& b);
/// max |a - b| over all elements; NaN if any difference is NaN (NaN propagates; shapes must agree).
double max_abs_diff(const Matrix& a, const Matrix& b);
double max_abs_diff(const Vector& a, const Vector& b);
/// max |a| (NaN propagates).
double max_abs(const Matrix& a);
double max_abs(const Vector& a);

// ================================================================================================================
// Rounding and bit conversions (host side of device uploads/downloads)
// ================================================================================================================

/// float -> bf16 bits, round to nearest even on the float32 bit pattern (as PyTorch's c10::BFloat16 does);
/// overflow rounds to inf, NaN stays a (quiet) NaN.
uint16_t float_to_bf16_bits(float f);
/// bf16 bits -> float (exact).
float bf16_bits_to_float(uint16_t bits);
/// float -> IEEE binary16 bits, round to nearest even, subnormals kept, overflow to inf, NaN stays NaN.
uint16_t float_to_fp16_bits(float f);
/// fp16 bits -> float (exact).
float fp16_bits_to_float(uint16_t bits);

/// x rounded to what `dtype` can hold, as a double. bf16 and fp16 go through float first (double -> float RNE,
/// then float -> 16 bit RNE), exactly as a host upload of float data does. CODA_FP32: float RNE.
/// Throws std::invalid_argument for the integer dtypes.
double round_to(double x, coda_dtype dtype);
Matrix round_to(const Matrix& m, coda_dtype dtype);
Vector round_to(const Vector& v, coda_dtype dtype);

/// 16-bit pattern of round_to(x, dtype) (dtype CODA_BF16 or CODA_FP16).
uint16_t to_bits(double x, coda_dtype dtype);
/// The value of a 16-bit pattern of `dtype` (CODA_BF16 or CODA_FP16).
double from_bits(uint16_t bits, coda_dtype dtype);
/// Element-wise to_bits, row-major: what to copy into a device tensor of `dtype`.
std::vector<uint16_t> to_bits(const Matrix& m, coda_dtype dtype);
std::vector<uint16_t> to_bits(const Vector& v, coda_dtype dtype);
/// A host copy of a device bf16/fp16 tensor, as doubles.
Matrix matrix_from_bits(const uint16_t* bits, int64_t rows, int64_t cols, coda_dtype dtype);
Vector vector_from_bits(const uint16_t* bits, int64_t n, coda_dtype dtype);
/// float32 host copies (fp32 tensors: rstd, lse, partials, dgamma, ...).
std::vector<float> to_float(const Matrix& m);
std::vector<float> to_float(const Vector& v);
Matrix matrix_from_float(const float* values, int64_t rows, int64_t cols);
Vector vector_from_float(const float* values, int64_t n);

// ================================================================================================================
// Random inputs (PROTOCOL.md: realistic scale, never zero, never constant)
// ================================================================================================================

/// rows x cols samples of N(mean, stddev^2).
Matrix random_normal(int64_t rows, int64_t cols, double mean, double stddev, Rng& rng);
/// nn.Linear weight [out_features, in_features] ~ N(0, stddev^2), stddev 0.02 by default.
Matrix random_weight(int64_t out_features, int64_t in_features, Rng& rng, double stddev = 0.02);
/// Activations [rows, cols] ~ N(0, 1).
Matrix random_activation(int64_t rows, int64_t cols, Rng& rng);
/// Residual stream [rows, cols] ~ N(0, 4^2) (larger than activations).
Matrix random_residual(int64_t rows, int64_t cols, Rng& rng);
/// RMSNorm weight [n] ~ U(0.5, 1.5): around 1 with spread, never 0.
Vector random_gamma(int64_t n, Rng& rng);
/// Packed-sequence positions [rows]: runs of consecutive positions that restart at random values in
/// [0, max_position] (jumps), every value in [0, max_position].
Positions random_positions(int64_t rows, int32_t max_position, Rng& rng);
/// Targets [rows] uniform in [0, vocab); each row is ignore_index instead with probability ignore_fraction.
Targets random_targets(int64_t rows, int64_t vocab, Rng& rng, double ignore_fraction = 0.0,
                       int64_t ignore_index = -100);
/// RoPE inverse frequencies [head_dim/2]: base^(-2i/head_dim), rounded to float32 (what the caller uploads).
Vector rope_inv_freq(int32_t head_dim, double base = 500000.0);

// ================================================================================================================
// Finite differences (for the backward tests)
// ================================================================================================================

/// Central differences of a scalar function: g[i] = (f(x + h_i e_i) - f(x - h_i e_i)) / (2 h_i),
/// with h_i = step * max(1, |x_i|).
Matrix numeric_gradient(const std::function<double(const Matrix&)>& f, const Matrix& x, double step = 1e-6);
Vector numeric_gradient(const std::function<double(const Vector&)>& f, const Vector& x, double step = 1e-6);

// ================================================================================================================
// GEMMs (float64)
// ================================================================================================================

/// d = alpha * a b^T (+ d when accumulate): a [M,K], b [N,K], d [M,N]. Without accumulate, d is resized.
/// (coda_gemm's equation; a transposed operand is passed as transpose(x).)
void gemm(const Matrix& a, const Matrix& b, double alpha, bool accumulate, Matrix& d);
/// y = a w^T: a [M,K], w [N,K] -> [M,N] (nn.Linear forward).
Matrix linear(const Matrix& a, const Matrix& w);
/// D = dz w: dz [M,N], w [N,K] -> [M,K] (data gradient).
Matrix dgrad(const Matrix& dz, const Matrix& w);
/// dW = dz^T a: dz [M,N], a [M,K] -> [N,K] (weight gradient).
Matrix wgrad(const Matrix& dz, const Matrix& a);
/// diag(r) z: row m multiplied by r[m].
Matrix scale_rows(const Matrix& z, const Vector& r);
/// out[m] = scale * sum_j a[m,j] b[m,j] (the zdz row dot).
Vector row_dot(const Matrix& a, const Matrix& b, double scale);
/// Per-(row, column tile) sums, tile-major [T, M]: s[t,m] = sum_{n in [t*tile_n, (t+1)*tile_n) and < N} v[m,n],
/// T = ceil(N / tile_n).
Matrix row_tile_sums(const Matrix& v, int64_t tile_n);
/// Per-(column, row tile) sums, tile-major [T, N]: s[t,n] = sum_{m in tile t} v[m,n], T = ceil(M / tile_m).
Matrix col_tile_sums(const Matrix& v, int64_t tile_m);
/// Column sums of tile partials: out[i] = sum_t partials[t, i] (in tile order).
Vector sum_tiles(const Matrix& partials);

// ================================================================================================================
// RMSNorm: linear_residual_rmsnorm, rmsnorm_prepare, linear_rowscale, linear_residual_rmsnorm_bwd and the direct
// (textbook) RMSNorm forward/backward
// ================================================================================================================

/// rstd[m] = 1 / sqrt(mean_n x[m,n]^2 + eps), from whole rows.
Vector rmsnorm_rstd_rows(const Matrix& x, double eps);
/// Textbook RMSNorm: n = x * rstd * gamma.
Matrix rmsnorm(const Matrix& x, const Vector& gamma, double eps);

struct RmsnormGrad {
  Matrix dx;     ///< [M,N]
  Vector dgamma; ///< [N]
};
/// Direct RMSNorm backward from dn = dL/dn (no zdz trick):
///   dx = r (dn*gamma) - r^3 x (1/N) sum_k dn_k gamma_k x_k,  dgamma[n] = sum_m dn[m,n] x[m,n] r[m].
RmsnormGrad rmsnorm_bwd(const Matrix& x, const Vector& gamma, double eps, const Matrix& dn);
/// Backward of rstd alone: dx[m,n] = -drstd[m] * rstd[m]^3 * x[m,n] / N.
Matrix rstd_bwd(const Matrix& x, const Vector& rstd, const Vector& drstd);

/// linear_residual_rmsnorm's partials: per-(row, N-tile) sums of squares of x, tile-major [T, M],
/// T = ceil(N / tile_n) (the last tile may be partial).
Matrix rmsnorm_sumsq_partials(const Matrix& x, int64_t tile_n);
/// linear_residual_rmsnorm's final reduce (coda_rmsnorm_rstd):
/// rstd[m] = 1 / sqrt(sum_t partials[t,m] / n_features + eps).
Vector rmsnorm_rstd(const Matrix& partials, int64_t n_features, double eps);

struct ResidualRmsnorm {
  Matrix x;    ///< [M,N] new residual stream
  Matrix h;    ///< [M,N] x * gamma (not normalised)
  Vector rstd; ///< [M]
};
/// linear_residual_rmsnorm: x = a w^T + residual, h = x * gamma, rstd from whole rows of x (exact; no rounding of x).
ResidualRmsnorm linear_residual_rmsnorm(const Matrix& a, const Matrix& w, const Matrix& residual,
                                        const Vector& gamma, double eps);

struct RmsnormPrepare {
  Matrix h;    ///< [M,N] x * gamma
  Vector rstd; ///< [M]
};
/// First-layer norm (coda_rmsnorm_prepare): rstd from x, h = x * gamma.
RmsnormPrepare rmsnorm_prepare(const Matrix& x, const Vector& gamma, double eps);

/// linear_rowscale: y = diag(rstd) (h w^T).
Matrix linear_rowscale(const Matrix& h, const Matrix& w, const Vector& rstd);

struct ResidualRmsnormBwd {
  Matrix dx;     ///< [M,N]
  Matrix a;      ///< [M,N] recomputed normalised input c * gamma
  Vector dgamma; ///< [N]
};
/// linear_residual_rmsnorm_bwd: D = alpha dz w; c = x rstd; dx = dx_in + rstd (D gamma - alpha c zdz); a = c gamma;
/// dgamma[n] = sum_m D c. dz [M,N'], w [N',N], x [M,N], gamma [N], rstd [M], zdz [M], dx_in nullptr or [M,N].
/// zdz is the row dot of the dz passed here, zdz[m] = (1/N) sum_j z dz (as cross_entropy, rope_bwd_zdz and
/// linear_swiglu_bwd_zdz produce it, before alpha); alpha scales D and zdz alike, so dx is the true gradient of
/// alpha * <dz, z>.
ResidualRmsnormBwd linear_residual_rmsnorm_bwd(const Matrix& dz, const Matrix& w, const Matrix& x,
                                               const Vector& gamma, const Vector& rstd, const Vector& zdz,
                                               const Matrix* dx_in, double alpha);

// ================================================================================================================
// SwiGLU: linear_rowscale_swiglu, linear_swiglu_bwd_zdz (gate/up interleaved: z[2i] = gate i, z[2i+1] = up i)
// ================================================================================================================

double sigmoid(double g);
/// silu(g) = g * sigmoid(g).
double silu(double g);
/// y[m,i] = silu(z[m,2i]) * z[m,2i+1]: z [M,2F] interleaved -> y [M,F].
Matrix swiglu(const Matrix& z);

struct Swiglu {
  Matrix z; ///< [M,2F] pre-activation (saved for backward)
  Matrix y; ///< [M,F]
};
/// linear_rowscale_swiglu: z = diag(rstd) (h w_gu^T), y = swiglu(z). w_gu [2F,K] interleaved.
Swiglu linear_rowscale_swiglu(const Matrix& h, const Matrix& w_gu, const Vector& rstd);

struct SwigluBwd {
  Matrix dz; ///< [M,2F] interleaved (dg, du)
  Matrix y;  ///< [M,F] recomputed silu(g) u
  Vector zdz; ///< [M] (1/hidden_size) sum_i (g dg + u du)
};
/// The elementwise part of linear_swiglu_bwd_zdz from dy = dL/dy [M,F]: dg = dy u s (1 + g (1 - s)),
/// du = dy silu(g).
SwigluBwd swiglu_bwd(const Matrix& z, const Matrix& dy, int64_t hidden_size);
/// linear_swiglu_bwd_zdz: dy = dx w_down (dx [M,d], w_down [d,F]), then swiglu_bwd with hidden_size d = dx.cols.
SwigluBwd linear_swiglu_bwd_zdz(const Matrix& dx, const Matrix& w_down, const Matrix& z);

// ================================================================================================================
// RoPE: linear_rowscale_rope, rope_bwd_zdz (columns [q heads | k heads | v heads], each head_dim wide)
// ================================================================================================================

struct RopeHeads {
  int32_t n_q_heads = 1;
  int32_t n_kv_heads = 1; ///< divides n_q_heads (GQA)
  int32_t head_dim = 2;   ///< even
  /// Row width of qkv: (n_q_heads + 2 n_kv_heads) head_dim.
  int64_t width() const { return static_cast<int64_t>(n_q_heads + 2 * n_kv_heads) * head_dim; }
  /// Columns [0, rotated_width()) are q and k (rotated); the rest is v.
  int64_t rotated_width() const { return static_cast<int64_t>(n_q_heads + n_kv_heads) * head_dim; }
};

/// The RoPE angle pos * inv_freq, in double (exact product of an int32 and a float-valued double).
double rope_angle(int32_t position, double inv_freq);
/// RoPE, pairs adjacent (CODA layout): for q and k heads, pair i at row m, theta = pos[m] * inv_freq[i]:
///   out[2i] = z[2i] cos - z[2i+1] sin,  out[2i+1] = z[2i+1] cos + z[2i] sin;  v passes through.
Matrix rope(const Matrix& z, const Positions& positions, const Vector& inv_freq, const RopeHeads& heads);
/// HF/NeoX rotate-half RoPE on the unpermuted layout: pairs (i, i + hd/2) inside each q/k head, same angles.
Matrix rope_rotate_half(const Matrix& z, const Positions& positions, const Vector& inv_freq,
                        const RopeHeads& heads);
/// linear_rowscale_rope: rope(diag(rstd) (h w_qkv^T)); w_qkv rows paired per q/k head (pair_rope_qkv_rows).
Matrix linear_rowscale_rope(const Matrix& h, const Matrix& w_qkv, const Vector& rstd, const Positions& positions,
                            const Vector& inv_freq, const RopeHeads& heads);

struct RopeBwd {
  Matrix dz;  ///< [M,W] R(-theta) dqkv per q/k pair; v passes through
  Vector zdz; ///< [M] (1/hidden_size) sum_j qkv dqkv
};
/// rope_bwd_zdz: dz = R^T dqkv, zdz[m] = (1/hidden_size) sum_j qkv[m,j] dqkv[m,j] (qkv is the rotated output of
/// linear_rowscale_rope).
RopeBwd rope_bwd_zdz(const Matrix& qkv, const Matrix& dqkv, const Positions& positions, const Vector& inv_freq,
                     const RopeHeads& heads, int64_t hidden_size);

// ================================================================================================================
// QK-norm + RoPE (Qwen3 / Gemma-3 attention input; docs/MATH.md, linear_rowscale_qk_norm_rope and
// qk_norm_rope_bwd_zdz)
// ================================================================================================================

/// The per-head RMSNorm of the q and k heads: gamma vectors [head_dim] in the column layout of z's heads (CODA's:
/// RoPE pairs adjacent, so permuted like the W_q / W_k rows), shared by all heads of their kind.
struct QkNorm {
  Vector q_gamma;
  Vector k_gamma;
  double eps = 1e-6;
};
/// head_rstd [M, Hq+Hkv]: 1 / sqrt(mean_j u_j^2 + eps) over the hd columns u of q/k head h of row m.
Matrix qk_head_rstd(const Matrix& z, const QkNorm& norm, const RopeHeads& heads);
/// n = u head_rstd gamma on every q/k head (q_gamma on q heads, k_gamma on k heads); v passes through.
Matrix qk_norm(const Matrix& z, const QkNorm& norm, const RopeHeads& heads);
/// linear_rowscale_qk_norm_rope: rope(qk_norm(diag(rstd) (h w_qkv^T))).
Matrix linear_rowscale_qk_norm_rope(const Matrix& h, const Matrix& w_qkv, const Vector& rstd, const QkNorm& norm,
                                    const Positions& positions, const Vector& inv_freq, const RopeHeads& heads);

struct QkNormRopeBwd {
  Matrix dz;       ///< [M,W] d<dqkv, rope(qk_norm(z))>/dz
  Vector zdz;      ///< [M] (1/hidden_size) <z, dz>, from the head dots: sum_h eps r_h^2 <dqkv_h, qkv_h> + <v, dv>
  Vector dq_gamma; ///< [hd] sum over rows and q heads of dn nh (dn = R^T dqkv, nh = u r_h)
  Vector dk_gamma; ///< [hd] the same over k heads
};
/// qk_norm_rope_bwd_zdz: z the pre-norm input (the QKV GEMM's output: the q/k heads' u, and v), qkv the stored
/// rotated output, dqkv its gradient. du = r (gamma dn - nh <dqkv_h, qkv_h> / hd) on q/k heads, dv = dqkv on v.
QkNormRopeBwd qk_norm_rope_bwd(const Matrix& z, const Matrix& qkv, const Matrix& dqkv, const QkNorm& norm,
                               const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                               int64_t hidden_size);

// ================================================================================================================
// Log-sum-exp and cross-entropy: linear_rowscale_lse, cross_entropy
// ================================================================================================================

/// Online log-sum-exp state: the values seen so far are summarised as sum exp(v) = se * exp(mx).
/// The empty state is (mx = -inf, se = 0).
struct LseState {
  double mx;
  double se;
};
LseState lse_empty();
/// Adds one value: mx' = max(mx, v), se' = se exp(mx - mx') + exp(v - mx').
LseState lse_update(LseState s, double v);
/// Merges two states by the same rule (the empty state is the identity).
LseState lse_merge(LseState a, LseState b);
/// mx + log(se) (-inf for the empty state).
double lse_value(LseState s);

/// c * tanh(l / c) for c > 0; l itself for c == 0 (off).
double softcap(double l, double c);
Matrix softcap(const Matrix& l, double c);
/// lse[m] = log sum_j exp(l[m,j]), direct (max-subtracted) two-pass computation.
Vector logsumexp_rows(const Matrix& l);

struct BlockedLse {
  Matrix tile_max;    ///< [T, M] mx of each (row, N-tile) state
  Matrix tile_sumexp; ///< [T, M] se of each state
  Matrix tile_lse;    ///< [T, M] mx + log(se)
  Vector lse;         ///< [M] logsumexp over t of tile_lse
};
/// linear_rowscale_lse's blocked log-sum-exp of softcap(logits): columns split into N-tiles of tile_n (the last tile's
/// overhang columns >= V never enter a state); inside a tile, `lanes` strided online states (lane k takes columns
/// tile_start + k, + k + lanes, ...) are merged in a tree, like lanes of a warp; lanes may be empty.
BlockedLse blocked_lse(const Matrix& logits, int64_t tile_n, double softcap_value, int lanes = 4);

struct Lse {
  Matrix logits;       ///< [M,V] diag(rstd) h w^T, before softcap (what coda_cross_entropy takes)
  Matrix capped;       ///< [M,V] after softcap (== logits when softcap is off)
  Vector lse;          ///< [M] logsumexp of capped (every row, ignored ones included)
  Vector target_logit; ///< [M] capped[m, t_m]; 0 for rows whose target is ignore_index
};
/// linear_rowscale_lse's statistics of given logits (pre-softcap): lse, target logit. Targets must be in [0,V) or
/// ignore_index.
Lse logits_lse(const Matrix& logits, const Targets& targets, double softcap_value, int64_t ignore_index);
/// linear_rowscale_lse: logits = diag(rstd) (h w^T) [M,V], then logits_lse.
Lse linear_rowscale_lse(const Matrix& h, const Matrix& w, const Vector& rstd, const Targets& targets,
                        double softcap_value, int64_t ignore_index);

/// PyTorch's defaults (coda_ce_options_default): ignore_index -100, mean, no smoothing, no z-loss, no softcap.
coda_ce_options default_ce_options();

struct CrossEntropy {
  Vector loss_rows;   ///< [M] per-row loss (0 for ignored rows)
  Vector loss;        ///< loss_out: [M] (= loss_rows) for none, [1] for mean/sum
  Matrix dlogits;     ///< [M,V] gradient w.r.t. the raw (pre-softcap) logits, g_m included
  Vector zdz;         ///< [M] (1/hidden_size) sum_j logits dlogits (raw logits)
  Vector lse;         ///< [M] logsumexp of the capped logits
  Vector grad_scale;  ///< [M] g_m used for each row (0 for ignored rows)
  int64_t n_valid = 0; ///< number of non-ignored rows
};
/// cross_entropy on raw logits [M,V]:
///   loss[m] = (1-ls)(lse - l_t) + ls (lse - mean_j l_j) + z_loss lse^2 (capped logits), 0 for ignored rows;
///   dlogits = g_m (p - (1-ls)[j=t] - ls/V + 2 z_loss lse p) (* (1 - tanh^2(l/c)) under softcap);
///   zdz = (1/hidden_size) sum_j l_raw dlogits.
/// grad_loss: empty (upstream 1), [1] (scalar; divided by n_valid for mean), or [M] (per row; reduction none).
/// mean over zero valid rows gives loss 0 and zero gradients.
CrossEntropy cross_entropy(const Matrix& logits, const Targets& targets, const coda_ce_options& options,
                           const Vector& grad_loss, int64_t hidden_size);

// ================================================================================================================
// Weight layouts (pure row permutations)
// ================================================================================================================

/// Stacked [W_gate; W_up] [2F,K] -> interleaved (row 2i <- gate i, row 2i+1 <- up i).
Matrix interleave_gate_up(const Matrix& w_stacked);
/// Inverse of interleave_gate_up.
Matrix deinterleave_gate_up(const Matrix& w_interleaved);
/// Rotate-half rows -> pairs adjacent, per head: new row 2i <- old i, new row 2i+1 <- old i + hd/2.
/// w [H*head_dim, K] (a bias is [H*head_dim, 1]).
Matrix pair_rope_rows(const Matrix& w, int32_t head_dim);
/// Inverse of pair_rope_rows.
Matrix unpair_rope_rows(const Matrix& w, int32_t head_dim);
/// pair_rope_rows on the q and k rows of a fused [q|k|v] weight [heads.width(), K]; v rows unchanged.
Matrix pair_rope_qkv_rows(const Matrix& w_qkv, const RopeHeads& heads);
/// Inverse of pair_rope_qkv_rows.
Matrix unpair_rope_qkv_rows(const Matrix& w_qkv, const RopeHeads& heads);

// ================================================================================================================
// The unfused same-dtype pipeline (o_unfused of the acceptance rule)
// ================================================================================================================
//
// "What PyTorch (or cuBLAS + simple kernels) would compute" with bf16/fp16 tensors (dtype CODA_FP32 gives the
// all-fp32 pipeline). Inputs are first rounded to `dtype` (a no-op for tensors that came from the device);
// GEMMs multiply the rounded values and accumulate in float; every tensor PyTorch would store is rounded to
// `dtype`; statistics (rstd, lse, loss, zdz, sums) are float; elementwise math is done in float and rounded
// once per PyTorch op. The row scale of the linear_rowscale* ops is the stored normalised input R(h * rstd)
// feeding the GEMM. Outputs are returned as doubles holding the rounded values.

/// Float-accumulated a b^T (a [M,K], b [N,K]): each element is sum_k float(a) * float(b) in float, in k order.
Matrix gemm_fp32(const Matrix& a, const Matrix& b);
/// d = R_out(alpha * fp32(R_in(a) R_in(b)^T) (+ d)): coda_gemm's unfused counterpart (out_dtype may be fp32).
void gemm_unfused(const Matrix& a, const Matrix& b, double alpha, bool accumulate, Matrix& d, coda_dtype in_dtype,
                  coda_dtype out_dtype);
/// R(a w^T), R(dz w), R(dz^T a) with float accumulation.
Matrix linear_unfused(const Matrix& a, const Matrix& w, coda_dtype dtype);
Matrix dgrad_unfused(const Matrix& dz, const Matrix& w, coda_dtype dtype);
Matrix wgrad_unfused(const Matrix& dz, const Matrix& a, coda_dtype dtype);

/// linear_residual_rmsnorm unfused: x = R(R(a w^T) + residual); rstd = 1/sqrtf(mean(x^2) + eps) in float from the
/// rounded x; h = R(x * gamma).
ResidualRmsnorm linear_residual_rmsnorm_unfused(const Matrix& a, const Matrix& w, const Matrix& residual,
                                                const Vector& gamma, double eps, coda_dtype dtype);
/// rmsnorm_prepare unfused: rstd in float from R(x), h = R(x * gamma).
RmsnormPrepare rmsnorm_prepare_unfused(const Matrix& x, const Vector& gamma, double eps, coda_dtype dtype);
/// linear_rowscale unfused: y = R(R(h * rstd) w^T).
Matrix linear_rowscale_unfused(const Matrix& h, const Matrix& w, const Vector& rstd, coda_dtype dtype);
/// linear_rowscale_swiglu unfused: z = R(R(h * rstd) w_gu^T); y = R(R(silu(g)) * u).
Swiglu linear_rowscale_swiglu_unfused(const Matrix& h, const Matrix& w_gu, const Vector& rstd, coda_dtype dtype);
/// How the unfused RoPE computes its angles.
enum class RopeAngles {
  /// theta = float(pos) * float(inv_freq) in float, as HF's LlamaRotaryEmbedding does: at pos ~ 1e5..1e6 the angle
  /// is off by up to ulp(theta)/2 ~ 4e-3..3e-2 rad, which dominates the unfused error (a lenient bound).
  kFloat32,
  /// theta and cos/sin in double, then rounded like kFloat32's cos/sin: only the dtype roundings remain (a strict
  /// bound that a kernel with naive float32 angles fails at large positions).
  kExact,
};
/// linear_rowscale_rope unfused (HF apply_rotary_pos_emb): z = R(R(h * rstd) w^T); theta per `angles`;
/// cos, sin = R(cos theta), R(sin theta) (computed in float for kFloat32); out[2i] = R(R(z0 cos) - R(z1 sin)),
/// out[2i+1] = R(R(z1 cos) + R(z0 sin)).
Matrix linear_rowscale_rope_unfused(const Matrix& h, const Matrix& w_qkv, const Vector& rstd,
                                    const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                                    coda_dtype dtype, RopeAngles angles = RopeAngles::kFloat32);
/// linear_rowscale_qk_norm_rope unfused (HF Qwen3): z = R(R(h * rstd) w^T); per q/k head r = 1/sqrtf(mean(z^2) + eps)
/// in float, n = R(gamma R(z r)); then linear_rowscale_rope_unfused's RoPE on n.
Matrix linear_rowscale_qk_norm_rope_unfused(const Matrix& h, const Matrix& w_qkv, const Vector& rstd,
                                            const QkNorm& norm, const Positions& positions, const Vector& inv_freq,
                                            const RopeHeads& heads, coda_dtype dtype,
                                            RopeAngles angles = RopeAngles::kFloat32);
/// qk_norm_rope_bwd_zdz unfused (autograd of HF Qwen3's q_norm/k_norm and RoPE in dtype): dn = rope_bwd_zdz_unfused's
/// dz (angles per `angles`); then per q/k head, with x the dtype z, r = 1/sqrtf(mean x^2 + eps) in float:
/// d(xn) = R(dn g), dx = r (d(xn) - x r^2 mean(d(xn) x)) in float, dz = R(dx); v: dz = R(dqkv);
/// zdz = (1/hidden) float sum z dz; dgamma = R(float sum over rows and heads of R(dn) R(x r)).
QkNormRopeBwd qk_norm_rope_bwd_unfused(const Matrix& z, const Matrix& dqkv, const QkNorm& norm,
                                       const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                                       int64_t hidden_size, coda_dtype dtype, RopeAngles angles = RopeAngles::kFloat32);
/// linear_rowscale_lse unfused: logits = R(R(h * rstd) w^T); capped = R(R(tanh(R(l / c))) * c) (three dtype ops); lse
/// in float over the capped dtype logits; target logit = capped[t].
Lse linear_rowscale_lse_unfused(const Matrix& h, const Matrix& w, const Vector& rstd, const Targets& targets,
                                double softcap_value, int64_t ignore_index, coda_dtype dtype);
/// cross_entropy unfused: softcap in dtype as above, then float cross-entropy of logits.float() (PyTorch), fp32
/// gradient rounded to dtype, softcap backward in dtype ops; zdz = (1/hidden) float sum of R(l) * R(dl).
CrossEntropy cross_entropy_unfused(const Matrix& logits, const Targets& targets, const coda_ce_options& options,
                                   const Vector& grad_loss, int64_t hidden_size, coda_dtype dtype);
/// rope_bwd_zdz unfused (autograd of HF RoPE): dz[2i] = R(R(d0 cos) + R(d1 sin)), dz[2i+1] = R(R(d1 cos) -
/// R(d0 sin)) with the dtype cos/sin of linear_rowscale_rope_unfused; zdz = (1/hidden) float sum qkv dqkv.
RopeBwd rope_bwd_zdz_unfused(const Matrix& qkv, const Matrix& dqkv, const Positions& positions,
                             const Vector& inv_freq, const RopeHeads& heads, int64_t hidden_size, coda_dtype dtype,
                             RopeAngles angles = RopeAngles::kFloat32);
/// linear_residual_rmsnorm_bwd unfused: D = R(alpha * fp32(dz w)), then autograd of HF LlamaRMSNorm in float with the
/// saved float rstd (no zdz): a = R(gamma * R(x rstd)); dx = R(dx_in + R(direct dx));
/// dgamma = float sum_m R(D * R(x rstd)).
ResidualRmsnormBwd linear_residual_rmsnorm_bwd_unfused(const Matrix& dz, const Matrix& w, const Matrix& x,
                                                       const Vector& gamma, const Vector& rstd,
                                                       const Matrix* dx_in, double alpha, coda_dtype dtype);
/// linear_swiglu_bwd_zdz unfused: dy = R(dx w_down); autograd of R(R(silu(g)) * u): du = R(dy R(silu(g))),
/// dg = R(silu'(g) R(dy u)); y = R(R(silu(g)) u); zdz = (1/d) float sum (g dg + u du).
SwigluBwd linear_swiglu_bwd_zdz_unfused(const Matrix& dx, const Matrix& w_down, const Matrix& z, coda_dtype dtype);

// ================================================================================================================
// Numerical acceptance rule (MATH.md, last section)
// ================================================================================================================

struct Acceptance {
  double coda_error = 0;    ///< max |coda - ref|
  double unfused_error = 0; ///< max |unfused - ref|
  double bound = 0;         ///< 2 * unfused_error + 1e-6
  bool pass = false;        ///< coda_error <= bound, no NaN anywhere, both errors finite
  /// "coda max err ..., unfused max err ..., bound ...: PASS|FAIL" (for test output).
  std::string message() const;
};
/// max|coda - ref| <= 2 max|unfused - ref| + 1e-6. NaN (in any of the three) never passes, nor does an infinite
/// error (coda's or the unfused one's); shapes must agree.
Acceptance acceptance(const Matrix& coda_out, const Matrix& unfused_out, const Matrix& ref_out);
Acceptance acceptance(const Vector& coda_out, const Vector& unfused_out, const Vector& ref_out);
Acceptance acceptance(double coda_out, double unfused_out, double ref_out);

}  // namespace coda::ref
