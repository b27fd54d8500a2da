// GPU tests of the first fused forward ops (issue 4): coda_linear_rowscale and coda_linear_residual_rmsnorm,
// against the float64 reference with the acceptance rule (MATH.md, last section) for every output (y; x, h, rstd).
// Every compiled config is forced through CODA_OP_CONFIG, and the default (heuristic) path runs with it unset.
// Outputs have poisoned (NaN) row padding that must stay untouched, the linear_residual_rmsnorm workspace is poisoned
// (every partial the rstd kernel reads must have been written), every call runs twice and must be bit-identical, and
// linear_residual_rmsnorm runs in place (x_out aliasing residual). `FusedForwardSanitize.*` is the small case for
// compute-sanitizer.
// Every test skips without an sm_90 GPU.
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
using coda::test::DeviceBuffer;
using coda::test::kPoison16;
using coda::test::strided_tensor;
using coda::test::bytes16;
using coda::test::config_name;
using coda::test::PinConfig;
using coda::test::Shape;

coda_dtype g_dt = CODA_BF16;  // bf16, or fp16 inside a UseFp16 scope
constexpr int64_t kPad = 8;  // extra (poisoned) elements per output row

// ---- coda_linear_rowscale -----------------------------------------------------------------------------------------

struct RowscaleData {
  Shape s;
  Matrix h, w;
  Vector rstd;
  Matrix ref, unf;
};

RowscaleData make_rowscale(Shape s, uint64_t seed) {
  RowscaleData d;
  d.s = s;
  Rng rng(seed);
  d.h = round_to(random_normal(s.M, s.K, 0.0, 4.0, rng), g_dt);  // x * gamma: residual-stream scale
  d.w = round_to(random_weight(s.N, s.K, rng), g_dt);
  d.rstd = random_normal(1, s.M, 0.25, 0.05, rng).data;
  for (double& r : d.rstd) r = round_to(std::fabs(r) + 0.05, CODA_FP32);
  d.ref = linear_rowscale(d.h, d.w, d.rstd);
  d.unf = linear_rowscale_unfused(d.h, d.w, d.rstd, g_dt);
  return d;
}

/// Runs linear_rowscale twice on poisoned output; returns the dense y of the first run (and checks the second is
/// identical).
void run_rowscale(RowscaleData const& d, char const* config, std::vector<uint16_t>& y_out) {
  Shape const s = d.s;
  int64_t const ldy = s.N + kPad;
  DeviceBuffer dh(bytes16(s.M, s.K)), dw(bytes16(s.N, s.K)), dr(static_cast<size_t>(s.M) * 4 + 16);
  DeviceBuffer dy(bytes16(s.M, ldy));
  dh.upload(to_bits(d.h, g_dt));
  dw.upload(to_bits(d.w, g_dt));
  std::vector<float> rstd_f(d.rstd.begin(), d.rstd.end());
  dr.upload(rstd_f);
  coda_tensor th = strided_tensor(dh.get(), g_dt, s.M, s.K, s.K);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, s.N, s.K, s.K);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {s.M});
  coda_tensor ty = strided_tensor(dy.get(), g_dt, s.M, s.N, ldy);
  PinConfig const pin(config);
  std::vector<uint16_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    dy.poison();
    ASSERT_EQ(coda_linear_rowscale(&th, &tw, &ts, &ty, nullptr, 0, nullptr), CODA_SUCCESS) << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> const yp = dy.download<uint16_t>(static_cast<size_t>(s.M * ldy));
    EXPECT_TRUE(coda::test::padding_untouched(yp, s.M, s.N, ldy, kPoison16)) << "y_out row padding was written";
    if (rep == 0) {
      first = yp;
    } else {
      EXPECT_TRUE(first == yp) << "two runs differ";
    }
  }
  y_out = coda::test::unpad_rows(first, s.M, s.N, ldy);
}

void check_rowscale(RowscaleData const& d, char const* config, bool print) {
  std::string const what =
      std::string("linear_rowscale ") + coda::test::dtype_name(g_dt) + " " + d.s.name() + " " + config_name(config);
  SCOPED_TRACE(what);
  std::vector<uint16_t> y;
  ASSERT_NO_FATAL_FAILURE(run_rowscale(d, config, y));
  Matrix const yc = matrix_from_bits(y.data(), d.s.M, d.s.N, g_dt);
  EXPECT_TRUE(Accepted(what + " y", acceptance(yc, d.unf, d.ref), print));
}

void rowscale_shapes(std::vector<Shape> const& shapes) {
  for (Shape const& s : shapes) {
    RowscaleData const d = make_rowscale(s, static_cast<uint64_t>(s.M * 1009 + s.N * 31 + s.K));
    for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale")) check_rowscale(d, config, s.M >= 1000);
  }
}

// ---- coda_linear_residual_rmsnorm --------------------------------------------------------------------------------

struct ResidualData {
  Shape s;
  Matrix a, w, residual;
  Vector gamma;
  float eps = 1e-5f;
  ResidualRmsnorm ref, unf;
};

ResidualData make_residual(Shape s, uint64_t seed) {
  ResidualData d;
  d.s = s;
  Rng rng(seed);
  d.a = round_to(random_activation(s.M, s.K, rng), g_dt);
  d.w = round_to(random_weight(s.N, s.K, rng), g_dt);
  d.residual = round_to(random_residual(s.M, s.N, rng), g_dt);
  d.gamma = round_to(random_gamma(s.N, rng), g_dt);
  d.ref = linear_residual_rmsnorm(d.a, d.w, d.residual, d.gamma, d.eps);
  d.unf = linear_residual_rmsnorm_unfused(d.a, d.w, d.residual, d.gamma, d.eps, g_dt);
  return d;
}

struct ResidualOut {
  std::vector<uint16_t> x, h;  // dense [M, N]
  std::vector<float> rstd;
};

/// Runs linear_residual_rmsnorm twice (outputs and workspace poisoned before each run); in_place: x_out is the
/// residual buffer (re-uploaded before each run).
void run_residual(ResidualData const& d, char const* config, bool in_place, ResidualOut& out) {
  Shape const s = d.s;
  int64_t const ld = s.N + kPad;  // x / residual / h row stride
  DeviceBuffer da(bytes16(s.M, s.K)), dw(bytes16(s.N, s.K)), dres(bytes16(s.M, ld)), dg(bytes16(1, s.N));
  DeviceBuffer dx(bytes16(s.M, ld)), dh(bytes16(s.M, ld)), ds(static_cast<size_t>(s.M) * 4 + 16);
  size_t const wsb = coda_linear_residual_rmsnorm_workspace_size(s.M, s.N);
  DeviceBuffer dws(wsb);
  da.upload(to_bits(d.a, g_dt));
  dw.upload(to_bits(d.w, g_dt));
  dg.upload(to_bits(d.gamma, g_dt));
  std::vector<uint16_t> const res_bits = coda::test::pad_rows(to_bits(d.residual, g_dt), s.M, s.N, ld, kPoison16);
  coda_tensor ta = strided_tensor(da.get(), g_dt, s.M, s.K, s.K);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, s.N, s.K, s.K);
  coda_tensor tr = strided_tensor(dres.get(), g_dt, s.M, s.N, ld);
  coda_tensor tg = coda::test::device_tensor(dg.get(), g_dt, {s.N});
  coda_tensor tx = in_place ? tr : strided_tensor(dx.get(), g_dt, s.M, s.N, ld);
  coda_tensor th = strided_tensor(dh.get(), g_dt, s.M, s.N, ld);
  coda_tensor ts = coda::test::device_tensor(ds.get(), CODA_FP32, {s.M});
  PinConfig const pin(config);
  ResidualOut first;
  for (int rep = 0; rep < 2; ++rep) {
    dres.upload(res_bits);
    dx.poison();
    dh.poison();
    ds.poison();
    dws.poison();
    ASSERT_EQ(coda_linear_residual_rmsnorm(&ta, &tw, &tr, &tg, d.eps, &tx, &th, &ts, dws.get(), wsb, nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    DeviceBuffer const& xbuf = in_place ? dres : dx;
    std::vector<uint16_t> const xp = xbuf.download<uint16_t>(static_cast<size_t>(s.M * ld));
    std::vector<uint16_t> const hp = dh.download<uint16_t>(static_cast<size_t>(s.M * ld));
    EXPECT_TRUE(coda::test::padding_untouched(xp, s.M, s.N, ld, kPoison16)) << "x_out row padding was written";
    EXPECT_TRUE(coda::test::padding_untouched(hp, s.M, s.N, ld, kPoison16)) << "h_out row padding was written";
    ResidualOut o;
    o.x = coda::test::unpad_rows(xp, s.M, s.N, ld);
    o.h = coda::test::unpad_rows(hp, s.M, s.N, ld);
    o.rstd = ds.download<float>(static_cast<size_t>(s.M));
    if (rep == 0) {
      first = o;
    } else {
      EXPECT_TRUE(first.x == o.x) << "two runs differ (x)";
      EXPECT_TRUE(first.h == o.h) << "two runs differ (h)";
      EXPECT_EQ(std::memcmp(first.rstd.data(), o.rstd.data(), o.rstd.size() * sizeof(float)), 0)
          << "two runs differ (rstd)";
    }
  }
  out = first;
}

void check_residual(ResidualData const& d, char const* config, bool in_place, bool print) {
  std::string const what =
      std::string("linear_residual_rmsnorm ") + coda::test::dtype_name(g_dt) + " " + d.s.name() + " " +
      config_name(config) + (in_place ? " in-place" : "");
  SCOPED_TRACE(what);
  ResidualOut out;
  ASSERT_NO_FATAL_FAILURE(run_residual(d, config, in_place, out));
  Matrix const x = matrix_from_bits(out.x.data(), d.s.M, d.s.N, g_dt);
  Matrix const h = matrix_from_bits(out.h.data(), d.s.M, d.s.N, g_dt);
  Vector const rstd = vector_from_float(out.rstd.data(), d.s.M);
  EXPECT_TRUE(Accepted(what + " x", acceptance(x, d.unf.x, d.ref.x), print));
  EXPECT_TRUE(Accepted(what + " h", acceptance(h, d.unf.h, d.ref.h), print));
  EXPECT_TRUE(Accepted(what + " rstd", acceptance(rstd, d.unf.rstd, d.ref.rstd), print));
}

void residual_shapes(std::vector<Shape> const& shapes) {
  for (Shape const& s : shapes) {
    ResidualData const d = make_residual(s, static_cast<uint64_t>(s.M * 7919 + s.N * 13 + s.K));
    for (char const* config : coda::test::fused_configs(g_dt, "linear_residual_rmsnorm")) check_residual(d, config, false, s.M >= 1000);
  }
}

// The small and medium shapes: M in {1, 7, 1000, 4097} x (N, K) in {(264, 264), (8, 16), (16, 8), (8, 8),
// (264, 8), (8, 264)} plus (2048, 2048) for M in {1, 7, 1000}. (4097, 2048, 2048) and the LLaMA shape are in the
// *Large tests (the float64 reference GEMM takes tens of seconds there).
std::vector<Shape> small_shapes() {
  std::vector<Shape> shapes;
  for (int64_t M : {1, 7, 1000, 4097}) {
    for (auto nk : {std::pair<int64_t, int64_t>{264, 264}, {8, 16}, {16, 8}, {8, 8}, {264, 8}, {8, 264}}) {
      shapes.push_back({M, nk.first, nk.second});
    }
    if (M != 4097) shapes.push_back({M, 2048, 2048});
  }
  return shapes;
}

std::vector<Shape> large_shapes() { return {{4097, 2048, 2048}, {4096, 2048, 2048}}; }

// ---- tests ---------------------------------------------------------------------------------------------------------

TEST(FusedForward, LinearRowscaleShapes) {
  CODA_REQUIRE_SM90();
  rowscale_shapes(small_shapes());
}

TEST(FusedForward, LinearRowscaleLarge) {
  CODA_REQUIRE_SM90();
  rowscale_shapes(large_shapes());
}

TEST(FusedForward, LinearResidualRmsnormShapes) {
  CODA_REQUIRE_SM90();
  residual_shapes(small_shapes());
}

TEST(FusedForward, LinearResidualRmsnormLarge) {
  CODA_REQUIRE_SM90();
  residual_shapes(large_shapes());
}

// The default path's shape rule (linear_residual_rmsnorm.cu): a down-projection (K > 2N) with K >= 16384 or
// M >= 4096 takes the cooperative 128x256 kernel, raster N, swizzle 8 (bf16); M = 129 with K = 14336 keeps the
// pingpong default. Every config is run too. Small N keeps the float64 reference cheap.
TEST(FusedForward, LinearResidualRmsnormLongK) {
  CODA_REQUIRE_SM90();
  residual_shapes({{129, 264, 16384}, {300, 520, 16392}, {129, 264, 14336}, {4100, 136, 400}});
}

TEST(FusedForward, LinearResidualRmsnormInPlace) {
  CODA_REQUIRE_SM90();
  for (Shape s : {Shape{7, 264, 264}, Shape{1000, 2048, 264}, Shape{4097, 264, 2048}}) {
    ResidualData const d = make_residual(s, static_cast<uint64_t>(s.M + s.N + s.K));
    for (char const* config : coda::test::fused_configs(g_dt, "linear_residual_rmsnorm")) check_residual(d, config, true, false);
  }
}

TEST(FusedForward, PinnedUnknownConfigIsAnError) {
  CODA_REQUIRE_SM90();
  DeviceBuffer dh(bytes16(7, 16)), dw(bytes16(16, 16)), dr(64), dy(bytes16(7, 16));
  coda_tensor th = strided_tensor(dh.get(), g_dt, 7, 16, 16);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, 16, 16, 16);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {7});
  coda_tensor ty = strided_tensor(dy.get(), g_dt, 7, 16, 16);
  PinConfig const pin("sk_128x256x64_c2x1");  // a plain-GEMM config the fused ops do not compile
  EXPECT_EQ(coda_linear_rowscale(&th, &tw, &ts, &ty, nullptr, 0, nullptr), CODA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("CODA_OP_CONFIG"), std::string::npos) << coda_last_error();
}

// The per-op form of CODA_OP_CONFIG: an entry applies to its op only, others keep their defaults; an unknown op
// name, a repeated one, a config the named op does not compile or a malformed entry is an error on any fused call,
// before anything is written.
TEST(FusedForward, PerOpPin) {
  CODA_REQUIRE_SM90();
  // A correct result through a per-op pin of linear_residual_rmsnorm (the cooperative kernel with knobs), and with
  // the pin naming another op only (linear_residual_rmsnorm then takes its default).
  ResidualData const d = make_residual({300, 264, 2048}, 4242);
  check_residual(d, "linear_residual_rmsnorm=coop_128x256x64_c2x1:raster=n,swizzle=8", false, false);
  check_residual(d,
                 "coda_linear_rowscale_swiglu=coop_128x256x64_c2x1:raster=m,swizzle=8;"
                 "linear_rowscale=pp_128x128x64_c2x1",
                 false, false);
  DeviceBuffer dh(bytes16(7, 16)), dw(bytes16(16, 16)), dr(64), dy(bytes16(7, 16));
  coda_tensor th = strided_tensor(dh.get(), g_dt, 7, 16, 16);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, 16, 16, 16);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {7});
  coda_tensor ty = strided_tensor(dy.get(), g_dt, 7, 16, 16);
  std::vector<uint16_t> const ones(7 * 16, 0x3f80);
  std::vector<float> const rstd(7, 1.0f);
  dh.upload(ones);
  dw.upload(std::vector<uint16_t>(16 * 16, 0x3f80));
  dr.upload(rstd);
  {  // an entry for another op only: linear_rowscale runs its default
    PinConfig const pin("linear_rowscale_swiglu=coop_128x256x64_c2x1:raster=m,swizzle=8");
    EXPECT_EQ(coda_linear_rowscale(&th, &tw, &ts, &ty, nullptr, 0, nullptr), CODA_SUCCESS) << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
  }
  struct Bad {
    char const* spec;
    char const* says;
  };
  // Every entry is checked whichever op runs (coda::ops::check_op_config): another op's bad entry is refused too.
  for (Bad const b : {Bad{"linear_rowscale=sk_128x256x64_c2x1", "compiles no config"},
                      Bad{"linear_rowscale_swiglu=sk_128x256x64_c2x1", "compiles no config"},
                      Bad{"linear_swiglu_bwd_zdz=pp_128x128x64_c2x1:raster=q", "CODA_OP_CONFIG"},
                      Bad{"linear_rowscal=pp_128x128x64_c2x1", "is not a fused op"},
                      Bad{"linear_rowscale=pp_128x128x64_c2x1;coda_linear_rowscale=pp_128x128x64_c2x1", "twice"},
                      Bad{"linear_rowscale_rope=pp_128x128x64_c2x1;junk", "is not <op>=<config>"},
                      Bad{"linear_rowscale=", "no config"},
                      Bad{"linear_rowscale=pp_128x128x64_c2x1:raster=q", "CODA_OP_CONFIG"}}) {
    SCOPED_TRACE(b.spec);
    PinConfig const pin(b.spec);
    dy.poison();
    EXPECT_EQ(coda_linear_rowscale(&th, &tw, &ts, &ty, nullptr, 0, nullptr), CODA_ERROR_INVALID_ARGUMENT);
    std::string const msg = coda_last_error();
    EXPECT_NE(msg.find("CODA_OP_CONFIG"), std::string::npos) << msg;
    EXPECT_NE(msg.find(b.says), std::string::npos) << msg;
    std::vector<uint16_t> const got = dy.download<uint16_t>(7 * 16);
    for (uint16_t v : got) ASSERT_EQ(v, kPoison16) << "an output was written";
  }
}

TEST(FusedForward, EmptyM) {
  CODA_REQUIRE_SM90();
  std::vector<DeviceBuffer> buf;
  for (int i = 0; i < 7; ++i) buf.emplace_back(size_t{1} << 12);
  coda_tensor a = strided_tensor(buf[0].get(), g_dt, 0, 16, 16), w = strided_tensor(buf[1].get(), g_dt, 16, 16, 16);
  coda_tensor r = strided_tensor(buf[2].get(), g_dt, 0, 16, 16), x = strided_tensor(buf[3].get(), g_dt, 0, 16, 16);
  coda_tensor h = strided_tensor(buf[4].get(), g_dt, 0, 16, 16);
  coda_tensor g = coda::test::device_tensor(buf[5].get(), g_dt, {16});
  coda_tensor s = coda::test::device_tensor(buf[6].get(), CODA_FP32, {0});
  EXPECT_EQ(coda_linear_rowscale(&a, &w, &s, &x, nullptr, 0, nullptr), CODA_SUCCESS) << coda_last_error();
  EXPECT_EQ(coda_linear_residual_rmsnorm(&a, &w, &r, &g, 1e-5f, &x, &h, &s, nullptr, 0, nullptr), CODA_SUCCESS)
      << coda_last_error();
}

// Small case of each op for compute-sanitizer (tools/gpu-check --sanitize): every config, ragged tiles.
TEST(FusedForwardSanitize, LinearRowscaleSmall) {
  CODA_REQUIRE_SM90();
  RowscaleData const d = make_rowscale({264, 136, 200}, 11);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale")) check_rowscale(d, config, false);
}

TEST(FusedForwardSanitize, LinearResidualRmsnormSmall) {
  CODA_REQUIRE_SM90();
  ResidualData const d = make_residual({264, 136, 200}, 12);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_residual_rmsnorm")) {
    check_residual(d, config, false, false);
    check_residual(d, config, true, false);
  }
}

// fp16: the pingpong kernels.
TEST(FusedForwardFp16, RowscaleAndResidualRmsnorm) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  std::vector<Shape> const shapes = {{1, 264, 264}, {7, 8, 16}, {1000, 264, 8}, {1000, 2048, 2048}, {4097, 264, 264}};
  rowscale_shapes(shapes);
  residual_shapes(shapes);
  ResidualData const d = make_residual({1000, 2048, 264}, 31);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_residual_rmsnorm")) check_residual(d, config, true, false);  // in place
}

TEST(FusedForwardSanitize, Fp16Small) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  RowscaleData const r = make_rowscale({264, 136, 200}, 32);
  ResidualData const x = make_residual({264, 136, 200}, 33);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale")) check_rowscale(r, config, false);
  for (char const* config : coda::test::fused_configs(g_dt, "linear_residual_rmsnorm")) {
    check_residual(x, config, false, false);
  }
}

}  // namespace
