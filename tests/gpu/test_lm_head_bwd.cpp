// GPU tests of coda_linear_cross_entropy_bwd (the chunked LM head + cross-entropy backward with the final RMSNorm
// backward) against the float64 reference (linear_rowscale -> cross_entropy -> linear_residual_rmsnorm_bwd -> dW
// composed on whole matrices) with the acceptance rule, the unfused same-dtype pipeline giving the bound: dx, dW
// (fp32), dgamma and the loss, for every reduction, label smoothing + z-loss + softcap, ignored rows (all of them too),
// chunk sizes that do and do not divide M, dx_in in place, bf16 and fp16. Outputs poisoned first; two runs
// bit-identical. Every test skips without an sm_90 GPU.
// The op has two internal paths with the same semantics. bf16 with label_smoothing 0 takes the exponential form by
// default: it stores E = s_j exp(c_j - K_m) with the per-row offset K_m = the (capped) target logit; a finishing
// kernel gives lse, the loss, the row scale and zdz in the GEMM's own terms, and rows with lse - K > 40 (a loss above
// ~40), or a z-loss factor 1 + 2 z lse below 2^-10, are recomputed by the rescue kernel. fp16 and label smoothing take
// the logits path (stored logits, then the cross-entropy kernel), and CODA_LCE_LOGITS=1 (LogitsPath below) forces it
// for every case: OptionsLogitsPath, ConfidentRowsLogitsPath and Llama32k run the bf16 rows on it. (Before stop 27
// the logits path was the default and Options / ConfidentRows named its runs; older GPU logs use those names so.)
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_util.hpp"
#include "gpu/kernel_test_util.hpp"
#include "reference/reference.hpp"

namespace {

using namespace coda::ref;
using coda::test::Accepted;
using coda::test::DeviceBuffer;

/// The options a case turns on besides the reduction: label smoothing 0.1, z-loss 1e-4, softcap 30, as named; kZ1:
/// z-loss 1 alone (its factor 1 + 2 z lse is negative for lse < -1/2).
enum Extras { kNoExtras, kLsZCap, kZCap, kCap, kZ, kZ1 };

struct Case {
  int64_t M, V, d, chunk;
  coda_reduction reduction;
  double ignore_fraction;
  bool with_grad, with_dx_in;
  Extras extras;
  coda_dtype dt;
  std::string name() const {
    char const* red[] = {"none", "mean", "sum"};
    char const* ext[] = {"", " ls+z+cap", " z+cap", " cap", " z", " z=1"};
    return "M=" + std::to_string(M) + " V=" + std::to_string(V) + " d=" + std::to_string(d) + " chunk=" +
           std::to_string(chunk) + " " + red[reduction] + " ignore=" + std::to_string(ignore_fraction) +
           (with_grad ? " grad" : "") + (with_dx_in ? " dx_in in place" : "") + ext[extras] + " " +
           coda::test::dtype_name(dt);
  }
};

/// Logits for the exponential path's rescue (rows with lse - K > 40, K the capped target logit): w ~ N(0, (0.05
/// w_scale)^2), so the logits are ~N(0, (0.83 w_scale)^2) at d = 256 (rstd h has squared norm ~1.08 d), and row m
/// gets a raw target logit of about target_logit[m % 4] (push_target_logits; 0: row left alone). check then counts
/// the non-ignored rows by lse - K in the float64 reference, prints the counts, and stops unless at least min_over40
/// of them are above 40, min_over90 above 90 and min_under40 at or below 40.
struct Spread {
  double w_scale = 1.0;
  std::array<double, 4> target_logit{};
  int64_t min_over40 = 0, min_over90 = 0, min_under40 = 0;
  bool active() const { return w_scale != 1.0 || target_logit != std::array<double, 4>{}; }
  std::string name() const {
    if (!active()) return "";
    std::string s = " w x" + std::to_string(static_cast<int>(w_scale)) + " target logits";
    for (double t : target_logit) s.append(" ").append(std::to_string(static_cast<int>(t)));
    return s;
  }
};

struct Result {
  Matrix dx, dw;
  Vector dgamma, loss;
};

/// Targets pushed far below (or above) their rows: for each row m with logits[m % 4] != 0 whose target t is a real
/// column that no earlier row took, sets w[t] (dtype-rounded) so that the raw logit rstd_m h_m . w[t] is
/// ~logits[m % 4], as make_confident_rows does. Other rows see column t as ~logits[m % 4] / sqrt(1.08 d) in size.
void push_target_logits(Matrix& w, Matrix const& h, Vector const& rstd, Targets const& targets,
                        std::array<double, 4> const& logits, coda_dtype dt) {
  std::vector<bool> taken(static_cast<size_t>(w.rows), false);
  for (int64_t m = 0; m < h.rows; ++m) {
    double const logit = logits[static_cast<size_t>(m % 4)];
    int64_t const t = targets[static_cast<size_t>(m)];
    if (logit == 0 || t < 0 || t >= w.rows || taken[static_cast<size_t>(t)]) continue;
    double const r = rstd[static_cast<size_t>(m)];
    double norm2 = 0;
    for (int64_t j = 0; j < h.cols; ++j) norm2 += (r * h(m, j)) * (r * h(m, j));
    if (norm2 == 0) continue;
    for (int64_t j = 0; j < h.cols; ++j) w(t, j) = round_to(logit * r * h(m, j) / norm2, dt);
    taken[static_cast<size_t>(t)] = true;
  }
}

/// confident_logit > 0: every 4th row gets a dominant target logit of about that size (make_confident_rows).
/// spread: wider logits and targets pushed below their rows (Spread).
void check(Case const& c, uint64_t seed, double confident_logit = 0.0, Spread const& spread = {}) {
  SCOPED_TRACE(c.name() + (confident_logit > 0 ? " confident rows" : "") + spread.name());
  Rng rng(seed);
  coda_dtype const dt = c.dt;
  Matrix const x = round_to(random_residual(c.M, c.d, rng), dt);
  Vector const gamma = round_to(random_gamma(c.d, rng), dt);
  Vector const rstd = round_to(rmsnorm_rstd_rows(x, 1e-5), CODA_FP32);
  Matrix h(c.M, c.d);
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t j = 0; j < c.d; ++j) h(m, j) = x(m, j) * gamma[static_cast<size_t>(j)];
  }
  h = round_to(h, dt);
  Matrix w = round_to(random_weight(c.V, c.d, rng, 0.05 * spread.w_scale), dt);
  Targets const targets = random_targets(c.M, c.V, rng, c.ignore_fraction, -100);
  if (confident_logit > 0) {
    std::vector<int64_t> const rows = coda::test::make_confident_rows(w, h, rstd, targets, 0, 4, confident_logit, dt);
    ASSERT_GE(static_cast<int64_t>(rows.size()), c.M / 8) << "too few confident rows to test";
  }
  push_target_logits(w, h, rstd, targets, spread.target_logit, dt);
  coda_ce_options o = coda_ce_options_default();
  o.reduction = c.reduction;
  if (c.extras == kLsZCap) o.label_smoothing = 0.1f;
  if (c.extras == kLsZCap || c.extras == kZCap || c.extras == kZ) o.z_loss = 1e-4f;
  if (c.extras == kZ1) o.z_loss = 1.0f;
  if (c.extras == kLsZCap || c.extras == kZCap || c.extras == kCap) o.softcap = 30.0f;
  if (spread.active()) {  // the rows the rescue takes (lse - K > 40), counted in the float64 reference
    Lse const l = linear_rowscale_lse(h, w, rstd, targets, o.softcap, o.ignore_index);
    int64_t over40 = 0, over90 = 0, under40 = 0;
    double top = 0, top_gap = 0;
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t j = 0; j < c.V; ++j) top = std::max(top, l.logits(m, j));
      if (targets[static_cast<size_t>(m)] == o.ignore_index) continue;
      double const gap = l.lse[static_cast<size_t>(m)] - l.target_logit[static_cast<size_t>(m)];
      over40 += gap > 40 ? 1 : 0;
      over90 += gap > 90 ? 1 : 0;
      under40 += gap > 40 ? 0 : 1;
      top_gap = std::max(top_gap, gap);
    }
    std::printf("[ INFO     ] LM head bwd %s: rows with lse - K > 40: %lld, > 90: %lld, <= 40: %lld; largest "
                "lse - K %.1f, largest raw logit %.1f\n",
                (c.name() + spread.name()).c_str(), static_cast<long long>(over40), static_cast<long long>(over90),
                static_cast<long long>(under40), top_gap, top);
    ASSERT_GE(over40, spread.min_over40) << "too few rows with lse - K > 40 (rescued) to test";
    ASSERT_GE(over90, spread.min_over90) << "too few rows with lse - K > 90 to test";
    ASSERT_GE(under40, spread.min_under40) << "too few rows with lse - K <= 40 (not rescued) to test";
  }
  Vector grad;
  if (c.with_grad) {
    grad = c.reduction == CODA_REDUCTION_NONE ? Vector(static_cast<size_t>(c.M)) : Vector(1);
    for (auto& g : grad) g = round_to(0.5 + std::uniform_real_distribution<double>(0.0, 1.0)(rng), CODA_FP32);
  }
  Matrix const dx_in = round_to(random_activation(c.M, c.d, rng), dt);

  auto host = [&](bool unfused) {
    Result r;
    Matrix const logits = unfused ? linear_rowscale_unfused(h, w, rstd, dt) : linear_rowscale(h, w, rstd);
    CrossEntropy const ce = unfused ? cross_entropy_unfused(logits, targets, o, grad, c.d, dt)
                                    : cross_entropy(logits, targets, o, grad, c.d);
    Matrix const* din = c.with_dx_in ? &dx_in : nullptr;
    ResidualRmsnormBwd const norm_bwd =
        unfused ? linear_residual_rmsnorm_bwd_unfused(ce.dlogits, w, x, gamma, rstd, din, 1.0, dt)
                : linear_residual_rmsnorm_bwd(ce.dlogits, w, x, gamma, rstd, ce.zdz, din, 1.0);
    r.dx = norm_bwd.dx;
    r.dgamma = norm_bwd.dgamma;
    r.loss = ce.loss;
    if (unfused) {
      r.dw = Matrix(c.V, c.d);
      gemm_unfused(transpose(ce.dlogits), transpose(norm_bwd.a), 1.0, false, r.dw, dt, CODA_FP32);
    } else {
      r.dw = wgrad(ce.dlogits, norm_bwd.a);
    }
    return r;
  };
  Result const ref = host(false), unf = host(true);

  size_t const e = coda_dtype_size(dt);
  DeviceBuffer dh(static_cast<size_t>(c.M * c.d) * e + 16), dw(static_cast<size_t>(c.V * c.d) * e + 16);
  DeviceBuffer dr(static_cast<size_t>(c.M) * 4 + 16), dxb(static_cast<size_t>(c.M * c.d) * e + 16);
  DeviceBuffer dg(static_cast<size_t>(c.d) * e + 16), dt_(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer dgrad(grad.size() * 4 + 16), ddx(static_cast<size_t>(c.M * c.d) * e + 16);
  DeviceBuffer ddw(static_cast<size_t>(c.V * c.d) * 4 + 16), ddg(static_cast<size_t>(c.d) * 4 + 16);
  DeviceBuffer dloss(static_cast<size_t>(c.M) * 4 + 16);
  bool const per_row = c.reduction == CODA_REDUCTION_NONE;
  int64_t const n_loss = per_row ? c.M : 1;
  coda_tensor tloss = per_row ? coda::test::device_tensor(dloss.get(), CODA_FP32, {c.M})
                              : coda::test::scalar_tensor(dloss.get(), CODA_FP32);
  dh.upload(to_bits(h, dt));
  dw.upload(to_bits(w, dt));
  dr.upload(std::vector<float>(rstd.begin(), rstd.end()));
  dxb.upload(to_bits(x, dt));
  dg.upload(to_bits(gamma, dt));
  dt_.upload(std::vector<int32_t>(targets.begin(), targets.end()));
  if (c.with_grad) dgrad.upload(std::vector<float>(grad.begin(), grad.end()));
  coda_tensor th = coda::test::strided_tensor(dh.get(), dt, c.M, c.d, c.d);
  coda_tensor tw = coda::test::strided_tensor(dw.get(), dt, c.V, c.d, c.d);
  coda_tensor tr = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  coda_tensor tx = coda::test::strided_tensor(dxb.get(), dt, c.M, c.d, c.d);
  coda_tensor tg = coda::test::device_tensor(dg.get(), dt, {c.d});
  coda_tensor tt = coda::test::device_tensor(dt_.get(), CODA_INT32, {c.M});
  coda_tensor tgl = c.reduction == CODA_REDUCTION_NONE ? coda::test::device_tensor(dgrad.get(), CODA_FP32, {c.M})
                                                       : coda::test::scalar_tensor(dgrad.get(), CODA_FP32);
  coda_tensor tdx = coda::test::strided_tensor(ddx.get(), dt, c.M, c.d, c.d);
  coda_tensor tdw = coda::test::strided_tensor(ddw.get(), CODA_FP32, c.V, c.d, c.d);
  coda_tensor tdg = coda::test::device_tensor(ddg.get(), CODA_FP32, {c.d});
  size_t const wsb = coda_linear_cross_entropy_bwd_workspace_size(c.M, c.V, c.d, c.chunk);
  DeviceBuffer ws(wsb);
  std::vector<uint16_t> dx_first;
  std::vector<float> dw_first, dg_first, loss_first;
  for (int rep = 0; rep < 2; ++rep) {
    if (c.with_dx_in) {
      ddx.upload(to_bits(dx_in, dt));
    } else {
      ddx.poison();
    }
    ddw.poison();
    ddg.poison();
    dloss.poison();
    ws.poison();
    ASSERT_EQ(coda_linear_cross_entropy_bwd(&th, &tw, &tr, &tx, &tg, &tt, &o, c.with_grad ? &tgl : nullptr, c.chunk,
                                            c.with_dx_in ? &tdx : nullptr, &tdx, &tdw, &tdg, &tloss, ws.get(), wsb,
                                            nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const dxv = ddx.download<uint16_t>(static_cast<size_t>(c.M * c.d));
    std::vector<float> const dwv = ddw.download<float>(static_cast<size_t>(c.V * c.d));
    std::vector<float> const dgv = ddg.download<float>(static_cast<size_t>(c.d));
    std::vector<float> const lv = dloss.download<float>(static_cast<size_t>(n_loss));
    if (rep == 0) {
      dx_first = dxv, dw_first = dwv, dg_first = dgv, loss_first = lv;
    } else {
      EXPECT_EQ(std::memcmp(loss_first.data(), lv.data(), lv.size() * 4), 0) << "two runs differ (loss)";
      EXPECT_TRUE(dx_first == dxv) << "two runs differ (dx)";
      EXPECT_EQ(std::memcmp(dw_first.data(), dwv.data(), dwv.size() * 4), 0) << "two runs differ (dW)";
      EXPECT_EQ(std::memcmp(dg_first.data(), dgv.data(), dgv.size() * 4), 0) << "two runs differ (dgamma)";
    }
  }
  Matrix const dxm = matrix_from_bits(dx_first.data(), c.M, c.d, dt);
  Matrix const dwm = matrix_from_float(dw_first.data(), c.V, c.d);
  Vector const dgm = vector_from_float(dg_first.data(), c.d);
  bool const print = c.M >= 256;
  EXPECT_TRUE(Accepted("LM head bwd " + c.name() + " dx", acceptance(dxm, unf.dx, ref.dx), print));
  EXPECT_TRUE(Accepted("LM head bwd " + c.name() + " dW", acceptance(dwm, unf.dw, ref.dw), print));
  EXPECT_TRUE(Accepted("LM head bwd " + c.name() + " dgamma", acceptance(dgm, unf.dgamma, ref.dgamma), print));
  Vector const lm = vector_from_float(loss_first.data(), n_loss);
  EXPECT_TRUE(Accepted("LM head bwd " + c.name() + " loss", acceptance(lm, unf.loss, ref.loss), print));
}

/// CODA_LCE_LOGITS=1 for the scope: every case takes the logits path (linear_rowscale -> cross_entropy ->
/// linear_residual_rmsnorm_bwd).
class LogitsPath : public coda::test::ScopedEnv {
 public:
  LogitsPath() : ScopedEnv("CODA_LCE_LOGITS", "1") {}
};

// bf16 without label smoothing takes the exponential form, the kLsZCap and fp16 rows the logits path.
// exp_eligible_only: only the cases the exponential form would take (the others reach the logits path anyway).
void check_options(bool exp_eligible_only = false) {
  std::vector<Case> const cases = {
      {300, 1000, 256, 128, CODA_REDUCTION_MEAN, 0.1, false, false, kNoExtras, CODA_BF16},  // 3 chunks, last partial
      {300, 1000, 256, 100, CODA_REDUCTION_MEAN, 0.0, true, true, kLsZCap, CODA_BF16},      // chunks divide M
      {257, 1000, 136, 64, CODA_REDUCTION_SUM, 0.2, true, false, kNoExtras, CODA_BF16},
      {257, 1000, 136, 0, CODA_REDUCTION_NONE, 0.2, true, true, kLsZCap, CODA_BF16},        // default chunk: 1 chunk
      {64, 1000, 136, 16, CODA_REDUCTION_MEAN, 1.0, false, true, kNoExtras, CODA_BF16},     // all rows ignored
      {1, 1000, 136, 0, CODA_REDUCTION_MEAN, 0.0, false, false, kNoExtras, CODA_BF16},
      {300, 1000, 256, 128, CODA_REDUCTION_MEAN, 0.1, true, true, kLsZCap, CODA_FP16},
      // The logits path with V % 8 != 0 (the padded copy of w, dW's 8-row tail): label smoothing, then fp16.
      {257, 1003, 136, 64, CODA_REDUCTION_MEAN, 0.1, true, true, kLsZCap, CODA_BF16},
      {300, 1003, 256, 128, CODA_REDUCTION_NONE, 0.1, true, false, kNoExtras, CODA_FP16},
  };
  uint64_t seed = 700;
  for (Case const& c : cases) {
    uint64_t const case_seed = seed++;  // each case keeps its seed whichever subset runs
    if (exp_eligible_only && (c.dt != CODA_BF16 || c.extras == kLsZCap)) continue;
    check(c, case_seed);
  }
}

// The M = 1 case (seed 705) missed the dW bound in exponential form (0.0216 against 0.0158) before
// ce_exp_target_fix: with one row dW's largest entries are the target column's, and E_t's bf16 rounding is coarser
// than dl_t ~ -1's (bench/python/lce_target_rounding.py); the fix carries E_t's residual into dW.
TEST(LinearCrossEntropyBwd, Options) {
  CODA_REQUIRE_SM90();
  check_options();
}

// Options' cases that take the exponential form by default, on the logits path.
TEST(LinearCrossEntropyBwd, OptionsLogitsPath) {
  CODA_REQUIRE_SM90();
  LogitsPath const logits_path;
  check_options(/*exp_eligible_only=*/true);
}

// bf16 with label_smoothing 0, so all on the exponential path: softcap + z-loss, softcap alone, z-loss alone, for
// every reduction, with and without ignored rows (all of them too), M = 1, chunks that do and do not divide M, dx_in
// on and off, V % 128 != 0 throughout and V % 8 != 0 (1003, 13: the chunks run on the padded copy of w, whose zero
// rows give logits of exactly 0 in the Vp - V pad columns, and those must not enter lse; at V = 13 the 3 pad columns
// sit next to 13 real ones with lse ~2.3-3.1, so counting them would move each loss by ~0.2).
TEST(LinearCrossEntropyBwd, OptionsNoSmoothing) {
  CODA_REQUIRE_SM90();
  std::vector<Case> const cases = {
      {300, 1003, 256, 128, CODA_REDUCTION_MEAN, 0.1, true, true, kZCap, CODA_BF16},     // 3 chunks, last partial
      {300, 1003, 256, 100, CODA_REDUCTION_SUM, 0.0, false, false, kZCap, CODA_BF16},    // chunks divide M
      {257, 1003, 136, 64, CODA_REDUCTION_NONE, 0.2, true, false, kZCap, CODA_BF16},     // last chunk: one row
      {257, 1000, 136, 0, CODA_REDUCTION_NONE, 0.0, true, true, kZCap, CODA_BF16},       // default chunk: 1 chunk
      {300, 1000, 256, 100, CODA_REDUCTION_MEAN, 0.0, true, false, kCap, CODA_BF16},
      {257, 1003, 136, 64, CODA_REDUCTION_SUM, 0.2, false, true, kCap, CODA_BF16},
      {300, 1003, 256, 128, CODA_REDUCTION_SUM, 0.1, true, true, kZ, CODA_BF16},
      {100, 13, 136, 32, CODA_REDUCTION_MEAN, 0.1, true, true, kZCap, CODA_BF16},        // V < 16: Vp = 16
      {64, 1003, 136, 16, CODA_REDUCTION_SUM, 1.0, true, false, kZCap, CODA_BF16},       // all rows ignored
      {64, 1000, 136, 0, CODA_REDUCTION_NONE, 1.0, true, true, kCap, CODA_BF16},         // all rows ignored
      {1, 1003, 136, 0, CODA_REDUCTION_NONE, 0.0, true, true, kZCap, CODA_BF16},
      {1, 1000, 256, 0, CODA_REDUCTION_SUM, 0.0, false, false, kZ, CODA_BF16},
  };
  uint64_t seed = 750;
  for (Case const& c : cases) check(c, seed++);
}

// The llama-like 32k vocabulary on the logits path (ConfidentRows runs the same case on the exponential form).
TEST(LinearCrossEntropyBwd, Llama32k) {
  CODA_REQUIRE_SM90();
  LogitsPath const logits_path;
  check({256, 32000, 512, 96, CODA_REDUCTION_MEAN, 0.05, false, false, kNoExtras, CODA_BF16}, 720);
}

// Rows whose target logit is ~25 (p_t ~ 1): the gradient there is -(1 - p_t) ~ -1e-5, so the row's statistics
// must be those of the logits the gradient is computed from. A version whose lse came from the unrounded fp32
// logits while p came from the stored bf16 ones (c2a2cf7 reverted it; a float64 simulation put its target gradient
// off by up to ~3e-2) fails the first case on the H200: dW error 2.18e-4 against a bound of 1.95e-4, dgamma 1.09e-4
// against 5.76e-5 (bench/results/lm_head_one_read_h200/run2_negative_control.log).
TEST(LinearCrossEntropyBwd, ConfidentRowsLogitsPath) {
  CODA_REQUIRE_SM90();
  LogitsPath const logits_path;
  check({300, 1000, 256, 128, CODA_REDUCTION_MEAN, 0.05, false, false, kNoExtras, CODA_BF16}, 740, 25.0);
  check({300, 1000, 256, 100, CODA_REDUCTION_NONE, 0.0, true, true, kLsZCap, CODA_BF16}, 741, 25.0);  // softcap 30
  check({300, 1000, 256, 128, CODA_REDUCTION_SUM, 0.05, true, false, kNoExtras, CODA_FP16}, 742, 12.0);
  check({256, 32000, 512, 96, CODA_REDUCTION_MEAN, 0.05, false, false, kNoExtras, CODA_BF16}, 743, 25.0);
}

// The same confident rows in exponential form: p_t - 1 there comes from the GEMM's own e_t and row sum (the finish
// works in the GEMM's terms; a recomputed target logit would leave ~1e-5 of e_t in it, the whole gradient). Also the
// llama-like 32k vocabulary.
TEST(LinearCrossEntropyBwd, ConfidentRows) {
  CODA_REQUIRE_SM90();
  check({300, 1000, 256, 128, CODA_REDUCTION_MEAN, 0.05, false, false, kNoExtras, CODA_BF16}, 740, 25.0);
  check({256, 32000, 512, 96, CODA_REDUCTION_MEAN, 0.05, false, false, kNoExtras, CODA_BF16}, 743, 25.0);
  check({256, 32000, 512, 96, CODA_REDUCTION_MEAN, 0.05, false, false, kNoExtras, CODA_BF16}, 720);
}

// The exponential path's rescue: rows whose loss lse - K exceeds 40 (K the capped target logit) are recomputed, and
// above ~88.7 exp(c - K) overflows even fp32, so E is inf there. All bf16, label_smoothing 0. check counts the rows
// in the float64 reference, prints the counts and stops below the minima given; the counts quoted here are those
// of these seeds (libstdc++'s normal_distribution), the minima ~2/3 of them.
//  1. Logits of the usual scale (~N(0, 0.83^2)), targets pushed down: raw target logit ~-95 on rows 0 mod 4, ~-50 on
//     rows 1 mod 4, ~-20 on rows 2 mod 4. The pushed w rows add ~N(0, (95/16.6)^2)-sized logits to the other rows'
//     columns, so lse is 10.8-27.7 and the -20 rows straddle 40. Of 287 non-ignored rows: 140 above 40, 64 above 90
//     (102-120), 147 at or below 40 (16 within 3 of it; the rows whose target column an earlier row took keep a
//     small loss). The bulk of each row stays small, so the unfused bound stays tight (dx 4.7e-3, dW 5.7e-4).
//  2. Wide logits: w x30, so raw logits ~N(0, 25^2), lse ~60-118; every 4th row confident at 150 (p_t ~ 1: K
//     at the row's top, the other columns' E underflow), z-loss (lse up to 150: z lse^2 ~2). Of 262 non-ignored
//     rows: 191 above 40, 67 above 90 (up to 133), 71 at or below 40 (64 confident). The unfused pipeline rounds
//     logits ~100 to bf16 (spacing 0.5), so its bound is loose (dx 0.43 against |dx| <= 3.8): a blow-up or NaN
//     check more than a precision one.
//  3. Wide logits under softcap 30: the capped logits lie in (-30, 30), so lse - K <= 2 * 30 + ln V < 67 and no row
//     reaches 90; which rows pass 40 depends on the data (lse 31.6-32.9 here, as many columns sit near the cap):
//     of 289 rows 112 above 40 (up to 61.8), 177 at or below (28 within 3 of 40).
//  4. Wide logits, all rows ignored: lse 63-102 and no target logit to offset by (an offset of 0 would give E = inf;
//     +inf gives E = 0); the outputs must be exactly dx_in, 0, 0, 0 (bound 1e-6).
//  5. M = 1: the one row at 102.2 (the chunk is that row alone).
//  6. Nearly every row rescued, in one chunk: targets at ~-95 and ~-60 on alternate rows, d = 136. Of 237 non-ignored
//     rows 219 above 40 (more than the rescue's blocks, one per SM: 132 on an H200), 114 above 90, 18 at or below 40
//     (targets taken by an earlier row).
//  7. V = 32000 (125+ N-tiles per row; the rescue's three passes over w): targets at ~-95 on rows 0 mod 4 and ~-50 on
//     rows 2 mod 4. Of 60 non-ignored rows 29 above 40 (lse 10.7-20.4), 15 above 90, 31 at or below 40.
TEST(LinearCrossEntropyBwd, HugeLossRows) {
  CODA_REQUIRE_SM90();
  check({300, 1003, 256, 128, CODA_REDUCTION_MEAN, 0.05, true, true, kNoExtras, CODA_BF16}, 770, 0.0,
        {1.0, {-95.0, -50.0, -20.0, 0.0}, 100, 40, 100});
  check({300, 1000, 256, 100, CODA_REDUCTION_NONE, 0.1, true, false, kZ, CODA_BF16}, 771, 150.0,
        {30.0, {}, 130, 45, 50});
  check({300, 1003, 256, 128, CODA_REDUCTION_SUM, 0.05, true, true, kCap, CODA_BF16}, 772, 0.0,
        {30.0, {}, 75, 0, 120});
  check({64, 1000, 256, 16, CODA_REDUCTION_MEAN, 1.0, true, true, kNoExtras, CODA_BF16}, 773, 0.0, {30.0, {}, 0, 0, 0});
  check({1, 1003, 256, 0, CODA_REDUCTION_MEAN, 0.0, true, true, kNoExtras, CODA_BF16}, 774, 0.0,
        {1.0, {-95.0, 0.0, 0.0, 0.0}, 1, 1, 0});
  check({257, 1003, 136, 0, CODA_REDUCTION_SUM, 0.1, false, true, kNoExtras, CODA_BF16}, 775, 0.0,
        {1.0, {-95.0, -60.0, -95.0, -60.0}, 150, 75, 0});
  check({64, 32000, 256, 0, CODA_REDUCTION_MEAN, 0.05, true, true, kZ, CODA_BF16}, 777, 0.0,
        {1.0, {-95.0, 0.0, -50.0, 0.0}, 20, 10, 20});
}

// The rescue's other trigger: with z-loss the gradient is g s_j (a p_j - [j = t]), a = 1 + 2 z lse, and the
// exponential path divides by a, so rows with a below 2^-10 are recomputed too. V = 1 makes lse the one logit,
// ~N(0, 0.83^2), and z-loss 1 puts a below 2^-10 for lse < -0.4995: 78 of the 283 non-ignored rows of this seed
// (7 with |a| < 0.05, next to the switch).
TEST(LinearCrossEntropyBwd, NegativeZLossFactor) {
  CODA_REQUIRE_SM90();
  check({300, 1, 256, 128, CODA_REDUCTION_MEAN, 0.05, true, true, kZ1, CODA_BF16}, 776);
}

TEST(LinearCrossEntropyBwdSanitize, Small) {
  CODA_REQUIRE_SM90();
  check({100, 264, 136, 32, CODA_REDUCTION_MEAN, 0.1, true, true, kLsZCap, CODA_BF16}, 730);  // logits path
  check({100, 261, 136, 32, CODA_REDUCTION_MEAN, 0.1, true, true, kZCap, CODA_BF16}, 731);    // exponential path
  // Exponential path with rescued rows (targets pushed to -95 and -50 on rows 0 and 1 mod 4) beside others.
  check({64, 264, 136, 32, CODA_REDUCTION_SUM, 0.1, true, false, kNoExtras, CODA_BF16}, 732, 0.0,
        {1.0, {-95.0, -50.0, 0.0, 0.0}, 8, 4, 8});
}

}  // namespace
