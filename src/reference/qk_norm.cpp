// QK-norm + RoPE in float64 (docs/MATH.md, linear_rowscale_qk_norm_rope and qk_norm_rope_bwd_zdz): the per-head
// RMSNorm of the q and k heads before RoPE, its forward and its backward with the zdz row dot the input norm's
// linear_residual_rmsnorm_bwd needs.
#include "reference/reference.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace coda::ref {

namespace {

void check_qk_norm_args(const Matrix& z, const QkNorm& norm, const RopeHeads& heads, const char* where) {
  const std::string w(where);
  if (heads.n_q_heads < 1 || heads.n_kv_heads < 1 || heads.n_q_heads % heads.n_kv_heads != 0 ||
      heads.head_dim < 2 || heads.head_dim % 2 != 0) {
    throw std::invalid_argument("coda::ref::" + w + ": need n_kv_heads >= 1 dividing n_q_heads, head_dim even");
  }
  if (z.cols != heads.width()) throw std::invalid_argument("coda::ref::" + w + ": z must be [M,(Hq+2Hkv)hd]");
  if (static_cast<int64_t>(norm.q_gamma.size()) != heads.head_dim ||
      static_cast<int64_t>(norm.k_gamma.size()) != heads.head_dim) {
    throw std::invalid_argument("coda::ref::" + w + ": q_gamma and k_gamma must be [head_dim]");
  }
  if (!(norm.eps >= 0.0)) throw std::invalid_argument("coda::ref::" + w + ": eps must be >= 0");
}

// Heads [0, Hq) are q (q_gamma), [Hq, Hq+Hkv) k (k_gamma).
const Vector& gamma_of(const QkNorm& norm, const RopeHeads& heads, int64_t head) {
  return head < heads.n_q_heads ? norm.q_gamma : norm.k_gamma;
}

}  // namespace

Matrix qk_head_rstd(const Matrix& z, const QkNorm& norm, const RopeHeads& heads) {
  check_qk_norm_args(z, norm, heads, "qk_head_rstd");
  const int64_t hd = heads.head_dim, n_heads = heads.n_q_heads + heads.n_kv_heads;
  Matrix r(z.rows, n_heads);
  for (int64_t m = 0; m < z.rows; ++m) {
    for (int64_t h = 0; h < n_heads; ++h) {
      double sq = 0.0;
      for (int64_t j = 0; j < hd; ++j) sq += z(m, h * hd + j) * z(m, h * hd + j);
      r(m, h) = 1.0 / std::sqrt(sq / static_cast<double>(hd) + norm.eps);
    }
  }
  return r;
}

Matrix qk_norm(const Matrix& z, const QkNorm& norm, const RopeHeads& heads) {
  const Matrix r = qk_head_rstd(z, norm, heads);
  const int64_t hd = heads.head_dim;
  Matrix n = z;  // v passes through
  for (int64_t m = 0; m < z.rows; ++m) {
    for (int64_t h = 0; h < r.cols; ++h) {
      const Vector& g = gamma_of(norm, heads, h);
      for (int64_t j = 0; j < hd; ++j) n(m, h * hd + j) = z(m, h * hd + j) * r(m, h) * g[static_cast<size_t>(j)];
    }
  }
  return n;
}

Matrix linear_rowscale_qk_norm_rope(const Matrix& h, const Matrix& w_qkv, const Vector& rstd, const QkNorm& norm,
                                    const Positions& positions, const Vector& inv_freq, const RopeHeads& heads) {
  if (w_qkv.rows != heads.width()) {
    throw std::invalid_argument("coda::ref::linear_rowscale_qk_norm_rope: w_qkv must be [(Hq+2Hkv)hd, K]");
  }
  return rope(qk_norm(linear_rowscale(h, w_qkv, rstd), norm, heads), positions, inv_freq, heads);
}

QkNormRopeBwd qk_norm_rope_bwd(const Matrix& z, const Matrix& qkv, const Matrix& dqkv, const QkNorm& norm,
                               const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                               int64_t hidden_size) {
  check_qk_norm_args(z, norm, heads, "qk_norm_rope_bwd");
  if (!qkv.same_shape(z) || !dqkv.same_shape(z)) {
    throw std::invalid_argument("coda::ref::qk_norm_rope_bwd: z, qkv and dqkv must have the same shape");
  }
  if (hidden_size <= 0) throw std::invalid_argument("coda::ref::qk_norm_rope_bwd: hidden_size must be > 0");
  const int64_t hd = heads.head_dim, n_heads = heads.n_q_heads + heads.n_kv_heads;
  const Matrix r = qk_head_rstd(z, norm, heads);
  // dn = R^T dqkv on q/k heads (v passes through): rope_bwd_zdz's rotation.
  const Matrix dn = rope_bwd_zdz(qkv, dqkv, positions, inv_freq, heads, hidden_size).dz;

  QkNormRopeBwd out;
  out.dz = dn;  // v: dv = dqkv
  out.zdz.assign(static_cast<size_t>(z.rows), 0.0);
  out.dq_gamma.assign(static_cast<size_t>(hd), 0.0);
  out.dk_gamma.assign(static_cast<size_t>(hd), 0.0);
  for (int64_t m = 0; m < z.rows; ++m) {
    double row = 0.0;
    for (int64_t h = 0; h < n_heads; ++h) {
      const Vector& g = gamma_of(norm, heads, h);
      Vector& dg = h < heads.n_q_heads ? out.dq_gamma : out.dk_gamma;
      const double rh = r(m, h);
      double s = 0.0;  // <dqkv_h, qkv_h> = <dn_h, n_h>
      for (int64_t j = 0; j < hd; ++j) s += dqkv(m, h * hd + j) * qkv(m, h * hd + j);
      for (int64_t j = 0; j < hd; ++j) {
        const int64_t c = h * hd + j;
        const double nh = z(m, c) * rh;
        dg[static_cast<size_t>(j)] += dn(m, c) * nh;
        out.dz(m, c) = rh * (g[static_cast<size_t>(j)] * dn(m, c) - nh * s / static_cast<double>(hd));
      }
      row += norm.eps * rh * rh * s;  // <u_h, du_h>
    }
    for (int64_t c = heads.rotated_width(); c < z.cols; ++c) row += z(m, c) * dqkv(m, c);  // <v, dv>
    out.zdz[static_cast<size_t>(m)] = row / static_cast<double>(hidden_size);
  }
  return out;
}

}  // namespace coda::ref
