// The block API's validation (include/coda/block.h): valid arguments reach the device stage; every rule names the
// argument; nothing is written on rejection; the workspace sizes cover the temporaries.
#include <coda/block.h>
#include <coda/block.hpp>
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cstddef>

#include "cpu/tensor_pool.hpp"

extern "C" int coda_c_block_init_check(void);  // tests/cpu/c_header_check.c

namespace {

using coda::test::TensorPool;

constexpr int64_t kM = 24, kD = 64, kF = 96;
constexpr int32_t kHq = 2, kHkv = 1, kHd = 64;
constexpr int64_t kQo = kHq * kHd, kW = (kHq + 2 * kHkv) * kHd;

struct Block {
  TensorPool pool;
  coda_dtype dt = CODA_BF16;
  coda_block_config config{sizeof(coda_block_config), kD, kF, kHq, kHkv, kHd, 1e-5f, 0.0f, 0u};
  coda_block_weights w{sizeof(coda_block_weights),  pool.make(dt, {kD, kQo}),     pool.make(dt, {kD}),
                       pool.make(dt, {2 * kF, kD}),  pool.make(dt, {kD, kF}),      pool.make(dt, {kD}),
                       pool.make(dt, {kW, kD}),      coda_tensor{},                coda_tensor{}};
  coda_block_grads g{sizeof(coda_block_grads),       pool.make(CODA_FP32, {kD, kQo}), pool.make(CODA_FP32, {kD}),
                     pool.make(CODA_FP32, {2 * kF, kD}), pool.make(CODA_FP32, {kD, kF}),
                     pool.make(CODA_FP32, {kD}),       pool.make(dt, {kW, kD}),      coda_tensor{},
                     coda_tensor{}};
  coda_block_saved saved{sizeof(coda_block_saved), pool.make(dt, {kM, kD}), pool.make(CODA_FP32, {kM}),
                         pool.make(dt, {kM, 2 * kF}), pool.make(dt, {kM, kD}), pool.make(CODA_FP32, {kM}),
                         pool.make(dt, {kM, kW}),     coda_tensor{}};

  /// Layer i+1 with a QK-norm (Qwen3): config.qk_eps and the version-2 tensors set.
  void enable_qk_norm() {
    config.qk_eps = 1e-6f;
    w.q_gamma = pool.make(CODA_FP32, {kHd}), w.k_gamma = pool.make(CODA_FP32, {kHd});
    g.q_gamma = pool.make(CODA_FP32, {kHd}), g.k_gamma = pool.make(CODA_FP32, {kHd});
    saved.z = pool.make(dt, {kM, kW});
    fwd_bytes = coda_block_forward_workspace_size(&config, kM);
    bwd_bytes = coda_block_backward_workspace_size(&config, kM);
    fwd_ws = pool.bytes(fwd_bytes);
    bwd_ws = pool.bytes(bwd_bytes);
  }
  coda_tensor y0 = pool.make(dt, {kM, kQo}), x0 = pool.make(dt, {kM, kD});
  coda_tensor pos = pool.make(CODA_INT32, {kM}), freq = pool.make(CODA_FP32, {kHd / 2});
  coda_tensor dqkv = pool.make(dt, {kM, kW}), dx2 = pool.make(dt, {kM, kD});
  coda_tensor dy0 = pool.make(dt, {kM, kQo}), dx0 = pool.make(dt, {kM, kD});
  size_t fwd_bytes = coda_block_forward_workspace_size(&config, kM);
  size_t bwd_bytes = coda_block_backward_workspace_size(&config, kM);
  void* fwd_ws = pool.bytes(fwd_bytes);
  void* bwd_ws = pool.bytes(bwd_bytes);

  coda_status forward() {
    return coda_block_forward(&config, &w, &y0, &x0, &pos, &freq, &saved, fwd_ws, fwd_bytes, nullptr);
  }
  coda_status backward(coda_tensor const* dx2_in) {
    return coda_block_backward(&config, &w, &y0, &pos, &freq, &saved, &dqkv, dx2_in, &dy0, &dx0, &g, bwd_ws,
                               bwd_bytes, nullptr);
  }
};

TEST(BlockApi, ValidArgumentsReachTheDevice) {
  Block b;
  auto& pool = b.pool;
  EXPECT_DEVICE_STAGE(b.forward(), "y0:");
  EXPECT_DEVICE_STAGE(b.backward(&b.dx2), "y0:");
  EXPECT_DEVICE_STAGE(b.backward(nullptr), "y0:");
  b.saved.x1 = b.x0;  // x1 in place over x0
  EXPECT_DEVICE_STAGE(b.forward(), "y0:");
  b.dx0 = b.dx2;  // dx0 in place over dx2
  EXPECT_DEVICE_STAGE(b.backward(&b.dx2), "y0:");
}

TEST(BlockApi, WorkspaceSizes) {
  coda_block_config const c{sizeof(coda_block_config), kD, kF, kHq, kHkv, kHd, 1e-5f, 0.0f, 0u};
  // Forward: h [M,d] and y1 [M,F] bf16 at least; backward adds the two zdz vectors.
  EXPECT_GE(coda_block_forward_workspace_size(&c, kM), static_cast<size_t>(kM * (kD + kF) * 2));
  EXPECT_GE(coda_block_backward_workspace_size(&c, kM), static_cast<size_t>(kM * (kD + kF) * 2 + 2 * kM * 4));
  EXPECT_LE(coda_block_forward_workspace_size(&c, kM), coda_block_forward_workspace_size(&c, 4 * kM));
  EXPECT_EQ(coda_block_forward_workspace_size(nullptr, kM), 0u);
}

TEST(BlockApi, ConfigRules) {
  Block b;
  auto& pool = b.pool;
  EXPECT_REJECTED(coda_block_forward(nullptr, &b.w, &b.y0, &b.x0, &b.pos, &b.freq, &b.saved, b.fwd_ws, b.fwd_bytes,
                                     nullptr),
                  CODA_ERROR_INVALID_ARGUMENT, "config");
  b.config.head_dim = 96;
  EXPECT_REJECTED(b.forward(), CODA_ERROR_SHAPE, "config.head_dim", "64 or 128");
  b.config.head_dim = kHd;
  b.config.n_kv_heads = 3;
  EXPECT_REJECTED(b.backward(nullptr), CODA_ERROR_SHAPE, "n_kv_heads");
  b.config.n_kv_heads = kHkv;
  b.config.eps = 0.0f;
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "eps");
  b.config.eps = 1e-5f;
  b.config.intermediate_size = 100;
  EXPECT_REJECTED(b.forward(), CODA_ERROR_SHAPE, "config.intermediate_size", "multiple of 8");
  b.config.intermediate_size = kF;
  b.config.reserved = 1;
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "config.reserved", "must be 0");
}

// block.h "Versioning": each struct's struct_size must be a size this library knows (version 1: its sizeof); 0
// (not set) and a larger one (a newer header) are refused naming the field, before anything else is read.
TEST(BlockApi, StructSizeRules) {
  Block b;
  auto& pool = b.pool;
  b.config.struct_size = 0;
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "config.struct_size", "CODA_BLOCK_CONFIG_INIT",
                  "not set");
  EXPECT_EQ(coda_block_forward_workspace_size(&b.config, kM), 0u);
  EXPECT_EQ(coda_block_backward_workspace_size(&b.config, kM), 0u);
  b.config.struct_size = sizeof(coda_block_config) + 8;
  EXPECT_REJECTED(b.backward(nullptr), CODA_ERROR_INVALID_ARGUMENT, "config.struct_size", "does not know");
  b.config.struct_size = sizeof(coda_block_config);
  b.w.struct_size = sizeof(coda_block_weights) - 8;
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "weights.struct_size", "CODA_BLOCK_WEIGHTS_INIT");
  b.w.struct_size = sizeof(coda_block_weights);
  b.saved.struct_size = 0;
  EXPECT_REJECTED(b.backward(&b.dx2), CODA_ERROR_INVALID_ARGUMENT, "saved.struct_size", "CODA_BLOCK_SAVED_INIT");
  b.saved.struct_size = sizeof(coda_block_saved);
  b.g.struct_size = 1;
  EXPECT_REJECTED(b.backward(&b.dx2), CODA_ERROR_INVALID_ARGUMENT, "grads.struct_size", "CODA_BLOCK_GRADS_INIT");
  b.g.struct_size = sizeof(coda_block_grads);
  EXPECT_DEVICE_STAGE(b.backward(&b.dx2), "y0:");
  // The initialisers: struct_size set, the rest zero (C: CODA_BLOCK_*_INIT, compiled as C; C++: block_struct).
  EXPECT_EQ(coda_c_block_init_check(), 1);
  auto const c = coda::block_struct<coda::BlockConfig>();
  EXPECT_EQ(c.struct_size, sizeof(coda_block_config));
  EXPECT_EQ(c.hidden_size, 0);
}

// Version 1's sizes (before the QK-norm fields) are read with those fields at their defaults: no QK-norm.
TEST(BlockApi, Version1StructsAreAccepted) {
  Block b;
  auto& pool = b.pool;
  size_t const v2_fwd = b.fwd_bytes, v2_bwd = b.bwd_bytes;
  b.config.struct_size = offsetof(coda_block_config, qk_eps);
  b.w.struct_size = offsetof(coda_block_weights, q_gamma);
  b.g.struct_size = offsetof(coda_block_grads, q_gamma);
  b.saved.struct_size = offsetof(coda_block_saved, z);
  EXPECT_EQ(b.config.struct_size, 40u);  // LP64: what a version-1 caller's sizeof gave
  EXPECT_EQ(b.w.struct_size, 8 + 6 * sizeof(coda_tensor));
  EXPECT_EQ(coda_block_forward_workspace_size(&b.config, kM), v2_fwd);
  EXPECT_EQ(coda_block_backward_workspace_size(&b.config, kM), v2_bwd);
  // Beyond a version-1 struct, in each of the four: never read (else each would be refused as set without qk_eps).
  b.config.qk_eps = 1.0f;
  b.w.q_gamma = pool.make(CODA_FP32, {kHd});
  b.g.k_gamma = pool.make(CODA_FP32, {kHd});
  b.saved.z = pool.make(CODA_BF16, {kM, kW});
  EXPECT_DEVICE_STAGE(b.forward(), "y0:");
  EXPECT_DEVICE_STAGE(b.backward(&b.dx2), "y0:");
}

TEST(BlockApi, QkNormRules) {
  Block b;
  auto& pool = b.pool;
  b.enable_qk_norm();
  // The temporaries (a [M,d], y1 [M,F] bf16, two zdz [M] fp32: 8192 bytes in 256-byte slots here) plus a scratch
  // slot that holds qk_norm_rope_bwd_zdz's gamma partials.
  size_t const qk_ws = coda_qk_norm_rope_bwd_zdz_workspace_size(kM, kHd);
  EXPECT_GT(qk_ws, 0u);
  EXPECT_GE(b.bwd_bytes, 8192 + qk_ws);
  EXPECT_DEVICE_STAGE(b.forward(), "y0:");
  EXPECT_DEVICE_STAGE(b.backward(&b.dx2), "y0:");
  coda_tensor const gq = b.w.q_gamma, z = b.saved.z, dgk = b.g.k_gamma;
  b.w.q_gamma = coda_tensor{};
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "weights.q_gamma", "required with config.qk_eps > 0");
  b.w.q_gamma = pool.make(CODA_BF16, {kHd});  // fp32 only
  EXPECT_REJECTED(b.backward(nullptr), CODA_ERROR_DTYPE, "weights.q_gamma");
  b.w.q_gamma = pool.make(CODA_FP32, {kHd / 2});
  EXPECT_REJECTED(b.forward(), CODA_ERROR_SHAPE, "weights.q_gamma", "head_dim");
  b.w.q_gamma = gq;
  coda_tensor const gk = b.w.k_gamma;
  b.w.k_gamma = coda_tensor{};
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "weights.k_gamma", "required with config.qk_eps > 0");
  b.w.k_gamma = gk;
  b.saved.z = coda_tensor{};
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "saved.z");
  b.saved.z = b.saved.qkv;  // the output and the pre-norm z must not overlap
  EXPECT_REJECTED(b.forward(), CODA_ERROR_ALIASING, "saved.z");
  b.saved.z = z;
  b.g.k_gamma = coda_tensor{};
  EXPECT_REJECTED(b.backward(&b.dx2), CODA_ERROR_INVALID_ARGUMENT, "grads.k_gamma");
  b.g.k_gamma = b.g.q_gamma;  // two gradients in one buffer
  EXPECT_REJECTED(b.backward(&b.dx2), CODA_ERROR_ALIASING, "grads.k_gamma");
  b.g.k_gamma = dgk;
  b.config.qk_eps = -1.0f;
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "config.qk_eps", ">= 0");
  b.config.qk_eps = 0.0f;  // QK-norm off: a QK-norm field still set is refused, not ignored
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "weights.q_gamma", "config.qk_eps is 0");
  b.w.q_gamma = b.w.k_gamma = coda_tensor{};
  EXPECT_REJECTED(b.forward(), CODA_ERROR_INVALID_ARGUMENT, "saved.z", "config.qk_eps is 0");
  b.saved.z = coda_tensor{};
  EXPECT_DEVICE_STAGE(b.forward(), "y0:");
  EXPECT_REJECTED(b.backward(&b.dx2), CODA_ERROR_INVALID_ARGUMENT, "grads.q_gamma", "config.qk_eps is 0");
}

TEST(BlockApi, ShapeAndDtypeRules) {
  Block b;
  auto& pool = b.pool;
  b.w.w_gu = pool.make(CODA_BF16, {kF, kD});  // stacked half: wrong rows
  EXPECT_REJECTED(b.forward(), CODA_ERROR_SHAPE, "weights.w_gu", "2 * intermediate_size");
  b.w.w_gu = pool.make(CODA_FP16, {2 * kF, kD});  // dtype differs from y0
  EXPECT_REJECTED(b.backward(nullptr), CODA_ERROR_DTYPE, "weights.w_gu");
  b.w.w_gu = pool.make(CODA_BF16, {2 * kF, kD});
  b.saved.qkv = pool.make(CODA_BF16, {kM, kQo});  // missing k/v columns
  EXPECT_REJECTED(b.forward(), CODA_ERROR_SHAPE, "saved.qkv");
  b.saved.qkv = pool.make(CODA_BF16, {kM, kW});
  b.g.w_o = pool.make(CODA_INT32, {kD, kQo});
  EXPECT_REJECTED(b.backward(nullptr), CODA_ERROR_DTYPE, "grads.w_o");
  b.g.w_o = pool.make(CODA_FP32, {kD, kQo});
  b.g.gamma1 = pool.make(CODA_BF16, {kD});  // dgamma is fp32
  EXPECT_REJECTED(b.backward(nullptr), CODA_ERROR_DTYPE, "grads.gamma1");
  b.g.gamma1 = pool.make(CODA_FP32, {kD});
  coda_tensor short_dx2 = pool.make(CODA_BF16, {kM - 1, kD});
  EXPECT_REJECTED(b.backward(&short_dx2), CODA_ERROR_SHAPE, "dx2");
}

TEST(BlockApi, AliasingAndWorkspaceRules) {
  Block b;
  auto& pool = b.pool;
  coda_tensor const z1 = b.saved.z1;
  b.saved.z1.data = b.w.w_gu.data;  // a saved output over a weight (w_gu holds 2F x d >= M x 2F elements)
  EXPECT_REJECTED(b.forward(), CODA_ERROR_ALIASING, "saved.z1", "weights.w_gu");
  b.saved.z1 = z1;
  b.saved.x2 = b.saved.x1;  // two outputs on one buffer
  EXPECT_REJECTED(b.forward(), CODA_ERROR_ALIASING, "saved.x2");
  b.saved.x2 = pool.make(CODA_BF16, {kM, kD});
  b.dy0 = b.y0;  // an output over an input
  EXPECT_REJECTED(b.backward(nullptr), CODA_ERROR_ALIASING, "dy0_out", "y0");
  b.dy0 = pool.make(CODA_BF16, {kM, kQo});
  EXPECT_REJECTED(coda_block_forward(&b.config, &b.w, &b.y0, &b.x0, &b.pos, &b.freq, &b.saved, b.fwd_ws,
                                     b.fwd_bytes - 256, nullptr),
                  CODA_ERROR_WORKSPACE, "coda_block_forward");
  // The workspace (the block's temporaries) over a tensor of the call: refused before anything is written.
  EXPECT_REJECTED(coda_block_forward(&b.config, &b.w, &b.y0, &b.x0, &b.pos, &b.freq, &b.saved, b.x0.data,
                                     b.fwd_bytes, nullptr),
                  CODA_ERROR_ALIASING, "workspace");
  EXPECT_REJECTED(coda_block_backward(&b.config, &b.w, &b.y0, &b.pos, &b.freq, &b.saved, &b.dqkv, nullptr, &b.dy0,
                                      &b.dx0, &b.g, b.dx0.data, b.bwd_bytes, nullptr),
                  CODA_ERROR_ALIASING, "workspace");
  EXPECT_REJECTED(coda_block_backward(&b.config, &b.w, &b.y0, &b.pos, &b.freq, &b.saved, &b.dqkv, nullptr, &b.dy0,
                                      &b.dx0, &b.g, nullptr, b.bwd_bytes, nullptr),
                  CODA_ERROR_WORKSPACE, "coda_block_backward");
}

}  // namespace
