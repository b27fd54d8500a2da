// Matrix, float64 GEMMs, row/tile reductions, finite differences and the acceptance rule.
#include "reference/reference.hpp"

#include "reference/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace coda::ref {

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("coda::ref: ") + what);
}

// NaN-propagating running maximum of |values|.
void update_max(double& m, double v) {
  const double a = std::fabs(v);
  if (std::isnan(a) || a > m) m = a;
}

}  // namespace

Matrix::Matrix(int64_t n_rows, int64_t n_cols, double fill) : rows(n_rows), cols(n_cols) {
  require(n_rows >= 0 && n_cols >= 0, "Matrix: negative size");
  data.assign(static_cast<size_t>(n_rows * n_cols), fill);
}

Matrix::Matrix(int64_t n_rows, int64_t n_cols, std::vector<double> values)
    : rows(n_rows), cols(n_cols), data(std::move(values)) {
  require(n_rows >= 0 && n_cols >= 0, "Matrix: negative size");
  require(static_cast<int64_t>(data.size()) == n_rows * n_cols, "Matrix: values.size() != rows * cols");
}

Matrix transpose(const Matrix& m) {
  Matrix t(m.cols, m.rows);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) t(j, i) = m(i, j);
  return t;
}

Matrix vstack(const Matrix& top, const Matrix& bottom) {
  require(top.cols == bottom.cols, "vstack: column counts differ");
  Matrix out(top.rows + bottom.rows, top.cols);
  std::copy(top.data.begin(), top.data.end(), out.data.begin());
  std::copy(bottom.data.begin(), bottom.data.end(), out.data.begin() + top.size());
  return out;
}

double dot(const Matrix& a, const Matrix& b) {
  require(a.same_shape(b), "dot: shapes differ");
  double s = 0;
  for (int64_t i = 0; i < a.size(); ++i) s += a.data[static_cast<size_t>(i)] * b.data[static_cast<size_t>(i)];
  return s;
}

double dot(const Vector& a, const Vector& b) {
  require(a.size() == b.size(), "dot: sizes differ");
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double max_abs_diff(const Matrix& a, const Matrix& b) {
  require(a.same_shape(b), "max_abs_diff: shapes differ");
  double m = 0;
  for (size_t i = 0; i < a.data.size(); ++i) update_max(m, a.data[i] - b.data[i]);
  return m;
}

double max_abs_diff(const Vector& a, const Vector& b) {
  require(a.size() == b.size(), "max_abs_diff: sizes differ");
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) update_max(m, a[i] - b[i]);
  return m;
}

double max_abs(const Matrix& a) {
  double m = 0;
  for (double v : a.data) update_max(m, v);
  return m;
}

double max_abs(const Vector& a) {
  double m = 0;
  for (double v : a) update_max(m, v);
  return m;
}

// ---- finite differences ------------------------------------------------------------------------------------------

Matrix numeric_gradient(const std::function<double(const Matrix&)>& f, const Matrix& x, double step) {
  Matrix g(x.rows, x.cols);
  Matrix xp = x;
  for (size_t i = 0; i < x.data.size(); ++i) {
    const double h = step * std::max(1.0, std::fabs(x.data[i]));
    xp.data[i] = x.data[i] + h;
    const double fp = f(xp);
    xp.data[i] = x.data[i] - h;
    const double fm = f(xp);
    xp.data[i] = x.data[i];
    g.data[i] = (fp - fm) / (2 * h);
  }
  return g;
}

Vector numeric_gradient(const std::function<double(const Vector&)>& f, const Vector& x, double step) {
  Vector g(x.size());
  Vector xp = x;
  for (size_t i = 0; i < x.size(); ++i) {
    const double h = step * std::max(1.0, std::fabs(x[i]));
    xp[i] = x[i] + h;
    const double fp = f(xp);
    xp[i] = x[i] - h;
    const double fm = f(xp);
    xp[i] = x[i];
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// ---- GEMMs -------------------------------------------------------------------------------------------------------

void gemm(const Matrix& a, const Matrix& b, double alpha, bool accumulate, Matrix& d) {
  require(a.cols == b.cols, "gemm: a [M,K] and b [N,K] disagree on K");
  if (accumulate) {
    require(d.rows == a.rows && d.cols == b.rows, "gemm: accumulate needs d [M,N]");
  } else {
    d = Matrix(a.rows, b.rows);
  }
  detail::for_rows(a.rows, b.rows * a.cols, [&](int64_t i) {
    const double* ai = a.row(i);
    for (int64_t j = 0; j < b.rows; ++j) {
      const double* bj = b.row(j);
      double s = 0;
      for (int64_t k = 0; k < a.cols; ++k) s += ai[k] * bj[k];
      d(i, j) = alpha * s + (accumulate ? d(i, j) : 0.0);
    }
  });
}

Matrix linear(const Matrix& a, const Matrix& w) {
  Matrix y;
  gemm(a, w, 1.0, false, y);
  return y;
}

Matrix dgrad(const Matrix& dz, const Matrix& w) {
  require(dz.cols == w.rows, "dgrad: dz [M,N] and w [N,K] disagree on N");
  Matrix d;
  gemm(dz, transpose(w), 1.0, false, d);
  return d;
}

Matrix wgrad(const Matrix& dz, const Matrix& a) {
  require(dz.rows == a.rows, "wgrad: dz [M,N] and a [M,K] disagree on M");
  Matrix d;
  gemm(transpose(dz), transpose(a), 1.0, false, d);
  return d;
}

Matrix scale_rows(const Matrix& z, const Vector& r) {
  require(static_cast<int64_t>(r.size()) == z.rows, "scale_rows: r must have one value per row");
  Matrix out = z;
  for (int64_t i = 0; i < z.rows; ++i)
    for (int64_t j = 0; j < z.cols; ++j) out(i, j) *= r[static_cast<size_t>(i)];
  return out;
}

Vector row_dot(const Matrix& a, const Matrix& b, double scale) {
  require(a.same_shape(b), "row_dot: shapes differ");
  Vector out(static_cast<size_t>(a.rows));
  for (int64_t i = 0; i < a.rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < a.cols; ++j) s += a(i, j) * b(i, j);
    out[static_cast<size_t>(i)] = scale * s;
  }
  return out;
}

Matrix row_tile_sums(const Matrix& v, int64_t tile_n) {
  require(tile_n > 0, "row_tile_sums: tile_n must be > 0");
  const int64_t tiles = (v.cols + tile_n - 1) / tile_n;
  Matrix s(tiles, v.rows);
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t m = 0; m < v.rows; ++m) {
      double acc = 0;
      for (int64_t n = t * tile_n; n < std::min(v.cols, (t + 1) * tile_n); ++n) acc += v(m, n);
      s(t, m) = acc;
    }
  return s;
}

Matrix col_tile_sums(const Matrix& v, int64_t tile_m) {
  require(tile_m > 0, "col_tile_sums: tile_m must be > 0");
  const int64_t tiles = (v.rows + tile_m - 1) / tile_m;
  Matrix s(tiles, v.cols);
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t m = t * tile_m; m < std::min(v.rows, (t + 1) * tile_m); ++m)
      for (int64_t n = 0; n < v.cols; ++n) s(t, n) += v(m, n);
  return s;
}

Vector sum_tiles(const Matrix& partials) {
  Vector out(static_cast<size_t>(partials.cols), 0.0);
  for (int64_t t = 0; t < partials.rows; ++t)
    for (int64_t i = 0; i < partials.cols; ++i) out[static_cast<size_t>(i)] += partials(t, i);
  return out;
}

// ---- acceptance rule ---------------------------------------------------------------------------------------------

namespace {

Acceptance decide(double coda_error, double unfused_error, bool any_nan) {
  Acceptance r;
  r.coda_error = coda_error;
  r.unfused_error = unfused_error;
  r.bound = 2 * unfused_error + 1e-6;
  // A NaN anywhere fails (any_nan catches NaN in coda and ref at the same place, whose difference is NaN anyway).
  // An infinite error fails too: an unfused baseline that overflowed must not make the bound infinite.
  r.pass = !any_nan && std::isfinite(coda_error) && std::isfinite(unfused_error) && coda_error <= r.bound;
  return r;
}

bool has_nan(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
}

}  // namespace

std::string Acceptance::message() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "coda max err %.6g, unfused max err %.6g, bound %.6g: %s", coda_error,
                unfused_error, bound, pass ? "PASS" : "FAIL");
  return buf;
}

Acceptance acceptance(const Matrix& coda_out, const Matrix& unfused_out, const Matrix& ref_out) {
  require(coda_out.same_shape(ref_out) && unfused_out.same_shape(ref_out), "acceptance: shapes differ");
  const bool any_nan = has_nan(coda_out.data) || has_nan(unfused_out.data) || has_nan(ref_out.data);
  return decide(max_abs_diff(coda_out, ref_out), max_abs_diff(unfused_out, ref_out), any_nan);
}

Acceptance acceptance(const Vector& coda_out, const Vector& unfused_out, const Vector& ref_out) {
  require(coda_out.size() == ref_out.size() && unfused_out.size() == ref_out.size(), "acceptance: sizes differ");
  const bool any_nan = has_nan(coda_out) || has_nan(unfused_out) || has_nan(ref_out);
  return decide(max_abs_diff(coda_out, ref_out), max_abs_diff(unfused_out, ref_out), any_nan);
}

Acceptance acceptance(double coda_out, double unfused_out, double ref_out) {
  return acceptance(Vector{coda_out}, Vector{unfused_out}, Vector{ref_out});
}

}  // namespace coda::ref
