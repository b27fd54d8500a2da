// GPU tests of coda_linear_rowscale_qk_norm_rope against the float64 reference with the acceptance rule (MATH.md, last
// section) on both outputs (qkv and the pre-norm z), every compiled config and the default path: q/k gammas random and
// different (a swap fails), head_dim 64 and 128, head counts whose width is not a multiple of the 128-column tile (a
// tile holding a q and a k head, or v and columns past N), ragged M and K, positions up to 2^24 - 1, a zero row (the
// norm's epsilon). Outputs carry poisoned row padding that must stay untouched, are poisoned before each run and each
// call runs twice, bit-identical. `FusedQkNormRopeSanitize.*` are the small cases for compute-sanitizer. Every test
// skips without an sm_90 GPU.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/fused_test_util.hpp"
#include "gpu/gpu_util.hpp"
#include "gpu/kernel_test_util.hpp"
#include "reference/reference.hpp"

namespace {

using namespace coda::ref;
using coda::test::Accepted;
using coda::test::bytes16;
using coda::test::config_name;
using coda::test::dense_output;
using coda::test::DeviceBuffer;
using coda::test::kPoison16;
using coda::test::PinConfig;
using coda::test::random_rstd;
using coda::test::strided_tensor;

coda_dtype g_dt = CODA_BF16;  // bf16, or fp16 inside a UseFp16 scope
constexpr int64_t kPad = 8;    // extra (poisoned) elements per output row
constexpr double kQkEps = 1e-6;

struct QkCase {
  int64_t M, K;
  RopeHeads heads;
  int32_t max_position;
  std::string name() const {
    return "M=" + std::to_string(M) + " K=" + std::to_string(K) + " Hq=" + std::to_string(heads.n_q_heads) +
           " Hkv=" + std::to_string(heads.n_kv_heads) + " hd=" + std::to_string(heads.head_dim) +
           " maxpos=" + std::to_string(max_position);
  }
};

struct QkData {
  QkCase c;
  Matrix h, w;
  Vector rstd, inv_freq;
  QkNorm norm;
  Positions pos;
  Matrix ref, unf, z_ref, z_unf;
};

QkData make_case(QkCase const& c, uint64_t seed) {
  QkData d;
  d.c = c;
  Rng rng(seed);
  int64_t const N = c.heads.width();
  d.h = round_to(random_normal(c.M, c.K, 0.0, 4.0, rng), g_dt);
  if (c.M > 5) {
    for (int64_t k = 0; k < c.K; ++k) d.h(5, k) = 0.0;  // a zero row: the per-head norm is eps alone
  }
  d.w = round_to(random_weight(N, c.K, rng), g_dt);
  d.rstd = random_rstd(c.M, rng);
  d.norm.q_gamma = round_to(random_gamma(c.heads.head_dim, rng), CODA_FP32);
  d.norm.k_gamma = round_to(random_gamma(c.heads.head_dim, rng), CODA_FP32);
  d.norm.eps = kQkEps;
  d.inv_freq = rope_inv_freq(c.heads.head_dim);
  d.pos = random_positions(c.M, c.max_position, rng);
  d.ref = linear_rowscale_qk_norm_rope(d.h, d.w, d.rstd, d.norm, d.pos, d.inv_freq, c.heads);
  d.unf = linear_rowscale_qk_norm_rope_unfused(d.h, d.w, d.rstd, d.norm, d.pos, d.inv_freq, c.heads, g_dt,
                                               RopeAngles::kExact);
  d.z_ref = linear_rowscale(d.h, d.w, d.rstd);
  d.z_unf = linear_rowscale_unfused(d.h, d.w, d.rstd, g_dt);
  return d;
}

/// with_z false: z_out NULL (not stored); z comes back empty.
void run_case(QkData const& d, char const* config, std::vector<uint16_t>& qkv, std::vector<uint16_t>& z,
              bool with_z = true) {
  QkCase const& c = d.c;
  int64_t const N = c.heads.width(), ldq = N + kPad, ldz = N + 2 * kPad;
  int64_t const hd = c.heads.head_dim;
  DeviceBuffer dh(bytes16(c.M, c.K)), dw(bytes16(N, c.K)), dr(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer dp(static_cast<size_t>(c.M) * 4 + 16), df(static_cast<size_t>(hd) * 2 + 16);
  DeviceBuffer dgq(static_cast<size_t>(hd) * 4 + 16), dgk(static_cast<size_t>(hd) * 4 + 16);
  DeviceBuffer dq(bytes16(c.M, ldq)), dz(bytes16(c.M, ldz));
  dh.upload(to_bits(d.h, g_dt));
  dw.upload(to_bits(d.w, g_dt));
  dr.upload(std::vector<float>(d.rstd.begin(), d.rstd.end()));
  dp.upload(d.pos);
  df.upload(std::vector<float>(d.inv_freq.begin(), d.inv_freq.end()));
  dgq.upload(std::vector<float>(d.norm.q_gamma.begin(), d.norm.q_gamma.end()));
  dgk.upload(std::vector<float>(d.norm.k_gamma.begin(), d.norm.k_gamma.end()));
  coda_tensor th = strided_tensor(dh.get(), g_dt, c.M, c.K, c.K);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, N, c.K, c.K);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  coda_tensor tp = coda::test::device_tensor(dp.get(), CODA_INT32, {c.M});
  coda_tensor tf = coda::test::device_tensor(df.get(), CODA_FP32, {hd / 2});
  coda_tensor tgq = coda::test::device_tensor(dgq.get(), CODA_FP32, {hd});
  coda_tensor tgk = coda::test::device_tensor(dgk.get(), CODA_FP32, {hd});
  coda_tensor tq = strided_tensor(dq.get(), g_dt, c.M, N, ldq);
  coda_tensor tz = strided_tensor(dz.get(), g_dt, c.M, N, ldz);
  PinConfig const pin(config);
  for (int rep = 0; rep < 2; ++rep) {
    dq.poison();
    dz.poison();
    ASSERT_EQ(coda_linear_rowscale_qk_norm_rope(&th, &tw, &ts, &tgq, &tgk, &tp, &tf, c.heads.n_q_heads,
                                                c.heads.n_kv_heads, c.heads.head_dim, static_cast<float>(kQkEps), &tq,
                                                with_z ? &tz : nullptr, nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const q = dense_output(dq, c.M, N, ldq, "qkv_out");
    std::vector<uint16_t> zz;
    if (with_z) {
      zz = dense_output(dz, c.M, N, ldz, "z_out");
    } else {
      EXPECT_TRUE(dz.download<uint16_t>(static_cast<size_t>(c.M * ldz)) ==
                  std::vector<uint16_t>(static_cast<size_t>(c.M * ldz), kPoison16))
          << "z_out NULL: z's buffer was written";
    }
    if (rep == 0) {
      qkv = q;
      z = zz;
    } else {
      EXPECT_TRUE(qkv == q) << "two runs differ (qkv)";
      EXPECT_TRUE(z == zz) << "two runs differ (z)";
    }
  }
}

void check_case(QkData const& d, char const* config, bool print) {
  std::string const what =
      std::string("linear_rowscale_qk_norm_rope ") + coda::test::dtype_name(g_dt) + " " + d.c.name() + " " +
      config_name(config);
  SCOPED_TRACE(what);
  std::vector<uint16_t> q, z;
  ASSERT_NO_FATAL_FAILURE(run_case(d, config, q, z));
  int64_t const N = d.c.heads.width();
  Matrix const qc = matrix_from_bits(q.data(), d.c.M, N, g_dt);
  Matrix const zc = matrix_from_bits(z.data(), d.c.M, N, g_dt);
  EXPECT_TRUE(Accepted(what + " qkv", acceptance(qc, d.unf, d.ref), print));
  EXPECT_TRUE(Accepted(what + " z", acceptance(zc, d.z_unf, d.z_ref), print));
  // v passes through: R(rstd * acc), the same as z's v block up to the GEMM's fp32 rounding (1 ulp of the dtype).
  double worst = 0;
  for (int64_t m = 0; m < d.c.M; ++m) {
    for (int64_t n = d.c.heads.rotated_width(); n < N; ++n) {
      double const r = d.ref(m, n);
      worst = std::fmax(worst, std::fabs(qc(m, n) - r) / (std::fabs(r) + 1e-3));
    }
  }
  EXPECT_LE(worst, 1.0 / 128) << "v columns are not passed through";
  if (config == nullptr) {  // z_out NULL (inference): the same qkv, nothing else written
    std::vector<uint16_t> q2, z2;
    ASSERT_NO_FATAL_FAILURE(run_case(d, config, q2, z2, false));
    EXPECT_TRUE(q2 == q) << "qkv differs without z";
  }
}

void cases(std::vector<QkCase> const& list) {
  for (QkCase const& c : list) {
    QkData const d = make_case(c, static_cast<uint64_t>(c.M * 131 + c.K * 7 + c.heads.width() + c.max_position));
    for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_qk_norm_rope")) {
      check_case(d, config, c.M >= 1000);
    }
  }
}

// Widths: 4q+2k+2v of 64 (N = 512), 1q+1k+1v of 64 (N = 192: the second tile holds v and 64 columns past N),
// 3q+1k+1v of 64 (N = 320: a tile with a q and a k head), 1q+1k+1v of 128 (N = 384), MHA and GQA of 128.
std::vector<QkCase> small_cases() {
  RopeHeads const gqa64{4, 2, 64}, one64{1, 1, 64}, odd64{3, 1, 64}, one128{1, 1, 128}, mha128{2, 2, 128};
  RopeHeads const gqa128{8, 1, 128};
  return {{1, 8, one64, 100},          {7, 264, gqa64, 4096},       {1000, 264, mha128, 8192},
          {1000, 8, gqa128, 1 << 20},  {4097, 264, odd64, 131072},  {33, 2048, one128, 16777215},
          {130, 136, one64, 77}};
}

TEST(FusedForward, LinearRowscaleQkNormRopeShapes) {
  CODA_REQUIRE_SM90();
  cases(small_cases());
}

// Qwen3-8B's q/k/v (Hq 32, Hkv 8, hd 128, d 4096) and Qwen3-0.6B's (16, 8, 128, d 1024) at reduced M; an hd 64
// model at d 2048.
TEST(FusedForward, LinearRowscaleQkNormRopeLarge) {
  CODA_REQUIRE_SM90();
  cases({{515, 4096, RopeHeads{32, 8, 128}, 1000000},
         {1031, 1024, RopeHeads{16, 8, 128}, 40960},
         {1031, 2048, RopeHeads{32, 8, 64}, 131072}});
}

TEST(FusedForward, QkNormRopeEmptyM) {
  CODA_REQUIRE_SM90();
  std::vector<DeviceBuffer> buf;
  for (int i = 0; i < 9; ++i) buf.emplace_back(size_t{1} << 14);
  coda_tensor h = strided_tensor(buf[0].get(), g_dt, 0, 16, 16), w = strided_tensor(buf[1].get(), g_dt, 192, 16, 16);
  coda_tensor s = coda::test::device_tensor(buf[2].get(), CODA_FP32, {0});
  coda_tensor p = coda::test::device_tensor(buf[3].get(), CODA_INT32, {0});
  coda_tensor f = coda::test::device_tensor(buf[4].get(), CODA_FP32, {32});
  coda_tensor gq = coda::test::device_tensor(buf[5].get(), CODA_FP32, {64});
  coda_tensor gk = coda::test::device_tensor(buf[6].get(), CODA_FP32, {64});
  coda_tensor q = strided_tensor(buf[7].get(), g_dt, 0, 192, 192), z = strided_tensor(buf[8].get(), g_dt, 0, 192, 192);
  EXPECT_EQ(coda_linear_rowscale_qk_norm_rope(&h, &w, &s, &gq, &gk, &p, &f, 1, 1, 64, 1e-6f, &q, &z, nullptr),
            CODA_SUCCESS)
      << coda_last_error();
}

TEST(FusedQkNormRopeSanitize, Small) {
  CODA_REQUIRE_SM90();
  QkData const d = make_case({264, 200, RopeHeads{3, 1, 64}, 70000}, 31);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_qk_norm_rope")) {
    check_case(d, config, false);
  }
}

TEST(FusedForwardFp16, QkNormRopeShapes) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  cases({{7, 264, RopeHeads{4, 2, 64}, 4096}, {1000, 264, RopeHeads{2, 2, 128}, 1 << 20}});
}

TEST(FusedQkNormRopeSanitize, Fp16Small) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  QkData const d = make_case({264, 200, RopeHeads{1, 1, 128}, 70000}, 32);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_qk_norm_rope")) {
    check_case(d, config, false);
  }
}

// ---- coda_qk_norm_rope_bwd_zdz ------------------------------------------------------------------------------------

struct BwdCase {
  int64_t M;
  RopeHeads heads;
  int32_t max_position;
  bool in_place;       // dz_out over dqkv (its v check then only sees the input; the out-of-place cases test it)
  double z_std = 2.0;  // 1e-3: mean u^2 ~ qk_eps, where the q/k heads' share of zdz (eps r^2 <dn, n>) is not tiny
  std::string name() const {
    return "M=" + std::to_string(M) + " Hq=" + std::to_string(heads.n_q_heads) + " Hkv=" +
           std::to_string(heads.n_kv_heads) + " hd=" + std::to_string(heads.head_dim) + (in_place ? " in place" : "") +
           " z_std=" + std::to_string(z_std);
  }
};

constexpr int64_t kHidden = 4096;

void check_bwd(BwdCase const& c, uint64_t seed) {
  SCOPED_TRACE("qk_norm_rope_bwd_zdz " + std::string(coda::test::dtype_name(g_dt)) + " " + c.name());
  Rng rng(seed);
  int64_t const W = c.heads.width(), hd = c.heads.head_dim, ld = W + kPad;
  Matrix z = round_to(random_normal(c.M, W, 0.0, c.z_std, rng), g_dt);
  if (c.M > 5) {
    for (int64_t n = 0; n < W; ++n) z(5, n) = 0.0;  // a zero row: r = 1/sqrt(eps)
  }
  Matrix const dqkv = round_to(random_normal(c.M, W, 0.0, 1.0, rng), g_dt);
  QkNorm norm;
  norm.q_gamma = round_to(random_gamma(hd, rng), CODA_FP32);
  norm.k_gamma = round_to(random_gamma(hd, rng), CODA_FP32);
  norm.eps = kQkEps;
  Vector const inv_freq = rope_inv_freq(c.heads.head_dim);
  Positions const pos = random_positions(c.M, c.max_position, rng);
  Matrix const qkv = rope(qk_norm(z, norm, c.heads), pos, inv_freq, c.heads);
  QkNormRopeBwd const ref = qk_norm_rope_bwd(z, qkv, dqkv, norm, pos, inv_freq, c.heads, kHidden);
  QkNormRopeBwd const unf =
      qk_norm_rope_bwd_unfused(z, dqkv, norm, pos, inv_freq, c.heads, kHidden, g_dt, RopeAngles::kExact);

  DeviceBuffer dzb(bytes16(c.M, ld)), ddq(bytes16(c.M, ld)), dout(bytes16(c.M, ld));
  DeviceBuffer dp(static_cast<size_t>(c.M) * 4 + 16), df(static_cast<size_t>(hd) * 2 + 16);
  DeviceBuffer dgq(static_cast<size_t>(hd) * 4 + 16), dgk(static_cast<size_t>(hd) * 4 + 16);
  DeviceBuffer dzdz(static_cast<size_t>(c.M) * 4 + 16), ddgq(static_cast<size_t>(hd) * 4 + 16),
      ddgk(static_cast<size_t>(hd) * 4 + 16);
  size_t const wsb = coda_qk_norm_rope_bwd_zdz_workspace_size(c.M, hd);
  DeviceBuffer dws(wsb + 16);
  std::vector<uint16_t> const zbits = coda::test::pad_rows(to_bits(z, g_dt), c.M, W, ld, kPoison16);
  std::vector<uint16_t> const dbits = coda::test::pad_rows(to_bits(dqkv, g_dt), c.M, W, ld, kPoison16);
  dzb.upload(zbits);
  dp.upload(pos);
  df.upload(std::vector<float>(inv_freq.begin(), inv_freq.end()));
  dgq.upload(std::vector<float>(norm.q_gamma.begin(), norm.q_gamma.end()));
  dgk.upload(std::vector<float>(norm.k_gamma.begin(), norm.k_gamma.end()));
  coda_tensor tz = strided_tensor(dzb.get(), g_dt, c.M, W, ld);
  coda_tensor tdq = strided_tensor(ddq.get(), g_dt, c.M, W, ld);
  coda_tensor tout = c.in_place ? tdq : strided_tensor(dout.get(), g_dt, c.M, W, ld);
  coda_tensor tp = coda::test::device_tensor(dp.get(), CODA_INT32, {c.M});
  coda_tensor tf = coda::test::device_tensor(df.get(), CODA_FP32, {hd / 2});
  coda_tensor tgq = coda::test::device_tensor(dgq.get(), CODA_FP32, {hd});
  coda_tensor tgk = coda::test::device_tensor(dgk.get(), CODA_FP32, {hd});
  coda_tensor tzdz = coda::test::device_tensor(dzdz.get(), CODA_FP32, {c.M});
  coda_tensor tdgq = coda::test::device_tensor(ddgq.get(), CODA_FP32, {hd});
  coda_tensor tdgk = coda::test::device_tensor(ddgk.get(), CODA_FP32, {hd});
  std::vector<uint16_t> first_dz;
  std::vector<float> first_zdz, first_dgq, first_dgk;
  for (int rep = 0; rep < 2; ++rep) {
    ddq.upload(dbits);
    if (!c.in_place) dout.poison();
    dzdz.poison();
    ddgq.poison();
    ddgk.poison();
    dws.poison();
    ASSERT_EQ(coda_qk_norm_rope_bwd_zdz(&tz, &tdq, &tgq, &tgk, &tp, &tf, c.heads.n_q_heads, c.heads.n_kv_heads,
                                        c.heads.head_dim, static_cast<float>(kQkEps), kHidden, &tout, &tzdz, &tdgq,
                                        &tdgk, dws.get(), wsb, nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const dz = dense_output(c.in_place ? ddq : dout, c.M, W, ld, "dz_out");
    std::vector<float> const zdz = dzdz.download<float>(static_cast<size_t>(c.M));
    std::vector<float> const dgq_out = ddgq.download<float>(static_cast<size_t>(hd));
    std::vector<float> const dgk_out = ddgk.download<float>(static_cast<size_t>(hd));
    if (rep == 1) {
      EXPECT_TRUE(dz == first_dz && zdz == first_zdz && dgq_out == first_dgq && dgk_out == first_dgk)
          << "two runs differ";
      break;
    }
    first_dz = dz, first_zdz = zdz, first_dgq = dgq_out, first_dgk = dgk_out;
  }
  bool const print = c.M >= 1000;
  Matrix const dzc = matrix_from_bits(first_dz.data(), c.M, W, g_dt);
  EXPECT_TRUE(Accepted("dz", acceptance(dzc, unf.dz, ref.dz), print));
  EXPECT_TRUE(Accepted("zdz", acceptance(Vector(first_zdz.begin(), first_zdz.end()), unf.zdz, ref.zdz), print));
  EXPECT_TRUE(Accepted("dq_gamma", acceptance(Vector(first_dgq.begin(), first_dgq.end()), unf.dq_gamma,
                                              ref.dq_gamma), print));
  EXPECT_TRUE(Accepted("dk_gamma", acceptance(Vector(first_dgk.begin(), first_dgk.end()), unf.dk_gamma,
                                              ref.dk_gamma), print));
  // v passes through bit for bit.
  std::vector<uint16_t> const dq_dense = coda::test::unpad_rows(dbits, c.M, W, ld);
  int64_t bad = 0;
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = c.heads.rotated_width(); n < W; ++n) {
      bad += first_dz[static_cast<size_t>(m * W + n)] != dq_dense[static_cast<size_t>(m * W + n)];
    }
  }
  EXPECT_EQ(bad, 0) << "v columns of dz are not dqkv's bits";
}

TEST(QkNormRopeBwd, Shapes) {
  CODA_REQUIRE_SM90();
  std::vector<BwdCase> const cases = {{1, RopeHeads{1, 1, 64}, 100, false},    {7, RopeHeads{3, 1, 64}, 4096, true},
                                      {1000, RopeHeads{2, 2, 128}, 1 << 20, false},
                                      {1300, RopeHeads{4, 2, 64}, 131072, true},
                                      {515, RopeHeads{32, 8, 128}, 16777215, false},
                                      {300, RopeHeads{4, 2, 64}, 8192, false, 1e-3},
                                      {200, RopeHeads{2, 1, 128}, 8192, true, 1e-3}};
  for (BwdCase const& c : cases) check_bwd(c, static_cast<uint64_t>(c.M * 7 + c.heads.width()));
}

TEST(QkNormRopeBwdSanitize, Small) {
  CODA_REQUIRE_SM90();
  check_bwd({33, RopeHeads{3, 1, 64}, 70000, false}, 41);
  check_bwd({33, RopeHeads{1, 1, 128}, 70000, true}, 42);
}

TEST(QkNormRopeBwdFp16, Shapes) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  check_bwd({1000, RopeHeads{2, 2, 128}, 1 << 20, false}, 43);
  check_bwd({7, RopeHeads{3, 1, 64}, 4096, true}, 44);
  check_bwd({300, RopeHeads{4, 2, 64}, 8192, false, 1e-3}, 45);
}

}  // namespace
