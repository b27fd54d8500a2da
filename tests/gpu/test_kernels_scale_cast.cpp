// GPU tests of coda_scale_cast (the LM head's backward scale of its saved fp32 weight gradient): every element
// bit-exact against the host's fp32 product rounded to nearest even (what torch.mul(src, g, out=bf16) gives),
// NaN as NaN, on the vector path and both scalar paths (misaligned src or out), with tails of every length,
// special values (inf, -0, NaN, subnormal results, overflow) and no write past the end.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpu/gpu_util.hpp"
#include "gpu/kernel_test_util.hpp"
#include "reference/reference.hpp"

namespace {

using coda::test::DeviceBuffer;
using coda::test::dtype_name;
using coda::test::kPoison16;

struct Case {
  coda_dtype dt;
  int64_t n;
  float scale;
  int64_t src_offset = 0, out_offset = 0;  // elements past a 256-byte aligned allocation (misaligned views)
  std::string name() const {
    return std::string(dtype_name(dt)) + " n=" + std::to_string(n) + " scale=" + std::to_string(scale) +
           " src+" + std::to_string(src_offset) + " out+" + std::to_string(out_offset);
  }
};

std::vector<float> inputs(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  float const specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            3.0e38f, 1.0e-38f, 65504.0f, 6.0e-8f};
  for (int64_t i = 0; i < n; ++i) {
    uint64_t const h = coda::test::splitmix64(seed * 1000003u + static_cast<uint64_t>(i));
    if (h % 97 == 0) {
      v[i] = specials[(h >> 8) % (sizeof(specials) / sizeof(specials[0]))];
    } else {  // wide magnitudes with a full mantissa: every rounding case shows up
      double const u = (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;
      v[i] = static_cast<float>((u - 0.5) * std::ldexp(1.0, static_cast<int>((h >> 3) % 40) - 20));
    }
  }
  return v;
}

uint16_t expected_bits(float x, float s, coda_dtype dt) {
  volatile float p = x * s;  // one IEEE fp32 multiply (no contraction), as the kernel computes
  return dt == CODA_BF16 ? coda::ref::float_to_bf16_bits(p) : coda::ref::float_to_fp16_bits(p);
}

void check(Case const& c) {
  SCOPED_TRACE(c.name());
  std::vector<float> const src = inputs(c.n, static_cast<uint64_t>(c.n) + 17u);
  int64_t const guard = 16;  // poisoned elements after the end of out: must stay untouched
  DeviceBuffer dsrc(static_cast<size_t>(c.n + c.src_offset + 1) * 4), dscale(256);
  DeviceBuffer dout(static_cast<size_t>(c.n + c.out_offset + guard) * 2);
  std::vector<float> padded(static_cast<size_t>(c.src_offset), 0.0f);
  padded.insert(padded.end(), src.begin(), src.end());
  if (!padded.empty()) dsrc.upload(padded);
  dscale.upload(std::vector<float>{c.scale});
  dout.poison();
  coda_tensor ts = coda::test::device_tensor(static_cast<float*>(dsrc.get()) + c.src_offset, CODA_FP32, {c.n});
  coda_tensor tg = coda::test::scalar_tensor(dscale.get(), CODA_FP32);
  coda_tensor to = coda::test::device_tensor(static_cast<uint16_t*>(dout.get()) + c.out_offset, c.dt, {c.n});
  ASSERT_EQ(coda_scale_cast(&ts, &tg, &to, nullptr), CODA_SUCCESS) << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> const got = dout.download<uint16_t>(static_cast<size_t>(c.n + c.out_offset + guard));
  int64_t bad = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    uint16_t const want = expected_bits(src[i], c.scale, c.dt), have = got[c.out_offset + i];
    bool const ok = coda::test::is_nan_bits(want, c.dt) ? coda::test::is_nan_bits(have, c.dt) : want == have;
    if (!ok && bad++ < 5) ADD_FAILURE() << "element " << i << ": " << src[i] << " * " << c.scale << " -> bits " << have
                                       << ", want " << want;
  }
  EXPECT_EQ(bad, 0);
  for (int64_t i = 0; i < c.out_offset; ++i) EXPECT_EQ(got[i], kPoison16) << "written before out";
  for (int64_t i = c.out_offset + c.n; i < c.out_offset + c.n + guard; ++i) {
    EXPECT_EQ(got[i], kPoison16) << "written past the end, element " << i - c.out_offset;
  }
}

TEST(KernelsScaleCast, BitExact) {
  CODA_REQUIRE_SM90();
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{4103}, (int64_t{1} << 20) + 5}) {
      for (float s : {1.0f, 1.0f / 3.0f, -2.5f, 0.0f, 1.0e-30f, 3.0e30f}) check({dt, n, s});
    }
    for (int64_t n : {int64_t{15}, int64_t{100003}}) {
      check({dt, n, 0.7f, 1, 0});  // src 4 bytes past alignment: the scalar kernel
      check({dt, n, 0.7f, 4, 0});  // src 16 bytes past: 16-byte aligned, the vector kernel on a shifted start
      check({dt, n, 0.7f, 0, 3});  // out misaligned
      check({dt, n, 0.7f, 8, 8});  // both 32 / 16 bytes past: the vector kernel again
    }
  }
}

TEST(KernelsScaleCast, NaNScaleGivesNaN) {
  CODA_REQUIRE_SM90();
  check({CODA_BF16, 1000, std::numeric_limits<float>::quiet_NaN()});
}

TEST(KernelsScaleCast, EmptyLaunchesNothing) {
  CODA_REQUIRE_SM90();
  DeviceBuffer dscale(256);
  coda_tensor ts = coda::test::device_tensor(nullptr, CODA_FP32, {0, 5});
  coda_tensor tg = coda::test::scalar_tensor(dscale.get(), CODA_FP32);
  coda_tensor to = coda::test::device_tensor(nullptr, CODA_BF16, {0, 5});
  EXPECT_EQ(coda_scale_cast(&ts, &tg, &to, nullptr), CODA_SUCCESS) << coda_last_error();
}

TEST(KernelsSanitize, ScaleCastSmall) {
  CODA_REQUIRE_SM90();
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    check({dt, 1003, 0.5f});
    check({dt, 1003, 0.5f, 1, 3});
  }
}

}  // namespace
