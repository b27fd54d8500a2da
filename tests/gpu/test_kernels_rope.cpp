// GPU tests of coda_rope_bwd_zdz (RoPE backward with the zdz row dot), against the float64 reference with the
// acceptance rule. The baseline is the unfused pipeline with exact angles (RopeAngles::kExact: only dtype roundings
// remain), a strict bound that a kernel with fp32 angles fails at large positions. Shapes: M in {1, 7, 1000, 4097},
// head_dim 64 and 128, GQA down to one kv head, packed-sequence positions that jump, positions up to ~2e6 (and one
// case up to 1.3e8), in place over dqkv, padded rows; plus determinism and M == 0.
#include <coda/coda.h>
#include <gtest/gtest.h>

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

struct RopeCase {
  coda_dtype dt = CODA_BF16;
  int64_t M = 7;
  RopeHeads heads{4, 2, 64};
  int32_t max_pos = 8192;     // positions: packed runs in [pos_offset, pos_offset + max_pos]
  int32_t pos_offset = 0;
  double base = 500000.0;     // inv_freq = base^(-2i/hd), rounded to fp32
  bool in_place = false;      // dz_out is the dqkv view
  int64_t pad = 0;            // extra elements per row of qkv, dqkv and dz (multiple of 8)
  int64_t hidden = 2048;
  uint64_t seed = 1;
  bool print = false;

  int64_t W() const { return heads.width(); }
  std::string name() const {
    return std::string(dtype_name(dt)) + " M=" + std::to_string(M) + " heads=" + std::to_string(heads.n_q_heads) +
           "/" + std::to_string(heads.n_kv_heads) + "x" + std::to_string(heads.head_dim) +
           " pos<=" + std::to_string(static_cast<int64_t>(pos_offset) + max_pos) + (in_place ? " in-place" : "") +
           (pad ? " padded" : "");
  }
};

struct RopeInputs {
  Matrix qkv, dqkv;
  Positions pos;
  Vector inv_freq;
};

RopeInputs make_inputs(RopeCase const& c) {
  Rng rng(c.seed);
  RopeInputs in;
  in.qkv = round_to(random_activation(c.M, c.W(), rng), c.dt);
  in.dqkv = round_to(random_normal(c.M, c.W(), 0.0, 0.1, rng), c.dt);
  in.pos = random_positions(c.M, c.max_pos, rng);
  for (int32_t& p : in.pos) p += c.pos_offset;
  in.inv_freq = rope_inv_freq(c.heads.head_dim, c.base);
  return in;
}

struct RopeOut {
  std::vector<uint16_t> dz;  // dense [M, W]
  std::vector<float> zdz;
};

void run_rope(RopeCase const& c, RopeInputs const& in, RopeOut& out) {
  int64_t const W = c.W(), ld = W + c.pad;
  size_t const mat_bytes = static_cast<size_t>(c.M * ld) * 2 + 16;
  DeviceBuffer dq(mat_bytes), dd(mat_bytes), dz(c.in_place ? 0 : mat_bytes);
  DeviceBuffer dp(static_cast<size_t>(c.M) * 4 + 16), df(static_cast<size_t>(W) * 4 + 16);
  DeviceBuffer dzdz(static_cast<size_t>(c.M) * 4 + 16);
  dq.upload(coda::test::pad_rows(to_bits(in.qkv, c.dt), c.M, W, ld, kPoison16));
  dd.upload(coda::test::pad_rows(to_bits(in.dqkv, c.dt), c.M, W, ld, kPoison16));
  dp.upload(in.pos);
  df.upload(to_float(in.inv_freq));
  if (!c.in_place) dz.poison();
  dzdz.poison();
  coda_tensor tq = strided_tensor(dq.get(), c.dt, c.M, W, ld);
  coda_tensor td = strided_tensor(dd.get(), c.dt, c.M, W, ld);
  coda_tensor tz = c.in_place ? td : strided_tensor(dz.get(), c.dt, c.M, W, ld);
  coda_tensor tp = coda::test::device_tensor(dp.get(), CODA_INT32, {c.M});
  coda_tensor tf = coda::test::device_tensor(df.get(), CODA_FP32, {c.heads.head_dim / 2});
  coda_tensor tzdz = coda::test::device_tensor(dzdz.get(), CODA_FP32, {c.M});
  ASSERT_EQ(coda_rope_bwd_zdz(&tq, &td, &tp, &tf, c.heads.n_q_heads, c.heads.n_kv_heads, c.heads.head_dim, c.hidden,
                              &tz, &tzdz, nullptr),
            CODA_SUCCESS)
      << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> const zp = (c.in_place ? dd : dz).download<uint16_t>(static_cast<size_t>(c.M * ld));
  EXPECT_TRUE(coda::test::padding_untouched(zp, c.M, W, ld, kPoison16)) << "dz_out row padding was written";
  out.dz = coda::test::unpad_rows(zp, c.M, W, ld);
  out.zdz = dzdz.download<float>(static_cast<size_t>(c.M));
}

void check_rope(RopeCase const& c) {
  SCOPED_TRACE(c.name());
  RopeInputs const in = make_inputs(c);
  RopeOut out;
  ASSERT_NO_FATAL_FAILURE(run_rope(c, in, out));
  int64_t const W = c.W();
  Matrix const dz = matrix_from_bits(out.dz.data(), c.M, W, c.dt);
  Vector const zdz = vector_from_float(out.zdz.data(), c.M);
  RopeBwd const ref = rope_bwd_zdz(in.qkv, in.dqkv, in.pos, in.inv_freq, c.heads, c.hidden);
  RopeBwd const unf =
      rope_bwd_zdz_unfused(in.qkv, in.dqkv, in.pos, in.inv_freq, c.heads, c.hidden, c.dt, RopeAngles::kExact);
  EXPECT_TRUE(Accepted(c.name() + " dz", acceptance(dz, unf.dz, ref.dz), c.print));
  EXPECT_TRUE(Accepted(c.name() + " zdz", acceptance(zdz, unf.zdz, ref.zdz), c.print));
  // v passes through bit for bit.
  std::vector<uint16_t> const dq_bits = to_bits(in.dqkv, c.dt);
  int64_t bad_v = 0;
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t j = c.heads.rotated_width(); j < W; ++j)
      bad_v += out.dz[static_cast<size_t>(m * W + j)] != dq_bits[static_cast<size_t>(m * W + j)] ? 1 : 0;
  EXPECT_EQ(bad_v, 0) << "v columns of dz differ from dqkv";
}

RopeCase make_case(coda_dtype dt, int64_t M, RopeHeads heads, int32_t max_pos, int32_t offset, uint64_t seed) {
  RopeCase c;
  c.dt = dt;
  c.M = M;
  c.heads = heads;
  c.max_pos = max_pos;
  c.pos_offset = offset;
  c.seed = seed;
  return c;
}

TEST(KernelsRope, ShapesBf16) {
  CODA_REQUIRE_SM90();
  std::vector<RopeCase> cases = {
      make_case(CODA_BF16, 1, {1, 1, 64}, 100, 0, 1),
      make_case(CODA_BF16, 7, {4, 4, 64}, 8192, 0, 2),
      make_case(CODA_BF16, 7, {8, 1, 128}, 8192, 0, 3),        // GQA with one kv head
      make_case(CODA_BF16, 1000, {4, 2, 64}, 131072, 0, 4),
      make_case(CODA_BF16, 1000, {32, 8, 128}, 1000000, 0, 5),  // llama3-8B widths (W = 6144)
      make_case(CODA_BF16, 4097, {8, 2, 128}, 2000000, 0, 6),
  };
  cases[4].print = true;
  cases[5].print = true;
  for (RopeCase const& c : cases) check_rope(c);
}

TEST(KernelsRope, ShapesFp16) {
  CODA_REQUIRE_SM90();
  std::vector<RopeCase> cases = {
      make_case(CODA_FP16, 1, {2, 1, 128}, 1000, 0, 11),
      make_case(CODA_FP16, 7, {4, 1, 64}, 8192, 0, 12),
      make_case(CODA_FP16, 1000, {16, 4, 128}, 2000000, 0, 13),
      make_case(CODA_FP16, 4097, {4, 4, 64}, 65536, 0, 14),
  };
  cases[2].print = true;
  for (RopeCase const& c : cases) check_rope(c);
}

// Positions of ~2e6 and beyond, with inv_freq[0] = 1 (base 10000): theta up to 2.1e6 rad, where an fp32 angle is off
// by up to 0.125 rad. Also positions up to 1.3e8 (theta ~1e8) to show the double-precision angles hold far beyond.
TEST(KernelsRope, LargePositions) {
  CODA_REQUIRE_SM90();
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    for (double base : {10000.0, 500000.0}) {
      RopeCase c = make_case(dt, 1000, {8, 2, 128}, 100000, 2000000, 21);
      c.base = base;
      c.print = base == 10000.0;
      check_rope(c);
      RopeCase d = make_case(dt, 257, {4, 1, 64}, 1 << 27, 0, 22);
      d.base = base;
      check_rope(d);
    }
  }
}

TEST(KernelsRope, InPlaceAndPadded) {
  CODA_REQUIRE_SM90();
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    RopeCase c = make_case(dt, 1000, {8, 2, 128}, 2000000, 0, 31);
    c.in_place = true;
    c.print = true;
    check_rope(c);
    RopeCase d = make_case(dt, 7, {2, 1, 64}, 8192, 0, 32);
    d.pad = 8;
    check_rope(d);
    d.in_place = true;
    d.pad = 64;
    check_rope(d);
    RopeCase e = make_case(dt, 4097, {4, 1, 64}, 300000, 0, 33);
    e.in_place = true;
    e.pad = 16;
    e.hidden = 512;
    check_rope(e);
  }
}

TEST(KernelsRope, Deterministic) {
  CODA_REQUIRE_SM90();
  RopeCase c = make_case(CODA_BF16, 4097, {32, 8, 128}, 2000000, 0, 41);
  RopeInputs const in = make_inputs(c);
  RopeOut a, b;
  ASSERT_NO_FATAL_FAILURE(run_rope(c, in, a));
  ASSERT_NO_FATAL_FAILURE(run_rope(c, in, b));
  EXPECT_TRUE(a.dz == b.dz);
  EXPECT_EQ(std::memcmp(a.zdz.data(), b.zdz.data(), a.zdz.size() * sizeof(float)), 0);
}

TEST(KernelsRope, EmptyIsNoOp) {
  CODA_REQUIRE_SM90();
  int64_t const W = 3 * 64;
  DeviceBuffer dq(W * 2), dd(W * 2), dz(W * 2), dp(256), df(256), dzdz(256);
  dz.poison();
  dzdz.poison();
  coda_tensor tq = strided_tensor(dq.get(), CODA_BF16, 0, W, W);
  coda_tensor td = strided_tensor(dd.get(), CODA_BF16, 0, W, W);
  coda_tensor tz = strided_tensor(dz.get(), CODA_BF16, 0, W, W);
  coda_tensor tp = coda::test::device_tensor(dp.get(), CODA_INT32, {0});
  coda_tensor tf = coda::test::device_tensor(df.get(), CODA_FP32, {32});
  coda_tensor tzdz = coda::test::device_tensor(dzdz.get(), CODA_FP32, {0});
  ASSERT_EQ(coda_rope_bwd_zdz(&tq, &td, &tp, &tf, 1, 1, 64, 64, &tz, &tzdz, nullptr), CODA_SUCCESS)
      << coda_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  for (uint16_t v : dz.download<uint16_t>(W)) ASSERT_EQ(v, kPoison16);
}

TEST(KernelsSanitize, RopeBwdZdzSmall) {
  CODA_REQUIRE_SM90();
  RopeCase c = make_case(CODA_BF16, 7, {2, 1, 64}, 2000000, 0, 51);
  c.in_place = true;
  c.pad = 8;
  check_rope(c);
  RopeCase d = make_case(CODA_FP16, 5, {2, 2, 128}, 8192, 0, 52);
  check_rope(d);
}

}  // namespace
