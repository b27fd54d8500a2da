// GPU tests of the CODA block (include/coda/block.h): coda_block_forward and coda_block_backward against the
// float64 reference of the same block (the reference ops composed in MATH.md's order: the rewrites are exact, so
// this is the block's true gradient) with the acceptance rule, the unfused same-dtype pipeline (the unfused ops
// composed the same way) giving the bound. Every saved tensor and every gradient is checked: dy0, dx0, dW of all
// four weights, dgamma of both norms. A two-block chain (the second block's attention output stands in as the first
// block's q columns, so gradients flow back through both) checks that the pieces compose. Outputs poisoned first;
// GQA and MHA; bf16 and fp16. Every test skips without an sm_90 GPU.
#include <coda/block.h>
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gemm/gemm_hooks.h"
#include "gpu/gpu_util.hpp"
#include "gpu/kernel_test_util.hpp"
#include "reference/reference.hpp"

namespace {

using namespace coda::ref;
using coda::test::Accepted;
using coda::test::DeviceBuffer;

constexpr double kEps = 1e-5;

struct Shape {
  int64_t M, d, F;
  int32_t hq, hkv, hd;
  int64_t qo() const { return int64_t{hq} * hd; }
  int64_t W() const { return (int64_t{hq} + 2 * int64_t{hkv}) * hd; }
  RopeHeads heads() const { return {hq, hkv, hd}; }
  std::string name() const {
    return "M=" + std::to_string(M) + " d=" + std::to_string(d) + " F=" + std::to_string(F) + " heads " +
           std::to_string(hq) + "/" + std::to_string(hkv) + "x" + std::to_string(hd);
  }
};

struct Weights {
  Matrix wo, wgu, wd, wqkv;
  Vector g1, g2;
  bool qk = false;  // layer i+1's QK-norm (block.h version 2): norm's gammas and eps
  QkNorm norm;
};

struct Saved {
  Matrix x1, z1, x2, qkv;
  Vector rstd1, rstd2;
  Matrix z;  // with QK-norm: the pre-norm q/k/v projection
};

struct Grads {
  Matrix dy0, dx0, dwo, dwgu, dwd, dwqkv;
  Vector dg1, dg2;
  Vector dgq, dgk;  // with QK-norm
};

Weights random_weights(Shape const& s, Rng& rng, coda_dtype dt, bool qk = false) {
  Weights w;
  w.wo = round_to(random_weight(s.d, s.qo(), rng), dt);
  w.wgu = round_to(random_weight(2 * s.F, s.d, rng), dt);
  w.wd = round_to(random_weight(s.d, s.F, rng), dt);
  w.wqkv = round_to(random_weight(s.W(), s.d, rng), dt);
  w.g1 = round_to(random_gamma(s.d, rng), dt);
  w.g2 = round_to(random_gamma(s.d, rng), dt);
  if (qk) {
    w.qk = true;
    w.norm.q_gamma = round_to(random_gamma(s.hd, rng), CODA_FP32);
    w.norm.k_gamma = round_to(random_gamma(s.hd, rng), CODA_FP32);
    w.norm.eps = 1e-6;
  }
  return w;
}

// ---- the two host pipelines ----------------------------------------------------------------------------------------

Saved ref_forward(Shape const& s, Weights const& w, Matrix const& y0, Matrix const& x0, Positions const& pos,
                  Vector const& freq) {
  Saved o;
  ResidualRmsnorm const out_proj = linear_residual_rmsnorm(y0, w.wo, x0, w.g1, kEps);
  Swiglu const gate_up = linear_rowscale_swiglu(out_proj.h, w.wgu, out_proj.rstd);
  ResidualRmsnorm const down_proj = linear_residual_rmsnorm(gate_up.y, w.wd, out_proj.x, w.g2, kEps);
  o.x1 = out_proj.x, o.rstd1 = out_proj.rstd, o.z1 = gate_up.z, o.x2 = down_proj.x, o.rstd2 = down_proj.rstd;
  if (w.qk) {
    o.z = linear_rowscale(down_proj.h, w.wqkv, down_proj.rstd);
    o.qkv = linear_rowscale_qk_norm_rope(down_proj.h, w.wqkv, down_proj.rstd, w.norm, pos, freq, s.heads());
    return o;
  }
  o.qkv = linear_rowscale_rope(down_proj.h, w.wqkv, down_proj.rstd, pos, freq, s.heads());
  return o;
}

Saved unf_forward(Shape const& s, Weights const& w, Matrix const& y0, Matrix const& x0, Positions const& pos,
                  Vector const& freq, coda_dtype dt) {
  Saved o;
  ResidualRmsnorm const out_proj = linear_residual_rmsnorm_unfused(y0, w.wo, x0, w.g1, kEps, dt);
  Swiglu const gate_up = linear_rowscale_swiglu_unfused(out_proj.h, w.wgu, out_proj.rstd, dt);
  ResidualRmsnorm const down_proj = linear_residual_rmsnorm_unfused(gate_up.y, w.wd, out_proj.x, w.g2, kEps, dt);
  o.x1 = out_proj.x, o.rstd1 = out_proj.rstd, o.z1 = gate_up.z, o.x2 = down_proj.x, o.rstd2 = down_proj.rstd;
  if (w.qk) {
    o.z = linear_rowscale_unfused(down_proj.h, w.wqkv, down_proj.rstd, dt);
    o.qkv = linear_rowscale_qk_norm_rope_unfused(down_proj.h, w.wqkv, down_proj.rstd, w.norm, pos, freq, s.heads(),
                                                 dt, RopeAngles::kExact);
    return o;
  }
  o.qkv =
      linear_rowscale_rope_unfused(down_proj.h, w.wqkv, down_proj.rstd, pos, freq, s.heads(), dt, RopeAngles::kExact);
  return o;
}

/// dW = dz^T a into fp32 (what coda_gemm computes into the fp32 grads), exact or unfused.
Matrix weight_grad(Matrix const& dz, Matrix const& a, bool unfused, coda_dtype dt) {
  if (!unfused) return wgrad(dz, a);
  Matrix d(dz.cols, a.cols);
  gemm_unfused(transpose(dz), transpose(a), 1.0, false, d, dt, CODA_FP32);
  return d;
}

Grads backward(Shape const& s, Weights const& w, Matrix const& y0, Positions const& pos, Vector const& freq,
               Saved const& sv, Matrix const& dqkv, Matrix const* dx2_in, bool unfused, coda_dtype dt) {
  Grads g;
  RopeBwd qkv_bwd;
  if (w.qk) {
    QkNormRopeBwd const qb =
        unfused ? qk_norm_rope_bwd_unfused(sv.z, dqkv, w.norm, pos, freq, s.heads(), s.d, dt, RopeAngles::kExact)
                : qk_norm_rope_bwd(sv.z, sv.qkv, dqkv, w.norm, pos, freq, s.heads(), s.d);
    qkv_bwd.dz = qb.dz, qkv_bwd.zdz = qb.zdz;
    g.dgq = qb.dq_gamma, g.dgk = qb.dk_gamma;
  } else {
    qkv_bwd = unfused ? rope_bwd_zdz_unfused(sv.qkv, dqkv, pos, freq, s.heads(), s.d, dt, RopeAngles::kExact)
                      : rope_bwd_zdz(sv.qkv, dqkv, pos, freq, s.heads(), s.d);
  }
  ResidualRmsnormBwd const norm2 =
      unfused ? linear_residual_rmsnorm_bwd_unfused(qkv_bwd.dz, w.wqkv, sv.x2, w.g2, sv.rstd2, dx2_in, 1.0, dt)
              : linear_residual_rmsnorm_bwd(qkv_bwd.dz, w.wqkv, sv.x2, w.g2, sv.rstd2, qkv_bwd.zdz, dx2_in, 1.0);
  g.dwqkv = weight_grad(qkv_bwd.dz, norm2.a, unfused, dt);
  g.dg2 = norm2.dgamma;
  SwigluBwd const down_bwd = unfused ? linear_swiglu_bwd_zdz_unfused(norm2.dx, w.wd, sv.z1, dt)
                                     : linear_swiglu_bwd_zdz(norm2.dx, w.wd, sv.z1);
  g.dwd = weight_grad(norm2.dx, down_bwd.y, unfused, dt);
  ResidualRmsnormBwd const norm1 =
      unfused ? linear_residual_rmsnorm_bwd_unfused(down_bwd.dz, w.wgu, sv.x1, w.g1, sv.rstd1, &norm2.dx, 1.0, dt)
              : linear_residual_rmsnorm_bwd(down_bwd.dz, w.wgu, sv.x1, w.g1, sv.rstd1, down_bwd.zdz, &norm2.dx, 1.0);
  g.dwgu = weight_grad(down_bwd.dz, norm1.a, unfused, dt);
  g.dg1 = norm1.dgamma;
  g.dx0 = norm1.dx;
  g.dy0 = unfused ? dgrad_unfused(norm1.dx, w.wo, dt) : dgrad(norm1.dx, w.wo);
  g.dwo = weight_grad(norm1.dx, y0, unfused, dt);
  return g;
}

// ---- the device side -----------------------------------------------------------------------------------------------

/// A dense row-major device tensor of the block's dtype (16-bit) or fp32.
struct Dev {
  DeviceBuffer buf;
  coda_tensor t{};
  Dev(coda_dtype dt, int64_t rows, int64_t cols)
      : buf(static_cast<size_t>(rows * cols) * coda_dtype_size(dt) + 256) {
    t = coda::test::strided_tensor(buf.get(), dt, rows, cols, cols);
    buf.poison();
  }
  Dev(coda_dtype dt, int64_t n) : buf(static_cast<size_t>(n) * coda_dtype_size(dt) + 256) {
    t = coda::test::device_tensor(buf.get(), dt, {n});
    buf.poison();
  }
  void set(Matrix const& m) {
    if (t.dtype == CODA_FP32) {
      buf.upload(to_float(m));
    } else {
      buf.upload(to_bits(m, t.dtype));
    }
  }
  void set(Vector const& v) {
    if (t.dtype == CODA_FP32) {
      std::vector<float> f(v.begin(), v.end());
      buf.upload(f);
    } else {
      buf.upload(to_bits(v, t.dtype));
    }
  }
  Matrix matrix() const {
    size_t const n = static_cast<size_t>(t.sizes[0] * t.sizes[1]);
    if (t.dtype == CODA_FP32) return matrix_from_float(buf.download<float>(n).data(), t.sizes[0], t.sizes[1]);
    return matrix_from_bits(buf.download<uint16_t>(n).data(), t.sizes[0], t.sizes[1], t.dtype);
  }
  Vector vector() const {
    size_t const n = static_cast<size_t>(t.sizes[0]);
    if (t.dtype == CODA_FP32) return vector_from_float(buf.download<float>(n).data(), t.sizes[0]);
    return vector_from_bits(buf.download<uint16_t>(n).data(), t.sizes[0], t.dtype);
  }
};

/// One block on the device: weights, saved tensors, gradients.
struct DevBlock {
  Shape s;
  coda_dtype dt;
  coda_block_config config{};
  Dev wo, g1, wgu, wd, g2, wqkv;
  Dev x1, rstd1, z1, x2, rstd2, qkv;
  Dev gwo, gg1, gwgu, gwd, gg2, gwqkv;
  Dev qg, kg, z, gqg, gkg;  // QK-norm (allocated always, handed to the block only with it)
  coda_block_weights weights{};
  coda_block_saved saved{};
  coda_block_grads grads{};

  DevBlock(Shape const& shape, coda_dtype dtype, Weights const& w)
      : s(shape),
        dt(dtype),
        wo(dt, s.d, s.qo()), g1(dt, s.d), wgu(dt, 2 * s.F, s.d), wd(dt, s.d, s.F), g2(dt, s.d),
        wqkv(dt, s.W(), s.d),
        x1(dt, s.M, s.d), rstd1(CODA_FP32, s.M), z1(dt, s.M, 2 * s.F), x2(dt, s.M, s.d), rstd2(CODA_FP32, s.M),
        qkv(dt, s.M, s.W()),
        gwo(CODA_FP32, s.d, s.qo()), gg1(CODA_FP32, s.d), gwgu(CODA_FP32, 2 * s.F, s.d), gwd(CODA_FP32, s.d, s.F),
        gg2(CODA_FP32, s.d), gwqkv(CODA_FP32, s.W(), s.d),
        qg(CODA_FP32, s.hd), kg(CODA_FP32, s.hd), z(dt, s.M, s.W()), gqg(CODA_FP32, s.hd), gkg(CODA_FP32, s.hd) {
    config = {sizeof(coda_block_config), s.d, s.F, s.hq, s.hkv, s.hd, static_cast<float>(kEps), 0.0f, 0u};
    wo.set(w.wo), g1.set(w.g1), wgu.set(w.wgu), wd.set(w.wd), g2.set(w.g2), wqkv.set(w.wqkv);
    weights = {sizeof(coda_block_weights), wo.t, g1.t, wgu.t, wd.t, g2.t, wqkv.t, coda_tensor{}, coda_tensor{}};
    saved = {sizeof(coda_block_saved), x1.t, rstd1.t, z1.t, x2.t, rstd2.t, qkv.t, coda_tensor{}};
    grads = {sizeof(coda_block_grads), gwo.t, gg1.t, gwgu.t, gwd.t, gg2.t, gwqkv.t, coda_tensor{}, coda_tensor{}};
    if (w.qk) {
      qg.set(w.norm.q_gamma), kg.set(w.norm.k_gamma);
      config.qk_eps = static_cast<float>(w.norm.eps);
      weights.q_gamma = qg.t, weights.k_gamma = kg.t;
      saved.z = z.t;
      grads.q_gamma = gqg.t, grads.k_gamma = gkg.t;
    }
  }

  void forward(coda_tensor const& y0, coda_tensor const& x0, coda_tensor const& pos, coda_tensor const& freq) {
    size_t const bytes = coda_block_forward_workspace_size(&config, s.M);
    DeviceBuffer ws(bytes);
    ws.poison();
    ASSERT_EQ(coda_block_forward(&config, &weights, &y0, &x0, &pos, &freq, &saved, ws.get(), bytes, nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
  }

  void backward(coda_tensor const& y0, coda_tensor const& pos, coda_tensor const& freq, coda_tensor& dqkv,
                coda_tensor const* dx2, coda_tensor& dy0, coda_tensor& dx0) {
    size_t const bytes = coda_block_backward_workspace_size(&config, s.M);
    DeviceBuffer ws(bytes);
    ws.poison();
    ASSERT_EQ(coda_block_backward(&config, &weights, &y0, &pos, &freq, &saved, &dqkv, dx2, &dy0, &dx0, &grads,
                                  ws.get(), bytes, nullptr),
              CODA_SUCCESS)
        << coda_last_error();
    CUDA_OK(cudaDeviceSynchronize());
  }

  Saved saved_values() const {
    Saved o;
    o.x1 = x1.matrix(), o.z1 = z1.matrix(), o.x2 = x2.matrix(), o.qkv = qkv.matrix();
    o.rstd1 = rstd1.vector(), o.rstd2 = rstd2.vector();
    if (config.qk_eps > 0) o.z = z.matrix();
    return o;
  }
  Grads weight_grads() const {
    Grads g;
    g.dwo = gwo.matrix(), g.dwgu = gwgu.matrix(), g.dwd = gwd.matrix(), g.dwqkv = gwqkv.matrix();
    g.dg1 = gg1.vector(), g.dg2 = gg2.vector();
    if (config.qk_eps > 0) g.dgq = gqg.vector(), g.dgk = gkg.vector();
    return g;
  }
};

void expect_saved(std::string const& what, Saved const& c, Saved const& u, Saved const& r, bool print,
                  bool qk = false) {
  EXPECT_TRUE(Accepted(what + " x1", acceptance(c.x1, u.x1, r.x1), print));
  EXPECT_TRUE(Accepted(what + " rstd1", acceptance(c.rstd1, u.rstd1, r.rstd1), print));
  EXPECT_TRUE(Accepted(what + " z1", acceptance(c.z1, u.z1, r.z1), print));
  EXPECT_TRUE(Accepted(what + " x2", acceptance(c.x2, u.x2, r.x2), print));
  EXPECT_TRUE(Accepted(what + " rstd2", acceptance(c.rstd2, u.rstd2, r.rstd2), print));
  EXPECT_TRUE(Accepted(what + " qkv", acceptance(c.qkv, u.qkv, r.qkv), print));
  if (qk) {
    EXPECT_TRUE(Accepted(what + " z", acceptance(c.z, u.z, r.z), print));
  }
}

void expect_weight_grads(std::string const& what, Grads const& c, Grads const& u, Grads const& r, bool print,
                         bool qk = false) {
  EXPECT_TRUE(Accepted(what + " dW_o", acceptance(c.dwo, u.dwo, r.dwo), print));
  EXPECT_TRUE(Accepted(what + " dW_gu", acceptance(c.dwgu, u.dwgu, r.dwgu), print));
  EXPECT_TRUE(Accepted(what + " dW_down", acceptance(c.dwd, u.dwd, r.dwd), print));
  EXPECT_TRUE(Accepted(what + " dW_qkv", acceptance(c.dwqkv, u.dwqkv, r.dwqkv), print));
  EXPECT_TRUE(Accepted(what + " dgamma1", acceptance(c.dg1, u.dg1, r.dg1), print));
  EXPECT_TRUE(Accepted(what + " dgamma2", acceptance(c.dg2, u.dg2, r.dg2), print));
  if (qk) {
    EXPECT_TRUE(Accepted(what + " dq_gamma", acceptance(c.dgq, u.dgq, r.dgq), print));
    EXPECT_TRUE(Accepted(what + " dk_gamma", acceptance(c.dgk, u.dgk, r.dgk), print));
  }
}

/// One block: forward (all saved tensors), then backward with or without an incoming dx2.
/// A block's random inputs in the dtype: weights, attention output y0, residual x0, positions, inv_freq, and the
/// upstream gradients dqkv and dx2.
struct BlockInputs {
  Weights w;
  Matrix y0, x0;
  Positions pos;
  Vector freq;
  Matrix dqkv, dx2;
  BlockInputs(Shape const& s, coda_dtype dt, uint64_t seed, bool qk = false) {
    Rng rng(seed);
    w = random_weights(s, rng, dt, qk);
    y0 = round_to(random_activation(s.M, s.qo(), rng), dt);
    x0 = round_to(random_residual(s.M, s.d, rng), dt);
    pos = random_positions(s.M, 8192, rng);
    freq = rope_inv_freq(s.hd);
    dqkv = round_to(random_activation(s.M, s.W(), rng), dt);
    dx2 = round_to(random_activation(s.M, s.d, rng), dt);
  }
};

void check_block(Shape const& s, coda_dtype dt, bool with_dx2, uint64_t seed, bool print, bool qk = false) {
  std::string const what = std::string("block ") + coda::test::dtype_name(dt) + " " + s.name() +
                           (with_dx2 ? " dx2" : " no dx2") + (qk ? " QK-norm" : "");
  SCOPED_TRACE(what);
  BlockInputs const in(s, dt, seed, qk);
  Weights const& w = in.w;
  Matrix const &y0 = in.y0, &x0 = in.x0, &dqkv = in.dqkv, &dx2 = in.dx2;
  Positions const& pos = in.pos;
  Vector const& freq = in.freq;

  Saved const ref = ref_forward(s, w, y0, x0, pos, freq);
  Saved const unf = unf_forward(s, w, y0, x0, pos, freq, dt);
  Grads const gref = backward(s, w, y0, pos, freq, ref, dqkv, with_dx2 ? &dx2 : nullptr, false, dt);
  Grads const gunf = backward(s, w, y0, pos, freq, unf, dqkv, with_dx2 ? &dx2 : nullptr, true, dt);

  DevBlock b(s, dt, w);
  Dev dy0v(dt, s.M, s.qo()), dx0v(dt, s.M, s.d), dqkvv(dt, s.M, s.W()), dx2v(dt, s.M, s.d);
  Dev dpos(CODA_INT32, s.M), dfreq(CODA_FP32, s.hd / 2);
  dy0v.set(y0);
  dx0v.set(x0);
  dpos.buf.upload(pos);
  dfreq.set(freq);
  ASSERT_NO_FATAL_FAILURE(b.forward(dy0v.t, dx0v.t, dpos.t, dfreq.t));
  expect_saved(what, b.saved_values(), unf, ref, print, qk);

  dqkvv.set(dqkv);
  dx2v.set(dx2);
  Dev gy0(dt, s.M, s.qo()), gx0(dt, s.M, s.d);
  ASSERT_NO_FATAL_FAILURE(b.backward(dy0v.t, dpos.t, dfreq.t, dqkvv.t, with_dx2 ? &dx2v.t : nullptr, gy0.t, gx0.t));
  Grads c = b.weight_grads();
  c.dy0 = gy0.matrix();
  c.dx0 = gx0.matrix();
  EXPECT_TRUE(Accepted(what + " dy0", acceptance(c.dy0, gunf.dy0, gref.dy0), print));
  EXPECT_TRUE(Accepted(what + " dx0", acceptance(c.dx0, gunf.dx0, gref.dx0), print));
  expect_weight_grads(what, c, gunf, gref, print, qk);
}

TEST(Block, ForwardBackward) {
  CODA_REQUIRE_SM90();
  check_block({200, 256, 384, 4, 2, 64}, CODA_BF16, true, 1, true);     // GQA, awkward M
  check_block({129, 256, 264, 2, 2, 128}, CODA_BF16, false, 2, true);   // MHA, F not a tile multiple
  check_block({512, 1024, 2816, 8, 2, 128}, CODA_BF16, true, 3, true);  // llama-like proportions
}

// Layer i+1 with Qwen3's QK-norm (block.h version 2): linear_rowscale_qk_norm_rope last, z saved,
// qk_norm_rope_bwd_zdz first in the backward with the q/k gamma gradients.
TEST(Block, ForwardBackwardQkNorm) {
  CODA_REQUIRE_SM90();
  check_block({200, 256, 384, 4, 2, 64}, CODA_BF16, true, 11, true, true);
  check_block({129, 256, 264, 2, 2, 128}, CODA_BF16, false, 12, true, true);
  check_block({200, 256, 384, 4, 2, 64}, CODA_FP16, true, 13, true, true);
}

TEST(BlockSanitize, SmallQkNorm) {
  CODA_REQUIRE_SM90();
  check_block({72, 128, 136, 2, 1, 64}, CODA_BF16, true, 14, false, true);
}

TEST(Block, ForwardBackwardFp16) {
  CODA_REQUIRE_SM90();
  check_block({200, 256, 384, 4, 2, 64}, CODA_FP16, true, 4, true);
}

TEST(BlockSanitize, Small) {
  CODA_REQUIRE_SM90();
  check_block({72, 128, 136, 2, 1, 64}, CODA_BF16, true, 5, false);
}

/// Programmatic dependent launch (CODA_PDL=1: each GEMM may start while the previous kernel finishes) must not
/// change a bit: the block's forward and backward chain every fused op on its predecessor's output, in place too
/// (dx accumulated into dx2, dz over z). Run twice on the same inputs, CODA_PDL unset and set, twice each way.
TEST(Block, ProgrammaticLaunchIsBitIdentical) {
  CODA_REQUIRE_SM90();
  if (coda_gemm_pdl_compiled() == 0) GTEST_SKIP() << "libcoda built without -DCODA_GDC=ON: CODA_PDL has no effect";
  Shape const s{512, 1024, 2816, 8, 2, 128};
  coda_dtype const dt = CODA_BF16;
  BlockInputs const in(s, dt, 21);
  auto run = [&](bool pdl) {
    if (pdl) {
      setenv("CODA_PDL", "1", 1);
    } else {
      unsetenv("CODA_PDL");
    }
    DevBlock b(s, dt, in.w);
    Dev dy0v(dt, s.M, s.qo()), dx0v(dt, s.M, s.d), dqkvv(dt, s.M, s.W()), dx2v(dt, s.M, s.d);
    Dev dpos(CODA_INT32, s.M), dfreq(CODA_FP32, s.hd / 2), gy0(dt, s.M, s.qo());
    dy0v.set(in.y0), dx0v.set(in.x0), dqkvv.set(in.dqkv), dx2v.set(in.dx2), dfreq.set(in.freq);
    dpos.buf.upload(in.pos);
    b.forward(dy0v.t, dx0v.t, dpos.t, dfreq.t);
    b.backward(dy0v.t, dpos.t, dfreq.t, dqkvv.t, &dx2v.t, gy0.t, dx2v.t);  // dx0 accumulated in place over dx2
    unsetenv("CODA_PDL");
    std::vector<Matrix> out{b.x1.matrix(), b.z1.matrix(), b.x2.matrix(), b.qkv.matrix(), gy0.matrix(),
                            dx2v.matrix(), b.gwo.matrix(), b.gwgu.matrix(), b.gwd.matrix(), b.gwqkv.matrix()};
    for (Vector const& v : {b.rstd1.vector(), b.rstd2.vector(), b.gg1.vector(), b.gg2.vector()}) {
      out.emplace_back(1, static_cast<int64_t>(v.size()), v);
    }
    return out;
  };
  char const* const names[] = {"x1", "z1", "x2", "qkv", "dy0", "dx0", "dwo", "dwgu", "dwd", "dwqkv",
                               "rstd1", "rstd2", "dgamma1", "dgamma2"};
  std::vector<Matrix> const off = run(false);
  for (bool pdl : {true, false, true}) {
    std::vector<Matrix> const again = run(pdl);
    ASSERT_EQ(again.size(), off.size());
    for (size_t i = 0; i < off.size(); ++i) {
      ASSERT_TRUE(again[i].same_shape(off[i])) << names[i];
      size_t differ = 0;
      for (size_t k = 0; k < off[i].data.size(); ++k) differ += again[i].data[k] != off[i].data[k];
      EXPECT_EQ(differ, 0u) << names[i] << (pdl ? " with" : " without") << " CODA_PDL: elements that differ";
    }
  }
}

/// Two blocks A -> B: B's attention output is A's q columns (a stand-in for attention), B's residual input is A's
/// x2; backward B, then A with dqkv_A = [dy0_B | 0] and dx2_A = dx0_B.
TEST(Block, TwoBlockChain) {
  CODA_REQUIRE_SM90();
  Shape const s{160, 256, 384, 4, 2, 64};
  coda_dtype const dt = CODA_BF16;
  SCOPED_TRACE("two-block chain " + s.name());
  Rng rng(11);
  Weights const wa = random_weights(s, rng, dt), wb = random_weights(s, rng, dt);
  Matrix const y0 = round_to(random_activation(s.M, s.qo(), rng), dt);
  Matrix const x0 = round_to(random_residual(s.M, s.d, rng), dt);
  Positions const pos = random_positions(s.M, 8192, rng);
  Vector const freq = rope_inv_freq(s.hd);
  Matrix const dqkv_b = round_to(random_activation(s.M, s.W(), rng), dt);
  Matrix const dx2_b = round_to(random_activation(s.M, s.d, rng), dt);
  auto q_cols = [&](Matrix const& qkv) {
    Matrix q(s.M, s.qo());
    for (int64_t m = 0; m < s.M; ++m) {
      for (int64_t j = 0; j < s.qo(); ++j) q(m, j) = qkv(m, j);
    }
    return q;
  };
  auto pad_q = [&](Matrix const& dq) {
    Matrix d(s.M, s.W());
    for (int64_t m = 0; m < s.M; ++m) {
      for (int64_t j = 0; j < s.qo(); ++j) d(m, j) = dq(m, j);
    }
    return d;
  };
  // Host pipelines.
  struct Chain {
    Saved a, b;
    Grads ga, gb;
  };
  auto host_chain = [&](bool unfused) {
    Chain c;
    c.a = unfused ? unf_forward(s, wa, y0, x0, pos, freq, dt) : ref_forward(s, wa, y0, x0, pos, freq);
    Matrix const y0b = q_cols(c.a.qkv);
    c.b = unfused ? unf_forward(s, wb, y0b, c.a.x2, pos, freq, dt) : ref_forward(s, wb, y0b, c.a.x2, pos, freq);
    c.gb = backward(s, wb, y0b, pos, freq, c.b, dqkv_b, &dx2_b, unfused, dt);
    c.ga = backward(s, wa, y0, pos, freq, c.a, pad_q(c.gb.dy0), &c.gb.dx0, unfused, dt);
    return c;
  };
  Chain const ref = host_chain(false), unf = host_chain(true);

  // Device.
  DevBlock a(s, dt, wa), b(s, dt, wb);
  Dev dy0(dt, s.M, s.qo()), dx0(dt, s.M, s.d), y0b(dt, s.M, s.qo()), dpos(CODA_INT32, s.M), dfreq(CODA_FP32, s.hd / 2);
  dy0.set(y0);
  dx0.set(x0);
  dpos.buf.upload(pos);
  dfreq.set(freq);
  ASSERT_NO_FATAL_FAILURE(a.forward(dy0.t, dx0.t, dpos.t, dfreq.t));
  size_t const el = coda_dtype_size(dt);
  CUDA_OK(cudaMemcpy2D(y0b.buf.get(), s.qo() * el, a.qkv.buf.get(), s.W() * el, s.qo() * el, s.M,
                       cudaMemcpyDeviceToDevice));
  ASSERT_NO_FATAL_FAILURE(b.forward(y0b.t, a.x2.t, dpos.t, dfreq.t));
  expect_saved("chain A", a.saved_values(), unf.a, ref.a, true);
  expect_saved("chain B", b.saved_values(), unf.b, ref.b, true);

  Dev dqkvb(dt, s.M, s.W()), dx2b(dt, s.M, s.d), gy0b(dt, s.M, s.qo()), gx0b(dt, s.M, s.d);
  dqkvb.set(dqkv_b);
  dx2b.set(dx2_b);
  ASSERT_NO_FATAL_FAILURE(b.backward(y0b.t, dpos.t, dfreq.t, dqkvb.t, &dx2b.t, gy0b.t, gx0b.t));
  Dev dqkva(dt, s.M, s.W()), gy0a(dt, s.M, s.qo()), gx0a(dt, s.M, s.d);
  CUDA_OK(cudaMemset(dqkva.buf.get(), 0, dqkva.buf.bytes()));
  CUDA_OK(cudaMemcpy2D(dqkva.buf.get(), s.W() * el, gy0b.buf.get(), s.qo() * el, s.qo() * el, s.M,
                       cudaMemcpyDeviceToDevice));
  // dx2 of A is dx0 of B, accumulated in place (dx0_out = dx2).
  ASSERT_NO_FATAL_FAILURE(a.backward(dy0.t, dpos.t, dfreq.t, dqkva.t, &gx0b.t, gy0a.t, gx0b.t));
  Grads ca = a.weight_grads(), cb = b.weight_grads();
  cb.dy0 = gy0b.matrix();
  ca.dy0 = gy0a.matrix();
  ca.dx0 = gx0b.matrix();
  EXPECT_TRUE(Accepted("chain B dy0", acceptance(cb.dy0, unf.gb.dy0, ref.gb.dy0), true));
  EXPECT_TRUE(Accepted("chain A dy0", acceptance(ca.dy0, unf.ga.dy0, ref.ga.dy0), true));
  EXPECT_TRUE(Accepted("chain A dx0", acceptance(ca.dx0, unf.ga.dx0, ref.ga.dx0), true));
  expect_weight_grads("chain B", cb, unf.gb, ref.gb, true);
  expect_weight_grads("chain A", ca, unf.ga, ref.ga, true);
}

}  // namespace
