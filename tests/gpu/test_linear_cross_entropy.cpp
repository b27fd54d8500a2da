// GPU tests of coda_linear_cross_entropy (LM head + cross-entropy loss without logits in memory: chunked
// linear_rowscale_lse + the loss from row statistics) against the float64 reference (cross_entropy of the exact logits
// diag(rstd) h w^T) with the acceptance rule, the unfused baseline being bf16 logits + PyTorch-style float
// cross-entropy (ref::cross_entropy_unfused). Every reduction, label smoothing, z-loss, softcap, ignore_index (also
// inside [0,V) and all rows ignored), int32/int64 targets, chunk sizes that split M unevenly, V not a multiple of the
// tile. Outputs are poisoned before each run; two runs must be bit-identical. `LinearCrossEntropySanitize.*` is the
// small case for compute-sanitizer. Every test skips without an sm_90 GPU.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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
using coda::test::strided_tensor;

coda_dtype g_dt = CODA_BF16;  // bf16, or fp16 inside a UseFp16 scope

struct Case {
  int64_t M, V, K;
  coda_ce_options options;
  int64_t chunk_rows;
  bool int64_targets = false;
  double ignore_fraction = 0.1;
  std::string name() const {
    return "M=" + std::to_string(M) + " V=" + std::to_string(V) + " K=" + std::to_string(K) +
           " red=" + std::to_string(static_cast<int>(options.reduction)) +
           " ls=" + std::to_string(options.label_smoothing) +
           " z=" + std::to_string(options.z_loss) + " cap=" + std::to_string(options.softcap) +
           " ignore=" + std::to_string(options.ignore_index) + " chunk=" + std::to_string(chunk_rows) +
           (int64_targets ? " int64" : " int32");
  }
};

coda_ce_options opts(coda_reduction r, float ls = 0.0f, float z = 0.0f, float cap = 0.0f, int64_t ignore = -100) {
  coda_ce_options o = coda_ce_options_default();
  o.reduction = r;
  o.label_smoothing = ls;
  o.z_loss = z;
  o.softcap = cap;
  o.ignore_index = ignore;
  return o;
}

void check_case(Case const& c, uint64_t seed, bool print) {
  SCOPED_TRACE(c.name() + " " + coda::test::dtype_name(g_dt));
  Rng rng(seed);
  Matrix const h = round_to(random_normal(c.M, c.K, 0.0, 4.0, rng), g_dt);
  Matrix const w = round_to(random_weight(c.V, c.K, rng), g_dt);
  Vector rstd = random_normal(1, c.M, 0.25, 0.05, rng).data;
  for (double& v : rstd) v = round_to(std::fabs(v) + 0.05, CODA_FP32);
  Targets targets = random_targets(c.M, c.V, rng, c.ignore_fraction, c.options.ignore_index);
  if (c.M > 2 && c.ignore_fraction < 1.0) {  // the edges of the vocabulary
    targets[0] = 0;
    targets[1] = c.V - 1;
  }
  Matrix const logits = linear_rowscale(h, w, rstd);
  CrossEntropy const ref = cross_entropy(logits, targets, c.options, {}, 1);
  CrossEntropy const unf =
      cross_entropy_unfused(linear_rowscale_unfused(h, w, rstd, g_dt), targets, c.options, {}, 1, g_dt);

  bool const per_row = c.options.reduction == CODA_REDUCTION_NONE;
  int64_t const n_loss = per_row ? c.M : 1;
  DeviceBuffer dh(bytes16(c.M, c.K)), dw(bytes16(c.V, c.K)), dr(static_cast<size_t>(c.M) * 4 + 16);
  DeviceBuffer dt(static_cast<size_t>(c.M) * 8 + 16), dl(static_cast<size_t>(n_loss) * 4 + 16);
  DeviceBuffer dlse(static_cast<size_t>(c.M) * 4 + 16);
  size_t const wsb = coda_linear_cross_entropy_workspace_size(c.M, c.V, c.chunk_rows);
  DeviceBuffer dws(wsb);
  dh.upload(to_bits(h, g_dt));
  dw.upload(to_bits(w, g_dt));
  dr.upload(std::vector<float>(rstd.begin(), rstd.end()));
  if (c.int64_targets) {
    dt.upload(targets);
  } else {
    dt.upload(std::vector<int32_t>(targets.begin(), targets.end()));
  }
  coda_tensor th = strided_tensor(dh.get(), g_dt, c.M, c.K, c.K);
  coda_tensor tw = strided_tensor(dw.get(), g_dt, c.V, c.K, c.K);
  coda_tensor ts = coda::test::device_tensor(dr.get(), CODA_FP32, {c.M});
  coda_tensor tt = coda::test::device_tensor(dt.get(), c.int64_targets ? CODA_INT64 : CODA_INT32, {c.M});
  coda_tensor tl = per_row ? coda::test::device_tensor(dl.get(), CODA_FP32, {c.M})
                           : coda::test::scalar_tensor(dl.get(), CODA_FP32);
  coda_tensor tlse = coda::test::device_tensor(dlse.get(), CODA_FP32, {c.M});
  std::vector<float> loss_first, lse_first;
  for (int rep = 0; rep < 2; ++rep) {
    dl.poison();
    dlse.poison();
    dws.poison();
    ASSERT_EQ(coda_linear_cross_entropy(&th, &tw, &ts, &tt, &c.options, c.chunk_rows, &tl, &tlse, dws.get(), wsb,
                                        nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> const loss = dl.download<float>(static_cast<size_t>(n_loss));
    std::vector<float> const lse = dlse.download<float>(static_cast<size_t>(c.M));
    if (rep == 0) {
      loss_first = loss;
      lse_first = lse;
    } else {
      EXPECT_EQ(std::memcmp(loss.data(), loss_first.data(), loss.size() * 4), 0) << "two runs differ (loss)";
      EXPECT_EQ(std::memcmp(lse.data(), lse_first.data(), lse.size() * 4), 0) << "two runs differ (lse)";
    }
  }
  Vector const loss = vector_from_float(loss_first.data(), n_loss);
  EXPECT_TRUE(Accepted(c.name() + " loss", acceptance(loss, unf.loss, ref.loss), print));
  Vector const lse = vector_from_float(lse_first.data(), c.M);
  EXPECT_TRUE(Accepted(c.name() + " lse", acceptance(lse, unf.lse, ref.lse), print));
}

TEST(LinearCrossEntropy, Options) {
  CODA_REQUIRE_SM90();
  std::vector<Case> const cases = {
      {1000, 1000, 520, opts(CODA_REDUCTION_MEAN), 0},
      {1000, 1000, 520, opts(CODA_REDUCTION_SUM), 300},
      {1000, 1000, 520, opts(CODA_REDUCTION_NONE), 333, true},
      {1000, 1000, 520, opts(CODA_REDUCTION_MEAN, 0.1f), 0},
      {1000, 1000, 520, opts(CODA_REDUCTION_MEAN, 0.0f, 1e-4f), 0},
      {1000, 1000, 520, opts(CODA_REDUCTION_NONE, 0.1f, 1e-4f, 30.0f), 256},
      {1000, 1000, 520, opts(CODA_REDUCTION_MEAN, 0.0f, 0.0f, 0.0f, 5), 0},  // ignore_index inside [0, V)
      {7, 264, 8, opts(CODA_REDUCTION_MEAN), 1},                            // one row per chunk
      {1, 264, 64, opts(CODA_REDUCTION_NONE), 0},
  };
  uint64_t seed = 100;
  for (Case const& c : cases) check_case(c, seed++, false);
}

TEST(LinearCrossEntropy, AllRowsIgnored) {
  CODA_REQUIRE_SM90();
  Case mean{300, 1000, 64, opts(CODA_REDUCTION_MEAN), 128};
  mean.ignore_fraction = 1.0;
  check_case(mean, 7, false);
  Case none{300, 1000, 64, opts(CODA_REDUCTION_NONE), 0};
  none.ignore_fraction = 1.0;
  check_case(none, 8, false);
}

// LLaMA-3 vocabulary (V = 128256) at a reduced M, two chunks.
TEST(LinearCrossEntropy, Llama3Vocab) {
  CODA_REQUIRE_SM90();
  check_case({300, 128256, 2048, opts(CODA_REDUCTION_MEAN, 0.1f, 1e-4f), 160}, 11, true);
}

TEST(LinearCrossEntropySanitize, Small) {
  CODA_REQUIRE_SM90();
  check_case({130, 600, 200, opts(CODA_REDUCTION_MEAN, 0.1f, 1e-4f, 30.0f), 64}, 12, false);
  check_case({130, 600, 200, opts(CODA_REDUCTION_NONE), 0, true}, 13, false);
}

// fp16.
TEST(LinearCrossEntropyFp16, Options) {
  CODA_REQUIRE_SM90();
  coda::test::UseFp16 const fp16(g_dt);
  check_case({1000, 1000, 520, opts(CODA_REDUCTION_MEAN, 0.1f, 1e-4f, 30.0f), 300}, 41, false);
  check_case({7, 264, 8, opts(CODA_REDUCTION_NONE), 0, true}, 42, false);
}

}  // namespace
