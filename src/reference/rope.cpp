// RoPE in float64: linear_rowscale_rope (q/k/v GEMM with row scale and RoPE, pairs adjacent) and rope_bwd_zdz
// (rotation by -theta with the zdz row dot), plus HF/NeoX rotate-half RoPE on the unpermuted layout for the layout
// tests.
//
// Angles are pos * inv_freq computed in double: inv_freq is a float-valued double (24 significant bits), so the
// product is exact for |pos| < 2^29 (29 + 24 <= 53 bits) and within 2^-53 relative beyond; std::cos/std::sin
// reduce arguments of any size accurately. At pos ~ 1e5..1e6 a float32 angle would already be off by up to
// 4e-3..3e-2 rad (half a float ulp of theta).
#include "reference/reference.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace coda::ref {

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("coda::ref: ") + what);
}

void check_rope_args(const Matrix& z, const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
                     const char* where) {
  const std::string w(where);
  if (heads.n_q_heads < 1 || heads.n_kv_heads < 1 || heads.n_q_heads % heads.n_kv_heads != 0) {
    throw std::invalid_argument("coda::ref::" + w + ": need n_kv_heads >= 1 dividing n_q_heads >= 1");
  }
  if (heads.head_dim < 2 || heads.head_dim % 2 != 0) {
    throw std::invalid_argument("coda::ref::" + w + ": head_dim must be even and >= 2");
  }
  if (z.cols != heads.width()) throw std::invalid_argument("coda::ref::" + w + ": z must be [M,(Hq+2Hkv)hd]");
  if (static_cast<int64_t>(positions.size()) != z.rows) {
    throw std::invalid_argument("coda::ref::" + w + ": positions must be [M]");
  }
  if (static_cast<int64_t>(inv_freq.size()) * 2 != heads.head_dim) {
    throw std::invalid_argument("coda::ref::" + w + ": inv_freq must be [head_dim/2]");
  }
}

// Rotates the q/k pairs of every row by +theta (sign = +1) or -theta (sign = -1). `paired` selects the CODA layout
// (pair i = columns 2i, 2i+1 of a head) or the HF rotate-half layout (pair i = columns i, i + hd/2).
Matrix rotate(const Matrix& z, const Positions& positions, const Vector& inv_freq, const RopeHeads& heads,
              double sign, bool paired) {
  const int64_t hd = heads.head_dim;
  const int64_t half = hd / 2;
  Matrix out = z;  // v columns pass through
  for (int64_t m = 0; m < z.rows; ++m) {
    for (int64_t i = 0; i < half; ++i) {
      const double theta = rope_angle(positions[static_cast<size_t>(m)], inv_freq[static_cast<size_t>(i)]);
      const double c = std::cos(theta);
      const double s = sign * std::sin(theta);
      for (int64_t head = 0; head < heads.n_q_heads + heads.n_kv_heads; ++head) {
        const int64_t j0 = head * hd + (paired ? 2 * i : i);
        const int64_t j1 = head * hd + (paired ? 2 * i + 1 : i + half);
        const double z0 = z(m, j0);
        const double z1 = z(m, j1);
        out(m, j0) = z0 * c - z1 * s;
        out(m, j1) = z1 * c + z0 * s;
      }
    }
  }
  return out;
}

}  // namespace

double rope_angle(int32_t position, double inv_freq) { return static_cast<double>(position) * inv_freq; }

Matrix rope(const Matrix& z, const Positions& positions, const Vector& inv_freq, const RopeHeads& heads) {
  check_rope_args(z, positions, inv_freq, heads, "rope");
  return rotate(z, positions, inv_freq, heads, +1.0, true);
}

Matrix rope_rotate_half(const Matrix& z, const Positions& positions, const Vector& inv_freq,
                        const RopeHeads& heads) {
  check_rope_args(z, positions, inv_freq, heads, "rope_rotate_half");
  return rotate(z, positions, inv_freq, heads, +1.0, false);
}

Matrix linear_rowscale_rope(const Matrix& h, const Matrix& w_qkv, const Vector& rstd, const Positions& positions,
                            const Vector& inv_freq, const RopeHeads& heads) {
  require(w_qkv.rows == heads.width(), "linear_rowscale_rope: w_qkv must be [(Hq+2Hkv)hd, K]");
  return rope(linear_rowscale(h, w_qkv, rstd), positions, inv_freq, heads);
}

RopeBwd rope_bwd_zdz(const Matrix& qkv, const Matrix& dqkv, const Positions& positions, const Vector& inv_freq,
                     const RopeHeads& heads, int64_t hidden_size) {
  check_rope_args(dqkv, positions, inv_freq, heads, "rope_bwd_zdz");
  require(qkv.same_shape(dqkv), "rope_bwd_zdz: qkv and dqkv must have the same shape");
  require(hidden_size > 0, "rope_bwd_zdz: hidden_size must be > 0");
  // R is orthogonal: R^T = R(-theta), and <z, R^T dy> = <R z, dy>, so zdz needs only the rotated output.
  return RopeBwd{rotate(dqkv, positions, inv_freq, heads, -1.0, true),
                 row_dot(qkv, dqkv, 1.0 / static_cast<double>(hidden_size))};
}

}  // namespace coda::ref
