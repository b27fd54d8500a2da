// GPU tests of coda_cross_entropy (loss, dlogits and zdz over stored logits), against the float64 reference
// with the acceptance rule (MATH.md, last section). Covers PROTOCOL.md's cross-entropy list: ignore_index rows
// (none, some, all; any ignore_index value, one inside [0,V) too), reduction mean/sum/none with scalar, per-row and
// NULL upstream gradients, label smoothing, z-loss, softcap, targets at 0 and V-1, dlogits in place over the logits,
// int32 and int64 targets, bf16 and fp16, padded rows; shapes M in {1, 7, 1000, 4097, 8192} with V up to 128256;
// out-of-range targets (NaN rows, the documented behaviour); determinism; M == 0.
//
// Huge shapes (M * V > kFullReferenceElements) are checked on a sample of rows against the float64 reference (the
// full reference would take minutes on the CPU), but every element of dlogits is checked to be written (not NaN),
// the per-row losses come from a second, loss-only call with reduction none, and the reduced loss is checked
// against the float64 sum of those per-row losses.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
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
using coda::test::scalar_tensor;
using coda::test::strided_tensor;

constexpr int64_t kFullReferenceElements = int64_t{12} << 20;  // ~12.6M logits: a second or two of reference

struct CeCase {
  coda_dtype dt = CODA_BF16;
  int64_t M = 7, V = 264;
  int64_t pad = 0;                // extra elements per logits row (multiple of 8)
  int64_t dpad = 0;               // extra elements per dlogits row (out of place only)
  coda_reduction reduction = CODA_REDUCTION_MEAN;
  float ls = 0.0f, z = 0.0f, cap = 0.0f;
  int64_t ignore_index = -100;
  double ignore_fraction = 0.0;   // rows whose target is set to ignore_index
  bool int64_targets = true;
  bool grad = true;               // dlogits requested
  bool zdz = true;                // zdz requested (needs grad)
  bool in_place = false;          // dlogits is the logits view
  bool upstream = true;           // grad_loss given (scalar for mean/sum, [M] for none); else NULL
  double logit_std = 2.0;
  int64_t hidden = 2048;
  uint64_t seed = 1;
  int sample_rows = 48;           // rows checked against the reference when M * V is huge
  bool print = false;

  std::string name() const {
    char const* red = reduction == CODA_REDUCTION_NONE ? "none" : reduction == CODA_REDUCTION_MEAN ? "mean" : "sum";
    std::string s = std::string(dtype_name(dt)) + " M=" + std::to_string(M) + " V=" + std::to_string(V) + " " + red;
    if (ls > 0) s += " ls=" + std::to_string(ls);
    if (z > 0) s += " z=" + std::to_string(z);
    if (cap > 0) s += " softcap=" + std::to_string(cap);
    s += " ignore=" + std::to_string(ignore_index) + "@" + std::to_string(ignore_fraction);
    s += int64_targets ? " t64" : " t32";
    if (!grad) s += " loss-only";
    if (grad && !zdz) s += " no-zdz";
    if (in_place) s += " in-place";
    if (!upstream) s += " grad_loss=NULL";
    if (pad || dpad) s += " padded";
    return s;
  }
  coda_ce_options options() const {
    coda_ce_options o = coda_ce_options_default();
    o.ignore_index = ignore_index;
    o.reduction = reduction;
    o.label_smoothing = ls;
    o.z_loss = z;
    o.softcap = cap;
    return o;
  }
  bool full_reference() const { return M * V <= kFullReferenceElements; }
};

struct CeInputs {
  std::vector<uint16_t> logits;  // dense [M, V] bits
  Targets targets;
  Vector grad_loss;  // empty (NULL), [1] or [M]
};

CeInputs make_inputs(CeCase const& c) {
  CeInputs in;
  in.logits = coda::test::normal_bits(c.M * c.V, 0.0, c.logit_std, c.dt, c.seed);
  Rng rng(c.seed + 1000);
  std::uniform_int_distribution<int64_t> col(0, c.V - 1);
  std::bernoulli_distribution ignore(c.ignore_fraction);
  in.targets.resize(static_cast<size_t>(c.M));
  for (int64_t m = 0; m < c.M; ++m) in.targets[static_cast<size_t>(m)] = ignore(rng) ? c.ignore_index : col(rng);
  // Targets at the row edges (rows 0 and 1 unless every row is ignored).
  if (c.ignore_fraction < 1.0) {
    in.targets[0] = 0;
    if (c.M > 1) in.targets[1] = c.V - 1;
  }
  if (c.upstream) {
    if (c.reduction == CODA_REDUCTION_NONE) {
      in.grad_loss = random_normal(1, c.M, 0.0, 1.0, rng).data;
    } else {
      in.grad_loss = {0.75};
    }
  }
  return in;
}

struct CeOut {
  std::vector<float> loss;       // [1] or [M]
  std::vector<uint16_t> dlogits;  // dense [M, V] (empty when not requested)
  std::vector<float> zdz;
};

// One call of coda_cross_entropy with the case's options (or `override_reduction` loss-only when >= 0).
void run_ce(CeCase const& c, CeInputs const& in, CeOut& out, int override_reduction = -1) {
  bool const loss_only = override_reduction >= 0;
  coda_ce_options o = c.options();
  if (loss_only) o.reduction = static_cast<coda_reduction>(override_reduction);
  bool const grad = c.grad && !loss_only, want_zdz = grad && c.zdz, in_place = grad && c.in_place;
  bool const per_row = o.reduction == CODA_REDUCTION_NONE;
  int64_t const ld = c.V + c.pad, ldd = in_place ? ld : c.V + c.dpad;

  DeviceBuffer dl(static_cast<size_t>(c.M * ld) * 2 + 16);
  dl.upload(c.pad ? coda::test::pad_rows(in.logits, c.M, c.V, ld, kPoison16) : in.logits);
  DeviceBuffer dd(grad && !in_place ? static_cast<size_t>(c.M * ldd) * 2 + 16 : 0);
  if (grad && !in_place) dd.poison();
  DeviceBuffer dt(static_cast<size_t>(c.M) * 8 + 16);
  if (c.int64_targets) {
    dt.upload(in.targets);
  } else {
    std::vector<int32_t> t32(in.targets.begin(), in.targets.end());
    dt.upload(t32);
  }
  std::vector<float> const gl = to_float(in.grad_loss);
  DeviceBuffer dg(gl.size() * 4 + 16);
  if (!gl.empty()) dg.upload(gl);
  size_t const loss_n = per_row ? static_cast<size_t>(c.M) : 1;
  DeviceBuffer dloss(loss_n * 4 + 16), dz(static_cast<size_t>(c.M) * 4 + 16);
  dloss.poison();
  dz.poison();
  size_t const ws_bytes = coda_cross_entropy_workspace_size(c.M, c.V);
  DeviceBuffer ws(ws_bytes);
  if (ws_bytes > 0) ws.poison();  // the kernels must not rely on a zeroed workspace

  coda_tensor tl = strided_tensor(dl.get(), c.dt, c.M, c.V, ld);
  coda_tensor tt = coda::test::device_tensor(dt.get(), c.int64_targets ? CODA_INT64 : CODA_INT32, {c.M});
  coda_tensor tg = per_row ? coda::test::device_tensor(dg.get(), CODA_FP32, {c.M}) : scalar_tensor(dg.get(), CODA_FP32);
  coda_tensor tloss =
      per_row ? coda::test::device_tensor(dloss.get(), CODA_FP32, {c.M}) : scalar_tensor(dloss.get(), CODA_FP32);
  coda_tensor td = in_place ? tl : strided_tensor(dd.get(), c.dt, c.M, c.V, ldd);
  coda_tensor tz = coda::test::device_tensor(dz.get(), CODA_FP32, {c.M});
  coda_tensor const* grad_loss = (!loss_only && c.upstream) ? &tg : nullptr;
  ASSERT_EQ(coda_cross_entropy(&tl, &tt, &o, grad_loss, c.hidden, &tloss, grad ? &td : nullptr,
                               want_zdz ? &tz : nullptr, ws.get(), ws_bytes, nullptr),
            CODA_SUCCESS)
      << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());

  out.loss = dloss.download<float>(loss_n);
  out.dlogits.clear();
  out.zdz.clear();
  if (grad) {
    std::vector<uint16_t> dp = (in_place ? dl : dd).download<uint16_t>(static_cast<size_t>(c.M * ldd));
    if (!in_place) {
      EXPECT_TRUE(coda::test::padding_untouched(dp, c.M, c.V, ldd, kPoison16)) << "dlogits row padding was written";
    }
    out.dlogits = (ldd == c.V) ? std::move(dp) : coda::test::unpad_rows(dp, c.M, c.V, ldd);
  }
  if (want_zdz) out.zdz = dz.download<float>(static_cast<size_t>(c.M));
  if (!want_zdz) {
    for (float v : dz.download<float>(static_cast<size_t>(c.M))) ASSERT_TRUE(std::isnan(v)) << "zdz written";
  }
}

// g_m of each row as the kernel must apply it (0 for ignored rows), exactly (double).
Vector row_grad_scale(CeCase const& c, CeInputs const& in) {
  int64_t n_valid = 0;
  for (int64_t t : in.targets) n_valid += t != c.ignore_index ? 1 : 0;
  Vector g(static_cast<size_t>(c.M), 0.0);
  for (int64_t m = 0; m < c.M; ++m) {
    if (in.targets[static_cast<size_t>(m)] == c.ignore_index) continue;
    double v = 1.0;
    if (in.grad_loss.size() == 1) v = in.grad_loss[0];
    if (in.grad_loss.size() > 1) v = in.grad_loss[static_cast<size_t>(m)];
    if (c.reduction == CODA_REDUCTION_MEAN) v /= static_cast<double>(n_valid);
    g[static_cast<size_t>(m)] = v;
  }
  return g;
}

// Rows of the sample for huge shapes: the edges, the edge targets (rows 0 and 1), some ignored rows, random rows.
std::vector<int64_t> sample_rows(CeCase const& c, CeInputs const& in) {
  std::vector<int64_t> rows = {0, 1, c.M / 2, c.M - 2, c.M - 1};
  int ignored = 0;
  for (int64_t m = 0; m < c.M && ignored < 3; ++m) {
    if (in.targets[static_cast<size_t>(m)] == c.ignore_index) {
      rows.push_back(m);
      ++ignored;
    }
  }
  Rng rng(c.seed + 7);
  std::uniform_int_distribution<int64_t> pick(0, c.M - 1);
  while (static_cast<int>(rows.size()) < c.sample_rows) rows.push_back(pick(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  rows.erase(std::remove_if(rows.begin(), rows.end(), [&](int64_t r) { return r < 0 || r >= c.M; }), rows.end());
  return rows;
}

void check_ce(CeCase const& c) {
  SCOPED_TRACE(c.name());
  CeInputs const in = make_inputs(c);
  coda_ce_options const o = c.options();
  CeOut out;
  ASSERT_NO_FATAL_FAILURE(run_ce(c, in, out));

  if (c.full_reference()) {
    Matrix const logits = matrix_from_bits(in.logits.data(), c.M, c.V, c.dt);
    CrossEntropy const ref = cross_entropy(logits, in.targets, o, in.grad_loss, c.hidden);
    CrossEntropy const unf = cross_entropy_unfused(logits, in.targets, o, in.grad_loss, c.hidden, c.dt);
    Vector const loss(out.loss.begin(), out.loss.end());
    EXPECT_TRUE(Accepted(c.name() + " loss", acceptance(loss, unf.loss, ref.loss), c.print));
    if (c.grad) {
      Matrix const dl = matrix_from_bits(out.dlogits.data(), c.M, c.V, c.dt);
      EXPECT_TRUE(Accepted(c.name() + " dlogits", acceptance(dl, unf.dlogits, ref.dlogits), c.print));
    }
    if (c.grad && c.zdz) {
      Vector const zdz(out.zdz.begin(), out.zdz.end());
      EXPECT_TRUE(Accepted(c.name() + " zdz", acceptance(zdz, unf.zdz, ref.zdz), c.print));
    }
    return;
  }

  // Huge shape. Every dlogits element written (no poison NaN left) and ignored rows exactly zero.
  if (c.grad) {
    int64_t nan_count = 0, nonzero_ignored = 0;
    for (int64_t m = 0; m < c.M; ++m) {
      bool const ignored = in.targets[static_cast<size_t>(m)] == c.ignore_index;
      uint16_t const* row = out.dlogits.data() + m * c.V;
      for (int64_t j = 0; j < c.V; ++j) {
        nan_count += coda::test::is_nan_bits(row[j], c.dt) ? 1 : 0;
        nonzero_ignored += (ignored && row[j] != 0) ? 1 : 0;
      }
    }
    EXPECT_EQ(nan_count, 0) << "dlogits elements not written (or NaN)";
    EXPECT_EQ(nonzero_ignored, 0) << "ignored rows must have a zero gradient";
  }
  // Per-row losses from a loss-only call with reduction none.
  CeOut rows_out;
  ASSERT_NO_FATAL_FAILURE(run_ce(c, in, rows_out, CODA_REDUCTION_NONE));
  if (c.reduction != CODA_REDUCTION_NONE) {
    double total = 0.0;
    int64_t n_valid = 0;
    for (int64_t m = 0; m < c.M; ++m) {
      total += rows_out.loss[static_cast<size_t>(m)];
      n_valid += in.targets[static_cast<size_t>(m)] != c.ignore_index ? 1 : 0;
    }
    double const expect = c.reduction == CODA_REDUCTION_SUM ? total : (n_valid > 0 ? total / n_valid : 0.0);
    EXPECT_NEAR(out.loss[0], expect, 1e-6 * std::fabs(expect) + 1e-6) << "reduced loss vs the sum of the row losses";
    if (c.print) {
      std::printf("[ INFO     ] %s: loss %.9g, from row losses %.9g\n", c.name().c_str(), out.loss[0], expect);
    }
  } else {
    EXPECT_EQ(std::memcmp(out.loss.data(), rows_out.loss.data(), out.loss.size() * 4), 0);
  }
  // Sampled rows against the reference, as reduction none with each row's g_m as its upstream gradient.
  std::vector<int64_t> const rows = sample_rows(c, in);
  int64_t const S = static_cast<int64_t>(rows.size());
  Vector const g_all = row_grad_scale(c, in);
  Matrix sub(S, c.V);
  Targets t_sub(static_cast<size_t>(S));
  Vector g_sub(static_cast<size_t>(S)), loss_sub(static_cast<size_t>(S)), zdz_sub(static_cast<size_t>(S));
  Matrix dl_sub(S, c.V);
  for (int64_t i = 0; i < S; ++i) {
    int64_t const m = rows[static_cast<size_t>(i)];
    for (int64_t j = 0; j < c.V; ++j) {
      sub(i, j) = from_bits(in.logits[static_cast<size_t>(m * c.V + j)], c.dt);
      if (c.grad) dl_sub(i, j) = from_bits(out.dlogits[static_cast<size_t>(m * c.V + j)], c.dt);
    }
    t_sub[static_cast<size_t>(i)] = in.targets[static_cast<size_t>(m)];
    g_sub[static_cast<size_t>(i)] = g_all[static_cast<size_t>(m)];
    loss_sub[static_cast<size_t>(i)] = rows_out.loss[static_cast<size_t>(m)];
    if (c.grad && c.zdz) zdz_sub[static_cast<size_t>(i)] = out.zdz[static_cast<size_t>(m)];
  }
  coda_ce_options o_rows = o;
  o_rows.reduction = CODA_REDUCTION_NONE;
  std::string const tag = c.name() + " (" + std::to_string(S) + " sampled rows)";
  CrossEntropy const ref = cross_entropy(sub, t_sub, o_rows, g_sub, c.hidden);
  CrossEntropy const unf = cross_entropy_unfused(sub, t_sub, o_rows, g_sub, c.hidden, c.dt);
  EXPECT_TRUE(Accepted(tag + " row losses", acceptance(loss_sub, unf.loss_rows, ref.loss_rows), c.print));
  if (c.grad) {
    EXPECT_TRUE(Accepted(tag + " dlogits", acceptance(dl_sub, unf.dlogits, ref.dlogits), c.print));
  }
  if (c.grad && c.zdz) {
    EXPECT_TRUE(Accepted(tag + " zdz", acceptance(zdz_sub, unf.zdz, ref.zdz), c.print));
  }
}

CeCase make_case(coda_dtype dt, int64_t M, int64_t V, coda_reduction r, uint64_t seed) {
  CeCase c;
  c.dt = dt;
  c.M = M;
  c.V = V;
  c.reduction = r;
  c.seed = seed;
  return c;
}

// ---- shapes -------------------------------------------------------------------------------------------------------

TEST(KernelsCrossEntropy, Shapes) {
  CODA_REQUIRE_SM90();
  struct S {
    int64_t M, V;
  };
  uint64_t seed = 1;
  for (S s : {S{1, 8}, S{1, 128256}, S{7, 24}, S{7, 264}, S{7, 50264}, S{7, 128256}, S{1000, 8}, S{1000, 264},
              S{1000, 8192}, S{4097, 264}, S{4097, 1000}, S{1000, 50264}}) {
    CeCase c = make_case(CODA_BF16, s.M, s.V, CODA_REDUCTION_MEAN, seed++);
    c.ignore_fraction = 0.1;
    c.print = s.V >= 50264;
    check_ce(c);
  }
}

TEST(KernelsCrossEntropy, ShapesFp16) {
  CODA_REQUIRE_SM90();
  struct S {
    int64_t M, V;
  };
  uint64_t seed = 100;
  for (S s : {S{1, 8}, S{7, 264}, S{1000, 2048}, S{4097, 264}, S{3, 128256}}) {
    CeCase c = make_case(CODA_FP16, s.M, s.V, CODA_REDUCTION_SUM, seed++);
    c.ignore_fraction = 0.2;
    c.print = s.V == 128256;
    check_ce(c);
  }
}

// The LM-head shape of llama3-1B at 8192 tokens (1.05e9 logits, 2.1 GB): sampled rows against the reference.
TEST(KernelsCrossEntropy, HugeLlama3Vocab) {
  CODA_REQUIRE_SM90();
  CeCase c = make_case(CODA_BF16, 8192, 128256, CODA_REDUCTION_MEAN, 4242);
  c.ignore_fraction = 0.1;
  c.upstream = false;
  c.print = true;
  check_ce(c);
}

// ---- options and edges ------------------------------------------------------------------------------------------

TEST(KernelsCrossEntropy, OptionsGrid) {
  CODA_REQUIRE_SM90();
  struct Opt {
    float ls, z, cap;
  };
  Opt const opts[] = {{0, 0, 0}, {0.1f, 0, 0}, {0, 1e-4f, 0}, {0, 0, 30.0f}, {0.05f, 1e-3f, 15.0f}, {1.0f, 0, 0}};
  uint64_t seed = 200;
  int k = 0;
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    for (coda_reduction r : {CODA_REDUCTION_NONE, CODA_REDUCTION_MEAN, CODA_REDUCTION_SUM}) {
      for (Opt const& op : opts) {
        CeCase c = make_case(dt, 37, 1000, r, seed++);
        c.ls = op.ls;
        c.z = op.z;
        c.cap = op.cap;
        c.ignore_fraction = 0.25;
        c.int64_targets = (k % 2) == 0;
        c.upstream = (k % 3) != 2;
        c.in_place = (k % 4) == 1;
        c.logit_std = op.cap > 0 ? 12.0 : 2.0;  // logits that reach the softcap's curved part
        c.print = op.ls > 0 && op.z > 0;
        check_ce(c);
        ++k;
      }
    }
  }
}

TEST(KernelsCrossEntropy, IgnoreIndex) {
  CODA_REQUIRE_SM90();
  uint64_t seed = 300;
  for (coda_reduction r : {CODA_REDUCTION_MEAN, CODA_REDUCTION_SUM, CODA_REDUCTION_NONE}) {
    for (double frac : {0.0, 0.3, 1.0}) {  // none, some, all rows ignored
      for (int64_t ii : {int64_t{-100}, int64_t{3}, int64_t{0}, int64_t{263}, int64_t{-1}}) {
        CeCase c = make_case(CODA_BF16, 50, 264, r, seed++);
        c.ignore_index = ii;
        c.ignore_fraction = frac;
        c.int64_targets = (seed % 2) == 0;
        c.print = frac == 1.0 && ii == -100;
        check_ce(c);
      }
    }
  }
}

// ignore_index beyond the int32 range with int32 targets: no row is ignored, not even the one whose target equals
// the low 32 bits of ignore_index (the comparison is done in 64 bits).
TEST(KernelsCrossEntropy, IgnoreIndexWiderThanInt32Targets) {
  CODA_REQUIRE_SM90();
  CeCase c = make_case(CODA_BF16, 64, 264, CODA_REDUCTION_MEAN, 310);
  c.ignore_index = (int64_t{1} << 32) + 5;
  c.int64_targets = false;
  CeInputs in = make_inputs(c);
  for (int64_t m = 2; m < c.M; m += 3) in.targets[static_cast<size_t>(m)] = 5;
  CeOut out;
  ASSERT_NO_FATAL_FAILURE(run_ce(c, in, out));
  Matrix const logits = matrix_from_bits(in.logits.data(), c.M, c.V, c.dt);
  CrossEntropy const ref = cross_entropy(logits, in.targets, c.options(), in.grad_loss, c.hidden);
  CrossEntropy const unf = cross_entropy_unfused(logits, in.targets, c.options(), in.grad_loss, c.hidden, c.dt);
  ASSERT_EQ(ref.n_valid, c.M);
  EXPECT_TRUE(Accepted("t32 ignore_index 2^32+5 loss", acceptance(Vector{out.loss[0]}, unf.loss, ref.loss), true));
  Matrix const dl = matrix_from_bits(out.dlogits.data(), c.M, c.V, c.dt);
  EXPECT_TRUE(Accepted("t32 ignore_index 2^32+5 dlogits", acceptance(dl, unf.dlogits, ref.dlogits), false));
}

TEST(KernelsCrossEntropy, UpstreamGradients) {
  CODA_REQUIRE_SM90();
  uint64_t seed = 400;
  for (coda_reduction r : {CODA_REDUCTION_NONE, CODA_REDUCTION_MEAN, CODA_REDUCTION_SUM}) {
    for (bool upstream : {false, true}) {
      CeCase c = make_case(CODA_BF16, 1000, 264, r, seed++);
      c.upstream = upstream;
      c.ignore_fraction = 0.2;
      c.print = r == CODA_REDUCTION_NONE && upstream;
      check_ce(c);
    }
  }
}

TEST(KernelsCrossEntropy, InPlace) {
  CODA_REQUIRE_SM90();
  CeCase c = make_case(CODA_BF16, 64, 128256, CODA_REDUCTION_MEAN, 500);
  c.in_place = true;
  c.ignore_fraction = 0.1;
  c.ls = 0.1f;
  c.z = 1e-4f;
  c.print = true;
  check_ce(c);
  CeCase d = make_case(CODA_FP16, 1000, 2048, CODA_REDUCTION_NONE, 501);
  d.in_place = true;
  d.cap = 30.0f;
  d.logit_std = 12.0;
  d.pad = 8;
  check_ce(d);
}

TEST(KernelsCrossEntropy, LossOnlyAndNoZdz) {
  CODA_REQUIRE_SM90();
  for (coda_reduction r : {CODA_REDUCTION_NONE, CODA_REDUCTION_MEAN, CODA_REDUCTION_SUM}) {
    CeCase c = make_case(CODA_BF16, 257, 8192, r, 600 + static_cast<uint64_t>(r));
    c.grad = false;
    c.ignore_fraction = 0.1;
    check_ce(c);
    c.grad = true;
    c.zdz = false;
    c.ls = 0.1f;
    check_ce(c);
  }
}

TEST(KernelsCrossEntropy, PaddedRows) {
  CODA_REQUIRE_SM90();
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    CeCase c = make_case(dt, 1000, 264, CODA_REDUCTION_MEAN, 700);
    c.pad = 8;
    c.dpad = 24;
    c.ignore_fraction = 0.1;
    c.print = dt == CODA_BF16;
    check_ce(c);
    c.M = 7;
    c.V = 50264;
    c.pad = 64;
    c.dpad = 8;
    c.cap = 30.0f;
    c.logit_std = 12.0;
    check_ce(c);
  }
}

// A target outside [0, V) that is not ignore_index: that row's loss, dlogits and zdz are NaN (coda.h); the row counts
// as valid, so a mean is NaN; the other rows are unaffected.
TEST(KernelsCrossEntropy, OutOfRangeTargetGivesNaNRow) {
  CODA_REQUIRE_SM90();
  for (coda_reduction r : {CODA_REDUCTION_NONE, CODA_REDUCTION_MEAN}) {
    CeCase c = make_case(CODA_BF16, 6, 264, r, 800);
    CeInputs in = make_inputs(c);
    in.targets[2] = c.V;  // just past the end
    in.targets[4] = -1;   // negative, not ignore_index (-100)
    in.targets[5] = c.ignore_index;
    CeOut out;
    ASSERT_NO_FATAL_FAILURE(run_ce(c, in, out));
    for (int64_t m = 0; m < c.M; ++m) {
      bool const bad = m == 2 || m == 4;
      int64_t nan_count = 0;
      for (int64_t j = 0; j < c.V; ++j) {
        nan_count += std::isnan(from_bits(out.dlogits[static_cast<size_t>(m * c.V + j)], c.dt)) ? 1 : 0;
      }
      EXPECT_EQ(nan_count, bad ? c.V : 0) << "row " << m;
      EXPECT_EQ(std::isnan(out.zdz[static_cast<size_t>(m)]), bad) << "row " << m;
      if (r == CODA_REDUCTION_NONE) {
        EXPECT_EQ(std::isnan(out.loss[static_cast<size_t>(m)]), bad) << "row " << m;
      }
    }
    if (r == CODA_REDUCTION_MEAN) {
      EXPECT_TRUE(std::isnan(out.loss[0]));
    }
    // The good rows match the reference (rows 0, 1, 3; row 5 is ignored), each with its own g_m.
    if (r == CODA_REDUCTION_NONE) {
      std::vector<int64_t> const good = {0, 1, 3, 5};
      Matrix sub(4, c.V);
      Targets t(4);
      Vector g(4);
      for (int i = 0; i < 4; ++i) {
        int64_t const m = good[static_cast<size_t>(i)];
        for (int64_t j = 0; j < c.V; ++j) sub(i, j) = from_bits(in.logits[static_cast<size_t>(m * c.V + j)], c.dt);
        t[static_cast<size_t>(i)] = in.targets[static_cast<size_t>(m)];
        g[static_cast<size_t>(i)] = in.grad_loss[static_cast<size_t>(m)];
      }
      CrossEntropy const ref = cross_entropy(sub, t, c.options(), g, c.hidden);
      CrossEntropy const unf = cross_entropy_unfused(sub, t, c.options(), g, c.hidden, c.dt);
      Vector loss(4);
      Matrix dl(4, c.V);
      for (int i = 0; i < 4; ++i) {
        int64_t const m = good[static_cast<size_t>(i)];
        loss[static_cast<size_t>(i)] = out.loss[static_cast<size_t>(m)];
        for (int64_t j = 0; j < c.V; ++j) dl(i, j) = from_bits(out.dlogits[static_cast<size_t>(m * c.V + j)], c.dt);
      }
      EXPECT_TRUE(Accepted("good rows loss", acceptance(loss, unf.loss, ref.loss), false));
      EXPECT_TRUE(Accepted("good rows dlogits", acceptance(dl, unf.dlogits, ref.dlogits), false));
    }
  }
}

TEST(KernelsCrossEntropy, AllIgnoredMeanIsZero) {
  CODA_REQUIRE_SM90();
  CeCase c = make_case(CODA_FP16, 33, 264, CODA_REDUCTION_MEAN, 900);
  c.ignore_fraction = 1.0;
  CeInputs const in = make_inputs(c);
  CeOut out;
  ASSERT_NO_FATAL_FAILURE(run_ce(c, in, out));
  EXPECT_EQ(out.loss[0], 0.0f);
  for (uint16_t v : out.dlogits) ASSERT_EQ(v, 0u);
  for (float v : out.zdz) ASSERT_EQ(v, 0.0f);
}

TEST(KernelsCrossEntropy, EmptyBatch) {
  CODA_REQUIRE_SM90();
  for (coda_reduction r : {CODA_REDUCTION_MEAN, CODA_REDUCTION_SUM, CODA_REDUCTION_NONE}) {
    DeviceBuffer dl(256), dt(256), dloss(256), dd(256), dz(256);
    dloss.poison();
    dd.poison();
    dz.poison();
    coda_ce_options o = coda_ce_options_default();
    o.reduction = r;
    bool const per_row = r == CODA_REDUCTION_NONE;
    coda_tensor tl = strided_tensor(dl.get(), CODA_BF16, 0, 264, 264);
    coda_tensor tt = coda::test::device_tensor(dt.get(), CODA_INT64, {0});
    coda_tensor tloss =
        per_row ? coda::test::device_tensor(dloss.get(), CODA_FP32, {0}) : scalar_tensor(dloss.get(), CODA_FP32);
    coda_tensor td = strided_tensor(dd.get(), CODA_BF16, 0, 264, 264);
    coda_tensor tz = coda::test::device_tensor(dz.get(), CODA_FP32, {0});
    ASSERT_EQ(coda_cross_entropy(&tl, &tt, &o, nullptr, 64, &tloss, &td, &tz, nullptr, 0, nullptr), CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> const loss = dloss.download<float>(1);
    if (per_row) {
      EXPECT_TRUE(std::isnan(loss[0])) << "nothing may be written for an empty [0] loss";
    } else {
      EXPECT_EQ(loss[0], 0.0f) << "a mean or sum over no rows is 0";
    }
    for (uint16_t v : dd.download<uint16_t>(128)) ASSERT_EQ(v, kPoison16);
  }
}

// V = 1: a single column, a layout that the TMA rule admits only as a non-unit-stride view ([M,1] with strides
// [8, 8]); the kernels' scalar path. loss = z * lse^2 and dlogits = 2 g z l. Skipped if validation rejects it.
TEST(KernelsCrossEntropy, SingleColumnScalarPath) {
  CODA_REQUIRE_SM90();
  int64_t const M = 9;
  std::vector<uint16_t> bits = coda::test::normal_bits(M * 8, 0.0, 2.0, CODA_BF16, 77);
  DeviceBuffer dl(bits.size() * 2), dt(M * 8), dloss(256), dd(M * 16), dz(256);
  DeviceBuffer ws(coda_cross_entropy_workspace_size(M, 1));
  dl.upload(bits);
  Targets targets(M, 0);
  targets[3] = -100;
  dt.upload(targets);
  dloss.poison();
  dd.poison();
  dz.poison();
  ws.poison();
  coda_ce_options o = coda_ce_options_default();
  o.z_loss = 1e-2f;
  o.label_smoothing = 0.1f;
  coda_tensor tl = strided_tensor(dl.get(), CODA_BF16, M, 1, 8);
  tl.strides[1] = 8;
  coda_tensor td = strided_tensor(dd.get(), CODA_BF16, M, 1, 8);
  td.strides[1] = 8;
  coda_tensor tt = coda::test::device_tensor(dt.get(), CODA_INT64, {M});
  coda_tensor tloss = scalar_tensor(dloss.get(), CODA_FP32);
  coda_tensor tz = coda::test::device_tensor(dz.get(), CODA_FP32, {M});
  coda_status const st = coda_cross_entropy(&tl, &tt, &o, nullptr, 64, &tloss, &td, &tz, ws.get(),
                                            coda_cross_entropy_workspace_size(M, 1), nullptr);
  if (st == CODA_ERROR_MISALIGNED || st == CODA_ERROR_LAYOUT) {
    GTEST_SKIP() << "validation rejects V = 1: " << coda_last_error();
  }
  ASSERT_EQ(st, CODA_SUCCESS) << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  Matrix logits(M, 1);
  for (int64_t m = 0; m < M; ++m) logits(m, 0) = from_bits(bits[static_cast<size_t>(m * 8)], CODA_BF16);
  CrossEntropy const ref = cross_entropy(logits, targets, o, {}, 64);
  CrossEntropy const unf = cross_entropy_unfused(logits, targets, o, {}, 64, CODA_BF16);
  std::vector<uint16_t> const dp = dd.download<uint16_t>(static_cast<size_t>(M * 8));
  Matrix dlm(M, 1);
  for (int64_t m = 0; m < M; ++m) {
    dlm(m, 0) = from_bits(dp[static_cast<size_t>(m * 8)], CODA_BF16);
    for (int64_t j = 1; j < 8; ++j) ASSERT_EQ(dp[static_cast<size_t>(m * 8 + j)], kPoison16) << "wrote past V = 1";
  }
  std::vector<float> const zf = dz.download<float>(static_cast<size_t>(M));
  EXPECT_TRUE(Accepted("V=1 loss", acceptance(Vector{dloss.download<float>(1)[0]}, unf.loss, ref.loss), true));
  EXPECT_TRUE(Accepted("V=1 dlogits", acceptance(dlm, unf.dlogits, ref.dlogits), true));
  EXPECT_TRUE(Accepted("V=1 zdz", acceptance(Vector(zf.begin(), zf.end()), unf.zdz, ref.zdz), true));
}

TEST(KernelsCrossEntropy, Deterministic) {
  CODA_REQUIRE_SM90();
  for (coda_reduction r : {CODA_REDUCTION_MEAN, CODA_REDUCTION_NONE}) {
    CeCase c = make_case(CODA_BF16, 257, 128256, r, 1000);
    c.ls = 0.1f;
    c.z = 1e-4f;
    c.cap = 30.0f;
    c.logit_std = 12.0;
    c.ignore_fraction = 0.1;
    CeInputs const in = make_inputs(c);
    CeOut a, b;
    ASSERT_NO_FATAL_FAILURE(run_ce(c, in, a));
    ASSERT_NO_FATAL_FAILURE(run_ce(c, in, b));
    EXPECT_EQ(std::memcmp(a.loss.data(), b.loss.data(), a.loss.size() * 4), 0);
    EXPECT_TRUE(a.dlogits == b.dlogits);
    EXPECT_EQ(std::memcmp(a.zdz.data(), b.zdz.data(), a.zdz.size() * 4), 0);
  }
}

// ---- compute-sanitizer target (small and quick) -----------------------------------------------------------------

TEST(KernelsSanitize, CrossEntropySmall) {
  CODA_REQUIRE_SM90();
  CeCase c = make_case(CODA_BF16, 7, 264, CODA_REDUCTION_MEAN, 1100);
  c.ls = 0.1f;
  c.z = 1e-4f;
  c.cap = 30.0f;
  c.ignore_fraction = 0.3;
  c.in_place = true;
  c.int64_targets = false;
  check_ce(c);
  CeCase d = make_case(CODA_FP16, 5, 2048, CODA_REDUCTION_NONE, 1101);
  d.pad = 8;
  d.dpad = 16;
  check_ce(d);
}

}  // namespace
