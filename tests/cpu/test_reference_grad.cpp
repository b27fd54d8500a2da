// Finite-difference checks (central differences, float64, small shapes) of every backward in the reference:
// rstd, the direct RMSNorm backward, rope_bwd_zdz, linear_residual_rmsnorm_bwd (dx, dgamma, dW with alpha and
// dx_in), linear_swiglu_bwd_zdz, cross-entropy with every option, QK-norm + RoPE, and whole chains (LM head, MLP,
// q/k/v input with and without QK-norm) where rope_bwd_zdz / linear_swiglu_bwd_zdz / cross_entropy feed zdz to
// linear_residual_rmsnorm_bwd.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "reference/reference.hpp"

namespace {

using namespace coda::ref;

// |numeric - analytic| <= tol * (1 + max|analytic|), reported with the observed error.
void expect_grad(const Matrix& numeric, const Matrix& analytic, const std::string& what, double tol = 1e-7) {
  ASSERT_TRUE(numeric.same_shape(analytic)) << what;
  const double err = max_abs_diff(numeric, analytic);
  EXPECT_LE(err, tol * (1 + max_abs(analytic))) << what << ": max err " << err << ", max|grad| " << max_abs(analytic);
}

void expect_grad(const Vector& numeric, const Vector& analytic, const std::string& what, double tol = 1e-7) {
  ASSERT_EQ(numeric.size(), analytic.size()) << what;
  const double err = max_abs_diff(numeric, analytic);
  EXPECT_LE(err, tol * (1 + max_abs(analytic))) << what << ": max err " << err << ", max|grad| " << max_abs(analytic);
}

TEST(ReferenceGrad, RstdMatchesFiniteDifferences) {
  Rng rng(11);
  // Small x so that eps matters in rstd = (mean x^2 + eps)^(-1/2).
  const Matrix x = random_normal(5, 9, 0.0, 0.1, rng);
  const double eps = 0.01;
  Vector weights(5);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.3 + 0.2 * static_cast<double>(i);
  auto f = [&](const Matrix& xx) { return dot(weights, rmsnorm_rstd_rows(xx, eps)); };
  expect_grad(numeric_gradient(f, x), rstd_bwd(x, rmsnorm_rstd_rows(x, eps), weights), "drstd/dx");
}

TEST(ReferenceGrad, DirectRmsnormBackward) {
  Rng rng(12);
  const Matrix x = random_normal(6, 10, 0.0, 0.2, rng);
  const Vector gamma = random_gamma(10, rng);
  const Matrix dn = random_activation(6, 10, rng);
  const double eps = 1e-2;
  const RmsnormGrad g = rmsnorm_bwd(x, gamma, eps, dn);
  expect_grad(numeric_gradient([&](const Matrix& xx) { return dot(dn, rmsnorm(xx, gamma, eps)); }, x), g.dx, "dx");
  expect_grad(numeric_gradient([&](const Vector& gg) { return dot(dn, rmsnorm(x, gg, eps)); }, gamma), g.dgamma,
              "dgamma");
}

// linear_residual_rmsnorm_bwd: f = alpha <dz, rmsnorm(x) W^T> + <dx_in, x>, so df/dx = its dx, df/dgamma = its
// dgamma, df/dW = alpha dz^T a, with zdz = (1/N) sum_j z dz (the op scales it by alpha together with D).
TEST(ReferenceGrad, LinearResidualRmsnormBwd) {
  for (const bool with_dx_in : {false, true}) {
    for (const double alpha : {1.0, 0.37}) {
      SCOPED_TRACE("dx_in " + std::to_string(with_dx_in) + ", alpha " + std::to_string(alpha));
      Rng rng(13);
      const int64_t m_rows = 6, n = 16, n_out = 12;
      const double eps = 1e-5;
      const Matrix x = random_residual(m_rows, n, rng);
      const Vector gamma = random_gamma(n, rng);
      const Matrix w = random_weight(n_out, n, rng, 0.2);
      const Matrix dz = random_activation(m_rows, n_out, rng);
      const Matrix dx_in = random_activation(m_rows, n, rng);
      const Matrix* dx_in_ptr = with_dx_in ? &dx_in : nullptr;

      auto f = [&](const Matrix& xx, const Vector& gg, const Matrix& ww) {
        return alpha * dot(dz, linear(rmsnorm(xx, gg, eps), ww)) + (with_dx_in ? dot(dx_in, xx) : 0.0);
      };
      const Vector rstd = rmsnorm_rstd_rows(x, eps);
      const Matrix z = linear(rmsnorm(x, gamma, eps), w);
      const Vector zdz = row_dot(dz, z, 1.0 / static_cast<double>(n));
      const ResidualRmsnormBwd b = linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd, zdz, dx_in_ptr, alpha);

      expect_grad(numeric_gradient([&](const Matrix& xx) { return f(xx, gamma, w); }, x), b.dx, "dx");
      expect_grad(numeric_gradient([&](const Vector& gg) { return f(x, gg, w); }, gamma), b.dgamma, "dgamma");
      Matrix dw = wgrad(dz, b.a);
      for (double& v : dw.data) v *= alpha;
      expect_grad(numeric_gradient([&](const Matrix& ww) { return f(x, gamma, ww); }, w), dw, "dW");
      EXPECT_LE(max_abs_diff(b.a, rmsnorm(x, gamma, eps)), 1e-14 * max_abs(b.a));
    }
  }
}

// rope_bwd_zdz: f = <dqkv, rope(z)>; its dz is df/dz, and its zdz (from the rotated qkv) equals (1/d) <z, dz>.
TEST(ReferenceGrad, RopeBwdZdz) {
  for (const RopeHeads heads : {RopeHeads{4, 2, 8}, RopeHeads{4, 1, 8}, RopeHeads{2, 2, 4}}) {
    SCOPED_TRACE("heads " + std::to_string(heads.n_q_heads) + "/" + std::to_string(heads.n_kv_heads) + " hd " +
                 std::to_string(heads.head_dim));
    Rng rng(14);
    const int64_t m_rows = 5, hidden = 24;
    const Matrix z = random_activation(m_rows, heads.width(), rng);
    const Matrix dqkv = random_activation(m_rows, heads.width(), rng);
    const Positions pos = {0, 1, 17, 4096, 131071};
    const Vector inv_freq = rope_inv_freq(heads.head_dim, 10000.0);
    const RopeBwd b = rope_bwd_zdz(rope(z, pos, inv_freq, heads), dqkv, pos, inv_freq, heads, hidden);
    auto f = [&](const Matrix& zz) { return dot(dqkv, rope(zz, pos, inv_freq, heads)); };
    expect_grad(numeric_gradient(f, z), b.dz, "dz");
    expect_grad(row_dot(z, b.dz, 1.0 / hidden), b.zdz, "zdz == (1/d) <z_pre_rope, dz>", 1e-14);
  }
}

// linear_swiglu_bwd_zdz: f = <dx, swiglu(z) W_down^T>; dz, dW_down = dx^T y, and zdz = (1/d) sum (g dg + u du).
TEST(ReferenceGrad, LinearSwigluBwdZdz) {
  Rng rng(15);
  const int64_t m_rows = 5, d = 12, f_width = 8;
  const Matrix z = random_normal(m_rows, 2 * f_width, 0.0, 2.0, rng);  // wide range of gates
  const Matrix w_down = random_weight(d, f_width, rng, 0.2);
  const Matrix dx = random_activation(m_rows, d, rng);
  const SwigluBwd b = linear_swiglu_bwd_zdz(dx, w_down, z);
  auto f = [&](const Matrix& zz, const Matrix& ww) { return dot(dx, linear(swiglu(zz), ww)); };
  const Matrix num_dz = numeric_gradient([&](const Matrix& zz) { return f(zz, w_down); }, z);
  expect_grad(num_dz, b.dz, "dz");
  expect_grad(numeric_gradient([&](const Matrix& ww) { return f(z, ww); }, w_down), wgrad(dx, b.y), "dW_down");
  expect_grad(row_dot(z, num_dz, 1.0 / d), b.zdz, "zdz");
  EXPECT_EQ(max_abs_diff(b.y, swiglu(z)), 0.0);
}

// ---- cross-entropy -----------------------------------------------------------------------------------------------

struct CeCase {
  std::string name;
  coda_reduction reduction;
  float label_smoothing;
  float z_loss;
  float softcap;
  int64_t ignore_index;
  std::vector<int> ignored_rows;  // rows whose target is replaced by ignore_index
  bool per_row_grad;              // grad_loss [M] (none) instead of a scalar
  double scalar_grad;             // grad_loss [1] when != 1, empty otherwise
};

std::vector<CeCase> ce_cases() {
  return {
      {"mean", CODA_REDUCTION_MEAN, 0, 0, 0, -100, {}, false, 1.0},
      {"sum_scalar_grad", CODA_REDUCTION_SUM, 0, 0, 0, -100, {}, false, 0.7},
      {"mean_scalar_grad_ignored", CODA_REDUCTION_MEAN, 0, 0, 0, -100, {1, 4}, false, 1.9},
      {"none_per_row_grad", CODA_REDUCTION_NONE, 0, 0, 0, -100, {}, true, 1.0},
      {"none_default_grad", CODA_REDUCTION_NONE, 0, 0, 0, -100, {2}, false, 1.0},
      {"label_smoothing", CODA_REDUCTION_MEAN, 0.1f, 0, 0, -100, {}, false, 1.0},
      {"z_loss", CODA_REDUCTION_MEAN, 0, 0.01f, 0, -100, {}, false, 1.0},
      {"softcap", CODA_REDUCTION_MEAN, 0, 0, 3.0f, -100, {}, false, 1.0},
      {"all_options_none", CODA_REDUCTION_NONE, 0.2f, 0.05f, 2.5f, -100, {0, 3}, true, 1.0},
      {"all_options_sum", CODA_REDUCTION_SUM, 0.2f, 0.05f, 2.5f, -1, {5}, false, 0.3},
      {"ignore_index_inside_vocab", CODA_REDUCTION_MEAN, 0, 0, 0, 5, {2, 6}, false, 1.0},
      {"all_ignored_mean", CODA_REDUCTION_MEAN, 0.1f, 0.01f, 0, -100, {0, 1, 2, 3, 4, 5, 6}, false, 1.0},
      {"all_ignored_sum", CODA_REDUCTION_SUM, 0, 0, 2.0f, -100, {0, 1, 2, 3, 4, 5, 6}, false, 1.0},
      {"all_ignored_none", CODA_REDUCTION_NONE, 0, 0, 0, -100, {0, 1, 2, 3, 4, 5, 6}, true, 1.0},
  };
}

TEST(ReferenceGrad, CrossEntropyEveryOption) {
  const int64_t m_rows = 7, vocab = 11, hidden = 16;
  for (const CeCase& c : ce_cases()) {
    SCOPED_TRACE(c.name);
    Rng rng(16);
    const Matrix logits = random_normal(m_rows, vocab, 0.0, c.softcap > 0 ? 4.0 : 2.0, rng);
    // Targets at column 0 and V-1 always appear; ignored rows replace theirs.
    Targets targets = {0, static_cast<int64_t>(vocab - 1), 3, 7, 0, static_cast<int64_t>(vocab - 1), 9};
    if (c.ignore_index == 5) targets[2] = targets[6] = 5;  // ignore_index inside [0, V): those rows are ignored
    for (int r : c.ignored_rows) targets[static_cast<size_t>(r)] = c.ignore_index;
    coda_ce_options opt = default_ce_options();
    opt.reduction = c.reduction;
    opt.label_smoothing = c.label_smoothing;
    opt.z_loss = c.z_loss;
    opt.softcap = c.softcap;
    opt.ignore_index = c.ignore_index;
    Vector grad_loss;
    if (c.per_row_grad) {
      grad_loss = random_normal(1, m_rows, 0.0, 1.0, rng).data;
    } else if (c.scalar_grad != 1.0) {
      grad_loss = {c.scalar_grad};
    }

    const CrossEntropy ce = cross_entropy(logits, targets, opt, grad_loss, hidden);
    int64_t n_valid = 0;
    for (int64_t t : targets) n_valid += t != c.ignore_index ? 1 : 0;
    EXPECT_EQ(ce.n_valid, n_valid);

    // The scalar the gradient differentiates: sum_m g_m loss_m (none) or G * reduced loss.
    auto total = [&](const Matrix& l) {
      const CrossEntropy e = cross_entropy(l, targets, opt, {}, hidden);
      if (c.reduction != CODA_REDUCTION_NONE) return (grad_loss.empty() ? 1.0 : grad_loss[0]) * e.loss[0];
      double s = 0;
      for (int64_t m = 0; m < m_rows; ++m) {
        s += (grad_loss.empty() ? 1.0 : grad_loss[static_cast<size_t>(m)]) * e.loss_rows[static_cast<size_t>(m)];
      }
      return s;
    };
    expect_grad(numeric_gradient(total, logits), ce.dlogits, "dlogits");
    expect_grad(row_dot(logits, ce.dlogits, 1.0 / hidden), ce.zdz, "zdz", 1e-14);

    // Loss values against the textbook form: -sum_j q_j log p_j, q = (1-ls) onehot(t) + ls/V, plus z_loss lse^2,
    // on capped logits; ignored rows 0; mean over non-ignored rows.
    double sum = 0;
    for (int64_t m = 0; m < m_rows; ++m) {
      const int64_t t = targets[static_cast<size_t>(m)];
      double expect = 0;
      if (t != c.ignore_index) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, softcap(logits(m, j), c.softcap));
        double se = 0;
        for (int64_t j = 0; j < vocab; ++j) se += std::exp(softcap(logits(m, j), c.softcap) - mx);
        const double lse = mx + std::log(se);
        for (int64_t j = 0; j < vocab; ++j) {
          const double qj = (j == t ? 1.0 - c.label_smoothing : 0.0) + c.label_smoothing / static_cast<double>(vocab);
          expect -= qj * (softcap(logits(m, j), c.softcap) - lse);
        }
        expect += c.z_loss * lse * lse;
      } else {
        for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(ce.dlogits(m, j), 0.0);
        EXPECT_EQ(ce.zdz[static_cast<size_t>(m)], 0.0);
      }
      EXPECT_NEAR(ce.loss_rows[static_cast<size_t>(m)], expect, 1e-12 * (1 + std::fabs(expect))) << "row " << m;
      sum += expect;
    }
    switch (c.reduction) {
      case CODA_REDUCTION_NONE:
        EXPECT_EQ(ce.loss, ce.loss_rows);
        break;
      case CODA_REDUCTION_MEAN:
        ASSERT_EQ(ce.loss.size(), 1u);
        EXPECT_NEAR(ce.loss[0], n_valid > 0 ? sum / static_cast<double>(n_valid) : 0.0, 1e-12);
        break;
      case CODA_REDUCTION_SUM:
        ASSERT_EQ(ce.loss.size(), 1u);
        EXPECT_NEAR(ce.loss[0], sum, 1e-12);
        break;
    }
    if (n_valid == 0) {
      EXPECT_EQ(max_abs(ce.dlogits), 0.0);
      EXPECT_EQ(max_abs(ce.loss), 0.0);
    }
  }
}

// ---- whole chains: cross_entropy, linear_swiglu_bwd_zdz or rope_bwd_zdz feed zdz to linear_residual_rmsnorm_bwd ---

// LM head: x -> RMSNorm -> logits = n W^T -> cross-entropy. linear_residual_rmsnorm_bwd with cross_entropy's dlogits
// and zdz gives dx, dgamma, dW.
TEST(ReferenceGrad, LmHeadChainThroughNormBwd) {
  Rng rng(17);
  const int64_t m_rows = 6, d = 16, vocab = 13;
  const double eps = 1e-5;
  const Matrix x = random_residual(m_rows, d, rng);
  const Vector gamma = random_gamma(d, rng);
  const Matrix w = random_weight(vocab, d, rng, 0.3);
  const Targets targets = {0, 12, -100, 5, 7, 12};
  coda_ce_options opt = default_ce_options();
  opt.label_smoothing = 0.1f;
  opt.z_loss = 0.02f;
  opt.softcap = 5.0f;

  auto loss = [&](const Matrix& xx, const Vector& gg, const Matrix& ww) {
    return cross_entropy(linear(rmsnorm(xx, gg, eps), ww), targets, opt, {}, d).loss[0];
  };
  // Forward as CODA runs it: h and rstd (linear_residual_rmsnorm / rmsnorm_prepare), logits from linear_rowscale_lse's
  // GEMM.
  const RmsnormPrepare prep = rmsnorm_prepare(x, gamma, eps);
  const Lse head = linear_rowscale_lse(prep.h, w, prep.rstd, targets, opt.softcap, opt.ignore_index);
  const CrossEntropy ce = cross_entropy(head.logits, targets, opt, {}, d);
  const ResidualRmsnormBwd b =
      linear_residual_rmsnorm_bwd(ce.dlogits, w, x, gamma, prep.rstd, ce.zdz, nullptr, 1.0);
  expect_grad(numeric_gradient([&](const Matrix& xx) { return loss(xx, gamma, w); }, x), b.dx, "dx");
  expect_grad(numeric_gradient([&](const Vector& gg) { return loss(x, gg, w); }, gamma), b.dgamma, "dgamma");
  expect_grad(numeric_gradient([&](const Matrix& ww) { return loss(x, gamma, ww); }, w), wgrad(ce.dlogits, b.a),
              "dW");
}

// The LM-head use of linear_residual_rmsnorm_bwd's alpha: cross_entropy run with upstream gradient 1 (sum), the
// scale G applied as alpha in the dgrad GEMM. zdz comes from cross_entropy unscaled; linear_residual_rmsnorm_bwd
// scales it by alpha together with D. Pre-scaling it by hand is then wrong.
TEST(ReferenceGrad, NormBwdAlphaScalesZdzToo) {
  Rng rng(18);
  const int64_t m_rows = 5, d = 12, vocab = 9;
  const double eps = 1e-5, g_upstream = 0.25;
  const Matrix x = random_residual(m_rows, d, rng);
  const Vector gamma = random_gamma(d, rng);
  const Matrix w = random_weight(vocab, d, rng, 0.3);
  const Targets targets = {1, 8, 0, 4, 4};
  coda_ce_options opt = default_ce_options();
  opt.reduction = CODA_REDUCTION_SUM;
  auto loss = [&](const Matrix& xx) {
    return g_upstream * cross_entropy(linear(rmsnorm(xx, gamma, eps), w), targets, opt, {}, d).loss[0];
  };
  const Vector rstd = rmsnorm_rstd_rows(x, eps);
  const CrossEntropy ce = cross_entropy(linear(rmsnorm(x, gamma, eps), w), targets, opt, {}, d);
  const Matrix num = numeric_gradient(loss, x);
  const ResidualRmsnormBwd good = linear_residual_rmsnorm_bwd(ce.dlogits, w, x, gamma, rstd, ce.zdz, nullptr, g_upstream);
  expect_grad(num, good.dx, "dx with cross_entropy's zdz and alpha");
  Vector zdz_scaled = ce.zdz;
  for (double& v : zdz_scaled) v *= g_upstream;
  const ResidualRmsnormBwd bad =
      linear_residual_rmsnorm_bwd(ce.dlogits, w, x, gamma, rstd, zdz_scaled, nullptr, g_upstream);
  EXPECT_GT(max_abs_diff(num, bad.dx), 1e-3 * max_abs(num)) << "alpha applied twice to zdz should not match";
  // Same result as cross_entropy with the upstream gradient inside dlogits and alpha = 1.
  const CrossEntropy ce_g = cross_entropy(linear(rmsnorm(x, gamma, eps), w), targets, opt, {g_upstream}, d);
  const ResidualRmsnormBwd same = linear_residual_rmsnorm_bwd(ce_g.dlogits, w, x, gamma, rstd, ce_g.zdz, nullptr, 1.0);
  EXPECT_LE(max_abs_diff(same.dx, good.dx), 1e-13 * max_abs(good.dx));
}

// MLP: out = swiglu(RMSNorm(x) W_gu^T) W_down^T + x; L = <G, out>. linear_swiglu_bwd_zdz (dz, zdz) then
// linear_residual_rmsnorm_bwd with dx_in = G.
TEST(ReferenceGrad, MlpChainSwigluBwdThenNormBwd) {
  Rng rng(19);
  const int64_t m_rows = 5, d = 12, f_width = 10;
  const double eps = 1e-5;
  const Matrix x = random_residual(m_rows, d, rng);
  const Vector gamma = random_gamma(d, rng);
  const Matrix w_gu = interleave_gate_up(random_weight(2 * f_width, d, rng, 0.3));
  const Matrix w_down = random_weight(d, f_width, rng, 0.3);
  const Matrix g_out = random_activation(m_rows, d, rng);
  auto loss = [&](const Matrix& xx, const Vector& gg, const Matrix& wgu, const Matrix& wd) {
    return dot(g_out, linear(swiglu(linear(rmsnorm(xx, gg, eps), wgu)), wd)) + dot(g_out, xx);
  };
  const RmsnormPrepare prep = rmsnorm_prepare(x, gamma, eps);
  const Swiglu fwd = linear_rowscale_swiglu(prep.h, w_gu, prep.rstd);
  const SwigluBwd down_bwd = linear_swiglu_bwd_zdz(g_out, w_down, fwd.z);
  const ResidualRmsnormBwd norm_bwd =
      linear_residual_rmsnorm_bwd(down_bwd.dz, w_gu, x, gamma, prep.rstd, down_bwd.zdz, &g_out, 1.0);
  expect_grad(numeric_gradient([&](const Matrix& v) { return loss(v, gamma, w_gu, w_down); }, x), norm_bwd.dx, "dx");
  expect_grad(numeric_gradient([&](const Vector& v) { return loss(x, v, w_gu, w_down); }, gamma), norm_bwd.dgamma,
              "dgamma");
  expect_grad(numeric_gradient([&](const Matrix& v) { return loss(x, gamma, v, w_down); }, w_gu),
              wgrad(down_bwd.dz, norm_bwd.a), "dW_gu");
  expect_grad(numeric_gradient([&](const Matrix& v) { return loss(x, gamma, w_gu, v); }, w_down),
              wgrad(g_out, down_bwd.y), "dW_down");
}

// QK-norm: per head, the same as the row RMSNorm of that head's columns.
TEST(ReferenceGrad, QkNormIsRmsnormPerHead) {
  const RopeHeads heads{4, 2, 8};
  Rng rng(22);
  const Matrix z = random_normal(5, heads.width(), 0.0, 0.3, rng);
  const QkNorm norm{random_gamma(8, rng), random_gamma(8, rng), 1e-2};
  const Matrix n = qk_norm(z, norm, heads);
  const Matrix r = qk_head_rstd(z, norm, heads);
  for (int64_t h = 0; h < heads.n_q_heads + 2 * heads.n_kv_heads; ++h) {
    Matrix head(z.rows, heads.head_dim), got(z.rows, heads.head_dim);
    for (int64_t m = 0; m < z.rows; ++m) {
      for (int64_t j = 0; j < heads.head_dim; ++j) {
        head(m, j) = z(m, h * heads.head_dim + j);
        got(m, j) = n(m, h * heads.head_dim + j);
      }
    }
    if (h >= heads.n_q_heads + heads.n_kv_heads) {  // v passes through
      EXPECT_EQ(max_abs_diff(got, head), 0.0) << "v head " << h;
      continue;
    }
    const Vector& g = h < heads.n_q_heads ? norm.q_gamma : norm.k_gamma;
    EXPECT_LE(max_abs_diff(got, rmsnorm(head, g, norm.eps)), 1e-14 * max_abs(got)) << "head " << h;
    const Vector rows = rmsnorm_rstd_rows(head, norm.eps);
    for (int64_t m = 0; m < z.rows; ++m) EXPECT_NEAR(r(m, h), rows[static_cast<size_t>(m)], 1e-14 * rows[0]);
  }
}

// qk_norm_rope_bwd_zdz: f = <dqkv, rope(qk_norm(z))>; dz, both gammas' gradients, the zdz identity
// (1/d) <z, dz> = (1/d) (sum_h eps r_h^2 <dqkv_h, qkv_h> + <v, dv>), and nh = R^T(qkv) / gamma = u r where gamma != 0.
TEST(ReferenceGrad, QkNormRopeBwd) {
  for (const RopeHeads heads : {RopeHeads{4, 2, 8}, RopeHeads{4, 1, 8}, RopeHeads{2, 2, 4}}) {
    for (const double eps : {1e-2, 1e-6}) {
      SCOPED_TRACE("heads " + std::to_string(heads.n_q_heads) + "/" + std::to_string(heads.n_kv_heads) + " hd " +
                   std::to_string(heads.head_dim) + " eps " + std::to_string(eps));
      Rng rng(23);
      const int64_t m_rows = 5, hidden = 24;
      const Matrix z = random_normal(m_rows, heads.width(), 0.0, 0.2, rng);  // small: eps matters at 1e-2
      const Matrix dqkv = random_activation(m_rows, heads.width(), rng);
      const QkNorm norm{random_gamma(heads.head_dim, rng), random_gamma(heads.head_dim, rng), eps};
      const Positions pos = {0, 1, 17, 4096, 131071};
      const Vector inv_freq = rope_inv_freq(heads.head_dim, 1000000.0);
      const Matrix qkv = rope(qk_norm(z, norm, heads), pos, inv_freq, heads);
      const QkNormRopeBwd b = qk_norm_rope_bwd(z, qkv, dqkv, norm, pos, inv_freq, heads, hidden);
      auto f = [&](const Matrix& zz, const QkNorm& nn) {
        return dot(dqkv, rope(qk_norm(zz, nn, heads), pos, inv_freq, heads));
      };
      expect_grad(numeric_gradient([&](const Matrix& v) { return f(v, norm); }, z), b.dz, "dz");
      expect_grad(numeric_gradient([&](const Vector& v) { return f(z, QkNorm{v, norm.k_gamma, eps}); }, norm.q_gamma),
                  b.dq_gamma, "dq_gamma");
      expect_grad(numeric_gradient([&](const Vector& v) { return f(z, QkNorm{norm.q_gamma, v, eps}); }, norm.k_gamma),
                  b.dk_gamma, "dk_gamma");
      expect_grad(row_dot(z, b.dz, 1.0 / hidden), b.zdz, "zdz == (1/d) <z, dz>", 1e-13);
      // The pre-norm u is recoverable from the output where gamma has no zero: nh = (R^T qkv) / gamma.
      const Matrix unrotated = rope_bwd_zdz(qkv, qkv, pos, inv_freq, heads, hidden).dz;
      const Matrix r = qk_head_rstd(z, norm, heads);
      double err = 0.0;
      for (int64_t m = 0; m < m_rows; ++m) {
        for (int64_t c = 0; c < heads.rotated_width(); ++c) {
          const int64_t h = c / heads.head_dim, j = c % heads.head_dim;
          const double g = (h < heads.n_q_heads ? norm.q_gamma : norm.k_gamma)[static_cast<size_t>(j)];
          err = std::max(err, std::abs(unrotated(m, c) / g - z(m, c) * r(m, h)));
        }
      }
      EXPECT_LE(err, 1e-13) << "nh from the rotated output";
    }
  }
}

// q/k/v input: qkv = rope(RMSNorm(x) W_qkv^T), or with QK-norm (Qwen3) rope(qk_norm(RMSNorm(x) W_qkv^T));
// L = <G, qkv> + <dx_in, x>. rope_bwd_zdz (dz, zdz), or qk_norm_rope_bwd_zdz (zdz from the head dots), then
// linear_residual_rmsnorm_bwd: the input norm's zdz rewrite holds with the per-head norm in between.
TEST(ReferenceGrad, QkvChainRopeBwdThenNormBwd) {
  for (const bool with_qk_norm : {false, true}) {
    SCOPED_TRACE(with_qk_norm ? "with QK-norm" : "without QK-norm");
    Rng rng(20);
    const RopeHeads heads{4, 2, 8};
    const int64_t m_rows = 5, d = 16;
    const double eps = 1e-5;
    const Matrix x = random_residual(m_rows, d, rng);
    const Vector gamma = random_gamma(d, rng);
    const Matrix w_qkv = random_weight(heads.width(), d, rng, 0.3);
    const Matrix g_out = random_activation(m_rows, heads.width(), rng);
    const Matrix dx_in = random_activation(m_rows, d, rng);
    const QkNorm norm{random_gamma(heads.head_dim, rng), random_gamma(heads.head_dim, rng), 1e-3};
    const Positions pos = {3, 4, 5, 150000, 0};
    const Vector inv_freq = rope_inv_freq(heads.head_dim, 500000.0);
    auto loss = [&](const Matrix& xx, const Vector& gg, const Matrix& ww, const QkNorm& nn) {
      const Matrix z = linear(rmsnorm(xx, gg, eps), ww);
      return dot(g_out, rope(with_qk_norm ? qk_norm(z, nn, heads) : z, pos, inv_freq, heads)) + dot(dx_in, xx);
    };
    const RmsnormPrepare prep = rmsnorm_prepare(x, gamma, eps);
    Matrix dz;
    Vector zdz;
    if (with_qk_norm) {
      const Matrix z = linear_rowscale(prep.h, w_qkv, prep.rstd);
      const Matrix qkv = linear_rowscale_qk_norm_rope(prep.h, w_qkv, prep.rstd, norm, pos, inv_freq, heads);
      const QkNormRopeBwd qkv_bwd = qk_norm_rope_bwd(z, qkv, g_out, norm, pos, inv_freq, heads, d);
      auto with_q_gamma = [&](const Vector& v) { return loss(x, gamma, w_qkv, QkNorm{v, norm.k_gamma, 1e-3}); };
      auto with_k_gamma = [&](const Vector& v) { return loss(x, gamma, w_qkv, QkNorm{norm.q_gamma, v, 1e-3}); };
      expect_grad(numeric_gradient(with_q_gamma, norm.q_gamma), qkv_bwd.dq_gamma, "dq_gamma");
      expect_grad(numeric_gradient(with_k_gamma, norm.k_gamma), qkv_bwd.dk_gamma, "dk_gamma");
      dz = qkv_bwd.dz, zdz = qkv_bwd.zdz;
    } else {
      const Matrix qkv = linear_rowscale_rope(prep.h, w_qkv, prep.rstd, pos, inv_freq, heads);
      const RopeBwd qkv_bwd = rope_bwd_zdz(qkv, g_out, pos, inv_freq, heads, d);
      dz = qkv_bwd.dz, zdz = qkv_bwd.zdz;
    }
    const ResidualRmsnormBwd norm_bwd = linear_residual_rmsnorm_bwd(dz, w_qkv, x, gamma, prep.rstd, zdz, &dx_in, 1.0);
    expect_grad(numeric_gradient([&](const Matrix& v) { return loss(v, gamma, w_qkv, norm); }, x), norm_bwd.dx, "dx");
    expect_grad(numeric_gradient([&](const Vector& v) { return loss(x, v, w_qkv, norm); }, gamma), norm_bwd.dgamma,
                "dgamma");
    expect_grad(numeric_gradient([&](const Matrix& v) { return loss(x, gamma, v, norm); }, w_qkv),
                wgrad(dz, norm_bwd.a), "dW_qkv");
  }
}

// Linear-layer gradients: dgrad and wgrad are the derivatives of <G, a w^T>; gemm's alpha and accumulate.
TEST(ReferenceGrad, LinearDgradWgradGemm) {
  Rng rng(21);
  const Matrix a = random_activation(4, 6, rng);
  const Matrix w = random_weight(5, 6, rng, 0.5);
  const Matrix g = random_activation(4, 5, rng);
  expect_grad(numeric_gradient([&](const Matrix& v) { return dot(g, linear(v, w)); }, a), dgrad(g, w), "dgrad");
  expect_grad(numeric_gradient([&](const Matrix& v) { return dot(g, linear(a, v)); }, w), wgrad(g, a), "wgrad");
  Matrix d = random_activation(4, 5, rng);
  const Matrix d0 = d;
  gemm(a, w, -0.5, true, d);
  const Matrix y = linear(a, w);
  for (size_t i = 0; i < d.data.size(); ++i) EXPECT_NEAR(d.data[i], d0.data[i] - 0.5 * y.data[i], 1e-14);
  // wgrad through gemm with transposed operands, as coda_gemm takes dz^T: dW = dz^T a = gemm(dz^T, a^T).
  Matrix dw;
  gemm(transpose(g), transpose(a), 1.0, false, dw);
  EXPECT_LE(max_abs_diff(dw, wgrad(g, a)), 1e-15);
}

}  // namespace
