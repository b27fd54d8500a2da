// GPU tests of the fused backward ops against the float64 reference with the acceptance rule:
//   coda_linear_residual_rmsnorm_bwd (dgrad GEMM + RMSNorm backward epilogue) on dx, a and dgamma; alpha 1 and
//      0.5, with and without dx_in, in place over dx_in;
//   coda_linear_swiglu_bwd_zdz (dgrad GEMM + SwiGLU backward epilogue, node src/epilogue/swiglu_bwd_pair.hpp) on
//      dz, y and zdz, out of place and in place over z, plus an element-wise check of the node against its host
//      reference;
// bf16 and fp16; outputs and workspace poisoned before each run, row padding untouched, two runs bit-identical.
// `FusedBackwardSanitize.*` are the small cases for compute-sanitizer. Every test skips without an sm_90 GPU.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "epilogue/column_partials.hpp"
#include "epilogue/swiglu_bwd_pair.hpp"
#include "gpu/fused_test_util.hpp"
#include "gpu/gpu_util.hpp"
#include "gpu/kernel_test_util.hpp"
#include "reference/reference.hpp"

namespace {

using namespace coda::ref;
using coda::test::Accepted;
using coda::test::bytes16;
using coda::test::DeviceBuffer;
using coda::test::kPoison16;
using coda::test::strided_tensor;

coda_dtype g_dt = CODA_BF16;  // bf16, or fp16 inside a UseFp16 scope
constexpr int64_t kPad = 8;

struct NormBwdCase {
  int64_t M, Nd, N;  // dz [M,Nd], w [Nd,N]
  double alpha;
  bool with_dx_in, in_place;
  std::string name() const {
    return "M=" + std::to_string(M) + " N'=" + std::to_string(Nd) + " N=" + std::to_string(N) +
           " alpha=" + std::to_string(alpha) + (with_dx_in ? (in_place ? " dx_in in place" : " dx_in") : "");
  }
};

struct NormBwdData {
  NormBwdCase c;
  Matrix dz, w, x, dx_in;
  Vector gamma, rstd, zdz;
  ResidualRmsnormBwd ref, unf;
};

NormBwdData make_norm_bwd(NormBwdCase const& c, uint64_t seed) {
  NormBwdData d;
  d.c = c;
  Rng rng(seed);
  d.dz = round_to(random_activation(c.M, c.Nd, rng), g_dt);
  d.w = round_to(random_weight(c.Nd, c.N, rng), g_dt);
  d.x = round_to(random_residual(c.M, c.N, rng), g_dt);
  d.gamma = round_to(random_gamma(c.N, rng), g_dt);
  d.rstd = round_to(rmsnorm_rstd_rows(d.x, 1e-5), CODA_FP32);
  // zdz consistent with the forward: (1/N) <dz, a W^T> with a = x rstd gamma (MATH.md rewrite 2).
  Matrix a = scale_rows(d.x, d.rstd);
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < a.cols; ++j) a(i, j) *= d.gamma[static_cast<size_t>(j)];
  }
  d.zdz = round_to(row_dot(d.dz, linear(a, d.w), 1.0 / static_cast<double>(c.N)), CODA_FP32);
  if (c.with_dx_in) d.dx_in = round_to(random_activation(c.M, c.N, rng), g_dt);
  Matrix const* dx_in = c.with_dx_in ? &d.dx_in : nullptr;
  d.ref = linear_residual_rmsnorm_bwd(d.dz, d.w, d.x, d.gamma, d.rstd, d.zdz, dx_in, c.alpha);
  d.unf = linear_residual_rmsnorm_bwd_unfused(d.dz, d.w, d.x, d.gamma, d.rstd, dx_in, c.alpha, g_dt);
  return d;
}

/// Runs linear_residual_rmsnorm_bwd twice on `d` and checks every output; with `partials`, also returns the
/// workspace after the first run (the ColumnPartials node's raw dgamma partials at its start).
void check_norm_bwd(NormBwdData const& d, bool print, std::vector<float>* partials = nullptr) {
  NormBwdCase const& c = d.c;
  SCOPED_TRACE(std::string("linear_residual_rmsnorm_bwd ") + coda::test::dtype_name(g_dt) + " " + c.name());
  int64_t const ld = c.N + kPad;
  DeviceBuffer ddz(bytes16(c.M, c.Nd)), dw(bytes16(c.Nd, c.N)), dx(bytes16(c.M, ld)), dg(bytes16(1, c.N));
  DeviceBuffer dr(static_cast<size_t>(c.M) * 4 + 16), dzdz(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer ddx_in(bytes16(c.M, ld)), ddx(bytes16(c.M, ld)), da(bytes16(c.M, ld));
  DeviceBuffer ddg(static_cast<size_t>(c.N) * 4 + 16);
  size_t const wsb = coda_linear_residual_rmsnorm_bwd_workspace_size(c.M, c.N);
  DeviceBuffer dws(wsb);
  ddz.upload(to_bits(d.dz, g_dt));
  dw.upload(to_bits(d.w, g_dt));
  dx.upload(coda::test::pad_rows(to_bits(d.x, g_dt), c.M, c.N, ld, kPoison16));
  dg.upload(to_bits(d.gamma, g_dt));
  dr.upload(std::vector<float>(d.rstd.begin(), d.rstd.end()));
  dzdz.upload(std::vector<float>(d.zdz.begin(), d.zdz.end()));
  std::vector<uint16_t> const dx_in_bits =
      c.with_dx_in ? coda::test::pad_rows(to_bits(d.dx_in, g_dt), c.M, c.N, ld, kPoison16) : std::vector<uint16_t>{};
  coda_tensor tdz = strided_tensor(ddz.get(), g_dt, c.M, c.Nd, c.Nd);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, c.Nd, c.N, c.N);
  coda_tensor tx = strided_tensor(dx.get(), g_dt, c.M, c.N, ld);
  coda_tensor tg = coda::test::device_tensor(dg.get(), g_dt, {c.N});
  coda_tensor tr = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  coda_tensor tzdz = coda::test::device_tensor(dzdz.get(), CODA_FP32, {c.M});
  coda_tensor tdx_in = strided_tensor(ddx_in.get(), g_dt, c.M, c.N, ld);
  DeviceBuffer& out_buf = c.in_place ? ddx_in : ddx;
  coda_tensor tdx = strided_tensor(out_buf.get(), g_dt, c.M, c.N, ld);
  coda_tensor ta = strided_tensor(da.get(), g_dt, c.M, c.N, ld);
  coda_tensor tdg = coda::test::device_tensor(ddg.get(), CODA_FP32, {c.N});
  std::vector<uint16_t> dx_first, a_first;
  std::vector<float> dg_first;
  for (int rep = 0; rep < 2; ++rep) {
    if (c.with_dx_in) ddx_in.upload(dx_in_bits);
    ddx.poison();
    if (!c.with_dx_in) ddx_in.poison();
    da.poison();
    ddg.poison();
    dws.poison();
    ASSERT_EQ(coda_linear_residual_rmsnorm_bwd(&tdz, &tw, &tx, &tg, &tr, &tzdz, c.with_dx_in ? &tdx_in : nullptr,
                                               static_cast<float>(c.alpha), &tdx, &ta, &tdg, dws.get(), wsb,
                                               nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const dxp = out_buf.download<uint16_t>(static_cast<size_t>(c.M * ld));
    std::vector<uint16_t> const ap = da.download<uint16_t>(static_cast<size_t>(c.M * ld));
    EXPECT_TRUE(coda::test::padding_untouched(dxp, c.M, c.N, ld, kPoison16)) << "dx row padding was written";
    EXPECT_TRUE(coda::test::padding_untouched(ap, c.M, c.N, ld, kPoison16)) << "a row padding was written";
    std::vector<float> const dgv = ddg.download<float>(static_cast<size_t>(c.N));
    if (rep == 0 && partials != nullptr) *partials = dws.download<float>(wsb / sizeof(float));
    if (rep == 0) {
      dx_first = dxp, a_first = ap, dg_first = dgv;
    } else {
      EXPECT_TRUE(dx_first == dxp) << "two runs differ (dx)";
      EXPECT_TRUE(a_first == ap) << "two runs differ (a)";
      EXPECT_EQ(std::memcmp(dg_first.data(), dgv.data(), dgv.size() * 4), 0) << "two runs differ (dgamma)";
    }
  }
  Matrix const dxm = matrix_from_bits(coda::test::unpad_rows(dx_first, c.M, c.N, ld).data(), c.M, c.N, g_dt);
  Matrix const am = matrix_from_bits(coda::test::unpad_rows(a_first, c.M, c.N, ld).data(), c.M, c.N, g_dt);
  Vector const dgm = vector_from_float(dg_first.data(), c.N);
  std::string const what = "linear_residual_rmsnorm_bwd " + c.name();
  EXPECT_TRUE(Accepted(what + " dx", acceptance(dxm, d.unf.dx, d.ref.dx), print));
  EXPECT_TRUE(Accepted(what + " a", acceptance(am, d.unf.a, d.ref.a), print));
  EXPECT_TRUE(Accepted(what + " dgamma", acceptance(dgm, d.unf.dgamma, d.ref.dgamma), print));
}

/// check_norm_bwd with each compiled config pinned (bf16: cooperative and pingpong; fp16: pingpong) and on the
/// default path.
void check_norm_bwd_configs(NormBwdData const& d, bool print) {
  for (char const* config : coda::test::fused_configs(g_dt, "linear_residual_rmsnorm_bwd")) {
    SCOPED_TRACE(coda::test::config_name(config));
    coda::test::PinConfig const pin(config);
    check_norm_bwd(d, print);
  }
}

TEST(FusedBackward, LinearResidualRmsnormBwd) {
  CODA_REQUIRE_SM90();
  std::vector<NormBwdCase> const cases = {
      {1, 264, 264, 1.0, false, false},      {7, 8, 16, 0.5, true, false},
      {1000, 264, 264, 1.0, true, true},     {1000, 2048, 512, 0.5, true, false},
      {4097, 264, 136, 1.0, false, false},   {1000, 3072, 2048, 1.0, true, true},  // llama3-1B qkv dgrad width
  };
  uint64_t seed = 50;
  for (NormBwdCase const& c : cases) check_norm_bwd_configs(make_norm_bwd(c, seed++), c.M >= 1000);
}

// A long-K dgrad (gate/up: K = 2F = 16384 at llama3-1B; the LM head's K = V is longer still): many k-blocks per
// tile through both mainloops (the default takes the cooperative one here), ragged M and N.
TEST(FusedBackward, LinearResidualRmsnormBwdLongK) {
  CODA_REQUIRE_SM90();
  check_norm_bwd_configs(make_norm_bwd({264, 16384, 264, 0.5, true, false}, 58), true);
}

// The ColumnPartials node (src/epilogue/column_partials.hpp) inside linear_residual_rmsnorm_bwd's GEMM: the raw
// per-(128-row tile, column) partials of acc * c in the (poisoned) workspace against the node's host reference on the
// float64 acc = dz w and c = x rstd; columns N..round_up(N, 128) must be written as 0. M and N are not tile
// multiples.
TEST(FusedBackward, ColumnPartialsNode) {
  CODA_REQUIRE_SM90();
  constexpr int64_t kTile = 128;  // the compiled linear_residual_rmsnorm_bwd kernel's CTA tile (pingpong 128x128)
  for (NormBwdCase const& c :
       {NormBwdCase{300, 200, 264, 1.0, true, false}, NormBwdCase{129, 64, 136, 0.5, false, false}}) {
    NormBwdData const d = make_norm_bwd(c, 80);
    std::vector<float> ws;
    check_norm_bwd(d, false, &ws);
    Matrix const acc = dgrad(d.dz, d.w);  // [M, N]
    std::vector<double> v(static_cast<size_t>(c.M * c.N)), mag(v.size());
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t n = 0; n < c.N; ++n) {
        double const t = acc(m, n) * d.x(m, n) * d.rstd[static_cast<size_t>(m)];
        v[static_cast<size_t>(m * c.N + n)] = t;
        mag[static_cast<size_t>(m * c.N + n)] = std::fabs(t);
      }
    }
    int64_t const ld = (c.N + kTile - 1) / kTile * kTile, tiles = (c.M + kTile - 1) / kTile;
    std::vector<double> const ref = coda::epilogue::column_partials_reference(v, c.M, c.N, c.N, kTile, ld);
    std::vector<double> const bound = coda::epilogue::column_partials_reference(mag, c.M, c.N, c.N, kTile, ld);
    ASSERT_GE(ws.size(), static_cast<size_t>(tiles * ld));
    int bad = 0;
    for (int64_t i = 0; i < tiles * ld; ++i) {
      double const got = ws[static_cast<size_t>(i)], want = ref[static_cast<size_t>(i)];
      // fp32 accumulation of fp32 products: a few ulps of the magnitude sum (K <= 200 terms per product).
      double const tol = 1e-5 * bound[static_cast<size_t>(i)] + 1e-30;
      bool const pad = i % ld >= c.N;
      if (!(std::fabs(got - want) <= tol) || (pad && got != 0.0)) {
        if (++bad <= 5) ADD_FAILURE() << c.name() << ": partial (" << i / ld << ", " << i % ld << ") = " << got
                                      << ", reference " << want << " (tolerance " << tol << ")";
      }
    }
    EXPECT_EQ(bad, 0) << c.name();
  }
}

TEST(FusedBackwardSanitize, LinearResidualRmsnormBwdSmall) {
  CODA_REQUIRE_SM90();
  check_norm_bwd_configs(make_norm_bwd({264, 200, 136, 0.5, true, true}, 60), false);
  check_norm_bwd_configs(make_norm_bwd({130, 64, 264, 1.0, false, false}, 61), false);
}

TEST(FusedBackwardFp16, LinearResidualRmsnormBwd) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  check_norm_bwd(make_norm_bwd({1000, 264, 264, 0.5, true, true}, 70), true);
  check_norm_bwd(make_norm_bwd({130, 64, 136, 1.0, false, false}, 71), false);
}

// ---- linear_swiglu_bwd_zdz ---------------------------------------------------------------------------------------

struct SwigluBwdCase {
  int64_t M, d, F;  // dx [M,d], w_down [d,F], z [M,2F]
  bool in_place;    // dz over z
  std::string name() const {
    return "M=" + std::to_string(M) + " d=" + std::to_string(d) + " F=" + std::to_string(F) +
           (in_place ? " dz over z" : "");
  }
};

struct SwigluBwdData {
  SwigluBwdCase c;
  Matrix dx, w, z;
  SwigluBwd ref, unf;
};

SwigluBwdData make_swiglu_bwd(SwigluBwdCase const& c, uint64_t seed) {
  SwigluBwdData d;
  d.c = c;
  Rng rng(seed);
  d.dx = round_to(random_activation(c.M, c.d, rng), g_dt);
  d.w = round_to(random_weight(c.d, c.F, rng), g_dt);
  d.z = round_to(random_activation(c.M, 2 * c.F, rng), g_dt);  // pre-activations of order 1: both silu regimes
  d.ref = linear_swiglu_bwd_zdz(d.dx, d.w, d.z);
  d.unf = linear_swiglu_bwd_zdz_unfused(d.dx, d.w, d.z, g_dt);
  return d;
}

/// Element-wise check of Sm90SwigluBwdPair against its host reference: swiglu_bwd_pair_reference applied to the
/// exact dy = dx w_down and each (g, u) gives every dz and y element (within one rounding of the element type plus
/// the fp32 GEMM error) and the row terms, whose sum / d is zdz (within fp32 summation error). A misplaced pair,
/// row or tile is off by O(|x|).
void check_swiglu_bwd_node(SwigluBwdData const& d, Matrix const& dz, Matrix const& y, Vector const& zdz) {
  double const ulp = g_dt == CODA_BF16 ? 1.0 / 256.0 : 1.0 / 2048.0;
  Matrix const dy = dgrad(d.dx, d.w);  // exact
  int64_t bad = 0;
  auto near = [&](char const* what, int64_t m, int64_t n, double got, double want) {
    double const scale = std::fabs(want);
    double const tol = scale * ulp + 1e-4 * (1.0 + scale);
    if (!(std::fabs(got - want) <= tol) && bad++ < 5) {
      ADD_FAILURE() << "SwigluBwdPair " << what << "[" << m << "," << n << "] = " << got << ", node reference "
                    << want;
    }
  };
  for (int64_t m = 0; m < d.c.M; ++m) {
    double row = 0.0, row_abs = 0.0;
    for (int64_t i = 0; i < d.c.F; ++i) {
      coda::epilogue::SwigluBwdPairValue const v =
          coda::epilogue::swiglu_bwd_pair_reference(dy(m, i), d.z(m, 2 * i), d.z(m, 2 * i + 1));
      near("dz", m, 2 * i, dz(m, 2 * i), v.dg);
      near("dz", m, 2 * i + 1, dz(m, 2 * i + 1), v.du);
      near("y", m, i, y(m, i), v.y);
      row += v.row_term;
      row_abs += std::fabs(v.row_term);
    }
    double const want = row / static_cast<double>(d.c.d);
    double const got = zdz[static_cast<size_t>(m)];
    // fp32 terms and partial sums: relative 1e-5 of the sum of magnitudes (each term is within ~1e-6 of exact).
    if (!(std::fabs(got - want) <= 1e-5 * row_abs / static_cast<double>(d.c.d) + 1e-7) && bad++ < 5) {
      ADD_FAILURE() << "SwigluBwdPair zdz[" << m << "] = " << got << ", node reference " << want;
    }
  }
  EXPECT_EQ(bad, 0) << "SwigluBwdPair elements off the node reference";
}

void check_swiglu_bwd(SwigluBwdData const& d, bool print, bool node_check) {
  SwigluBwdCase const& c = d.c;
  SCOPED_TRACE(std::string("linear_swiglu_bwd_zdz ") + coda::test::dtype_name(g_dt) + " " + c.name());
  int64_t const ldz = 2 * c.F + kPad, ldy = c.F + kPad;
  DeviceBuffer ddx(bytes16(c.M, c.d)), dw(bytes16(c.d, c.F)), dzin(bytes16(c.M, ldz)), ddz(bytes16(c.M, ldz));
  DeviceBuffer dy(bytes16(c.M, ldy)), dzdz(static_cast<size_t>(c.M) * 4 + 16);
  size_t const wsb = coda_linear_swiglu_bwd_zdz_workspace_size(c.M, c.F);
  DeviceBuffer dws(wsb);
  ddx.upload(to_bits(d.dx, g_dt));
  dw.upload(to_bits(d.w, g_dt));
  std::vector<uint16_t> const z_bits = coda::test::pad_rows(to_bits(d.z, g_dt), c.M, 2 * c.F, ldz, kPoison16);
  coda_tensor tdx = strided_tensor(ddx.get(), g_dt, c.M, c.d, c.d);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, c.d, c.F, c.F);
  coda_tensor tz = strided_tensor(dzin.get(), g_dt, c.M, 2 * c.F, ldz);
  DeviceBuffer& dz_buf = c.in_place ? dzin : ddz;
  coda_tensor tdz = strided_tensor(dz_buf.get(), g_dt, c.M, 2 * c.F, ldz);
  coda_tensor ty = strided_tensor(dy.get(), g_dt, c.M, c.F, ldy);
  coda_tensor tzdz = coda::test::device_tensor(dzdz.get(), CODA_FP32, {c.M});
  std::vector<uint16_t> dz_first, y_first;
  std::vector<float> zdz_first;
  for (int rep = 0; rep < 2; ++rep) {
    dzin.upload(z_bits);
    if (!c.in_place) ddz.poison();
    dy.poison();
    dzdz.poison();
    dws.poison();
    ASSERT_EQ(coda_linear_swiglu_bwd_zdz(&tdx, &tw, &tz, &tdz, &ty, &tzdz, dws.get(), wsb, nullptr), CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const dzp = dz_buf.download<uint16_t>(static_cast<size_t>(c.M * ldz));
    std::vector<uint16_t> const yp = dy.download<uint16_t>(static_cast<size_t>(c.M * ldy));
    EXPECT_TRUE(coda::test::padding_untouched(dzp, c.M, 2 * c.F, ldz, kPoison16)) << "dz row padding was written";
    EXPECT_TRUE(coda::test::padding_untouched(yp, c.M, c.F, ldy, kPoison16)) << "y row padding was written";
    std::vector<float> const zv = dzdz.download<float>(static_cast<size_t>(c.M));
    if (rep == 0) {
      dz_first = dzp, y_first = yp, zdz_first = zv;
    } else {
      EXPECT_TRUE(dz_first == dzp) << "two runs differ (dz)";
      EXPECT_TRUE(y_first == yp) << "two runs differ (y)";
      EXPECT_EQ(std::memcmp(zdz_first.data(), zv.data(), zv.size() * 4), 0) << "two runs differ (zdz)";
    }
  }
  Matrix const dzm = matrix_from_bits(coda::test::unpad_rows(dz_first, c.M, 2 * c.F, ldz).data(), c.M, 2 * c.F, g_dt);
  Matrix const ym = matrix_from_bits(coda::test::unpad_rows(y_first, c.M, c.F, ldy).data(), c.M, c.F, g_dt);
  Vector const zdzm = vector_from_float(zdz_first.data(), c.M);
  std::string const what = "linear_swiglu_bwd_zdz " + c.name();
  EXPECT_TRUE(Accepted(what + " dz", acceptance(dzm, d.unf.dz, d.ref.dz), print));
  EXPECT_TRUE(Accepted(what + " y", acceptance(ym, d.unf.y, d.ref.y), print));
  EXPECT_TRUE(Accepted(what + " zdz", acceptance(zdzm, d.unf.zdz, d.ref.zdz), print));
  if (node_check) check_swiglu_bwd_node(d, dzm, ym, zdzm);
}

/// check_swiglu_bwd with each compiled config pinned (bf16: pingpong 128x128 and 128x192 with 64x16 subtiles; fp16:
/// pingpong 128x128) and on the default path.
void check_swiglu_bwd_configs(SwigluBwdData const& d, bool print, bool node_check) {
  for (char const* config : coda::test::fused_configs(g_dt, "linear_swiglu_bwd_zdz")) {
    SCOPED_TRACE(coda::test::config_name(config));
    coda::test::PinConfig const pin(config);
    check_swiglu_bwd(d, print, node_check);
  }
}

TEST(FusedBackward, LinearSwigluBwdZdz) {
  CODA_REQUIRE_SM90();
  std::vector<SwigluBwdCase> const cases = {
      {1, 64, 8, false},       {7, 16, 24, true},        {1000, 264, 136, false}, {1000, 264, 136, true},
      {4097, 136, 264, false}, {1000, 2048, 2048, true},  // llama3-1B hidden size
  };
  uint64_t seed = 80;
  for (SwigluBwdCase const& c : cases) check_swiglu_bwd_configs(make_swiglu_bwd(c, seed++), c.M >= 1000, c.M <= 1000);
}

// d >= 4096 and M >= 4096: the default path takes pingpong 128x192 (64x16 subtiles); F = 200 leaves a partial
// 192-column tile, M = 4100 a partial row tile.
TEST(FusedBackward, LinearSwigluBwdZdzLongK) {
  CODA_REQUIRE_SM90();
  coda::test::PinConfig const unpinned(nullptr);  // the default path, whatever the environment pins
  check_swiglu_bwd(make_swiglu_bwd({4100, 4096, 200, true}, 88), true, false);
}

// z reaches the kernel as 32-bit words through the TMA C load (ElementC = float as a container): a pair whose up
// value u is +-0 reads as a float zero or denormal, which must arrive bit for bit (a flush
// to zero would drop g and make du = dy silu(g) zero). Every fifth pair has u = +0, every seventh u = -0, every
// eleventh g = 0 too.
TEST(FusedBackward, LinearSwigluBwdZdzZeroUp) {
  CODA_REQUIRE_SM90();
  auto run = [] {
    SwigluBwdCase const c{300, 136, 264, true};
    SwigluBwdData d = make_swiglu_bwd(c, 97);
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t i = 0; i < c.F; ++i) {
        if ((m + i) % 5 == 0) d.z(m, 2 * i + 1) = 0.0;
        if ((m + i) % 7 == 0) d.z(m, 2 * i + 1) = -0.0;
        if ((m + i) % 11 == 0) d.z(m, 2 * i) = 0.0;
      }
    }
    d.ref = linear_swiglu_bwd_zdz(d.dx, d.w, d.z);
    d.unf = linear_swiglu_bwd_zdz_unfused(d.dx, d.w, d.z, g_dt);
    check_swiglu_bwd_configs(d, false, true);
  };
  run();
  coda::test::UseFp16 const fp16(g_dt);
  run();
}

TEST(FusedBackwardFp16, LinearSwigluBwdZdz) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  check_swiglu_bwd(make_swiglu_bwd({1000, 264, 136, true}, 90), true, true);
  check_swiglu_bwd(make_swiglu_bwd({130, 64, 264, false}, 91), false, true);
}

TEST(FusedBackwardSanitize, LinearSwigluBwdZdzSmall) {
  CODA_REQUIRE_SM90();
  check_swiglu_bwd_configs(make_swiglu_bwd({264, 200, 136, true}, 95), false, false);
  check_swiglu_bwd_configs(make_swiglu_bwd({130, 64, 264, false}, 96), false, false);
}

TEST(FusedBackward, EmptyM) {
  CODA_REQUIRE_SM90();
  size_t const wsb = coda_linear_swiglu_bwd_zdz_workspace_size(0, 64);
  DeviceBuffer dw(bytes16(32, 64)), one(64);
  coda_tensor tdx = strided_tensor(one.get(), g_dt, 0, 32, 32);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, 32, 64, 64);
  coda_tensor tz = strided_tensor(one.get(), g_dt, 0, 128, 128);
  coda_tensor tdz = tz;
  coda_tensor ty = strided_tensor(one.get(), g_dt, 0, 64, 64);
  coda_tensor tzdz = coda::test::device_tensor(one.get(), CODA_FP32, {0});
  EXPECT_EQ(coda_linear_swiglu_bwd_zdz(&tdx, &tw, &tz, &tdz, &ty, &tzdz, nullptr, wsb, nullptr), CODA_SUCCESS)
      << coda_last_error();
}

}  // namespace
