// GPU tests of the RMSNorm kernels outside the GEMMs: coda_rmsnorm_rstd (final reduce of linear_residual_rmsnorm's
// partial sums of squares) and coda_rmsnorm_prepare (first-layer h = x * gamma and rstd), against the float64 reference
// with the acceptance rule (MATH.md, last section), plus determinism, untouched row padding, the scalar path (gamma not
// 16-byte aligned) and M == 0.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cmath>
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
using coda::test::dtype_name;
using coda::test::kPoison16;
using coda::test::strided_tensor;

// ---- coda_rmsnorm_prepare -----------------------------------------------------------------------------------------

struct PrepareCase {
  coda_dtype dt = CODA_BF16;
  int64_t M = 7, N = 264;
  int64_t x_pad = 0, h_pad = 0;  // extra elements per row (multiples of 8)
  bool misaligned_gamma = false;  // gamma 2 bytes past a 16-byte boundary: the scalar path
  double x_std = 1.0;
  float eps = 1e-5f;
  uint64_t seed = 1;
  bool print = false;

  std::string name() const {
    return std::string(dtype_name(dt)) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
           (x_pad || h_pad ? " padded" : "") + (misaligned_gamma ? " gamma-misaligned" : "");
  }
};

struct PrepareOut {
  std::vector<uint16_t> h;  // dense [M, N]
  std::vector<float> rstd;
};

void run_prepare(PrepareCase const& c, Matrix const& x, Vector const& gamma, PrepareOut& out) {
  int64_t const ldx = c.N + c.x_pad, ldh = c.N + c.h_pad;
  DeviceBuffer dx(static_cast<size_t>(c.M * ldx) * 2 + 16), dg(static_cast<size_t>(c.N) * 2 + 16);
  DeviceBuffer dh(static_cast<size_t>(c.M * ldh) * 2 + 16), dr(static_cast<size_t>(c.M) * 4 + 16);
  // x padding holds NaN: a kernel that read it would produce a NaN rstd.
  dx.upload(coda::test::pad_rows(to_bits(x, c.dt), c.M, c.N, ldx, kPoison16));
  std::vector<uint16_t> gbits = to_bits(gamma, c.dt);
  if (c.misaligned_gamma) gbits.insert(gbits.begin(), uint16_t{0x7777});
  dg.upload(gbits);
  dh.poison();
  dr.poison();
  void* gptr = static_cast<char*>(dg.get()) + (c.misaligned_gamma ? 2 : 0);
  coda_tensor tx = strided_tensor(dx.get(), c.dt, c.M, c.N, ldx);
  coda_tensor tg = coda::test::device_tensor(gptr, c.dt, {c.N});
  coda_tensor th = strided_tensor(dh.get(), c.dt, c.M, c.N, ldh);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  ASSERT_EQ(coda_rmsnorm_prepare(&tx, &tg, c.eps, &th, &ts, nullptr), CODA_SUCCESS) << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> const hp = dh.download<uint16_t>(static_cast<size_t>(c.M * ldh));
  EXPECT_TRUE(coda::test::padding_untouched(hp, c.M, c.N, ldh, kPoison16)) << "h_out row padding was written";
  out.h = coda::test::unpad_rows(hp, c.M, c.N, ldh);
  out.rstd = dr.download<float>(static_cast<size_t>(c.M));
}

void check_prepare(PrepareCase const& c) {
  SCOPED_TRACE(c.name());
  Rng rng(c.seed);
  Matrix const x = round_to(random_normal(c.M, c.N, 0.0, c.x_std, rng), c.dt);
  Vector const gamma = round_to(random_gamma(c.N, rng), c.dt);
  PrepareOut out;
  ASSERT_NO_FATAL_FAILURE(run_prepare(c, x, gamma, out));
  RmsnormPrepare const ref = rmsnorm_prepare(x, gamma, c.eps);
  RmsnormPrepare const unf = rmsnorm_prepare_unfused(x, gamma, c.eps, c.dt);
  Matrix const h = matrix_from_bits(out.h.data(), c.M, c.N, c.dt);
  Vector const rstd = vector_from_float(out.rstd.data(), c.M);
  EXPECT_TRUE(Accepted(c.name() + " h", acceptance(h, unf.h, ref.h), c.print));
  EXPECT_TRUE(Accepted(c.name() + " rstd", acceptance(rstd, unf.rstd, ref.rstd), c.print));
  // h = R(x * gamma) with the product exact in fp32: bit-identical to the unfused elementwise multiply.
  EXPECT_EQ(max_abs_diff(h, unf.h), 0.0);
}

TEST(KernelsNorm, PrepareShapesBf16) {
  CODA_REQUIRE_SM90();
  struct S {
    int64_t M, N;
  };
  // Row widths that give row groups of 32..512 threads, several rows per block, groups that do not divide 256
  // (3072: 96 threads, 5120: 160, 7168: 224) and an odd multiple of 8 vectors (8200).
  for (S s : {S{1, 8}, S{7, 24}, S{1000, 264}, S{4097, 2048}, S{1000, 3072}, S{33, 5120}, S{33, 7168}, S{7, 8192},
              S{1000, 8200}, S{3, 16384}, S{1, 8192}}) {
    PrepareCase c;
    c.M = s.M;
    c.N = s.N;
    c.seed = static_cast<uint64_t>(s.M * 131 + s.N);
    c.print = s.M == 4097 || s.N == 16384;
    check_prepare(c);
  }
}

TEST(KernelsNorm, PrepareShapesFp16) {
  CODA_REQUIRE_SM90();
  struct S {
    int64_t M, N;
  };
  for (S s : {S{1, 8}, S{7, 264}, S{1000, 2048}, S{4097, 8192}}) {
    PrepareCase c;
    c.dt = CODA_FP16;
    c.M = s.M;
    c.N = s.N;
    c.x_std = 4.0;  // residual-stream scale; the sum of squares stays fp32
    c.eps = 1e-6f;
    c.seed = static_cast<uint64_t>(s.M * 7 + s.N);
    c.print = s.M == 4097;
    check_prepare(c);
  }
}

TEST(KernelsNorm, PrepareLarge) {
  CODA_REQUIRE_SM90();
  PrepareCase c;
  c.M = 16384;
  c.N = 2048;
  c.seed = 99;
  c.print = true;
  check_prepare(c);
}

TEST(KernelsNorm, PreparePaddedRows) {
  CODA_REQUIRE_SM90();
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    PrepareCase c;
    c.dt = dt;
    c.M = 1000;
    c.N = 264;
    c.x_pad = 8;
    c.h_pad = 24;
    c.print = true;
    check_prepare(c);
    c.M = 7;
    c.N = 8192;
    c.x_pad = 64;
    c.h_pad = 8;
    check_prepare(c);
  }
}

TEST(KernelsNorm, PrepareMisalignedGammaScalarPath) {
  CODA_REQUIRE_SM90();
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    for (int64_t n : {int64_t{8}, int64_t{264}, int64_t{776}, int64_t{2048}}) {  // 264, 776: 96- and 224-thread groups
      PrepareCase c;
      c.dt = dt;
      c.M = n == 2048 ? 1000 : 7;
      c.N = n;
      c.misaligned_gamma = true;
      c.x_pad = 8;
      c.print = n == 2048;
      check_prepare(c);
    }
  }
}

TEST(KernelsNorm, PrepareDeterministic) {
  CODA_REQUIRE_SM90();
  PrepareCase c;
  c.M = 4097;
  c.N = 8192;
  Rng rng(5);
  Matrix const x = round_to(random_normal(c.M, c.N, 0.0, 1.0, rng), c.dt);
  Vector const gamma = round_to(random_gamma(c.N, rng), c.dt);
  PrepareOut a, b;
  ASSERT_NO_FATAL_FAILURE(run_prepare(c, x, gamma, a));
  ASSERT_NO_FATAL_FAILURE(run_prepare(c, x, gamma, b));
  EXPECT_TRUE(a.h == b.h);
  EXPECT_EQ(std::memcmp(a.rstd.data(), b.rstd.data(), a.rstd.size() * sizeof(float)), 0);
}

TEST(KernelsNorm, PrepareEmptyIsNoOp) {
  CODA_REQUIRE_SM90();
  DeviceBuffer dx(256), dg(256), dh(256), dr(256);
  dh.poison();
  dr.poison();
  coda_tensor tx = strided_tensor(dx.get(), CODA_BF16, 0, 64, 64);
  coda_tensor tg = coda::test::device_tensor(dg.get(), CODA_BF16, {64});
  coda_tensor th = strided_tensor(dh.get(), CODA_BF16, 0, 64, 64);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {0});
  ASSERT_EQ(coda_rmsnorm_prepare(&tx, &tg, 1e-5f, &th, &ts, nullptr), CODA_SUCCESS) << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  for (uint16_t v : dh.download<uint16_t>(128)) ASSERT_EQ(v, kPoison16);
}

// ---- coda_rmsnorm_rstd ----------------------------------------------------------------------------------------------

struct RstdCase {
  int64_t M = 7, N = 264, tile_n = 128;
  int64_t ld = 0;  // 0: M (dense); else the partials' row stride (>= M)
  float eps = 1e-5f;
  uint64_t seed = 1;
  bool print = false;

  std::string name() const {
    return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " tile=" + std::to_string(tile_n) +
           " ld=" + std::to_string(ld > 0 ? ld : M);
  }
};

// Partials as a linear_residual_rmsnorm epilogue produces them: per (row, N-tile) fp32 sums of squares of the
// stored bf16 x.
std::vector<float> tile_partials(Matrix const& x, int64_t tile_n, int64_t ld, float pad_value) {
  int64_t const T = (x.cols + tile_n - 1) / tile_n;
  std::vector<float> p(static_cast<size_t>(T * ld), pad_value);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t m = 0; m < x.rows; ++m) {
      float s = 0.0f;
      for (int64_t n = t * tile_n; n < std::min(x.cols, (t + 1) * tile_n); ++n) {
        float const v = static_cast<float>(x(m, n));
        s += v * v;
      }
      p[static_cast<size_t>(t * ld + m)] = s;
    }
  }
  return p;
}

void run_rstd(RstdCase const& c, std::vector<float> const& partials, int64_t T, std::vector<float>& rstd) {
  int64_t const ld = c.ld > 0 ? c.ld : c.M;
  DeviceBuffer dp(partials.size() * 4 + 16), dr(static_cast<size_t>(c.M) * 4 + 16);
  dp.upload(partials);
  dr.poison();
  coda_tensor tp{};
  tp.data = dp.get();
  tp.dtype = CODA_FP32;
  tp.rank = 2;
  tp.sizes[0] = T;
  tp.sizes[1] = c.M;
  tp.strides[0] = ld;
  tp.strides[1] = 1;
  tp.device = coda::test::current_device();
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  ASSERT_EQ(coda_rmsnorm_rstd(&tp, c.N, c.eps, &ts, nullptr), CODA_SUCCESS) << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  rstd = dr.download<float>(static_cast<size_t>(c.M));
}

void check_rstd(RstdCase const& c) {
  SCOPED_TRACE(c.name());
  Rng rng(c.seed);
  Matrix const x = round_to(random_residual(c.M, c.N, rng), CODA_BF16);
  int64_t const ld = c.ld > 0 ? c.ld : c.M;
  int64_t const T = (c.N + c.tile_n - 1) / c.tile_n;
  std::vector<float> const partials = tile_partials(x, c.tile_n, ld, std::nanf(""));  // NaN in the padding
  std::vector<float> rstd_f;
  ASSERT_NO_FATAL_FAILURE(run_rstd(c, partials, T, rstd_f));
  Vector const rstd = vector_from_float(rstd_f.data(), c.M);
  // End to end: rstd of the rows of x (float64) vs the unfused fp32 rstd of whole rows.
  Vector const ref = rmsnorm_rstd_rows(x, c.eps);
  Vector const unf = rmsnorm_prepare_unfused(x, Vector(static_cast<size_t>(c.N), 1.0), c.eps, CODA_BF16).rstd;
  EXPECT_TRUE(Accepted(c.name() + " rstd", acceptance(rstd, unf, ref), c.print));
  // The reduce itself: within a few fp32 ulps of the float64 reduce of the very partials given.
  Matrix pm(T, c.M);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t m = 0; m < c.M; ++m) pm(t, m) = partials[static_cast<size_t>(t * ld + m)];
  Vector const exact = rmsnorm_rstd(pm, c.N, c.eps);
  double worst = 0.0;
  for (int64_t m = 0; m < c.M; ++m) {
    double const e = std::fabs(rstd[static_cast<size_t>(m)] - exact[static_cast<size_t>(m)]) /
                     exact[static_cast<size_t>(m)];
    worst = std::isnan(e) ? e : std::max(worst, e);
  }
  EXPECT_LE(worst, 4.0 * T * 6e-8 + 2.4e-7) << "relative error vs the float64 reduce of the same partials";
  if (c.print) std::printf("[ INFO     ] %s: max relative error vs float64 reduce %.3g\n", c.name().c_str(), worst);
}

TEST(KernelsNorm, RstdShapes) {
  CODA_REQUIRE_SM90();
  std::vector<RstdCase> cases;
  auto add = [&](int64_t M, int64_t N, int64_t tile, int64_t ld, bool print) {
    RstdCase c;
    c.M = M;
    c.N = N;
    c.tile_n = tile;
    c.ld = ld;
    c.seed = static_cast<uint64_t>(M * 17 + N);
    c.print = print;
    cases.push_back(c);
  };
  add(1, 8, 128, 0, false);          // T = 1
  add(7, 264, 128, 0, false);        // T = 3, partial last tile
  add(7, 264, 128, 256, false);      // padded rows (workspace layout: M rounded up to 256)
  add(1000, 264, 64, 0, false);      // T = 5
  add(1000, 2048, 128, 1024, true);  // T = 16, padded
  add(4097, 8192, 128, 4352, true);  // T = 64, padded
  add(4097, 24, 8, 0, false);        // T = 3 of width 8
  for (RstdCase const& c : cases) check_rstd(c);
}

TEST(KernelsNorm, RstdLarge) {
  CODA_REQUIRE_SM90();
  RstdCase c;
  c.M = 16384;
  c.N = 2048;
  c.tile_n = 128;
  c.ld = 16384;
  c.print = true;
  check_rstd(c);
}

TEST(KernelsNorm, RstdDeterministic) {
  CODA_REQUIRE_SM90();
  RstdCase c;
  c.M = 4097;
  c.N = 8192;
  Rng rng(3);
  Matrix const x = round_to(random_residual(c.M, c.N, rng), CODA_BF16);
  std::vector<float> const partials = tile_partials(x, 128, c.M, 0.0f);
  std::vector<float> a, b;
  ASSERT_NO_FATAL_FAILURE(run_rstd(c, partials, 64, a));
  ASSERT_NO_FATAL_FAILURE(run_rstd(c, partials, 64, b));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(KernelsNorm, RstdEmptyIsNoOp) {
  CODA_REQUIRE_SM90();
  DeviceBuffer dp(256), dr(256);
  dr.poison();
  coda_tensor tp = coda::test::device_tensor(dp.get(), CODA_FP32, {2, 0});
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {0});
  ASSERT_EQ(coda_rmsnorm_rstd(&tp, 128, 1e-5f, &ts, nullptr), CODA_SUCCESS) << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  for (float v : dr.download<float>(64)) ASSERT_TRUE(std::isnan(v));
}

// ---- compute-sanitizer targets (small and quick) ---------------------------------------------------------------

TEST(KernelsSanitize, RmsnormPrepareSmall) {
  CODA_REQUIRE_SM90();
  PrepareCase c;
  c.M = 7;
  c.N = 264;
  c.x_pad = 8;
  c.h_pad = 16;
  check_prepare(c);  // vector path, several rows per block
  c.N = 4096;
  c.M = 3;
  check_prepare(c);  // several warps per row
  c.N = 3072;
  c.M = 5;
  check_prepare(c);  // 96-thread row groups, two per block
  c.misaligned_gamma = true;
  c.dt = CODA_FP16;
  check_prepare(c);  // scalar path
}

TEST(KernelsSanitize, RmsnormRstdSmall) {
  CODA_REQUIRE_SM90();
  RstdCase c;
  c.M = 300;
  c.N = 264;
  c.ld = 512;
  check_rstd(c);
}

}  // namespace
