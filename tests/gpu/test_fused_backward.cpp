// GPU tests of B2 coda_linear_residual_rmsnorm_bwd (dgrad GEMM + RMSNorm backward epilogue) against the float64
// reference with the acceptance rule on dx, a and dgamma; alpha 1 and 0.5, with and without dx_in, in place over
// dx_in; outputs and workspace poisoned before each run, two runs bit-identical. `FusedBackwardSanitize.*` is the
// small case for compute-sanitizer. Every test skips without an sm_90 GPU.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
using coda::test::DeviceBuffer;
using coda::test::kPoison16;
using coda::test::strided_tensor;

constexpr coda_dtype kDt = CODA_BF16;
constexpr int64_t kPad = 8;

struct B2Case {
  int64_t M, Nd, N;  // dz [M,Nd], w [Nd,N]
  double alpha;
  bool with_dx_in, in_place;
  std::string name() const {
    return "M=" + std::to_string(M) + " N'=" + std::to_string(Nd) + " N=" + std::to_string(N) +
           " alpha=" + std::to_string(alpha) + (with_dx_in ? (in_place ? " dx_in in place" : " dx_in") : "");
  }
};

struct B2Data {
  B2Case c;
  Matrix dz, w, x, dx_in;
  Vector gamma, rstd, zdz;
  ResidualRmsnormBwd ref, unf;
};

B2Data make_b2(B2Case const& c, uint64_t seed) {
  B2Data d;
  d.c = c;
  Rng rng(seed);
  d.dz = round_to(random_activation(c.M, c.Nd, rng), kDt);
  d.w = round_to(random_weight(c.Nd, c.N, rng), kDt);
  d.x = round_to(random_residual(c.M, c.N, rng), kDt);
  d.gamma = round_to(random_gamma(c.N, rng), kDt);
  d.rstd = round_to(rmsnorm_rstd_rows(d.x, 1e-5), CODA_FP32);
  // zdz consistent with the forward: (1/N) <dz, a W^T> with a = x rstd gamma (MATH.md rewrite 2).
  Matrix a = scale_rows(d.x, d.rstd);
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < a.cols; ++j) a(i, j) *= d.gamma[static_cast<size_t>(j)];
  }
  d.zdz = round_to(row_dot(d.dz, linear(a, d.w), 1.0 / static_cast<double>(c.N)), CODA_FP32);
  if (c.with_dx_in) d.dx_in = round_to(random_activation(c.M, c.N, rng), kDt);
  Matrix const* dx_in = c.with_dx_in ? &d.dx_in : nullptr;
  d.ref = linear_residual_rmsnorm_bwd(d.dz, d.w, d.x, d.gamma, d.rstd, d.zdz, dx_in, c.alpha);
  d.unf = linear_residual_rmsnorm_bwd_unfused(d.dz, d.w, d.x, d.gamma, d.rstd, dx_in, c.alpha, kDt);
  return d;
}

void check_b2(B2Data const& d, bool print) {
  B2Case const& c = d.c;
  SCOPED_TRACE("B2 " + c.name());
  int64_t const ld = c.N + kPad;
  DeviceBuffer ddz(bytes16(c.M, c.Nd)), dw(bytes16(c.Nd, c.N)), dx(bytes16(c.M, ld)), dg(bytes16(1, c.N));
  DeviceBuffer dr(static_cast<size_t>(c.M) * 4 + 16), dzdz(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer ddx_in(bytes16(c.M, ld)), ddx(bytes16(c.M, ld)), da(bytes16(c.M, ld));
  DeviceBuffer ddg(static_cast<size_t>(c.N) * 4 + 16);
  size_t const wsb = coda_linear_residual_rmsnorm_bwd_workspace_size(c.M, c.N);
  DeviceBuffer dws(wsb);
  ddz.upload(to_bits(d.dz, kDt));
  dw.upload(to_bits(d.w, kDt));
  dx.upload(coda::test::pad_rows(to_bits(d.x, kDt), c.M, c.N, ld, kPoison16));
  dg.upload(to_bits(d.gamma, kDt));
  dr.upload(std::vector<float>(d.rstd.begin(), d.rstd.end()));
  dzdz.upload(std::vector<float>(d.zdz.begin(), d.zdz.end()));
  std::vector<uint16_t> const dx_in_bits =
      c.with_dx_in ? coda::test::pad_rows(to_bits(d.dx_in, kDt), c.M, c.N, ld, kPoison16) : std::vector<uint16_t>{};
  coda_tensor tdz = strided_tensor(ddz.get(), kDt, c.M, c.Nd, c.Nd);
  coda_tensor tw = strided_tensor(dw.get(), kDt, c.Nd, c.N, c.N);
  coda_tensor tx = strided_tensor(dx.get(), kDt, c.M, c.N, ld);
  coda_tensor tg = coda::test::device_tensor(dg.get(), kDt, {c.N});
  coda_tensor tr = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  coda_tensor tzdz = coda::test::device_tensor(dzdz.get(), CODA_FP32, {c.M});
  coda_tensor tdx_in = strided_tensor(ddx_in.get(), kDt, c.M, c.N, ld);
  DeviceBuffer& out_buf = c.in_place ? ddx_in : ddx;
  coda_tensor tdx = strided_tensor(out_buf.get(), kDt, c.M, c.N, ld);
  coda_tensor ta = strided_tensor(da.get(), kDt, c.M, c.N, ld);
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
    if (rep == 0) {
      dx_first = dxp, a_first = ap, dg_first = dgv;
    } else {
      EXPECT_TRUE(dx_first == dxp) << "two runs differ (dx)";
      EXPECT_TRUE(a_first == ap) << "two runs differ (a)";
      EXPECT_EQ(std::memcmp(dg_first.data(), dgv.data(), dgv.size() * 4), 0) << "two runs differ (dgamma)";
    }
  }
  Matrix const dxm = matrix_from_bits(coda::test::unpad_rows(dx_first, c.M, c.N, ld).data(), c.M, c.N, kDt);
  Matrix const am = matrix_from_bits(coda::test::unpad_rows(a_first, c.M, c.N, ld).data(), c.M, c.N, kDt);
  Vector const dgm = vector_from_float(dg_first.data(), c.N);
  EXPECT_TRUE(Accepted("B2 " + c.name() + " dx", acceptance(dxm, d.unf.dx, d.ref.dx), print));
  EXPECT_TRUE(Accepted("B2 " + c.name() + " a", acceptance(am, d.unf.a, d.ref.a), print));
  EXPECT_TRUE(Accepted("B2 " + c.name() + " dgamma", acceptance(dgm, d.unf.dgamma, d.ref.dgamma), print));
}

TEST(FusedBackward, LinearResidualRmsnormBwd) {
  CODA_REQUIRE_SM90();
  std::vector<B2Case> const cases = {
      {1, 264, 264, 1.0, false, false},      {7, 8, 16, 0.5, true, false},
      {1000, 264, 264, 1.0, true, true},     {1000, 2048, 512, 0.5, true, false},
      {4097, 264, 136, 1.0, false, false},   {1000, 3072, 2048, 1.0, true, true},  // llama3-1B qkv dgrad width
  };
  uint64_t seed = 50;
  for (B2Case const& c : cases) check_b2(make_b2(c, seed++), c.M >= 1000);
}

TEST(FusedBackwardSanitize, LinearResidualRmsnormBwdSmall) {
  CODA_REQUIRE_SM90();
  check_b2(make_b2({264, 200, 136, 0.5, true, true}, 60), false);
  check_b2(make_b2({130, 64, 264, 1.0, false, false}, 61), false);
}

}  // namespace
