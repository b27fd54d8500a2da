// Device-level checks of the foundation: the sm_90 capability query, device-side validation (host pointers
// labelled as device memory), and the weight-layout helpers on device tensors.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <vector>

#include "gpu/gpu_util.hpp"

namespace {

using coda::test::DeviceBuffer;
using coda::test::device_tensor;

TEST(Device, CapabilityIsSm90) {
  CODA_REQUIRE_SM90();
  int supported = 0, major = 0, minor = 0;
  ASSERT_EQ(coda_device_supported(-1, &supported, &major, &minor), CODA_SUCCESS) << coda_last_error();
  EXPECT_EQ(supported, 1);
  EXPECT_EQ(major, 9);
  EXPECT_EQ(minor, 0);
  std::printf("[ INFO     ] sm_%d%d device supported\n", major, minor);
}

TEST(Device, OutOfRangeOrdinalIsNamed) {
  CODA_REQUIRE_SM90();
  int supported = 1;
  EXPECT_EQ(coda_device_supported(4096, &supported, nullptr, nullptr), CODA_ERROR_DEVICE);
  EXPECT_EQ(supported, 0);
  EXPECT_NE(std::string(coda_last_error()).find("4096"), std::string::npos) << coda_last_error();
}

TEST(Device, HostPointerLabelledAsDeviceRejected) {
  CODA_REQUIRE_SM90();
  std::vector<uint16_t> a(16 * 32, 0x3F80), b(8 * 32, 0x3F80), d(16 * 8, 0x7777);
  coda_tensor ta = device_tensor(a.data(), CODA_BF16, {16, 32});
  coda_tensor tb = device_tensor(b.data(), CODA_BF16, {8, 32});
  coda_tensor td = device_tensor(d.data(), CODA_BF16, {16, 8});
  size_t const wsb = coda_gemm_workspace_size(16, 8, 32);
  DeviceBuffer ws(wsb > 0 ? wsb : 256);
  EXPECT_EQ(coda_gemm(&ta, &tb, &td, 1.0f, 0, ws.get(), ws.bytes(), nullptr), CODA_ERROR_DEVICE);
  EXPECT_NE(std::string(coda_last_error()).find("host memory"), std::string::npos) << coda_last_error();
  for (uint16_t v : d) ASSERT_EQ(v, 0x7777) << "a rejected call wrote its output";
}

TEST(Device, LayoutHelpersOnDeviceMatchHost) {
  CODA_REQUIRE_SM90();
  int64_t const F = 24, K = 40, hd = 8, H = 6;
  std::vector<float> w(2 * F * K);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f - 7.0f;
  DeviceBuffer din(w.size() * 4), dout(w.size() * 4), dback(w.size() * 4);
  din.upload(w);
  dout.poison();
  dback.poison();
  coda_tensor ti = device_tensor(din.get(), CODA_FP32, {2 * F, K});
  coda_tensor to = device_tensor(dout.get(), CODA_FP32, {2 * F, K});
  coda_tensor tb = device_tensor(dback.get(), CODA_FP32, {2 * F, K});
  ASSERT_EQ(coda_interleave_gate_up(&ti, &to, nullptr), CODA_SUCCESS) << coda_last_error();
  ASSERT_EQ(coda_deinterleave_gate_up(&to, &tb, nullptr), CODA_SUCCESS) << coda_last_error();
  std::vector<float> out = dout.download<float>(w.size()), back = dback.download<float>(w.size());
  for (int64_t i = 0; i < F; ++i) {
    for (int64_t c = 0; c < K; ++c) {
      ASSERT_EQ(out[(2 * i) * K + c], w[i * K + c]);
      ASSERT_EQ(out[(2 * i + 1) * K + c], w[(F + i) * K + c]);
    }
  }
  EXPECT_EQ(back, w);

  // RoPE pairing over 6 heads of 8 rows (48 rows of 40).
  ASSERT_EQ(H * hd, 2 * F);
  dout.poison();
  ASSERT_EQ(coda_pair_rope_rows(&ti, static_cast<int32_t>(hd), &to, nullptr), CODA_SUCCESS) << coda_last_error();
  ASSERT_EQ(coda_unpair_rope_rows(&to, static_cast<int32_t>(hd), &tb, nullptr), CODA_SUCCESS) << coda_last_error();
  out = dout.download<float>(w.size());
  back = dback.download<float>(w.size());
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      for (int64_t c = 0; c < K; ++c) {
        ASSERT_EQ(out[(h * hd + 2 * i) * K + c], w[(h * hd + i) * K + c]);
        ASSERT_EQ(out[(h * hd + 2 * i + 1) * K + c], w[(h * hd + i + hd / 2) * K + c]);
      }
    }
  }
  EXPECT_EQ(back, w);
}

}  // namespace
