// The two rewrites of MATH.md and the split of whole-row operations into tiles, in float64:
//   - deferred row scale: diag(r) (x*gamma) W^T == RMSNorm(x) W^T (linear_rowscale and its fused variants against
//     the textbook composition);
//   - zdz: <D*gamma, c> == <dz, z>, so linear_residual_rmsnorm_bwd with zdz equals the direct RMSNorm backward;
//   - per-tile partials (sums of squares, dgamma, zdz) add up to the whole row/column for several tile widths;
//   - the blocked online log-sum-exp (lanes, tiles, masked overhang) equals the direct one, also for huge logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "reference/reference.hpp"

namespace {

using namespace coda::ref;

void expect_rel(const Matrix& got, const Matrix& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.same_shape(want)) << what;
  const double err = max_abs_diff(got, want);
  EXPECT_LE(err, tol * max_abs(want)) << what << ": max err " << err;
}

void expect_rel(const Vector& got, const Vector& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double err = max_abs_diff(got, want);
  EXPECT_LE(err, tol * max_abs(want)) << what << ": max err " << err;
}

TEST(ReferenceRewrites, DeferredRowScale) {
  Rng rng(31);
  const int64_t m_rows = 9, k = 24, d = 32, f_width = 20, vocab = 40;
  const double eps = 1e-6;
  const Matrix a = random_activation(m_rows, k, rng);
  const Matrix w_o = random_weight(d, k, rng);
  const Matrix residual = random_residual(m_rows, d, rng);
  const Vector gamma = random_gamma(d, rng);

  // linear_residual_rmsnorm gives x, h = x*gamma and rstd; the next GEMM applies rstd to its accumulator rows.
  const ResidualRmsnorm out_proj = linear_residual_rmsnorm(a, w_o, residual, gamma, eps);
  Matrix x_direct = residual;
  const Matrix lin = linear(a, w_o);
  for (size_t i = 0; i < x_direct.data.size(); ++i) x_direct.data[i] += lin.data[i];
  expect_rel(out_proj.x, x_direct, 1e-15, "linear_residual_rmsnorm x");
  const Matrix n = rmsnorm(out_proj.x, gamma, eps);

  // linear_rowscale: diag(r) (h W^T) == RMSNorm(x) W^T.
  const Matrix w = random_weight(f_width, d, rng);
  expect_rel(linear_rowscale(out_proj.h, w, out_proj.rstd), linear(n, w), 1e-14, "linear_rowscale");
  // linear_rowscale_swiglu: z and y.
  const Matrix w_gu = random_weight(2 * f_width, d, rng);
  const Swiglu gate_up = linear_rowscale_swiglu(out_proj.h, w_gu, out_proj.rstd);
  expect_rel(gate_up.z, linear(n, w_gu), 1e-14, "linear_rowscale_swiglu z");
  expect_rel(gate_up.y, swiglu(linear(n, w_gu)), 1e-14, "linear_rowscale_swiglu y");
  // linear_rowscale_rope.
  const RopeHeads heads{4, 2, 8};
  const Matrix w_qkv = random_weight(heads.width(), d, rng);
  const Positions pos = random_positions(m_rows, 200000, rng);
  const Vector inv_freq = rope_inv_freq(heads.head_dim);
  expect_rel(linear_rowscale_rope(out_proj.h, w_qkv, out_proj.rstd, pos, inv_freq, heads),
             rope(linear(n, w_qkv), pos, inv_freq, heads), 1e-14, "linear_rowscale_rope");
  // linear_rowscale_lse (with softcap).
  const Matrix w_v = random_weight(vocab, d, rng, 1.0);
  const Targets targets = random_targets(m_rows, vocab, rng, 0.3);
  const Lse lm_head = linear_rowscale_lse(out_proj.h, w_v, out_proj.rstd, targets, 15.0, -100);
  const Lse direct = logits_lse(linear(n, w_v), targets, 15.0, -100);
  expect_rel(lm_head.logits, direct.logits, 1e-14, "linear_rowscale_lse logits");
  expect_rel(lm_head.lse, direct.lse, 1e-14, "linear_rowscale_lse lse");
  EXPECT_LE(max_abs_diff(lm_head.target_logit, direct.target_logit), 1e-13);
  // rmsnorm_prepare: same h and rstd as linear_residual_rmsnorm would give for this x.
  const RmsnormPrepare prep = rmsnorm_prepare(out_proj.x, gamma, eps);
  EXPECT_EQ(max_abs_diff(prep.h, out_proj.h), 0.0);
  EXPECT_EQ(max_abs_diff(prep.rstd, out_proj.rstd), 0.0);
  expect_rel(scale_rows(prep.h, prep.rstd), n, 1e-15, "h * rstd == RMSNorm(x)");
}

TEST(ReferenceRewrites, ZdzIdentityAndNormBwdEqualsDirectBackward) {
  Rng rng(32);
  const int64_t m_rows = 8, n = 24, n_out = 36;
  const double eps = 1e-5, alpha = 0.6;
  const Matrix x = random_residual(m_rows, n, rng);
  const Vector gamma = random_gamma(n, rng);
  const Matrix w = random_weight(n_out, n, rng);
  const Matrix dz = random_activation(m_rows, n_out, rng);
  const Matrix dx_in = random_activation(m_rows, n, rng);
  const Vector rstd = rmsnorm_rstd_rows(x, eps);
  const Matrix a = rmsnorm(x, gamma, eps);  // a = c * gamma, c = x * rstd
  const Matrix z = linear(a, w);

  // <D*gamma, c> = <D, a> = <dz W, a> = <dz, a W^T> = <dz, z>, row by row.
  const Matrix d_mat = dgrad(dz, w);
  const Matrix c = scale_rows(x, rstd);
  Matrix d_gamma = d_mat;
  for (int64_t i = 0; i < m_rows; ++i)
    for (int64_t j = 0; j < n; ++j) d_gamma(i, j) *= gamma[static_cast<size_t>(j)];
  expect_rel(row_dot(d_gamma, c, 1.0), row_dot(dz, z, 1.0), 1e-13, "<D*gamma, c> == <dz, z>");
  expect_rel(row_dot(d_mat, a, 1.0), row_dot(dz, z, 1.0), 1e-13, "<D, a> == <dz, z>");

  // linear_residual_rmsnorm_bwd with zdz = alpha (1/N) <dz, z> equals dx_in + the textbook backward of RMSNorm with
  // dn = alpha dz W.
  const Vector zdz = row_dot(dz, z, 1.0 / static_cast<double>(n));
  const ResidualRmsnormBwd norm_bwd = linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, &dx_in, alpha);
  Matrix dn = d_mat;
  for (double& v : dn.data) v *= alpha;
  const RmsnormGrad direct = rmsnorm_bwd(x, gamma, eps, dn);
  Matrix dx_direct = direct.dx;
  for (size_t i = 0; i < dx_direct.data.size(); ++i) dx_direct.data[i] += dx_in.data[i];
  expect_rel(norm_bwd.dx, dx_direct, 1e-13, "linear_residual_rmsnorm_bwd dx");
  expect_rel(norm_bwd.dgamma, direct.dgamma, 1e-13, "linear_residual_rmsnorm_bwd dgamma");
  expect_rel(norm_bwd.a, a, 1e-15, "linear_residual_rmsnorm_bwd a");
}

TEST(ReferenceRewrites, SumsqPartialsAddUpForEveryTileWidth) {
  Rng rng(33);
  const double eps = 1e-5;
  for (const int64_t n : {512, 600}) {
    const Matrix x = random_residual(7, n, rng);
    Vector row_sumsq(7, 0.0);
    for (int64_t m = 0; m < 7; ++m)
      for (int64_t j = 0; j < n; ++j) row_sumsq[static_cast<size_t>(m)] += x(m, j) * x(m, j);
    for (const int64_t tile : {64, 128, 256, 96, 200, 1000, 1}) {
      SCOPED_TRACE("N " + std::to_string(n) + ", tile " + std::to_string(tile));
      const Matrix partials = rmsnorm_sumsq_partials(x, tile);
      ASSERT_EQ(partials.rows, (n + tile - 1) / tile);
      ASSERT_EQ(partials.cols, 7);
      for (int64_t t = 0; t < partials.rows; ++t)
        for (int64_t m = 0; m < 7; ++m) EXPECT_GT(partials(t, m), 0.0);
      expect_rel(sum_tiles(partials), row_sumsq, 1e-14, "sum of partials");
      expect_rel(rmsnorm_rstd(partials, n, eps), rmsnorm_rstd_rows(x, eps), 1e-15, "rstd from partials");
      // The last tile holds exactly the columns past (T-1)*tile (the overhang is not counted).
      const int64_t last = partials.rows - 1;
      double tail = 0;
      for (int64_t j = last * tile; j < n; ++j) tail += x(3, j) * x(3, j);
      EXPECT_NEAR(partials(last, 3), tail, 1e-12 * tail);
    }
  }
}

TEST(ReferenceRewrites, DgammaAndZdzPartialsAddUp) {
  Rng rng(34);
  const int64_t m_rows = 200, n = 48, n_out = 40, f_width = 72;
  const Matrix x = random_residual(m_rows, n, rng);
  const Vector gamma = random_gamma(n, rng);
  const Matrix w = random_weight(n_out, n, rng);
  const Matrix dz = random_activation(m_rows, n_out, rng);
  const Vector rstd = rmsnorm_rstd_rows(x, 1e-5);
  const Vector zdz(static_cast<size_t>(m_rows), 0.1);
  const ResidualRmsnormBwd norm_bwd = linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, nullptr, 1.0);
  // dgamma partials over M-tiles: [T, N] column sums of D * c.
  Matrix dc = dgrad(dz, w);
  const Matrix c = scale_rows(x, rstd);
  for (size_t i = 0; i < dc.data.size(); ++i) dc.data[i] *= c.data[i];
  for (const int64_t tile_m : {64, 128, 256, 7}) {
    const Matrix partials = col_tile_sums(dc, tile_m);
    EXPECT_EQ(partials.rows, (m_rows + tile_m - 1) / tile_m);
    expect_rel(sum_tiles(partials), norm_bwd.dgamma, 1e-13, "dgamma partials, tile_m " + std::to_string(tile_m));
  }
  // linear_swiglu_bwd_zdz's zdz as row partials over N-tiles of (1/d)(g dg + u du).
  const Matrix z = random_activation(m_rows, 2 * f_width, rng);
  const Matrix w_down = random_weight(n, f_width, rng);
  const Matrix dx = random_activation(m_rows, n, rng);
  const SwigluBwd down_bwd = linear_swiglu_bwd_zdz(dx, w_down, z);
  Matrix terms = z;
  for (size_t i = 0; i < terms.data.size(); ++i) terms.data[i] *= down_bwd.dz.data[i] / static_cast<double>(n);
  for (const int64_t tile : {64, 128, 256, 50}) {
    expect_rel(sum_tiles(row_tile_sums(terms, tile)), down_bwd.zdz, 1e-13,
               "linear_swiglu_bwd_zdz zdz partials, tile " + std::to_string(tile));
  }
}

TEST(ReferenceRewrites, LseStateMergeAlgebra) {
  const double inf = std::numeric_limits<double>::infinity();
  const LseState e = lse_empty();
  EXPECT_EQ(lse_value(e), -inf);
  EXPECT_EQ(lse_value(lse_merge(e, e)), -inf);
  EXPECT_FALSE(std::isnan(lse_merge(e, e).se));
  const std::vector<double> v = {3.0, -1.0, 700.0, 2.5, -800.0, 699.0, 0.0};
  LseState all = e;
  for (double x : v) all = lse_update(all, x);
  LseState left = e, right = e;  // the same values split over two states, as two lanes or tiles would hold them
  for (size_t i = 0; i < 3; ++i) left = lse_update(left, v[i]);
  for (size_t i = 3; i < v.size(); ++i) right = lse_update(right, v[i]);
  const double want = 700.0 + std::log(1.0 + std::exp(-1.0) + std::exp(-697.0) + std::exp(-697.5) + std::exp(-700.0) +
                                       std::exp(-701.0) + std::exp(-1500.0));
  EXPECT_NEAR(lse_value(all), want, 1e-12);
  EXPECT_NEAR(lse_value(lse_merge(left, right)), want, 1e-12);
  EXPECT_NEAR(lse_value(lse_merge(right, left)), want, 1e-12);  // commutative
  EXPECT_EQ(lse_value(lse_merge(all, e)), lse_value(all));      // empty is the identity
  EXPECT_EQ(lse_value(lse_merge(e, all)), lse_value(all));
  const LseState a = lse_update(e, 1.0), b = lse_update(e, 5.0), c = lse_update(e, -3.0);
  EXPECT_NEAR(lse_value(lse_merge(lse_merge(a, b), c)), lse_value(lse_merge(a, lse_merge(b, c))), 1e-14);
  EXPECT_EQ(lse_value(lse_update(e, -inf)), -inf);  // a masked (-inf) value leaves the state alone
}

TEST(ReferenceRewrites, BlockedLseEqualsDirect) {
  Rng rng(35);
  struct Scale {
    const char* name;
    double mean, stddev, softcap;
  };
  const Scale scales[] = {
      {"normal", 0.0, 3.0, 0.0},
      {"softcap", 0.0, 30.0, 30.0},
      {"huge positive", 1e6, 1e4, 0.0},  // naive sum of exp overflows
      {"huge negative", -1e6, 50.0, 0.0}, // naive sum of exp underflows to 0
      {"huge softcapped", 0.0, 1e5, 50.0},
  };
  for (const Scale& s : scales) {
    for (const int64_t vocab : {37, 256, 1000, 1031}) {
      const Matrix logits = random_normal(5, vocab, s.mean, s.stddev, rng);
      const Vector direct = logsumexp_rows(softcap(logits, s.softcap));
      for (const int64_t tile : {64, 128, 256, 100}) {
        for (const int lanes : {1, 3, 4, 32}) {
          SCOPED_TRACE(std::string(s.name) + ", V " + std::to_string(vocab) + ", tile " + std::to_string(tile) +
                       ", lanes " + std::to_string(lanes));
          const BlockedLse b = blocked_lse(logits, tile, s.softcap, lanes);
          ASSERT_EQ(b.tile_lse.rows, (vocab + tile - 1) / tile);
          const double err = max_abs_diff(b.lse, direct);
          EXPECT_LE(err, 1e-14 * (1 + max_abs(direct))) << err;
          for (int64_t t = 0; t < b.tile_lse.rows; ++t) {
            for (int64_t m = 0; m < 5; ++m) {
              ASSERT_TRUE(std::isfinite(b.tile_lse(t, m)));
              EXPECT_GE(b.tile_sumexp(t, m), 1.0);  // the max element contributes exp(0) = 1
            }
          }
          // Masked overhang: the last tile's state covers only columns [(T-1)*tile, V).
          const int64_t last = b.tile_lse.rows - 1;
          Matrix tail(1, vocab - last * tile);
          for (int64_t j = 0; j < tail.cols; ++j) tail(0, j) = softcap(logits(2, last * tile + j), s.softcap);
          EXPECT_NEAR(b.tile_lse(last, 2), logsumexp_rows(tail)[0], 1e-14 * (1 + std::fabs(b.tile_lse(last, 2))));
        }
      }
      if (s.mean == 1e6) {
        double naive = 0;
        for (int64_t j = 0; j < vocab; ++j) naive += std::exp(logits(0, j));
        EXPECT_TRUE(std::isinf(naive));  // why the online max is needed
      }
    }
  }
}

TEST(ReferenceRewrites, LinearRowscaleLseFeedsCrossEntropy) {
  Rng rng(36);
  const int64_t m_rows = 6, d = 16, vocab = 50;
  const Matrix h = random_activation(m_rows, d, rng);
  const Vector rstd = {0.9, 1.1, 0.5, 2.0, 1.0, 0.7};
  const Matrix w = random_weight(vocab, d, rng, 1.0);
  Targets targets = {0, 49, -100, 7, 7, -100};
  for (const double cap : {0.0, 4.0}) {
    const Lse lm_head = linear_rowscale_lse(h, w, rstd, targets, cap, -100);
    EXPECT_EQ(max_abs_diff(lm_head.capped, softcap(lm_head.logits, cap)), 0.0);
    EXPECT_EQ(lm_head.target_logit[2], 0.0);
    EXPECT_EQ(lm_head.target_logit[5], 0.0);
    EXPECT_EQ(lm_head.target_logit[1], lm_head.capped(1, 49));
    EXPECT_EQ(lm_head.target_logit[0], lm_head.capped(0, 0));
    coda_ce_options opt = default_ce_options();
    opt.reduction = CODA_REDUCTION_NONE;
    opt.softcap = static_cast<float>(cap);
    const CrossEntropy ce = cross_entropy(lm_head.logits, targets, opt, {}, d);
    EXPECT_LE(max_abs_diff(ce.lse, lm_head.lse), 1e-14);
    for (size_t m = 0; m < targets.size(); ++m) {
      const double want = targets[m] == -100 ? 0.0 : lm_head.lse[m] - lm_head.target_logit[m];
      EXPECT_NEAR(ce.loss_rows[m], want, 1e-13) << "row " << m;
    }
    const BlockedLse blocked = blocked_lse(lm_head.logits, 16, cap);
    EXPECT_LE(max_abs_diff(blocked.lse, lm_head.lse), 1e-13);
  }
  EXPECT_THROW(logits_lse(Matrix(1, 4, 0.5), Targets{4}, 0.0, -100), std::invalid_argument);  // target == V
}

}  // namespace
