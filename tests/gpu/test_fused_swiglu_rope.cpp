// GPU tests of coda_linear_rowscale_swiglu and coda_linear_rowscale_rope against the float64 reference with
// the acceptance rule (MATH.md, last section) on every output, every compiled config (CODA_OP_CONFIG) and the
// default path. Outputs carry poisoned (NaN) row padding that must stay untouched and are poisoned before each run
// (so every element must be written), every call runs twice and must be bit-identical. Also the node-level checks
// of src/epilogue/pair_store.hpp (y against the node's host reference, element by element) and of the RoPE
// functor of src/epilogue/rope_pair.hpp (every pair against its host reference). `FusedSwigluRopeSanitize.*` are
// the small cases for compute-sanitizer.
// Every test skips without an sm_90 GPU.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "epilogue/pair_store.hpp"
#include "epilogue/rope_pair.hpp"
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
using coda::test::Shape;
using coda::test::strided_tensor;

coda_dtype g_dt = CODA_BF16;  // bf16, or fp16 inside a UseFp16 scope
constexpr int64_t kPad = 8;  // extra (poisoned) elements per output row

// ---- coda_linear_rowscale_swiglu ----------------------------------------------------------------------------------

struct SwigluData {
  Shape s;  // N = 2F
  Matrix h, w;
  Vector rstd;
  Swiglu ref, unf;
};

SwigluData make_swiglu(Shape s, uint64_t seed) {
  SwigluData d;
  d.s = s;
  Rng rng(seed);
  d.h = round_to(random_normal(s.M, s.K, 0.0, 4.0, rng), g_dt);  // x * gamma: residual-stream scale
  d.w = round_to(random_weight(s.N, s.K, rng), g_dt);
  d.rstd = random_rstd(s.M, rng);
  d.ref = linear_rowscale_swiglu(d.h, d.w, d.rstd);
  d.unf = linear_rowscale_swiglu_unfused(d.h, d.w, d.rstd, g_dt);
  return d;
}

void run_swiglu(SwigluData const& d, char const* config, std::vector<uint16_t>& z_out, std::vector<uint16_t>& y_out) {
  Shape const s = d.s;
  int64_t const F = s.N / 2, ldz = s.N + kPad, ldy = F + kPad;
  DeviceBuffer dh(bytes16(s.M, s.K)), dw(bytes16(s.N, s.K)), dr(static_cast<size_t>(s.M) * 4 + 16);
  DeviceBuffer dz(bytes16(s.M, ldz)), dy(bytes16(s.M, ldy));
  dh.upload(to_bits(d.h, g_dt));
  dw.upload(to_bits(d.w, g_dt));
  dr.upload(std::vector<float>(d.rstd.begin(), d.rstd.end()));
  coda_tensor th = strided_tensor(dh.get(), g_dt, s.M, s.K, s.K);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, s.N, s.K, s.K);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {s.M});
  coda_tensor tz = strided_tensor(dz.get(), g_dt, s.M, s.N, ldz);
  coda_tensor ty = strided_tensor(dy.get(), g_dt, s.M, F, ldy);
  PinConfig const pin(config);
  for (int rep = 0; rep < 2; ++rep) {
    dz.poison();
    dy.poison();
    ASSERT_EQ(coda_linear_rowscale_swiglu(&th, &tw, &ts, &tz, &ty, nullptr, 0, nullptr), CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const z = dense_output(dz, s.M, s.N, ldz, "z_out");
    std::vector<uint16_t> const y = dense_output(dy, s.M, F, ldy, "y_out");
    if (rep == 0) {
      z_out = z;
      y_out = y;
    } else {
      EXPECT_TRUE(z_out == z) << "two runs differ (z)";
      EXPECT_TRUE(y_out == y) << "two runs differ (y)";
    }
  }
}

/// Node-level check of Sm90PairStore: every y element against the node's host reference applied to the exact z
/// (silu(g) u in double), within one bf16 rounding plus the fp32 GEMM error. A misplaced or missing element
/// (wrong transpose lane, wrong row) is off by O(|y|), far outside this.
void check_pair_store_node(Matrix const& z_exact, std::vector<uint16_t> const& y_bits, int64_t M, int64_t N) {
  std::vector<double> const y_ref = coda::epilogue::pair_store_reference(
      z_exact.data, M, N, N, [](double g, double u) { return silu(g) * u; });
  Matrix const y = matrix_from_bits(y_bits.data(), M, N / 2, g_dt);
  int64_t bad = 0;
  for (size_t i = 0; i < y_ref.size(); ++i) {
    double const tol = std::fabs(y_ref[i]) * (1.0 / 256.0) + 1e-4 * (1.0 + std::fabs(y_ref[i]));
    if (!(std::fabs(y.data[i] - y_ref[i]) <= tol)) {
      if (bad++ < 5) {
        ADD_FAILURE() << "PairStore y[" << static_cast<int64_t>(i) / (N / 2) << "," << static_cast<int64_t>(i) % (N / 2)
                      << "] = " << y.data[i] << ", node reference " << y_ref[i];
      }
    }
  }
  EXPECT_EQ(bad, 0) << "PairStore elements off the node reference";
}

void check_swiglu(SwigluData const& d, char const* config, bool print, bool node_check = false) {
  std::string const what =
      std::string("linear_rowscale_swiglu ") + coda::test::dtype_name(g_dt) + " " + d.s.name() + " " +
      config_name(config);
  SCOPED_TRACE(what);
  std::vector<uint16_t> z, y;
  ASSERT_NO_FATAL_FAILURE(run_swiglu(d, config, z, y));
  Matrix const zc = matrix_from_bits(z.data(), d.s.M, d.s.N, g_dt);
  Matrix const yc = matrix_from_bits(y.data(), d.s.M, d.s.N / 2, g_dt);
  EXPECT_TRUE(Accepted(what + " z", acceptance(zc, d.unf.z, d.ref.z), print));
  EXPECT_TRUE(Accepted(what + " y", acceptance(yc, d.unf.y, d.ref.y), print));
  if (node_check) check_pair_store_node(d.ref.z, y, d.s.M, d.s.N);
}

void swiglu_shapes(std::vector<Shape> const& shapes) {
  for (Shape const& s : shapes) {
    SwigluData const d = make_swiglu(s, static_cast<uint64_t>(s.M * 1013 + s.N * 37 + s.K));
    for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_swiglu")) check_swiglu(d, config, s.M >= 1000, config == nullptr);
  }
}

// ---- coda_linear_rowscale_rope ------------------------------------------------------------------------------------

struct RopeCase {
  int64_t M, K;
  RopeHeads heads;
  int32_t max_position;
  std::string name() const {
    return "M=" + std::to_string(M) + " K=" + std::to_string(K) + " Hq=" + std::to_string(heads.n_q_heads) +
           " Hkv=" + std::to_string(heads.n_kv_heads) + " hd=" + std::to_string(heads.head_dim) +
           " maxpos=" + std::to_string(max_position);
  }
};

struct RopeData {
  RopeCase c;
  Matrix h, w;
  Vector rstd, inv_freq;
  Positions pos;
  Matrix ref, unf;
};

RopeData make_rope(RopeCase const& c, uint64_t seed) {
  RopeData d;
  d.c = c;
  Rng rng(seed);
  int64_t const N = c.heads.width();
  d.h = round_to(random_normal(c.M, c.K, 0.0, 4.0, rng), g_dt);
  d.w = round_to(random_weight(N, c.K, rng), g_dt);
  d.rstd = random_rstd(c.M, rng);
  d.inv_freq = rope_inv_freq(c.heads.head_dim);
  d.pos = random_positions(c.M, c.max_position, rng);
  d.ref = linear_rowscale_rope(d.h, d.w, d.rstd, d.pos, d.inv_freq, c.heads);
  // The strict unfused bound: exact angles, only the dtype roundings (a float32-angle kernel fails it at large
  // positions).
  d.unf = linear_rowscale_rope_unfused(d.h, d.w, d.rstd, d.pos, d.inv_freq, c.heads, g_dt, RopeAngles::kExact);
  return d;
}

void run_rope(RopeData const& d, char const* config, std::vector<uint16_t>& out) {
  RopeCase const& c = d.c;
  int64_t const N = c.heads.width(), ldq = N + kPad;
  DeviceBuffer dh(bytes16(c.M, c.K)), dw(bytes16(N, c.K)), dr(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer dp(static_cast<size_t>(c.M) * 4 + 16), df(static_cast<size_t>(c.heads.head_dim) * 2 + 16);
  DeviceBuffer dq(bytes16(c.M, ldq));
  size_t const wsb = coda_linear_rowscale_rope_workspace_size(c.M, N);
  DeviceBuffer dws(wsb);
  dh.upload(to_bits(d.h, g_dt));
  dw.upload(to_bits(d.w, g_dt));
  dr.upload(std::vector<float>(d.rstd.begin(), d.rstd.end()));
  dp.upload(d.pos);
  df.upload(std::vector<float>(d.inv_freq.begin(), d.inv_freq.end()));
  coda_tensor th = strided_tensor(dh.get(), g_dt, c.M, c.K, c.K);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, N, c.K, c.K);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  coda_tensor tp = coda::test::device_tensor(dp.get(), CODA_INT32, {c.M});
  coda_tensor tf = coda::test::device_tensor(df.get(), CODA_FP32, {c.heads.head_dim / 2});
  coda_tensor tq = strided_tensor(dq.get(), g_dt, c.M, N, ldq);
  PinConfig const pin(config);
  for (int rep = 0; rep < 2; ++rep) {
    dq.poison();
    dws.poison();
    ASSERT_EQ(coda_linear_rowscale_rope(&th, &tw, &ts, &tp, &tf, c.heads.n_q_heads, c.heads.n_kv_heads,
                                        c.heads.head_dim, &tq, dws.get(), wsb, nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const q = dense_output(dq, c.M, N, ldq, "qkv_out");
    if (rep == 0) {
      out = q;
    } else {
      EXPECT_TRUE(out == q) << "two runs differ (qkv)";
    }
  }
}

void check_rope_functor(RopeData const& d, std::vector<uint16_t> const& q_bits);

void check_rope(RopeData const& d, char const* config, bool print, bool functor_check = false) {
  std::string const what =
      std::string("linear_rowscale_rope ") + coda::test::dtype_name(g_dt) + " " + d.c.name() + " " +
      config_name(config);
  SCOPED_TRACE(what);
  std::vector<uint16_t> q;
  ASSERT_NO_FATAL_FAILURE(run_rope(d, config, q));
  int64_t const N = d.c.heads.width();
  Matrix const qc = matrix_from_bits(q.data(), d.c.M, N, g_dt);
  EXPECT_TRUE(Accepted(what + " qkv", acceptance(qc, d.unf, d.ref), print));
  // v passes through: the v block equals R(rstd * acc) of the unrotated GEMM, so it must match the unfused v
  // rounding exactly wherever the fp32 GEMM and the reference round the same way; checked by the rule above, and
  // here its rotation must be the identity (no NaN, no sin/cos noise): |coda - ref| <= 1 bf16 ulp on v.
  int64_t const rot = d.c.heads.rotated_width();
  double worst = 0;
  for (int64_t m = 0; m < d.c.M; ++m) {
    for (int64_t n = rot; n < N; ++n) {
      double const r = d.ref(m, n);
      worst = std::fmax(worst, std::fabs(qc(m, n) - r) / (std::fabs(r) + 1e-3));
    }
  }
  EXPECT_LE(worst, 1.0 / 128) << "v columns are not passed through";
  if (functor_check) check_rope_functor(d, q);
}

/// Functor-level check of RopeRowscale (src/epilogue/rope_pair.hpp): every q/k pair against the functor's host
/// reference rope_pair_reference on the exact accumulator, v columns against rstd * acc; within one bf16 rounding
/// of the pair's magnitude plus the fp32 GEMM error. A wrong pair, column frequency or row position is off by
/// O(|z|).
void check_rope_functor(RopeData const& d, std::vector<uint16_t> const& q_bits) {
  RopeCase const& c = d.c;
  int64_t const N = c.heads.width(), rot = c.heads.rotated_width(), hd = c.heads.head_dim;
  Matrix const acc = linear(d.h, d.w);  // exact h w^T
  Matrix const q = matrix_from_bits(q_bits.data(), c.M, N, g_dt);
  int64_t bad = 0;
  auto expect_near = [&](int64_t m, int64_t n, double want, double scale) {
    double const tol = scale / 128.0 + 1e-4 * (1.0 + scale);
    if (!(std::fabs(q(m, n) - want) <= tol) && bad++ < 5) {
      ADD_FAILURE() << "RopeRowscale qkv[" << m << "," << n << "] = " << q(m, n) << ", functor reference " << want;
    }
  };
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < N; n += 2) {
      if (n < rot) {
        float const f = static_cast<float>(d.inv_freq[static_cast<size_t>((n % hd) / 2)]);
        double o0 = 0, o1 = 0;
        coda::epilogue::rope_pair_reference(acc(m, n), acc(m, n + 1), d.rstd[static_cast<size_t>(m)],
                                            d.pos[static_cast<size_t>(m)], f, &o0, &o1);
        double const scale = std::hypot(o0, o1);
        expect_near(m, n, o0, scale);
        expect_near(m, n + 1, o1, scale);
      } else {
        for (int64_t j = n; j < n + 2; ++j) {
          double const v = d.rstd[static_cast<size_t>(m)] * acc(m, j);
          expect_near(m, j, v, std::fabs(v));
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "RopeRowscale elements off the functor reference";
}

void rope_cases(std::vector<RopeCase> const& cases) {
  for (RopeCase const& c : cases) {
    RopeData const d = make_rope(c, static_cast<uint64_t>(c.M * 131 + c.K * 7 + c.heads.width() + c.max_position));
    for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_rope")) check_rope(d, config, c.M >= 1000);
  }
}

// ---- tests ---------------------------------------------------------------------------------------------------------

// Shapes: M in {1, 7, 1000, 4097}; 2F in {16, 272 (not a multiple of any tile), 2048}; K in {8, 264, 2048}.
std::vector<Shape> swiglu_small_shapes() {
  std::vector<Shape> shapes;
  for (int64_t M : {1, 7, 1000}) {
    for (auto nk : {std::pair<int64_t, int64_t>{16, 8}, {16, 264}, {272, 8}, {272, 264}, {2048, 2048}}) {
      shapes.push_back({M, nk.first, nk.second});
    }
  }
  shapes.push_back({4097, 272, 264});
  return shapes;
}

TEST(FusedForward, LinearRowscaleSwigluShapes) {
  CODA_REQUIRE_SM90();
  swiglu_shapes(swiglu_small_shapes());
}

// LLaMA widths at a reduced M (the float64 reference GEMM dominates the test time): llama3-1B gate/up
// (2F = 16384, d = 2048) and a ragged M.
TEST(FusedForward, LinearRowscaleSwigluLarge) {
  CODA_REQUIRE_SM90();
  swiglu_shapes({{1031, 16384, 2048}, {4096, 2048, 2048}});
}

// Long reductions (the llama3-70B and 8B gate/up K) on every config and the default path; small M and N keep the
// float64 reference cheap.
TEST(FusedForward, LinearRowscaleSwigluLongK) {
  CODA_REQUIRE_SM90();
  swiglu_shapes({{300, 528, 8192}, {129, 272, 4096}});
}

std::vector<RopeCase> rope_small_cases() {
  RopeHeads const gqa64{4, 2, 64}, mha128{2, 2, 128}, one64{1, 1, 64}, gqa128{8, 1, 128};
  return {{1, 8, one64, 100},       {7, 264, gqa64, 4096},     {1000, 264, mha128, 8192},
          {1000, 8, gqa128, 1 << 20}, {4097, 264, gqa64, 131072}, {33, 2048, mha128, 16777215}};
}

TEST(FusedForward, LinearRowscaleRopeShapes) {
  CODA_REQUIRE_SM90();
  rope_cases(rope_small_cases());
}

// llama3-1B qkv (Hq 32, Hkv 8, hd 64, d 2048) and llama3-8B qkv (32, 8, 128, d 4096) at reduced M, positions up to
// 131072 (long context) and 1e6.
TEST(FusedForward, LinearRowscaleRopeLarge) {
  CODA_REQUIRE_SM90();
  rope_cases({{1031, 2048, RopeHeads{32, 8, 64}, 131072}, {515, 4096, RopeHeads{32, 8, 128}, 1000000}});
}

TEST(FusedForward, SwigluRopeEmptyM) {
  CODA_REQUIRE_SM90();
  std::vector<DeviceBuffer> buf;
  for (int i = 0; i < 8; ++i) buf.emplace_back(size_t{1} << 14);
  coda_tensor h = strided_tensor(buf[0].get(), g_dt, 0, 16, 16), w = strided_tensor(buf[1].get(), g_dt, 256, 16, 16);
  coda_tensor s = coda::test::device_tensor(buf[2].get(), CODA_FP32, {0});
  coda_tensor z = strided_tensor(buf[3].get(), g_dt, 0, 256, 256), y = strided_tensor(buf[4].get(), g_dt, 0, 128, 128);
  EXPECT_EQ(coda_linear_rowscale_swiglu(&h, &w, &s, &z, &y, nullptr, 0, nullptr), CODA_SUCCESS) << coda_last_error();
  coda_tensor wq = strided_tensor(buf[1].get(), g_dt, 192, 16, 16);
  coda_tensor p = coda::test::device_tensor(buf[5].get(), CODA_INT32, {0});
  coda_tensor f = coda::test::device_tensor(buf[6].get(), CODA_FP32, {32});
  coda_tensor q = strided_tensor(buf[7].get(), g_dt, 0, 192, 192);
  EXPECT_EQ(coda_linear_rowscale_rope(&h, &wq, &s, &p, &f, 1, 1, 64, &q, nullptr, 0, nullptr), CODA_SUCCESS)
      << coda_last_error();
}

// Small cases for compute-sanitizer (tools/gpu-check --sanitize): every config, ragged tiles.
TEST(FusedSwigluRopeSanitize, SwigluSmall) {
  CODA_REQUIRE_SM90();
  SwigluData const d = make_swiglu({264, 272, 200}, 21);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_swiglu")) check_swiglu(d, config, false, true);
}

TEST(FusedSwigluRopeSanitize, RopeSmall) {
  CODA_REQUIRE_SM90();
  RopeData const d = make_rope({264, 200, RopeHeads{4, 2, 64}, 70000}, 22);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_rope")) check_rope(d, config, false, config == nullptr);
}

// fp16: the pingpong kernels.
TEST(FusedForwardFp16, SwigluShapes) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  swiglu_shapes({{7, 16, 264}, {1000, 272, 264}, {1031, 2048, 2048}});
}

TEST(FusedForwardFp16, RopeShapes) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  rope_cases({{7, 264, RopeHeads{4, 2, 64}, 4096}, {1000, 264, RopeHeads{2, 2, 128}, 1 << 20}});
}

TEST(FusedSwigluRopeSanitize, Fp16Small) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  SwigluData const s = make_swiglu({264, 272, 200}, 23);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_swiglu")) check_swiglu(s, config, false, true);
  RopeData const r = make_rope({264, 200, RopeHeads{4, 2, 64}, 70000}, 24);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_rope")) check_rope(r, config, false, config == nullptr);
}

}  // namespace
