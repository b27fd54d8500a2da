// The unfused same-dtype pipeline: what PyTorch (or cuBLAS + one simple kernel per op) computes with bf16/fp16
// tensors. This is o_unfused of the acceptance rule max|coda - ref| <= 2 max|unfused - ref| + 1e-6.
//
// Model of the arithmetic (float variables below are real float32 arithmetic, not doubles):
//   - inputs are rounded to the dtype (no-op for data that came from the device);
//   - a GEMM multiplies dtype values (exact in float) and accumulates in float, then rounds to the dtype;
//   - every PyTorch elementwise op computes in float and rounds its output to the dtype (one R(...) per op);
//   - statistics (rstd, lse, loss, zdz, dgamma, sums) stay float, as PyTorch's .float() code paths do.
// The deferred row scale of the linear_rowscale* ops has no PyTorch counterpart: its unfused form is the stored
// normalised input R(h * rstd) feeding an ordinary GEMM.
#include "reference/reference.hpp"

#include "reference/parallel.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace coda::ref {

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("coda::ref: ") + what);
}

size_t idx(int64_t i) { return static_cast<size_t>(i); }

/// The value stored by a tensor of `dtype` (R(...) in the comments), as a float.
float q(double v, coda_dtype dtype) { return static_cast<float>(round_to(v, dtype)); }

float silu_f(float g) { return g / (1.0f + std::exp(-g)); }

/// Element-wise R(...) of a float-valued matrix.
Matrix stored(const Matrix& m, coda_dtype dtype) { return round_to(m, dtype); }

/// a[m,n] = R(h[m,n] * rstd[m]): the normalised GEMM input an unfused pipeline stores.
Matrix normalized_input(const Matrix& h, const Vector& rstd, coda_dtype dtype) {
  require(static_cast<int64_t>(rstd.size()) == h.rows, "unfused: rstd must be [M]");
  Matrix a(h.rows, h.cols);
  for (int64_t m = 0; m < h.rows; ++m) {
    const float r = static_cast<float>(rstd[idx(m)]);
    for (int64_t n = 0; n < h.cols; ++n) a(m, n) = q(q(h(m, n), dtype) * r, dtype);
  }
  return a;
}

/// Float rstd of one row of dtype values (x.float().pow(2).mean(-1) + eps, rsqrt).
float row_rstd_f(const Matrix& xb, int64_t m, float eps) {
  float s = 0;
  for (int64_t n = 0; n < xb.cols; ++n) {
    const float v = static_cast<float>(xb(m, n));
    s += v * v;
  }
  return 1.0f / std::sqrt(s / static_cast<float>(xb.cols) + eps);
}

/// Softcap in three dtype ops, as written in PyTorch: R(R(tanh(R(l / c))) * c). Returns l unchanged if c == 0.
float softcap_dtype(float l, float c, coda_dtype dtype) {
  if (c <= 0) return l;
  return q(q(std::tanh(q(l / c, dtype)), dtype) * c, dtype);
}

/// HF RoPE cos/sin: angle in float (or double for kExact), cos/sin, then cast to the activation dtype.
void rope_cos_sin_dtype(int32_t pos, double inv_freq, coda_dtype dtype, RopeAngles angles, float& c, float& s) {
  if (angles == RopeAngles::kExact) {
    const double theta = rope_angle(pos, inv_freq);
    c = q(std::cos(theta), dtype);
    s = q(std::sin(theta), dtype);
    return;
  }
  const float theta = static_cast<float>(pos) * static_cast<float>(inv_freq);
  c = q(std::cos(theta), dtype);
  s = q(std::sin(theta), dtype);
}

void check_rope_shapes(const Matrix& z, const Positions& positions, const Vector& inv_freq, const RopeHeads& heads) {
  require(heads.head_dim >= 2 && heads.head_dim % 2 == 0 && z.cols == heads.width() &&
              static_cast<int64_t>(positions.size()) == z.rows &&
              static_cast<int64_t>(inv_freq.size()) * 2 == heads.head_dim,
          "unfused rope: shapes of z, positions, inv_freq and heads disagree");
}

}  // namespace

// ---- GEMMs -------------------------------------------------------------------------------------------------------

Matrix gemm_fp32(const Matrix& a, const Matrix& b) {
  require(a.cols == b.cols, "gemm_fp32: a [M,K] and b [N,K] disagree on K");
  const std::vector<float> af = to_float(a);
  const std::vector<float> bf = to_float(b);
  const int64_t k_dim = a.cols;
  Matrix out(a.rows, b.rows);
  detail::for_rows(a.rows, b.rows * k_dim, [&](int64_t i) {
    const float* ai = af.data() + i * k_dim;
    for (int64_t j = 0; j < b.rows; ++j) {
      const float* bj = bf.data() + j * k_dim;
      float s = 0;
      for (int64_t k = 0; k < k_dim; ++k) s += ai[k] * bj[k];
      out(i, j) = s;
    }
  });
  return out;
}

void gemm_unfused(const Matrix& a, const Matrix& b, double alpha, bool accumulate, Matrix& d, coda_dtype in_dtype,
                  coda_dtype out_dtype) {
  const Matrix acc = gemm_fp32(stored(a, in_dtype), stored(b, in_dtype));
  if (accumulate) {
    require(d.same_shape(acc), "gemm_unfused: accumulate needs d [M,N]");
  } else {
    d = Matrix(acc.rows, acc.cols);
  }
  const float alpha_f = static_cast<float>(alpha);
  for (size_t i = 0; i < d.data.size(); ++i) {
    const float prev = accumulate ? static_cast<float>(d.data[i]) : 0.0f;
    d.data[i] = q(alpha_f * static_cast<float>(acc.data[i]) + prev, out_dtype);
  }
}

Matrix linear_unfused(const Matrix& a, const Matrix& w, coda_dtype dtype) {
  return stored(gemm_fp32(stored(a, dtype), stored(w, dtype)), dtype);
}

Matrix dgrad_unfused(const Matrix& dz, const Matrix& w, coda_dtype dtype) {
  require(dz.cols == w.rows, "dgrad_unfused: dz [M,N] and w [N,K] disagree on N");
  return stored(gemm_fp32(stored(dz, dtype), transpose(stored(w, dtype))), dtype);
}

Matrix wgrad_unfused(const Matrix& dz, const Matrix& a, coda_dtype dtype) {
  require(dz.rows == a.rows, "wgrad_unfused: dz [M,N] and a [M,K] disagree on M");
  return stored(gemm_fp32(transpose(stored(dz, dtype)), transpose(stored(a, dtype))), dtype);
}

// ---- RMSNorm family ----------------------------------------------------------------------------------------------

ResidualRmsnorm linear_residual_rmsnorm_unfused(const Matrix& a, const Matrix& w, const Matrix& residual,
                                                const Vector& gamma, double eps, coda_dtype dtype) {
  require(residual.rows == a.rows && residual.cols == w.rows, "linear_residual_rmsnorm_unfused: residual [M,N]");
  require(static_cast<int64_t>(gamma.size()) == w.rows, "linear_residual_rmsnorm_unfused: gamma must be [N]");
  const Matrix lin = linear_unfused(a, w, dtype);
  ResidualRmsnorm out{Matrix(lin.rows, lin.cols), Matrix(lin.rows, lin.cols), Vector(idx(lin.rows))};
  for (int64_t m = 0; m < lin.rows; ++m) {
    for (int64_t n = 0; n < lin.cols; ++n) {
      out.x(m, n) = q(static_cast<float>(lin(m, n)) + q(residual(m, n), dtype), dtype);  // residual + linear
      out.h(m, n) = q(static_cast<float>(out.x(m, n)) * q(gamma[idx(n)], dtype), dtype);
    }
    out.rstd[idx(m)] = row_rstd_f(out.x, m, static_cast<float>(eps));
  }
  return out;
}

RmsnormPrepare rmsnorm_prepare_unfused(const Matrix& x, const Vector& gamma, double eps, coda_dtype dtype) {
  require(static_cast<int64_t>(gamma.size()) == x.cols, "rmsnorm_prepare_unfused: gamma must be [N]");
  const Matrix xb = stored(x, dtype);
  RmsnormPrepare out{Matrix(x.rows, x.cols), Vector(idx(x.rows))};
  for (int64_t m = 0; m < x.rows; ++m) {
    for (int64_t n = 0; n < x.cols; ++n) out.h(m, n) = q(static_cast<float>(xb(m, n)) * q(gamma[idx(n)], dtype), dtype);
    out.rstd[idx(m)] = row_rstd_f(xb, m, static_cast<float>(eps));
  }
  return out;
}

Matrix linear_rowscale_unfused(const Matrix& h, const Matrix& w, const Vector& rstd, coda_dtype dtype) {
  return linear_unfused(normalized_input(h, rstd, dtype), w, dtype);
}

ResidualRmsnormBwd linear_residual_rmsnorm_bwd_unfused(const Matrix& dz, const Matrix& w, const Matrix& x,
                                                       const Vector& gamma, const Vector& rstd,
                                                       const Matrix* dx_in, double alpha, coda_dtype dtype) {
  require(dz.cols == w.rows && x.rows == dz.rows && x.cols == w.cols,
          "linear_residual_rmsnorm_bwd_unfused: dz [M,N'], w [N',N], x [M,N]");
  require(static_cast<int64_t>(gamma.size()) == x.cols && static_cast<int64_t>(rstd.size()) == x.rows,
          "linear_residual_rmsnorm_bwd_unfused: gamma [N], rstd [M]");
  require(dx_in == nullptr || dx_in->same_shape(x), "linear_residual_rmsnorm_bwd_unfused: dx_in must be [M,N]");
  Matrix d;
  gemm_unfused(dz, transpose(w), alpha, false, d, dtype, dtype);  // D = R(alpha * fp32(dz w))
  const int64_t n_feat = x.cols;
  ResidualRmsnormBwd out{Matrix(x.rows, n_feat), Matrix(x.rows, n_feat), Vector(idx(n_feat), 0.0)};
  std::vector<float> dgamma(idx(n_feat), 0.0f);
  std::vector<float> dxf(idx(n_feat));
  for (int64_t m = 0; m < x.rows; ++m) {
    const float r = static_cast<float>(rstd[idx(m)]);
    // HF LlamaRMSNorm: nf = x.float() * rstd; out = gamma * nf.to(dtype). Autograd, in PyTorch's op order:
    float d_r = 0;  // dL/drstd = sum_n d_nf * xf
    for (int64_t n = 0; n < n_feat; ++n) {
      const float xf = q(x(m, n), dtype);
      const float gb = q(gamma[idx(n)], dtype);
      const float dd = static_cast<float>(d(m, n));
      const float nb = q(xf * r, dtype);
      out.a(m, n) = q(gb * nb, dtype);
      const float d_nf = q(dd * gb, dtype);  // mul backward (dtype), then .to(dtype) backward casts to float
      dxf[idx(n)] = d_nf * r;
      d_r += d_nf * xf;
      dgamma[idx(n)] += q(dd * nb, dtype);  // weight grad: R(D * nb) summed over rows in float
    }
    const float d_var = -0.5f * d_r * r * r * r;  // rsqrt backward
    for (int64_t n = 0; n < n_feat; ++n) {
      const float xf = q(x(m, n), dtype);
      const float dx_branch = q(dxf[idx(n)] + d_var / static_cast<float>(n_feat) * 2.0f * xf, dtype);
      out.dx(m, n) = dx_in ? q(q((*dx_in)(m, n), dtype) + dx_branch, dtype) : dx_branch;
    }
  }
  for (int64_t n = 0; n < n_feat; ++n) out.dgamma[idx(n)] = dgamma[idx(n)];
  return out;
}

// ---- SwiGLU ------------------------------------------------------------------------------------------------------

Swiglu linear_rowscale_swiglu_unfused(const Matrix& h, const Matrix& w_gu, const Vector& rstd, coda_dtype dtype) {
  require(w_gu.rows % 2 == 0, "linear_rowscale_swiglu_unfused: w_gu must be [2F,K]");
  Swiglu out;
  out.z = linear_rowscale_unfused(h, w_gu, rstd, dtype);
  out.y = Matrix(out.z.rows, out.z.cols / 2);
  for (int64_t m = 0; m < out.y.rows; ++m)
    for (int64_t i = 0; i < out.y.cols; ++i) {
      const float g = static_cast<float>(out.z(m, 2 * i));
      const float u = static_cast<float>(out.z(m, 2 * i + 1));
      out.y(m, i) = q(q(silu_f(g), dtype) * u, dtype);  // act_fn(gate) * up
    }
  return out;
}

SwigluBwd linear_swiglu_bwd_zdz_unfused(const Matrix& dx, const Matrix& w_down, const Matrix& z, coda_dtype dtype) {
  require(dx.cols == w_down.rows && z.rows == dx.rows && z.cols == 2 * w_down.cols,
          "linear_swiglu_bwd_zdz_unfused: dx [M,d], w_down [d,F], z [M,2F]");
  const Matrix dy = dgrad_unfused(dx, w_down, dtype);
  SwigluBwd out{Matrix(z.rows, z.cols), Matrix(dy.rows, dy.cols), Vector(idx(z.rows))};
  for (int64_t m = 0; m < z.rows; ++m) {
    float s_zdz = 0;
    for (int64_t i = 0; i < dy.cols; ++i) {
      const float g = q(z(m, 2 * i), dtype);
      const float u = q(z(m, 2 * i + 1), dtype);
      const float dyf = static_cast<float>(dy(m, i));
      const float sb = q(silu_f(g), dtype);
      const float d_sb = q(dyf * u, dtype);  // grad of silu(g) from the product
      const float s = 1.0f / (1.0f + std::exp(-g));
      const float dg = q(d_sb * s * (1.0f + g * (1.0f - s)), dtype);  // silu_backward in float
      const float du = q(dyf * sb, dtype);
      out.dz(m, 2 * i) = dg;
      out.dz(m, 2 * i + 1) = du;
      out.y(m, i) = q(sb * u, dtype);
      s_zdz += g * dg + u * du;
    }
    out.zdz[idx(m)] = s_zdz / static_cast<float>(dx.cols);
  }
  return out;
}

// ---- RoPE --------------------------------------------------------------------------------------------------------

namespace {

// HF apply_rotary_pos_emb on the q/k heads of an already rounded z (pairs adjacent).
Matrix rope_unfused(const Matrix& z, const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                    coda_dtype dtype, RopeAngles angles) {
  check_rope_shapes(z, positions, inv_freq, heads);
  Matrix out = z;  // v passes through (already rounded)
  const int64_t hd = heads.head_dim;
  for (int64_t m = 0; m < z.rows; ++m)
    for (int64_t i = 0; i < hd / 2; ++i) {
      float c, s;
      rope_cos_sin_dtype(positions[idx(m)], inv_freq[idx(i)], dtype, angles, c, s);
      for (int64_t head = 0; head < heads.n_q_heads + heads.n_kv_heads; ++head) {
        const int64_t j0 = head * hd + 2 * i;
        const float z0 = static_cast<float>(z(m, j0));
        const float z1 = static_cast<float>(z(m, j0 + 1));
        out(m, j0) = q(q(z0 * c, dtype) - q(z1 * s, dtype), dtype);      // q*cos + rotate_half(q)*sin
        out(m, j0 + 1) = q(q(z1 * c, dtype) + q(z0 * s, dtype), dtype);
      }
    }
  return out;
}

}  // namespace

Matrix linear_rowscale_rope_unfused(const Matrix& h, const Matrix& w_qkv, const Vector& rstd,
                                    const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                                    coda_dtype dtype, RopeAngles angles) {
  return rope_unfused(linear_rowscale_unfused(h, w_qkv, rstd, dtype), positions, inv_freq, heads, dtype, angles);
}

Matrix linear_rowscale_qk_norm_rope_unfused(const Matrix& h, const Matrix& w_qkv, const Vector& rstd,
                                            const QkNorm& norm, const Positions& positions, const Vector& inv_freq,
                                            const RopeHeads& heads, coda_dtype dtype, RopeAngles angles) {
  Matrix z = linear_rowscale_unfused(h, w_qkv, rstd, dtype);
  if (static_cast<int64_t>(norm.q_gamma.size()) != heads.head_dim ||
      static_cast<int64_t>(norm.k_gamma.size()) != heads.head_dim || z.cols != heads.width()) {
    throw std::invalid_argument("coda::ref::linear_rowscale_qk_norm_rope_unfused: gammas [head_dim], w_qkv rows W");
  }
  const int64_t hd = heads.head_dim;
  for (int64_t m = 0; m < z.rows; ++m) {
    for (int64_t head = 0; head < heads.n_q_heads + heads.n_kv_heads; ++head) {
      const Vector& g = head < heads.n_q_heads ? norm.q_gamma : norm.k_gamma;
      float sq = 0.0f;  // Qwen3RMSNorm: variance in float of the dtype values
      for (int64_t j = 0; j < hd; ++j) {
        const float v = static_cast<float>(z(m, head * hd + j));
        sq += v * v;
      }
      const float r = 1.0f / std::sqrt(sq / static_cast<float>(hd) + static_cast<float>(norm.eps));
      for (int64_t j = 0; j < hd; ++j) {
        const float v = static_cast<float>(z(m, head * hd + j));
        z(m, head * hd + j) = q(static_cast<float>(g[idx(j)]) * q(v * r, dtype), dtype);  // weight * R(x r)
      }
    }
  }
  return rope_unfused(z, positions, inv_freq, heads, dtype, angles);
}

RopeBwd rope_bwd_zdz_unfused(const Matrix& qkv, const Matrix& dqkv, const Positions& positions,
                             const Vector& inv_freq, const RopeHeads& heads, int64_t hidden_size, coda_dtype dtype,
                             RopeAngles angles) {
  check_rope_shapes(dqkv, positions, inv_freq, heads);
  require(qkv.same_shape(dqkv) && hidden_size > 0, "rope_bwd_zdz_unfused: qkv like dqkv, hidden_size > 0");
  RopeBwd out{stored(dqkv, dtype), Vector(idx(qkv.rows))};
  const int64_t hd = heads.head_dim;
  for (int64_t m = 0; m < dqkv.rows; ++m) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      float c, s;
      rope_cos_sin_dtype(positions[idx(m)], inv_freq[idx(i)], dtype, angles, c, s);
      for (int64_t head = 0; head < heads.n_q_heads + heads.n_kv_heads; ++head) {
        const int64_t j0 = head * hd + 2 * i;
        const float d0 = q(dqkv(m, j0), dtype);
        const float d1 = q(dqkv(m, j0 + 1), dtype);
        // Autograd: grad*cos, plus rotate_half's backward of grad*sin; the two branch grads are summed in dtype.
        out.dz(m, j0) = q(q(d0 * c, dtype) + q(d1 * s, dtype), dtype);
        out.dz(m, j0 + 1) = q(q(d1 * c, dtype) - q(d0 * s, dtype), dtype);
      }
    }
    float s_zdz = 0;
    for (int64_t j = 0; j < qkv.cols; ++j) s_zdz += q(qkv(m, j), dtype) * q(dqkv(m, j), dtype);
    out.zdz[idx(m)] = s_zdz / static_cast<float>(hidden_size);
  }
  return out;
}

QkNormRopeBwd qk_norm_rope_bwd_unfused(const Matrix& z, const Matrix& dqkv, const QkNorm& norm,
                                       const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                                       int64_t hidden_size, coda_dtype dtype, RopeAngles angles) {
  require(z.same_shape(dqkv) && hidden_size > 0 && z.cols == heads.width() &&
              static_cast<int64_t>(norm.q_gamma.size()) == heads.head_dim &&
              static_cast<int64_t>(norm.k_gamma.size()) == heads.head_dim,
          "qk_norm_rope_bwd_unfused: z like dqkv [M, W], gammas [head_dim], hidden_size > 0");
  const Matrix dn = rope_bwd_zdz_unfused(z, dqkv, positions, inv_freq, heads, hidden_size, dtype, angles).dz;
  const int64_t hd = heads.head_dim;
  QkNormRopeBwd out{dn, Vector(idx(z.rows)), Vector(idx(hd), 0.0), Vector(idx(hd), 0.0)};
  std::vector<float> dq(idx(hd), 0.0f), dk(idx(hd), 0.0f);
  for (int64_t m = 0; m < z.rows; ++m) {
    for (int64_t head = 0; head < heads.n_q_heads + heads.n_kv_heads; ++head) {
      const bool is_q = head < heads.n_q_heads;
      const Vector& g = is_q ? norm.q_gamma : norm.k_gamma;
      float sq = 0.0f;
      for (int64_t j = 0; j < hd; ++j) {
        const float x = q(z(m, head * hd + j), dtype);
        sq += x * x;
      }
      const float r = 1.0f / std::sqrt(sq / static_cast<float>(hd) + static_cast<float>(norm.eps));
      float dot = 0.0f;  // sum_j d(xn)_j x_j
      for (int64_t j = 0; j < hd; ++j) {
        const int64_t c = head * hd + j;
        const float x = q(z(m, c), dtype);
        const float dxn = q(static_cast<float>(dn(m, c)) * static_cast<float>(g[idx(j)]), dtype);
        dot += dxn * x;
        (is_q ? dq : dk)[idx(j)] += static_cast<float>(dn(m, c)) * q(x * r, dtype);
      }
      for (int64_t j = 0; j < hd; ++j) {
        const int64_t c = head * hd + j;
        const float x = q(z(m, c), dtype);
        const float dxn = q(static_cast<float>(dn(m, c)) * static_cast<float>(g[idx(j)]), dtype);
        out.dz(m, c) = q(r * (dxn - x * r * r * dot / static_cast<float>(hd)), dtype);
      }
    }
    float s = 0.0f;
    for (int64_t j = 0; j < z.cols; ++j) s += q(z(m, j), dtype) * static_cast<float>(out.dz(m, j));
    out.zdz[idx(m)] = s / static_cast<float>(hidden_size);
  }
  for (int64_t j = 0; j < hd; ++j) {
    out.dq_gamma[idx(j)] = q(dq[idx(j)], dtype);
    out.dk_gamma[idx(j)] = q(dk[idx(j)], dtype);
  }
  return out;
}

// ---- LM head and cross-entropy -----------------------------------------------------------------------------------

Lse linear_rowscale_lse_unfused(const Matrix& h, const Matrix& w, const Vector& rstd, const Targets& targets,
                                double softcap_value, int64_t ignore_index, coda_dtype dtype) {
  require(static_cast<int64_t>(targets.size()) == h.rows, "linear_rowscale_lse_unfused: targets must be [M]");
  require(softcap_value >= 0, "linear_rowscale_lse_unfused: softcap must be >= 0");
  Lse out;
  out.logits = linear_rowscale_unfused(h, w, rstd, dtype);
  out.capped = out.logits;
  const float cap = static_cast<float>(softcap_value);
  for (double& v : out.capped.data) v = softcap_dtype(static_cast<float>(v), cap, dtype);
  out.lse.assign(idx(h.rows), 0.0);
  out.target_logit.assign(idx(h.rows), 0.0);
  for (int64_t m = 0; m < out.capped.rows; ++m) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < out.capped.cols; ++j) mx = std::fmax(mx, static_cast<float>(out.capped(m, j)));
    float se = 0;
    for (int64_t j = 0; j < out.capped.cols; ++j) se += std::exp(static_cast<float>(out.capped(m, j)) - mx);
    out.lse[idx(m)] = mx + std::log(se);
    const int64_t t = targets[idx(m)];
    if (t != ignore_index) {
      require(t >= 0 && t < out.capped.cols, "linear_rowscale_lse_unfused: target outside [0,V)");
      out.target_logit[idx(m)] = out.capped(m, t);
    }
  }
  return out;
}

CrossEntropy cross_entropy_unfused(const Matrix& logits, const Targets& targets, const coda_ce_options& options,
                                   const Vector& grad_loss, int64_t hidden_size, coda_dtype dtype) {
  const int64_t rows = logits.rows;
  const int64_t vocab = logits.cols;
  require(static_cast<int64_t>(targets.size()) == rows && vocab > 0 && hidden_size > 0,
          "cross_entropy_unfused: targets [M], V > 0, hidden_size > 0");
  require(grad_loss.size() <= 1 || (options.reduction == CODA_REDUCTION_NONE &&
                                    static_cast<int64_t>(grad_loss.size()) == rows),
          "cross_entropy_unfused: grad_loss must be empty, [1], or [M] with reduction none");
  const float ls = options.label_smoothing;
  const float zl = options.z_loss;
  const float cap = options.softcap;
  const float upstream = grad_loss.size() == 1 ? static_cast<float>(grad_loss[0]) : 1.0f;

  CrossEntropy out;
  out.loss_rows.assign(idx(rows), 0.0);
  out.dlogits = Matrix(rows, vocab);
  out.zdz.assign(idx(rows), 0.0);
  out.lse.assign(idx(rows), 0.0);
  out.grad_scale.assign(idx(rows), 0.0);
  for (int64_t t : targets) out.n_valid += t != options.ignore_index ? 1 : 0;

  std::vector<float> lb(idx(vocab));  // stored logits, R(l)
  std::vector<float> lc(idx(vocab));  // softcapped in dtype ops, then .float()
  std::vector<float> lsm(idx(vocab)); // float log_softmax
  float total = 0;
  for (int64_t m = 0; m < rows; ++m) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) {
      lb[idx(j)] = q(logits(m, j), dtype);
      lc[idx(j)] = softcap_dtype(lb[idx(j)], cap, dtype);
      mx = std::fmax(mx, lc[idx(j)]);
    }
    float se = 0;
    for (int64_t j = 0; j < vocab; ++j) se += std::exp(lc[idx(j)] - mx);
    const float log_se = std::log(se);
    const float lse = mx + log_se;
    out.lse[idx(m)] = lse;
    const int64_t t = targets[idx(m)];
    if (t == options.ignore_index) continue;
    require(t >= 0 && t < vocab, "cross_entropy_unfused: target outside [0,V)");
    float sum_lsm = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      lsm[idx(j)] = (lc[idx(j)] - mx) - log_se;
      sum_lsm += lsm[idx(j)];
    }
    const float loss = (1.0f - ls) * -lsm[idx(t)] + ls * (-sum_lsm / static_cast<float>(vocab)) + zl * lse * lse;
    out.loss_rows[idx(m)] = loss;
    total += loss;

    float g = upstream;
    if (options.reduction == CODA_REDUCTION_MEAN) g = upstream / static_cast<float>(out.n_valid);
    if (grad_loss.size() > 1) g = static_cast<float>(grad_loss[idx(m)]);
    out.grad_scale[idx(m)] = g;

    float s_zdz = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const float p = std::exp(lsm[idx(j)]);
      const float dl_c = g * (p - (j == t ? 1.0f - ls : 0.0f) - ls / static_cast<float>(vocab) + 2.0f * zl * lse * p);
      float dl = q(dl_c, dtype);  // the grad of logits.float() is cast back to the logits' dtype
      if (cap > 0) {
        const float th = q(std::tanh(q(lb[idx(j)] / cap, dtype)), dtype);
        const float g1 = q(dl * cap, dtype);            // backward of * cap
        const float g2 = q(g1 * (1.0f - th * th), dtype);  // tanh backward from the saved output
        dl = q(g2 / cap, dtype);                        // backward of / cap
      }
      out.dlogits(m, j) = dl;
      s_zdz += lb[idx(j)] * dl;
    }
    out.zdz[idx(m)] = s_zdz / static_cast<float>(hidden_size);
  }
  switch (options.reduction) {
    case CODA_REDUCTION_NONE:
      out.loss = out.loss_rows;
      break;
    case CODA_REDUCTION_MEAN:
      out.loss = {out.n_valid > 0 ? static_cast<double>(total / static_cast<float>(out.n_valid)) : 0.0};
      break;
    case CODA_REDUCTION_SUM:
      out.loss = {total};
      break;
    default:
      throw std::invalid_argument("coda::ref::cross_entropy_unfused: bad reduction");
  }
  return out;
}

}  // namespace coda::ref
