// SwiGLU in float64: linear_rowscale_swiglu (gate/up GEMM with row scale and SwiGLU) and linear_swiglu_bwd_zdz
// (down-projection dgrad fused with the SwiGLU backward and the zdz row dot). Gate/up are interleaved:
// z[2i] = gate i, z[2i+1] = up i.
#include "reference/reference.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace coda::ref {

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("coda::ref: ") + what);
}

}  // namespace

double sigmoid(double g) {
  // Both branches avoid exp overflow: exp of a non-positive number only.
  if (g >= 0) return 1.0 / (1.0 + std::exp(-g));
  const double e = std::exp(g);
  return e / (1.0 + e);
}

double silu(double g) { return g * sigmoid(g); }

Matrix swiglu(const Matrix& z) {
  require(z.cols % 2 == 0, "swiglu: z must be [M,2F]");
  Matrix y(z.rows, z.cols / 2);
  for (int64_t m = 0; m < z.rows; ++m)
    for (int64_t i = 0; i < y.cols; ++i) y(m, i) = silu(z(m, 2 * i)) * z(m, 2 * i + 1);
  return y;
}

Swiglu linear_rowscale_swiglu(const Matrix& h, const Matrix& w_gu, const Vector& rstd) {
  require(w_gu.rows % 2 == 0, "linear_rowscale_swiglu: w_gu must be [2F,K]");
  Swiglu out;
  out.z = linear_rowscale(h, w_gu, rstd);
  out.y = swiglu(out.z);
  return out;
}

SwigluBwd swiglu_bwd(const Matrix& z, const Matrix& dy, int64_t hidden_size) {
  require(z.cols % 2 == 0 && dy.rows == z.rows && dy.cols * 2 == z.cols, "swiglu_bwd: z [M,2F], dy [M,F]");
  require(hidden_size > 0, "swiglu_bwd: hidden_size must be > 0");
  SwigluBwd out{Matrix(z.rows, z.cols), Matrix(dy.rows, dy.cols), Vector(static_cast<size_t>(z.rows), 0.0)};
  for (int64_t m = 0; m < z.rows; ++m) {
    double s_zdz = 0;
    for (int64_t i = 0; i < dy.cols; ++i) {
      const double g = z(m, 2 * i);
      const double u = z(m, 2 * i + 1);
      const double s = sigmoid(g);
      // silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)).
      const double dg = dy(m, i) * u * s * (1.0 + g * (1.0 - s));
      const double du = dy(m, i) * g * s;
      out.dz(m, 2 * i) = dg;
      out.dz(m, 2 * i + 1) = du;
      out.y(m, i) = g * s * u;
      s_zdz += g * dg + u * du;
    }
    out.zdz[static_cast<size_t>(m)] = s_zdz / static_cast<double>(hidden_size);
  }
  return out;
}

SwigluBwd linear_swiglu_bwd_zdz(const Matrix& dx, const Matrix& w_down, const Matrix& z) {
  require(dx.cols == w_down.rows, "linear_swiglu_bwd_zdz: dx [M,d] and w_down [d,F] disagree on d");
  require(z.rows == dx.rows && z.cols == 2 * w_down.cols, "linear_swiglu_bwd_zdz: z must be [M,2F]");
  return swiglu_bwd(z, dgrad(dx, w_down), dx.cols);
}

}  // namespace coda::ref
