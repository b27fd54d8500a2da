// RMSNorm family in float64: linear_residual_rmsnorm (linear + residual + norm statistics), rmsnorm_prepare,
// linear_rowscale (deferred row scale), linear_residual_rmsnorm_bwd (dgrad fused with the RMSNorm backward through
// zdz), and the textbook RMSNorm forward/backward that the rewrites are checked against.
#include "reference/reference.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace coda::ref {

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("coda::ref: ") + what);
}

size_t idx(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

Vector rmsnorm_rstd_rows(const Matrix& x, double eps) {
  require(x.cols > 0, "rmsnorm_rstd_rows: empty rows");
  Vector r(idx(x.rows));
  for (int64_t m = 0; m < x.rows; ++m) {
    double s = 0;
    for (int64_t n = 0; n < x.cols; ++n) s += x(m, n) * x(m, n);
    r[idx(m)] = 1.0 / std::sqrt(s / static_cast<double>(x.cols) + eps);
  }
  return r;
}

Matrix rmsnorm(const Matrix& x, const Vector& gamma, double eps) {
  require(static_cast<int64_t>(gamma.size()) == x.cols, "rmsnorm: gamma must be [N]");
  const Vector r = rmsnorm_rstd_rows(x, eps);
  Matrix n(x.rows, x.cols);
  for (int64_t m = 0; m < x.rows; ++m)
    for (int64_t k = 0; k < x.cols; ++k) n(m, k) = x(m, k) * r[idx(m)] * gamma[idx(k)];
  return n;
}

RmsnormGrad rmsnorm_bwd(const Matrix& x, const Vector& gamma, double eps, const Matrix& dn) {
  require(static_cast<int64_t>(gamma.size()) == x.cols, "rmsnorm_bwd: gamma must be [N]");
  require(dn.same_shape(x), "rmsnorm_bwd: dn must be [M,N] like x");
  const Vector r = rmsnorm_rstd_rows(x, eps);
  const double inv_n = 1.0 / static_cast<double>(x.cols);
  RmsnormGrad g{Matrix(x.rows, x.cols), Vector(gamma.size(), 0.0)};
  for (int64_t m = 0; m < x.rows; ++m) {
    const double rm = r[idx(m)];
    // n = x r gamma with r = (mean x^2 + eps)^(-1/2): dr/dx_k = -r^3 x_k / N.
    double s = 0;  // sum_k dn_k gamma_k x_k
    for (int64_t k = 0; k < x.cols; ++k) s += dn(m, k) * gamma[idx(k)] * x(m, k);
    for (int64_t k = 0; k < x.cols; ++k) {
      g.dx(m, k) = rm * dn(m, k) * gamma[idx(k)] - rm * rm * rm * x(m, k) * s * inv_n;
      g.dgamma[idx(k)] += dn(m, k) * x(m, k) * rm;
    }
  }
  return g;
}

Matrix rstd_bwd(const Matrix& x, const Vector& rstd, const Vector& drstd) {
  require(static_cast<int64_t>(rstd.size()) == x.rows && drstd.size() == rstd.size(),
          "rstd_bwd: rstd and drstd must be [M]");
  Matrix dx(x.rows, x.cols);
  for (int64_t m = 0; m < x.rows; ++m) {
    const double r = rstd[idx(m)];
    const double coef = -drstd[idx(m)] * r * r * r / static_cast<double>(x.cols);
    for (int64_t n = 0; n < x.cols; ++n) dx(m, n) = coef * x(m, n);
  }
  return dx;
}

Matrix rmsnorm_sumsq_partials(const Matrix& x, int64_t tile_n) {
  Matrix sq = x;
  for (double& v : sq.data) v *= v;
  return row_tile_sums(sq, tile_n);
}

Vector rmsnorm_rstd(const Matrix& partials, int64_t n_features, double eps) {
  require(n_features > 0, "rmsnorm_rstd: n_features must be > 0");
  Vector s = sum_tiles(partials);
  for (double& v : s) v = 1.0 / std::sqrt(v / static_cast<double>(n_features) + eps);
  return s;
}

ResidualRmsnorm linear_residual_rmsnorm(const Matrix& a, const Matrix& w, const Matrix& residual,
                                        const Vector& gamma, double eps) {
  require(residual.rows == a.rows && residual.cols == w.rows, "linear_residual_rmsnorm: residual must be [M,N]");
  require(static_cast<int64_t>(gamma.size()) == w.rows, "linear_residual_rmsnorm: gamma must be [N]");
  ResidualRmsnorm out;
  out.x = residual;
  gemm(a, w, 1.0, true, out.x);
  out.h = out.x;
  for (int64_t m = 0; m < out.h.rows; ++m)
    for (int64_t n = 0; n < out.h.cols; ++n) out.h(m, n) *= gamma[idx(n)];
  out.rstd = rmsnorm_rstd_rows(out.x, eps);
  return out;
}

RmsnormPrepare rmsnorm_prepare(const Matrix& x, const Vector& gamma, double eps) {
  require(static_cast<int64_t>(gamma.size()) == x.cols, "rmsnorm_prepare: gamma must be [N]");
  RmsnormPrepare out{x, rmsnorm_rstd_rows(x, eps)};
  for (int64_t m = 0; m < x.rows; ++m)
    for (int64_t n = 0; n < x.cols; ++n) out.h(m, n) *= gamma[idx(n)];
  return out;
}

Matrix linear_rowscale(const Matrix& h, const Matrix& w, const Vector& rstd) {
  return scale_rows(linear(h, w), rstd);
}

ResidualRmsnormBwd linear_residual_rmsnorm_bwd(const Matrix& dz, const Matrix& w, const Matrix& x,
                                               const Vector& gamma, const Vector& rstd, const Vector& zdz,
                                               const Matrix* dx_in, double alpha) {
  require(dz.cols == w.rows, "linear_residual_rmsnorm_bwd: dz [M,N'] and w [N',N] disagree on N'");
  require(x.rows == dz.rows && x.cols == w.cols, "linear_residual_rmsnorm_bwd: x must be [M,N]");
  require(static_cast<int64_t>(gamma.size()) == x.cols, "linear_residual_rmsnorm_bwd: gamma must be [N]");
  require(static_cast<int64_t>(rstd.size()) == x.rows && zdz.size() == rstd.size(),
          "linear_residual_rmsnorm_bwd: rstd and zdz must be [M]");
  require(dx_in == nullptr || dx_in->same_shape(x), "linear_residual_rmsnorm_bwd: dx_in must be [M,N]");
  Matrix d;
  gemm(dz, transpose(w), alpha, false, d);  // D = alpha dz w
  ResidualRmsnormBwd out{Matrix(x.rows, x.cols), Matrix(x.rows, x.cols), Vector(gamma.size(), 0.0)};
  for (int64_t m = 0; m < x.rows; ++m) {
    const double r = rstd[idx(m)];
    for (int64_t n = 0; n < x.cols; ++n) {
      const double c = x(m, n) * r;
      const double g = gamma[idx(n)];
      out.dx(m, n) = (dx_in ? (*dx_in)(m, n) : 0.0) + r * (d(m, n) * g - c * alpha * zdz[idx(m)]);
      out.a(m, n) = c * g;
      out.dgamma[idx(n)] += d(m, n) * c;
    }
  }
  return out;
}

}  // namespace coda::ref
