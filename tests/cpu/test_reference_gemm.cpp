// The float64 reference GEMMs run row-parallel above a work threshold (src/reference/parallel.hpp): the results must
// be bit-identical to the plain serial loop (each row has one owner and the serial summation order).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "reference/reference.hpp"

namespace {

using namespace coda::ref;

TEST(ReferenceGemm, ParallelRowsMatchSerial) {
  Rng rng(7);
  // 300 x 520 x 64 = 10M inner iterations: above the threshold, so several threads share the rows.
  Matrix const a = random_normal(300, 64, 0.0, 1.0, rng);
  Matrix const b = random_normal(520, 64, 0.0, 1.0, rng);
  Matrix got = random_normal(300, 520, 0.0, 1.0, rng);
  Matrix want = got;
  gemm(a, b, 0.5, /*accumulate=*/true, got);
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < b.rows; ++j) {
      double s = 0;
      for (int64_t k = 0; k < a.cols; ++k) s += a(i, k) * b(j, k);
      want(i, j) = 0.5 * s + want(i, j);
    }
  }
  EXPECT_EQ(std::memcmp(got.data.data(), want.data.data(), got.data.size() * sizeof(double)), 0);

  // The fp32 GEMM of the unfused pipeline: same rule.
  Matrix const f = gemm_fp32(a, b);
  std::vector<float> const af = to_float(a), bf = to_float(b);
  int64_t bad = 0;
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < b.rows; ++j) {
      float s = 0;
      for (int64_t k = 0; k < a.cols; ++k) {
        s += af[static_cast<size_t>(i * 64 + k)] * bf[static_cast<size_t>(j * 64 + k)];
      }
      bad += f(i, j) != static_cast<double>(s) ? 1 : 0;
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
