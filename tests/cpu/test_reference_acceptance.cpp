// The acceptance rule helper and the unfused same-dtype pipeline it compares against:
//   - acceptance(): passes at 2x the unfused error (+1e-6), fails at 3x, fails on NaN/inf anywhere;
//   - the unfused pipeline in fp32 computes the same math as the float64 reference (so it is the right baseline);
//   - in bf16/fp16 its error is of the dtype's rounding scale, and a perfectly rounded result (what an ideal
//     fused kernel stores) passes the rule for every output of every op, while typical bugs fail it.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/reference.hpp"

namespace {

using namespace coda::ref;

const char* dtype_name(coda_dtype dt) { return dt == CODA_BF16 ? "bf16" : dt == CODA_FP16 ? "fp16" : "fp32"; }

TEST(ReferenceAcceptance, RuleAndNaN) {
  Rng rng(51);
  const Matrix ref = random_activation(8, 8, rng);
  auto with_error = [&](double e) {  // ref plus an error of max magnitude e (at one element), smaller elsewhere
    Matrix m = ref;
    for (size_t i = 0; i < m.data.size(); ++i) m.data[i] += 0.5 * e * ((i % 2) ? 1 : -1);
    m.data[5] += 0.5 * e;  // this element is off by exactly e
    return m;
  };
  const Matrix unfused = with_error(1e-3);
  EXPECT_NEAR(max_abs_diff(unfused, ref), 1e-3, 1e-15);

  const Acceptance same = acceptance(with_error(1e-3), unfused, ref);
  EXPECT_TRUE(same.pass) << same.message();
  EXPECT_NEAR(same.coda_error, 1e-3, 1e-15);
  EXPECT_NEAR(same.unfused_error, 1e-3, 1e-15);
  EXPECT_NEAR(same.bound, 2e-3 + 1e-6, 1e-15);
  EXPECT_NE(same.message().find("PASS"), std::string::npos);
  EXPECT_TRUE(acceptance(with_error(2e-3), unfused, ref).pass);
  const Acceptance three = acceptance(with_error(3e-3), unfused, ref);
  EXPECT_FALSE(three.pass) << three.message();
  EXPECT_NE(three.message().find("FAIL"), std::string::npos);
  EXPECT_FALSE(acceptance(with_error(2.01e-3), unfused, ref).pass);

  // One NaN anywhere fails, even where everything else is exact; NaN in the baseline or reference fails too.
  Matrix nan_coda = ref;
  nan_coda.data[17] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(acceptance(nan_coda, unfused, ref).pass);
  EXPECT_TRUE(std::isnan(acceptance(nan_coda, unfused, ref).coda_error));
  EXPECT_FALSE(acceptance(ref, nan_coda, ref).pass);
  EXPECT_FALSE(acceptance(nan_coda, nan_coda, nan_coda).pass);
  Matrix inf_coda = ref;
  inf_coda.data[3] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(acceptance(inf_coda, unfused, ref).pass);
  EXPECT_FALSE(acceptance(inf_coda, inf_coda, ref).pass);  // an overflowed baseline does not make the bound infinite

  // An exact baseline leaves the 1e-6 floor.
  EXPECT_TRUE(acceptance(with_error(9e-7), ref, ref).pass);
  EXPECT_FALSE(acceptance(with_error(2e-6), ref, ref).pass);

  // Vector and scalar forms; shapes must agree.
  EXPECT_TRUE(acceptance(Vector{1.0, 2.0}, Vector{1.0, 2.1}, Vector{1.0, 2.05}).pass);
  EXPECT_FALSE(acceptance(Vector{1.0, NAN}, Vector{1.0, 2.1}, Vector{1.0, 2.05}).pass);
  EXPECT_TRUE(acceptance(3.0001, 3.001, 3.0).pass);
  EXPECT_FALSE(acceptance(3.003, 3.001, 3.0).pass);
  EXPECT_FALSE(acceptance(NAN, 3.001, 3.0).pass);
  EXPECT_THROW(acceptance(Matrix(2, 3), Matrix(2, 3), Matrix(3, 2)), std::invalid_argument);
}

// ---- every op, reference vs unfused ------------------------------------------------------------------------------

struct Output {
  std::string name;
  Matrix ref;
  Matrix unfused;
  coda_dtype store;  // dtype a CODA kernel stores this output in: the activation dtype, or fp32 for statistics
};

Matrix as_row(const Vector& v) { return Matrix(1, static_cast<int64_t>(v.size()), v); }

// Runs every op on one set of random inputs (already rounded to dt, as device data is) in float64 and unfused.
std::vector<Output> all_outputs(coda_dtype dt, uint64_t seed, RopeAngles angles = RopeAngles::kFloat32) {
  Rng rng(seed);
  const int64_t m_rows = 33, k = 64, d = 96, f_width = 80, vocab = 200;
  const double eps = 1e-5;
  const RopeHeads heads{4, 2, 16};
  auto act = [&](int64_t r, int64_t c) { return round_to(random_activation(r, c, rng), dt); };
  auto weight = [&](int64_t r, int64_t c, double s = 0.02) { return round_to(random_weight(r, c, rng, s), dt); };
  std::vector<Output> out;
  auto add = [&](const std::string& name, const Matrix& r, const Matrix& u, coda_dtype store) {
    out.push_back(Output{name, r, u, store});
  };
  auto add_v = [&](const std::string& name, const Vector& r, const Vector& u, coda_dtype store) {
    out.push_back(Output{name, as_row(r), as_row(u), store});
  };

  // GEMMs.
  const Matrix a = act(m_rows, k);
  const Matrix w_o = weight(d, k);
  add("linear", linear(a, w_o), linear_unfused(a, w_o, dt), dt);
  const Matrix g = act(m_rows, d);
  add("dgrad", dgrad(g, w_o), dgrad_unfused(g, w_o, dt), dt);
  add("wgrad", wgrad(g, a), wgrad_unfused(g, a, dt), dt);
  Matrix acc_ref = random_normal(d, k, 0, 1, rng), acc_unf = acc_ref;
  gemm(transpose(g), transpose(a), 0.5, true, acc_ref);
  gemm_unfused(transpose(g), transpose(a), 0.5, true, acc_unf, dt, CODA_FP32);
  add("gemm accumulate fp32", acc_ref, acc_unf, CODA_FP32);

  // linear_residual_rmsnorm and rmsnorm_prepare.
  const Matrix residual = round_to(random_residual(m_rows, d, rng), dt);
  const Vector gamma = round_to(random_gamma(d, rng), dt);
  const ResidualRmsnorm out_proj = linear_residual_rmsnorm(a, w_o, residual, gamma, eps);
  const ResidualRmsnorm out_proj_u = linear_residual_rmsnorm_unfused(a, w_o, residual, gamma, eps, dt);
  add("linear_residual_rmsnorm x", out_proj.x, out_proj_u.x, dt);
  add("linear_residual_rmsnorm h", out_proj.h, out_proj_u.h, dt);
  add_v("linear_residual_rmsnorm rstd", out_proj.rstd, out_proj_u.rstd, CODA_FP32);
  const RmsnormPrepare prep = rmsnorm_prepare(residual, gamma, eps);
  const RmsnormPrepare prepu = rmsnorm_prepare_unfused(residual, gamma, eps, dt);
  add("prepare h", prep.h, prepu.h, dt);
  add_v("prepare rstd", prep.rstd, prepu.rstd, CODA_FP32);

  // linear_rowscale and its fused variants (swiglu, rope, qk_norm_rope, lse) on stored h (dtype) and rstd (fp32).
  const Matrix h = round_to(out_proj.h, dt);
  const Vector rstd = round_to(out_proj.rstd, CODA_FP32);
  const Matrix w2 = weight(f_width, d);
  add("linear_rowscale y", linear_rowscale(h, w2, rstd), linear_rowscale_unfused(h, w2, rstd, dt), dt);
  const Matrix w_gu = weight(2 * f_width, d);
  const Swiglu gate_up = linear_rowscale_swiglu(h, w_gu, rstd);
  const Swiglu gate_up_u = linear_rowscale_swiglu_unfused(h, w_gu, rstd, dt);
  add("linear_rowscale_swiglu z", gate_up.z, gate_up_u.z, dt);
  add("linear_rowscale_swiglu y", gate_up.y, gate_up_u.y, dt);
  const Matrix w_qkv = weight(heads.width(), d);
  const Positions pos = random_positions(m_rows, 300000, rng);
  const Vector inv_freq = rope_inv_freq(heads.head_dim);
  add("linear_rowscale_rope qkv", linear_rowscale_rope(h, w_qkv, rstd, pos, inv_freq, heads),
      linear_rowscale_rope_unfused(h, w_qkv, rstd, pos, inv_freq, heads, dt, angles), dt);
  const QkNorm qk_norm_args{round_to(random_gamma(heads.head_dim, rng), dt),
                            round_to(random_gamma(heads.head_dim, rng), dt), 1e-6};
  add("linear_rowscale_qk_norm_rope qkv",
      linear_rowscale_qk_norm_rope(h, w_qkv, rstd, qk_norm_args, pos, inv_freq, heads),
      linear_rowscale_qk_norm_rope_unfused(h, w_qkv, rstd, qk_norm_args, pos, inv_freq, heads, dt, angles), dt);
  const Matrix w_v = weight(vocab, d, 0.1);
  const Targets targets = random_targets(m_rows, vocab, rng, 0.2);
  for (const double cap : {0.0, 5.0}) {
    const std::string tag = cap > 0 ? " softcap" : "";
    const Lse lm_head = linear_rowscale_lse(h, w_v, rstd, targets, cap, -100);
    const Lse lm_head_u = linear_rowscale_lse_unfused(h, w_v, rstd, targets, cap, -100, dt);
    add("linear_rowscale_lse logits" + tag, lm_head.logits, lm_head_u.logits, dt);
    add_v("linear_rowscale_lse lse" + tag, lm_head.lse, lm_head_u.lse, CODA_FP32);
    add_v("linear_rowscale_lse target_logit" + tag, lm_head.target_logit, lm_head_u.target_logit, CODA_FP32);
  }

  // cross_entropy on stored logits, several option sets.
  const Matrix logits = round_to(random_normal(m_rows, vocab, 0.0, 3.0, rng), dt);
  struct CeVariant {
    const char* name;
    coda_reduction reduction;
    float ls, zl, cap;
    bool per_row;
  };
  const CeVariant variants[] = {{"mean", CODA_REDUCTION_MEAN, 0, 0, 0, false},
                                {"sum ls zloss", CODA_REDUCTION_SUM, 0.1f, 1e-3f, 0, false},
                                {"none per-row softcap", CODA_REDUCTION_NONE, 0.05f, 1e-4f, 10.0f, true}};
  const Vector per_row_grad = random_normal(1, m_rows, 0.0, 1.0, rng).data;
  for (const CeVariant& v : variants) {
    coda_ce_options opt = default_ce_options();
    opt.reduction = v.reduction;
    opt.label_smoothing = v.ls;
    opt.z_loss = v.zl;
    opt.softcap = v.cap;
    const Vector gl = v.per_row ? per_row_grad : Vector{0.5};
    const CrossEntropy ce = cross_entropy(logits, targets, opt, gl, d);
    const CrossEntropy ceu = cross_entropy_unfused(logits, targets, opt, gl, d, dt);
    add_v(std::string("cross_entropy loss ") + v.name, ce.loss, ceu.loss, CODA_FP32);
    add(std::string("cross_entropy dlogits ") + v.name, ce.dlogits, ceu.dlogits, dt);
    add_v(std::string("cross_entropy zdz ") + v.name, ce.zdz, ceu.zdz, CODA_FP32);
  }

  // rope_bwd_zdz on stored qkv and dqkv.
  const Matrix qkv = act(m_rows, heads.width());
  const Matrix dqkv = act(m_rows, heads.width());
  const RopeBwd qkv_bwd = rope_bwd_zdz(qkv, dqkv, pos, inv_freq, heads, d);
  const RopeBwd qkv_bwd_u = rope_bwd_zdz_unfused(qkv, dqkv, pos, inv_freq, heads, d, dt, angles);
  add("rope_bwd_zdz dz", qkv_bwd.dz, qkv_bwd_u.dz, dt);
  add_v("rope_bwd_zdz zdz", qkv_bwd.zdz, qkv_bwd_u.zdz, CODA_FP32);

  // qk_norm_rope_bwd_zdz on a stored pre-norm z and dqkv.
  const Matrix zq = act(m_rows, heads.width());
  const Matrix qkv_n = rope(qk_norm(zq, qk_norm_args, heads), pos, inv_freq, heads);
  const QkNormRopeBwd bq = qk_norm_rope_bwd(zq, qkv_n, dqkv, qk_norm_args, pos, inv_freq, heads, d);
  const QkNormRopeBwd bqu = qk_norm_rope_bwd_unfused(zq, dqkv, qk_norm_args, pos, inv_freq, heads, d, dt, angles);
  add("qk_norm_rope_bwd_zdz dz", bq.dz, bqu.dz, dt);
  add_v("qk_norm_rope_bwd_zdz zdz", bq.zdz, bqu.zdz, CODA_FP32);
  add_v("qk_norm_rope_bwd_zdz dq_gamma", bq.dq_gamma, bqu.dq_gamma, CODA_FP32);
  add_v("qk_norm_rope_bwd_zdz dk_gamma", bq.dk_gamma, bqu.dk_gamma, CODA_FP32);

  // linear_residual_rmsnorm_bwd on stored dz, x, gamma, fp32 rstd and zdz (zdz = (1/d) <dz, z>, scaled by alpha
  // inside the op), with dx_in and alpha.
  const double alpha = 0.5;
  const Matrix dz = act(m_rows, f_width);
  const Matrix x = round_to(out_proj.x, dt);
  const Vector rstd_x = round_to(rmsnorm_rstd_rows(x, eps), CODA_FP32);
  Matrix a_exact = scale_rows(x, rstd_x);
  for (int64_t i = 0; i < a_exact.rows; ++i)
    for (int64_t j = 0; j < a_exact.cols; ++j) a_exact(i, j) *= gamma[static_cast<size_t>(j)];
  const Vector zdz_in = round_to(row_dot(dz, linear(a_exact, w2), 1.0 / static_cast<double>(d)), CODA_FP32);
  const Matrix dx_in = act(m_rows, d);
  const ResidualRmsnormBwd norm_bwd = linear_residual_rmsnorm_bwd(dz, w2, x, gamma, rstd_x, zdz_in, &dx_in, alpha);
  const ResidualRmsnormBwd norm_bwd_u =
      linear_residual_rmsnorm_bwd_unfused(dz, w2, x, gamma, rstd_x, &dx_in, alpha, dt);
  add("linear_residual_rmsnorm_bwd dx", norm_bwd.dx, norm_bwd_u.dx, dt);
  add("linear_residual_rmsnorm_bwd a", norm_bwd.a, norm_bwd_u.a, dt);
  add_v("linear_residual_rmsnorm_bwd dgamma", norm_bwd.dgamma, norm_bwd_u.dgamma, CODA_FP32);

  // linear_swiglu_bwd_zdz on stored dx, w_down, z.
  const Matrix w_down = weight(d, f_width);
  const Matrix z = round_to(gate_up.z, dt);
  const Matrix dx = act(m_rows, d);
  const SwigluBwd down_bwd = linear_swiglu_bwd_zdz(dx, w_down, z);
  const SwigluBwd down_bwd_u = linear_swiglu_bwd_zdz_unfused(dx, w_down, z, dt);
  add("linear_swiglu_bwd_zdz dz", down_bwd.dz, down_bwd_u.dz, dt);
  add("linear_swiglu_bwd_zdz y", down_bwd.y, down_bwd_u.y, dt);
  add_v("linear_swiglu_bwd_zdz zdz", down_bwd.zdz, down_bwd_u.zdz, CODA_FP32);
  return out;
}

// In fp32 the unfused pipeline is the reference's math up to float rounding: it implements the same equations.
// (RoPE angles exact here: HF's float32 angles at positions up to 3e5 are off by ~1e-2 rad, tested below.)
TEST(ReferenceAcceptance, UnfusedFp32MatchesReference) {
  for (const Output& o : all_outputs(CODA_FP32, 52, RopeAngles::kExact)) {
    const double err = max_abs_diff(o.unfused, o.ref);
    EXPECT_LE(err, 2e-5 * (1 + max_abs(o.ref))) << o.name << ": max err " << err;
  }
}

// In bf16/fp16 the unfused error is nonzero for stored tensors and of the dtype's rounding scale for all outputs.
TEST(ReferenceAcceptance, UnfusedErrorHasDtypeScale) {
  for (const coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    const double unit = dt == CODA_BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // 2 ulp at 1
    for (const Output& o : all_outputs(dt, 53)) {
      const double err = max_abs_diff(o.unfused, o.ref);
      EXPECT_LE(err, 16 * unit * (1 + max_abs(o.ref))) << dtype_name(dt) << " " << o.name << ": max err " << err;
      if (o.store == dt) {
        EXPECT_GT(err, 0.0) << dtype_name(dt) << " " << o.name;
      }
    }
  }
}

// An ideal fused kernel stores round(ref): that passes the rule for every output, so the baseline is not too strict.
TEST(ReferenceAcceptance, PerfectlyRoundedResultPasses) {
  for (const coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    for (const uint64_t seed : {54u, 55u}) {
      for (const Output& o : all_outputs(dt, seed)) {
        const Acceptance r = acceptance(round_to(o.ref, o.store), o.unfused, o.ref);
        EXPECT_TRUE(r.pass) << dtype_name(dt) << " seed " << seed << " " << o.name << ": " << r.message();
      }
    }
  }
}

// RoPE at large positions: beyond ~1e6 HF's float32 angles dominate the unfused error (measured: bf16 at pos 1e6-2e6,
// 64 rows, max err 0.14 with float32 angles vs 0.019 with exact ones; at 1e5-2e5 both are ~0.02, bf16 noise). So
// against the HF baseline a kernel with naive float32 angles passes, against the exact-angle baseline (same dtype
// roundings) it fails, and an accurate kernel passes both.
TEST(ReferenceAcceptance, RopeAngleBaselinesAtLargePositions) {
  for (const coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    SCOPED_TRACE(dtype_name(dt));
    Rng rng(57);
    const RopeHeads heads{2, 1, 64};
    const int64_t m_rows = 64, d = 64;
    const Matrix h = round_to(random_activation(m_rows, d, rng), dt);
    const Vector rstd = round_to(rmsnorm_rstd_rows(h, 1e-5), CODA_FP32);
    const Matrix w = round_to(random_weight(heads.width(), d, rng, 0.1), dt);
    const Vector inv_freq = rope_inv_freq(heads.head_dim, 500000.0);
    Positions pos = random_positions(m_rows, 1000000, rng);
    for (int32_t& p : pos) p += 1000000;  // positions in [1e6, 2e6]
    const Matrix ref = linear_rowscale_rope(h, w, rstd, pos, inv_freq, heads);
    const Matrix hf = linear_rowscale_rope_unfused(h, w, rstd, pos, inv_freq, heads, dt, RopeAngles::kFloat32);
    const Matrix exact = linear_rowscale_rope_unfused(h, w, rstd, pos, inv_freq, heads, dt, RopeAngles::kExact);
    EXPECT_GT(max_abs_diff(hf, ref), 3 * max_abs_diff(exact, ref));
    // A kernel that computes in fp32 with float32 angles and stores once:
    const Matrix naive =
        round_to(linear_rowscale_rope_unfused(h, w, rstd, pos, inv_freq, heads, CODA_FP32, RopeAngles::kFloat32), dt);
    EXPECT_TRUE(acceptance(naive, hf, ref).pass) << acceptance(naive, hf, ref).message();
    EXPECT_FALSE(acceptance(naive, exact, ref).pass) << acceptance(naive, exact, ref).message();
    // An accurate kernel (exact angles, one rounding) passes both.
    const Matrix accurate = round_to(ref, dt);
    EXPECT_TRUE(acceptance(accurate, hf, ref).pass) << acceptance(accurate, hf, ref).message();
    EXPECT_TRUE(acceptance(accurate, exact, ref).pass) << acceptance(accurate, exact, ref).message();
    // Same for rope_bwd_zdz.
    const Matrix dqkv = round_to(random_activation(m_rows, heads.width(), rng), dt);
    const RopeBwd qkv_bwd = rope_bwd_zdz(accurate, dqkv, pos, inv_freq, heads, d);
    const RopeBwd qkv_bwd_exact = rope_bwd_zdz_unfused(accurate, dqkv, pos, inv_freq, heads, d, dt, RopeAngles::kExact);
    const RopeBwd qkv_bwd_naive =
        rope_bwd_zdz_unfused(accurate, dqkv, pos, inv_freq, heads, d, CODA_FP32, RopeAngles::kFloat32);
    EXPECT_FALSE(acceptance(round_to(qkv_bwd_naive.dz, dt), qkv_bwd_exact.dz, qkv_bwd.dz).pass);
    EXPECT_TRUE(acceptance(round_to(qkv_bwd.dz, dt), qkv_bwd_exact.dz, qkv_bwd.dz).pass);
  }
}

// Typical kernel bugs fail the rule (the rule has teeth).
TEST(ReferenceAcceptance, TypicalBugsFail) {
  const coda_dtype dt = CODA_BF16;
  Rng rng(56);
  const int64_t m_rows = 17, d = 64, f_width = 48, vocab = 100;
  const Matrix h = round_to(random_activation(m_rows, d, rng), dt);
  const Vector rstd = round_to(rmsnorm_rstd_rows(h, 1e-5), CODA_FP32);
  auto check_fails = [&](const char* what, const Matrix& bad, const Matrix& unfused, const Matrix& ref) {
    const Acceptance r = acceptance(round_to(bad, dt), unfused, ref);
    EXPECT_FALSE(r.pass) << what << ": " << r.message();
  };
  // linear_rowscale_swiglu with gate and up swapped.
  const Matrix w_gu = round_to(random_weight(2 * f_width, d, rng), dt);
  const Swiglu gate_up = linear_rowscale_swiglu(h, w_gu, rstd);
  Matrix swapped = gate_up.z;
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t i = 0; i < f_width; ++i) std::swap(swapped(m, 2 * i), swapped(m, 2 * i + 1));
  check_fails("linear_rowscale_swiglu gate/up swapped", swiglu(swapped),
              linear_rowscale_swiglu_unfused(h, w_gu, rstd, dt).y, gate_up.y);
  // linear_rowscale_rope rotating rotate-half pairs on the paired layout.
  const RopeHeads heads{2, 1, 16};
  const Matrix w_qkv = round_to(random_weight(heads.width(), d, rng), dt);
  const Positions pos = random_positions(m_rows, 1000, rng);
  const Vector inv_freq = rope_inv_freq(16);
  const Matrix z = linear_rowscale(h, w_qkv, rstd);
  check_fails("linear_rowscale_rope wrong pairs", rope_rotate_half(z, pos, inv_freq, heads),
              linear_rowscale_rope_unfused(h, w_qkv, rstd, pos, inv_freq, heads, dt),
              rope(z, pos, inv_freq, heads));
  // QK-norm with the gammas in HF's (rotate-half) order on the paired layout.
  const int64_t hd = heads.head_dim;
  const QkNorm qk{round_to(random_gamma(hd, rng), dt), round_to(random_gamma(hd, rng), dt), 1e-6};
  QkNorm unpaired = qk;
  for (Vector* g : {&unpaired.q_gamma, &unpaired.k_gamma}) {
    const Vector paired = *g;
    for (int64_t i = 0; i < hd / 2; ++i) {
      (*g)[static_cast<size_t>(i)] = paired[static_cast<size_t>(2 * i)];
      (*g)[static_cast<size_t>(i + hd / 2)] = paired[static_cast<size_t>(2 * i + 1)];
    }
  }
  check_fails("QK-norm gammas unpaired", linear_rowscale_qk_norm_rope(h, w_qkv, rstd, unpaired, pos, inv_freq, heads),
              linear_rowscale_qk_norm_rope_unfused(h, w_qkv, rstd, qk, pos, inv_freq, heads, dt),
              linear_rowscale_qk_norm_rope(h, w_qkv, rstd, qk, pos, inv_freq, heads));
  // linear_rowscale without the row scale.
  check_fails("linear_rowscale rstd dropped", linear(h, w_qkv), linear_rowscale_unfused(h, w_qkv, rstd, dt),
              linear_rowscale(h, w_qkv, rstd));
  // linear_residual_rmsnorm_bwd without the zdz term.
  const Matrix x = round_to(random_residual(m_rows, d, rng), dt);
  const Vector gamma = round_to(random_gamma(d, rng), dt);
  const Vector rstd_x = round_to(rmsnorm_rstd_rows(x, 1e-5), CODA_FP32);
  const Matrix dz = round_to(random_activation(m_rows, f_width, rng), dt);
  const Matrix w = round_to(random_weight(f_width, d, rng), dt);
  const Vector zdz = row_dot(dz, linear(rmsnorm(x, gamma, 1e-5), w), 1.0 / d);
  const ResidualRmsnormBwd good = linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd_x, zdz, nullptr, 1.0);
  const ResidualRmsnormBwd no_zdz =
      linear_residual_rmsnorm_bwd(dz, w, x, gamma, rstd_x, Vector(zdz.size(), 0.0), nullptr, 1.0);
  check_fails("linear_residual_rmsnorm_bwd zdz dropped", no_zdz.dx,
              linear_residual_rmsnorm_bwd_unfused(dz, w, x, gamma, rstd_x, nullptr, 1.0, dt).dx, good.dx);
  // cross_entropy's mean dividing by M instead of the number of non-ignored rows.
  const Matrix logits = round_to(random_normal(m_rows, vocab, 0.0, 2.0, rng), dt);
  const Targets targets = random_targets(m_rows, vocab, rng, 0.4);
  const CrossEntropy ce = cross_entropy(logits, targets, default_ce_options(), {}, d);
  const CrossEntropy ceu = cross_entropy_unfused(logits, targets, default_ce_options(), {}, d, dt);
  ASSERT_LT(ce.n_valid, m_rows);
  double wrong_mean = 0;
  for (double v : ce.loss_rows) wrong_mean += v / static_cast<double>(m_rows);
  EXPECT_FALSE(acceptance(wrong_mean, ceu.loss[0], ce.loss[0]).pass);
}

}  // namespace
