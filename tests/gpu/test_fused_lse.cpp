// GPU tests of coda_linear_rowscale_lse (LM-head logits + online log-sum-exp in the GEMM epilogue), against the
// float64 reference with the acceptance rule (MATH.md, last section) for lse, target_logit and, when stored, the
// logits. Both kernels (logits stored, and D = void) run with the config pinned through CODA_OP_CONFIG and on the
// default path. Outputs and the workspace are poisoned (NaN) before every run, logits rows carry poisoned padding
// that must stay untouched, and every call runs twice and must be bit-identical.
// FusedLse.NodePartials is the unit test of the OnlineLse EVT node: it reads the raw per-(row, N-tile) partials
// back from the workspace and compares them with the node's host reference (epilogue/online_lse_ref.hpp).
// `FusedLseSanitize.*` is the small case for compute-sanitizer. Every test skips without an sm_90 GPU.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "epilogue/online_lse_ref.hpp"
#include "gpu/fused_test_util.hpp"
#include "gpu/gpu_util.hpp"
#include "gpu/kernel_test_util.hpp"
#include "ops/linear_rowscale_lse/kernels.hpp"
#include "reference/reference.hpp"

namespace {

using namespace coda::ref;
using coda::test::Accepted;
using coda::test::bytes16;
using coda::test::config_name;
using coda::test::DeviceBuffer;
using coda::test::kPoison16;
using coda::test::PinConfig;
using coda::test::strided_tensor;

coda_dtype g_dt = CODA_BF16;  // bf16, or fp16 inside a UseFp16 scope
constexpr int64_t kPad = 8;            // extra (poisoned) elements per logits row
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;  // what DeviceBuffer::poison leaves in an fp32 word (a NaN)


struct LseCase {
  int64_t M, V, K;
  double softcap = 0.0;
  int64_t ignore_index = -100;
  double ignore_fraction = 0.1;
  bool targets64 = true;
  std::string name() const {
    return "M=" + std::to_string(M) + " V=" + std::to_string(V) + " K=" + std::to_string(K) +
           " softcap=" + std::to_string(static_cast<int>(softcap)) + " ignore=" + std::to_string(ignore_index) +
           (targets64 ? " int64" : " int32");
  }
};

struct LseData {
  LseCase c;
  std::vector<uint16_t> h_bits, w_bits;
  Matrix h, w;
  Vector rstd;
  Targets targets;
  Lse ref, unf;  // ref.logits / unf.logits: raw logits; capped dropped (memory on the 128k-vocab case)
  Matrix capped;  // float64 reference of the node's input (kept only when asked for)
  int64_t confident_rows = 0;  // rows make_confident_rows made dominant (confident_logit > 0)
};

/// Reference and unfused linear_rowscale_lse over row chunks on several threads (rows are independent; the float64 GEMM
/// is the cost on the large-vocabulary shapes). Each chunk copies w twice inside the unfused pipeline, so at most 8.
void compute_refs(LseData& d, bool keep_capped) {
  int64_t const M = d.c.M, V = d.c.V;
  int64_t const threads = std::max<int64_t>(1, std::min<int64_t>({8, M, std::thread::hardware_concurrency()}));
  int64_t const chunk = (M + threads - 1) / threads;
  std::vector<Lse> refs(static_cast<size_t>(threads)), unfs(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int64_t i = 0; i < threads; ++i) {
    int64_t const b = i * chunk, e = std::min(M, b + chunk);
    if (b >= e) continue;
    pool.emplace_back([&, i, b, e] {
      Matrix hc(e - b, d.h.cols);
      std::copy(d.h.row(b), d.h.row(b) + (e - b) * d.h.cols, hc.data.begin());
      Vector const rc(d.rstd.begin() + b, d.rstd.begin() + e);
      Targets const tc(d.targets.begin() + b, d.targets.begin() + e);
      refs[static_cast<size_t>(i)] = linear_rowscale_lse(hc, d.w, rc, tc, d.c.softcap, d.c.ignore_index);
      unfs[static_cast<size_t>(i)] =
          linear_rowscale_lse_unfused(hc, d.w, rc, tc, d.c.softcap, d.c.ignore_index, g_dt);
    });
  }
  for (auto& t : pool) t.join();
  auto merge = [&](std::vector<Lse>& parts, Lse& out, Matrix* capped) {
    out.logits = Matrix(M, V);
    if (capped != nullptr) *capped = Matrix(M, V);
    out.lse.clear();
    out.target_logit.clear();
    int64_t row = 0;
    for (Lse& p : parts) {
      if (p.logits.rows == 0) continue;
      std::copy(p.logits.data.begin(), p.logits.data.end(), out.logits.row(row));
      if (capped != nullptr) std::copy(p.capped.data.begin(), p.capped.data.end(), capped->row(row));
      out.lse.insert(out.lse.end(), p.lse.begin(), p.lse.end());
      out.target_logit.insert(out.target_logit.end(), p.target_logit.begin(), p.target_logit.end());
      row += p.logits.rows;
      p = Lse{};
    }
  };
  merge(refs, d.ref, keep_capped ? &d.capped : nullptr);
  merge(unfs, d.unf, nullptr);
}

/// Inputs as linear_rowscale's tests (LM-head scale): h ~ N(0, 4^2) (x * gamma of the residual stream),
/// w ~ N(0, 0.02^2), rstd around 0.25: logits of std ~0.9 at K = 2048. Targets uniform, `ignore_fraction` of them
/// ignore_index, and rows 0 / 1 forced to the first / last column. confident_logit > 0: every 4th row from row 2 gets
/// a dominant target logit of about that size (make_confident_rows).
LseData make_lse(LseCase const& c, uint64_t seed, bool keep_capped = false, double confident_logit = 0.0) {
  LseData d;
  d.c = c;
  d.h_bits = coda::test::normal_bits(c.M * c.K, 0.0, 4.0, g_dt, seed * 3 + 1);
  d.w_bits = coda::test::normal_bits(c.V * c.K, 0.0, 0.02, g_dt, seed * 3 + 2);
  d.h = matrix_from_bits(d.h_bits.data(), c.M, c.K, g_dt);
  d.w = matrix_from_bits(d.w_bits.data(), c.V, c.K, g_dt);
  Rng rng(seed);
  d.rstd = random_normal(1, c.M, 0.25, 0.05, rng).data;
  for (double& r : d.rstd) r = round_to(std::fabs(r) + 0.05, CODA_FP32);
  d.targets = random_targets(c.M, c.V, rng, c.ignore_fraction, c.ignore_index);
  if (c.M > 0 && c.ignore_fraction < 1.0) d.targets[0] = 0;
  if (c.M > 1 && c.ignore_fraction < 1.0) d.targets[1] = c.V - 1;
  if (confident_logit > 0) {
    d.confident_rows = static_cast<int64_t>(
        coda::test::make_confident_rows(d.w, d.h, d.rstd, d.targets, 2, 4, confident_logit, g_dt).size());
    d.w_bits = to_bits(d.w, g_dt);
  }
  compute_refs(d, keep_capped);
  return d;
}

struct LseOut {
  std::vector<float> lse, target_logit;
  std::vector<uint16_t> logits;  // dense [M, V] (store_logits only)
  std::vector<float> workspace;  // the raw workspace after the first run
};

/// Runs linear_rowscale_lse twice (outputs and workspace poisoned before each run); checks padding and run-to-run bits.
void run_lse(LseData const& d, char const* config, bool store_logits, LseOut& out) {
  LseCase const& c = d.c;
  int64_t const ld = c.V + kPad;
  DeviceBuffer dh(bytes16(c.M, c.K)), dw(bytes16(c.V, c.K)), dr(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer dt(static_cast<size_t>(c.M) * 8 + 16), dlse(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer dtl(static_cast<size_t>(c.M) * 4 + 16), dlog(store_logits ? bytes16(c.M, ld) : 16);
  size_t const wsb = coda_linear_rowscale_lse_workspace_size(c.M, c.V);
  DeviceBuffer dws(wsb);
  dh.upload(d.h_bits);
  dw.upload(d.w_bits);
  dr.upload(std::vector<float>(d.rstd.begin(), d.rstd.end()));
  if (c.targets64) {
    dt.upload(d.targets);
  } else {
    dt.upload(std::vector<int32_t>(d.targets.begin(), d.targets.end()));
  }
  coda_tensor th = strided_tensor(dh.get(), g_dt, c.M, c.K, c.K);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, c.V, c.K, c.K);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  coda_tensor tt = coda::test::device_tensor(dt.get(), c.targets64 ? CODA_INT64 : CODA_INT32, {c.M});
  coda_tensor tlse = coda::test::device_tensor(dlse.get(), CODA_FP32, {c.M});
  coda_tensor ttl = coda::test::device_tensor(dtl.get(), CODA_FP32, {c.M});
  coda_tensor tlog = strided_tensor(dlog.get(), g_dt, c.M, c.V, ld);
  PinConfig const pin(config);
  LseOut first;
  for (int rep = 0; rep < 2; ++rep) {
    dlse.poison();
    dtl.poison();
    dlog.poison();
    dws.poison();
    ASSERT_EQ(coda_linear_rowscale_lse(&th, &tw, &ts, &tt, static_cast<float>(c.softcap), c.ignore_index, &tlse, &ttl,
                                       store_logits ? &tlog : nullptr, dws.get(), wsb, nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    LseOut o;
    o.lse = dlse.download<float>(static_cast<size_t>(c.M));
    o.target_logit = dtl.download<float>(static_cast<size_t>(c.M));
    if (store_logits) {
      std::vector<uint16_t> const lp = dlog.download<uint16_t>(static_cast<size_t>(c.M * ld));
      EXPECT_TRUE(coda::test::padding_untouched(lp, c.M, c.V, ld, kPoison16)) << "logits_out row padding was written";
      o.logits = coda::test::unpad_rows(lp, c.M, c.V, ld);
    }
    if (rep == 0) {
      o.workspace = dws.download<float>(wsb / sizeof(float));
      first = std::move(o);
    } else {
      EXPECT_EQ(std::memcmp(first.lse.data(), o.lse.data(), o.lse.size() * sizeof(float)), 0)
          << "two runs differ (lse)";
      EXPECT_EQ(std::memcmp(first.target_logit.data(), o.target_logit.data(), o.target_logit.size() * sizeof(float)),
                0)
          << "two runs differ (target_logit)";
      EXPECT_TRUE(first.logits == o.logits) << "two runs differ (logits)";
    }
  }
  out = std::move(first);
}

void check_lse(LseData const& d, char const* config, bool store_logits, bool print) {
  std::string const what =
      std::string("linear_rowscale_lse ") + coda::test::dtype_name(g_dt) + " " + d.c.name() + " " +
      config_name(config) + (store_logits ? " +logits" : " no-logits");
  SCOPED_TRACE(what);
  LseOut out;
  ASSERT_NO_FATAL_FAILURE(run_lse(d, config, store_logits, out));
  Vector const lse(out.lse.begin(), out.lse.end());
  Vector const tl(out.target_logit.begin(), out.target_logit.end());
  EXPECT_TRUE(Accepted(what + " lse", acceptance(lse, d.unf.lse, d.ref.lse), print));
  EXPECT_TRUE(Accepted(what + " target_logit", acceptance(tl, d.unf.target_logit, d.ref.target_logit), print));
  if (store_logits) {
    Matrix const lg = matrix_from_bits(out.logits.data(), d.c.M, d.c.V, g_dt);
    EXPECT_TRUE(Accepted(what + " logits", acceptance(lg, d.unf.logits, d.ref.logits), print));
  }
}

/// Every config of the current dtype and both kernels (the logits kernel only when V is a multiple of 8: TMA rule
/// of logits_out).
void check_all(LseData const& d, bool print) {
  for (char const* config : coda::test::fused_configs(g_dt, "linear_rowscale_lse")) {
    check_lse(d, config, false, print);
    if (d.c.V % 8 == 0) check_lse(d, config, true, print);
  }
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- tests ---------------------------------------------------------------------------------------------------------

TEST(FusedLse, Shapes) {
  CODA_REQUIRE_SM90();
  std::vector<LseCase> const cases = {
      {1, 1000, 520, 0.0, -100, 0.0, true},
      {1, 1000, 520, 30.0, -100, 0.0, false},
      {7, 264, 8, 0.0, -100, 0.2, false},
      {1000, 1000, 520, 0.0, -100, 0.1, true},
      {1000, 1000, 520, 30.0, -100, 0.1, false},
      {1000, 1000, 520, 30.0, 5, 0.1, true},   // ignore_index inside [0, V)
      {1000, 1003, 520, 0.0, -100, 0.1, true}, // V not a multiple of 8: the no-logits kernel only
      {300, 8, 16, 0.0, -100, 0.1, true},      // a single, mostly empty N tile
      {129, 257, 64, 30.0, -100, 0.1, false},  // one row and one column past a tile
  };
  for (LseCase const& c : cases) {
    LseData const d = make_lse(c, static_cast<uint64_t>(c.M * 1009 + c.V * 31 + c.K + (c.targets64 ? 7 : 0)));
    check_all(d, c.M >= 1000);
  }
}

TEST(FusedLse, AllRowsIgnored) {
  CODA_REQUIRE_SM90();
  for (int64_t ignore : {int64_t{-100}, int64_t{3}}) {
    LseCase const c{200, 1000, 64, 30.0, ignore, 1.0, ignore > 0};
    LseData const d = make_lse(c, 77 + static_cast<uint64_t>(ignore + 100));
    check_all(d, false);
  }
}

TEST(FusedLse, Vocab32k) {
  CODA_REQUIRE_SM90();
  for (double cap : {0.0, 30.0}) {
    LseCase const c{100, 32000, 2048, cap, -100, 0.1, cap > 0};
    LseData const d = make_lse(c, 32000 + static_cast<uint64_t>(cap));
    check_all(d, true);
  }
}

TEST(FusedLse, Vocab128kLarge) {
  CODA_REQUIRE_SM90();
  LseCase const c{256, 128256, 2048, 30.0, -100, 0.1, true};
  LseData const d = make_lse(c, 128256);
  check_all(d, true);
}

// K = 8192 (the llama3-70B LM head's reduction) on every config, with and without stored logits.
TEST(FusedLse, LongK) {
  CODA_REQUIRE_SM90();
  LseCase const c{300, 1000, 8192, 30.0, -100, 0.1, true};
  LseData const d = make_lse(c, 8192);
  check_all(d, false);
}

// A target outside [0, V) that is not ignore_index: that row's lse and target logit are NaN (no host sync); every
// other row is unaffected.
TEST(FusedLse, BadTargetIsNaN) {
  CODA_REQUIRE_SM90();
  LseCase const c{40, 1000, 64, 0.0, -100, 0.1, true};
  LseData d = make_lse(c, 4040);  // references computed with valid targets
  d.targets[3] = c.V;
  d.targets[5] = -1;
  for (bool store : {false, true}) {
    SCOPED_TRACE(store ? "+logits" : "no-logits");
    LseOut out;
    ASSERT_NO_FATAL_FAILURE(run_lse(d, nullptr, store, out));
    Vector lse(out.lse.begin(), out.lse.end()), tl(out.target_logit.begin(), out.target_logit.end());
    for (int64_t m : {3, 5}) {
      EXPECT_TRUE(std::isnan(lse[static_cast<size_t>(m)])) << "row " << m;
      EXPECT_TRUE(std::isnan(tl[static_cast<size_t>(m)])) << "row " << m;
    }
    // The other rows, against references whose bad rows are replaced by the references' values.
    for (int64_t m : {3, 5}) {
      lse[static_cast<size_t>(m)] = d.ref.lse[static_cast<size_t>(m)];
      tl[static_cast<size_t>(m)] = d.ref.target_logit[static_cast<size_t>(m)];
    }
    EXPECT_TRUE(Accepted("lse", acceptance(lse, d.unf.lse, d.ref.lse), false));
    EXPECT_TRUE(Accepted("target_logit", acceptance(tl, d.unf.target_logit, d.ref.target_logit), false));
  }
}

// Unit test of the OnlineLse node: the raw partials in the workspace against online_lse_reference on an awkward
// shape (M = 300: three M tiles, so the 2x1 cluster has a CTA entirely past M; V = 1000: the last N tile has 232
// real columns and 24 overhang columns that must not enter any state), softcap on, int32 targets with ignored rows.
TEST(FusedLse, NodePartials) {
  CODA_REQUIRE_SM90();
  LseCase const c{300, 1000, 200, 30.0, -100, 0.2, false};
  LseData const d = make_lse(c, 300, /*keep_capped=*/true);
  ASSERT_EQ(coda::ops::lse_workspace(c.M, c.V, coda::ops::kLseTileM, coda::ops::kLseTileN).bytes(),
            coda_linear_rowscale_lse_workspace_size(c.M, c.V));
  // Each compiled config with its own CTA tile (the partials are laid out for the kernel that ran).
  for (auto const& [config, tile_n] : {std::pair<char const*, int64_t>{"coop_128x256x64_c2x1", 256},
                                       std::pair<char const*, int64_t>{"pp_128x128x64_c2x1", 128}}) {
    SCOPED_TRACE(config);
    coda::ops::LseWorkspace const ws = coda::ops::lse_workspace(c.M, c.V, coda::ops::kLseTileM, tile_n);
    coda::epilogue::OnlineLseReference const r =
        coda::epilogue::online_lse_reference(d.capped.data, c.M, c.V, c.V, coda::ops::kLseTileM, tile_n, &d.targets);
    ASSERT_EQ(r.tiles, ws.tiles);
    ASSERT_EQ(r.m_pad, ws.m_pad);
    for (bool store : {false, true}) {
      SCOPED_TRACE(store ? "+logits" : "no-logits");
      LseOut out;
      ASSERT_NO_FATAL_FAILURE(run_lse(d, config, store, out));
      size_t const slot = ws.slot / sizeof(float);
      float const* pmax = out.workspace.data();
      float const* pse = pmax + slot;
      float const* psum = pse + slot;
      float const* ptgt = psum + slot;
      int64_t bad = 0;
      for (int64_t t = 0; t < ws.tiles; ++t) {
        int64_t const n0 = t * tile_n, n1 = std::min(c.V, n0 + tile_n);
        for (int64_t m = 0; m < ws.m_pad; ++m) {
          size_t const i = static_cast<size_t>(m + ws.m_pad * t);
          if (m >= c.M) {  // rows past M: never written
            bool const untouched = bits_of(pmax[i]) == kPoison32 && bits_of(pse[i]) == kPoison32 &&
                                   bits_of(psum[i]) == kPoison32 && bits_of(ptgt[i]) == kPoison32;
            if (!untouched && bad++ < 10) ADD_FAILURE() << "row " << m << " >= M written in tile " << t;
            continue;
          }
          double sum_abs = 0, vmax = 0;
          for (int64_t n = n0; n < n1; ++n) {
            sum_abs += std::fabs(d.capped(m, n));
            vmax = std::max(vmax, std::fabs(d.capped(m, n)));
          }
          // fp32 logits (K = 200 products summed in fp32), ex2.approx and fp32 sums of <= 64 terms per lane: 2e-5
          // relative is loose for that and tight for a masking bug (an overhang 0 entering sumexp moves it ~0.1 %+).
          double const tol_v = 2e-5 * (1.0 + vmax);
          auto near = [](double a, double b, double tol) { return std::fabs(a - b) <= tol; };
          bool ok = near(pmax[i], r.max[i], tol_v) && near(pse[i], r.sumexp[i], 2e-5 * r.sumexp[i]) &&
                    near(psum[i], r.sum[i], 2e-5 * (sum_abs + 1.0));
          if (r.target_written[i]) {
            ok = ok && near(ptgt[i], r.target[i], tol_v);
          } else {
            ok = ok && bits_of(ptgt[i]) == kPoison32;  // only the owning tile writes the target
          }
          if (!ok && bad++ < 10) {
            ADD_FAILURE() << "tile " << t << " row " << m << ": max " << pmax[i] << " vs " << r.max[i] << ", sumexp "
                          << pse[i] << " vs " << r.sumexp[i] << ", sum " << psum[i] << " vs " << r.sum[i]
                          << ", target " << ptgt[i] << " vs " << r.target[i] << " (written " << int(r.target_written[i])
                          << ")";
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

// Rows with a dominant target logit (~25, p_t ~ 1), softcap off and on: both kernels against float64.
TEST(FusedLse, ConfidentRows) {
  CODA_REQUIRE_SM90();
  for (double cap : {0.0, 30.0}) {
    LseCase const c{300, 1000, 256, cap, -100, 0.05, true};
    LseData const d = make_lse(c, 4100 + static_cast<uint64_t>(cap), false, 25.0);
    ASSERT_GE(d.confident_rows, c.M / 8) << "too few confident rows to test";
    check_all(d, false);
  }
}

TEST(FusedLse, PinnedOtherConfigIsAnError) {
  CODA_REQUIRE_SM90();
  LseCase const c{7, 16, 16, 0.0, -100, 0.0, true};
  DeviceBuffer dh(bytes16(7, 16)), dw(bytes16(16, 16)), dr(64), dt(64), dl(64), dtl(64);
  size_t const wsb = coda_linear_rowscale_lse_workspace_size(c.M, c.V);
  DeviceBuffer dws(wsb);
  coda_tensor th = strided_tensor(dh.get(), g_dt, 7, 16, 16), tw = strided_tensor(dw.get(), g_dt, 16, 16, 16);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {7});
  coda_tensor tt = coda::test::device_tensor(dt.get(), CODA_INT64, {7});
  coda_tensor tl = coda::test::device_tensor(dl.get(), CODA_FP32, {7});
  coda_tensor ttl = coda::test::device_tensor(dtl.get(), CODA_FP32, {7});
  PinConfig const pin("sk_128x256x64_c2x1");  // a plain-GEMM config, not compiled for linear_rowscale_lse
  EXPECT_EQ(coda_linear_rowscale_lse(&th, &tw, &ts, &tt, 0.0f, -100, &tl, &ttl, nullptr, dws.get(), wsb, nullptr),
            CODA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("CODA_OP_CONFIG"), std::string::npos) << coda_last_error();
}

TEST(FusedLse, EmptyM) {
  CODA_REQUIRE_SM90();
  DeviceBuffer dh(4096), dw(4096), dr(64), dt(64), dl(64), dtl(64);
  coda_tensor th = strided_tensor(dh.get(), g_dt, 0, 16, 16), tw = strided_tensor(dw.get(), g_dt, 16, 16, 16);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {0});
  coda_tensor tt = coda::test::device_tensor(dt.get(), CODA_INT32, {0});
  coda_tensor tl = coda::test::device_tensor(dl.get(), CODA_FP32, {0});
  coda_tensor ttl = coda::test::device_tensor(dtl.get(), CODA_FP32, {0});
  EXPECT_EQ(coda_linear_rowscale_lse_workspace_size(0, 16), size_t{0});
  EXPECT_EQ(coda_linear_rowscale_lse(&th, &tw, &ts, &tt, 0.0f, -100, &tl, &ttl, nullptr, nullptr, 0, nullptr),
            CODA_SUCCESS)
      << coda_last_error();
}

// Small case for compute-sanitizer (tools/gpu-check --sanitize): both kernels, ragged M and V tiles, softcap on.
TEST(FusedLseSanitize, Small) {
  CODA_REQUIRE_SM90();
  LseData const d = make_lse({264, 1000, 200, 30.0, -100, 0.2, false}, 13);
  check_all(d, false);
}

// fp16: the pingpong kernels, both variants.
TEST(FusedLseFp16, Shapes) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  for (LseCase const& c : {LseCase{7, 264, 8, 0.0, -100, 0.2, false}, LseCase{1000, 1000, 520, 30.0, 5, 0.1, true},
                           LseCase{100, 32000, 2048, 0.0, -100, 0.1, false}}) {
    LseData const d = make_lse(c, static_cast<uint64_t>(c.M * 1013 + c.V * 29 + c.K));
    check_all(d, false);
  }
}

TEST(FusedLseSanitize, Fp16Small) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  LseData const d = make_lse({264, 1000, 200, 30.0, -100, 0.2, false}, 14);
  check_all(d, false);
}

}  // namespace
