// Op-specific validation rules, the not-yet-built ops (valid arguments must reach CODA_ERROR_NOT_IMPLEMENTED), the
// built non-GEMM kernels (valid arguments must reach the device stage), and the weight-layout helpers on host
// tensors (they run without a GPU).
#include <coda/coda.h>
#include <coda/ops.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/tensor_pool.hpp"

extern "C" int coda_c_header_check(void);  // tests/cpu/c_header_check.c

namespace {

using coda::test::TensorPool;

#define EXPECT_NOT_BUILT(call, op) EXPECT_REJECTED(call, CODA_ERROR_NOT_IMPLEMENTED, op, "not in this build")

constexpr int64_t M = 24, K = 64, N = 128;

struct RowScale {
  TensorPool pool;
  coda_tensor h = pool.make(CODA_FP16, {M, K}), w = pool.make(CODA_FP16, {N, K});
  coda_tensor rstd = pool.make(CODA_FP32, {M});
  void* ws = pool.bytes(1 << 16);
  size_t ws_bytes = 1 << 16;
};

// ---- ops whose kernels come with later issues ----------------------------------------------------------------

TEST(DeviceStage, LinearRowscaleSwiglu) {
  TensorPool pool;
  coda_tensor h = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {N, K});
  coda_tensor rstd = pool.make(CODA_FP32, {M});
  coda_tensor z = pool.make(CODA_BF16, {M, N}), y = pool.make(CODA_BF16, {M, N / 2});
  EXPECT_DEVICE_STAGE(coda_linear_rowscale_swiglu(&h, &w, &rstd, &z, &y, nullptr, 0, nullptr), "h:");
}

struct Rope {
  TensorPool pool;
  int32_t hq = 4, hkv = 2, hd = 64;
  int64_t W = (4 + 2 * 2) * 64;
  coda_tensor h = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {W, K});
  coda_tensor rstd = pool.make(CODA_FP32, {M}), pos = pool.make(CODA_INT32, {M});
  coda_tensor inv_freq = pool.make(CODA_FP32, {32}), qkv = pool.make(CODA_BF16, {M, W});
  void* ws = pool.bytes(4096);
  coda_status call() {
    return coda_linear_rowscale_rope(&h, &w, &rstd, &pos, &inv_freq, hq, hkv, hd, &qkv, ws, 4096, nullptr);
  }
};

TEST(DeviceStage, LinearRowscaleRope) {
  Rope f;
  auto& pool = f.pool;
  EXPECT_DEVICE_STAGE(f.call(), "h:");
}

TEST(OpRules, RopeNeedsWorkspace) {
  Rope f;
  auto& pool = f.pool;
  size_t const need = coda_linear_rowscale_rope_workspace_size(M, f.W);
  EXPECT_EQ(need, static_cast<size_t>(f.W) * sizeof(float));  // the per-column inv_freq (W = 512: 256-aligned)
  EXPECT_REJECTED(coda_linear_rowscale_rope(&f.h, &f.w, &f.rstd, &f.pos, &f.inv_freq, f.hq, f.hkv, f.hd, &f.qkv,
                                            nullptr, 0, nullptr),
                  CODA_ERROR_WORKSPACE, "workspace", "coda_linear_rowscale_rope");
}

struct QkNormRope {
  TensorPool pool;
  int32_t hq = 4, hkv = 2, hd = 64;
  int64_t W = (4 + 2 * 2) * 64;
  float qk_eps = 1e-6f;
  coda_tensor h = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {W, K});
  coda_tensor rstd = pool.make(CODA_FP32, {M}), pos = pool.make(CODA_INT32, {M});
  coda_tensor q_gamma = pool.make(CODA_FP32, {64}), k_gamma = pool.make(CODA_FP32, {64});
  coda_tensor inv_freq = pool.make(CODA_FP32, {32});
  coda_tensor qkv = pool.make(CODA_BF16, {M, W}), z = pool.make(CODA_BF16, {M, W});
  coda_status call() {
    return coda_linear_rowscale_qk_norm_rope(&h, &w, &rstd, &q_gamma, &k_gamma, &pos, &inv_freq, hq, hkv, hd, qk_eps,
                                             &qkv, &z, nullptr);
  }
};

TEST(DeviceStage, LinearRowscaleQkNormRope) {
  QkNormRope f;
  auto& pool = f.pool;
  EXPECT_DEVICE_STAGE(f.call(), "h:");
  f.hd = 128;
  f.w = pool.make(CODA_BF16, {(4 + 2 * 2) * 128, K});
  f.q_gamma = pool.make(CODA_FP32, {128});
  f.k_gamma = pool.make(CODA_FP32, {128});
  f.inv_freq = pool.make(CODA_FP32, {64});
  f.qkv = pool.make(CODA_BF16, {M, 1024});
  f.z = pool.make(CODA_BF16, {M, 1024});
  EXPECT_DEVICE_STAGE(f.call(), "h:");
}

TEST(OpRules, QkNormRopeArguments) {
  {
    QkNormRope f;
    auto& pool = f.pool;
    f.hd = 96;
    EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "head_dim", "64 or 128");
  }
  {
    QkNormRope f;
    auto& pool = f.pool;
    f.q_gamma = pool.make(CODA_BF16, {64});  // gamma is read as fp32
    EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "q_gamma");
  }
  {
    QkNormRope f;
    auto& pool = f.pool;
    f.k_gamma = pool.make(CODA_FP32, {128});
    EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "k_gamma", "head_dim");
  }
  {
    QkNormRope f;
    auto& pool = f.pool;
    f.k_gamma.data = static_cast<char*>(f.k_gamma.data) + 4;  // 4-byte aligned: not a float pair
    EXPECT_REJECTED(f.call(), CODA_ERROR_MISALIGNED, "k_gamma", "8-byte");
  }
  for (float bad : {0.0f, -1e-6f, std::nanf("")}) {
    QkNormRope f;
    auto& pool = f.pool;
    f.qk_eps = bad;
    EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "qk_eps", "> 0");
  }
  {
    QkNormRope f;
    auto& pool = f.pool;
    f.z = f.qkv;  // the two outputs must not overlap
    EXPECT_REJECTED(f.call(), CODA_ERROR_ALIASING, "qkv_out", "z_out");
  }
  {
    QkNormRope f;
    auto& pool = f.pool;
    f.z = pool.make(CODA_BF16, {M, f.W - 64});
    EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "z_out");
  }
}

struct QkNormRopeBwd {
  TensorPool pool;
  int32_t hq = 4, hkv = 2, hd = 64;
  int64_t W = (4 + 2 * 2) * 64;
  float qk_eps = 1e-6f;
  coda_tensor z = pool.make(CODA_BF16, {M, W}), dqkv = pool.make(CODA_BF16, {M, W});
  coda_tensor q_gamma = pool.make(CODA_FP32, {64}), k_gamma = pool.make(CODA_FP32, {64});
  coda_tensor pos = pool.make(CODA_INT32, {M}), inv_freq = pool.make(CODA_FP32, {32});
  coda_tensor dz = pool.make(CODA_BF16, {M, W}), zdz = pool.make(CODA_FP32, {M});
  coda_tensor dq_gamma = pool.make(CODA_FP32, {64}), dk_gamma = pool.make(CODA_FP32, {64});
  size_t wsb = coda_qk_norm_rope_bwd_zdz_workspace_size(M, 64);
  void* ws = pool.bytes(wsb);
  coda_status call() {
    return coda_qk_norm_rope_bwd_zdz(&z, &dqkv, &q_gamma, &k_gamma, &pos, &inv_freq, hq, hkv, hd, qk_eps, 4096, &dz,
                                     &zdz, &dq_gamma, &dk_gamma, ws, wsb, nullptr);
  }
};

TEST(DeviceStage, QkNormRopeBwdZdz) {
  QkNormRopeBwd f;
  auto& pool = f.pool;
  // The gamma partials of min(M, 1024) blocks, 2 head_dim floats each, 256-byte rounded.
  EXPECT_EQ(f.wsb, static_cast<size_t>(M) * 2 * 64 * 4);
  EXPECT_EQ(coda_qk_norm_rope_bwd_zdz_workspace_size(1 << 20, 128), size_t{1024} * 2 * 128 * 4);
  EXPECT_EQ(coda_qk_norm_rope_bwd_zdz_workspace_size(0, 128), 0u);
  EXPECT_DEVICE_STAGE(f.call(), "z:");
  f.dz = f.dqkv;  // in place over dqkv
  EXPECT_DEVICE_STAGE(f.call(), "z:");
}

TEST(OpRules, QkNormRopeBwdZdzArguments) {
  {
    QkNormRopeBwd f;
    auto& pool = f.pool;
    f.dz = f.z;  // dz may replace dqkv, never z
    EXPECT_REJECTED(f.call(), CODA_ERROR_ALIASING, "dz_out", "z");
  }
  {
    QkNormRopeBwd f;
    auto& pool = f.pool;
    EXPECT_REJECTED(coda_qk_norm_rope_bwd_zdz(&f.z, &f.dqkv, &f.q_gamma, &f.k_gamma, &f.pos, &f.inv_freq, f.hq, f.hkv,
                                              f.hd, f.qk_eps, 4096, &f.dz, &f.zdz, &f.dq_gamma, &f.dk_gamma, nullptr,
                                              0, nullptr),
                    CODA_ERROR_WORKSPACE, "coda_qk_norm_rope_bwd_zdz");
  }
  {
    QkNormRopeBwd f;
    auto& pool = f.pool;
    f.dk_gamma = pool.make(CODA_BF16, {64});  // the gamma gradients are fp32
    EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "dk_gamma_out");
  }
  {
    QkNormRopeBwd f;
    auto& pool = f.pool;
    f.qk_eps = 0.0f;
    EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "qk_eps", "> 0");
  }
  {
    QkNormRopeBwd f;
    auto& pool = f.pool;
    f.dqkv = pool.make(CODA_BF16, {M, f.W - 64});
    EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "dqkv");
  }
}

struct Lse {
  TensorPool pool;
  coda_tensor h = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {N, K});
  coda_tensor rstd = pool.make(CODA_FP32, {M}), t = pool.make(CODA_INT64, {M});
  coda_tensor lse = pool.make(CODA_FP32, {M}), tl = pool.make(CODA_FP32, {M});
  size_t wsb = coda_linear_rowscale_lse_workspace_size(M, N);
  void* ws = pool.bytes(wsb);
  float softcap = 0.0f;
  coda_status call(coda_tensor* logits = nullptr) {
    return coda_linear_rowscale_lse(&h, &w, &rstd, &t, softcap, -100, &lse, &tl, logits, ws, wsb, nullptr);
  }
};

struct LinearCe {
  TensorPool pool;
  coda_tensor h = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {N, K});
  coda_tensor rstd = pool.make(CODA_FP32, {M}), t = pool.make(CODA_INT32, {M});
  coda_tensor loss = pool.make(CODA_FP32, {}), lse = pool.make(CODA_FP32, {M});
  coda_ce_options o = coda_ce_options_default();
  int64_t chunk = 0;
  coda_status call(coda_tensor* lse_out = nullptr) {
    size_t const wsb = coda_linear_cross_entropy_workspace_size(M, N, chunk);
    return coda_linear_cross_entropy(&h, &w, &rstd, &t, &o, chunk, &loss, lse_out, pool.bytes(wsb), wsb, nullptr);
  }
};

// Valid fp16 arguments pass validation and reach the device.
TEST(DeviceStage, Fp16) {
  RowScale f;
  auto& pool = f.pool;
  coda_tensor y = pool.make(CODA_FP16, {M, N});
  EXPECT_DEVICE_STAGE(coda_linear_rowscale(&f.h, &f.w, &f.rstd, &y, f.ws, f.ws_bytes, nullptr), "h:");
  coda_tensor z = pool.make(CODA_FP16, {M, N}), yh = pool.make(CODA_FP16, {M, N / 2});
  EXPECT_DEVICE_STAGE(coda_linear_rowscale_swiglu(&f.h, &f.w, &f.rstd, &z, &yh, f.ws, f.ws_bytes, nullptr), "h:");
}

TEST(DeviceStage, LinearCrossEntropy) {
  LinearCe f;
  auto& pool = f.pool;
  EXPECT_DEVICE_STAGE(f.call(), "h:");
  EXPECT_DEVICE_STAGE(f.call(&f.lse), "h:");
  f.chunk = 5;
  EXPECT_DEVICE_STAGE(f.call(), "h:");
}

TEST(OpRules, LinearCrossEntropyArguments) {
  LinearCe f;
  auto& pool = f.pool;
  f.chunk = -1;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "chunk_rows", ">= 1");
  f.chunk = 0;
  f.o.label_smoothing = 1.5f;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "label_smoothing", "[0, 1]");
  f.o = coda_ce_options_default();
  f.o.reduction = CODA_REDUCTION_NONE;  // loss must then be [M]
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "loss_out");
  f.o = coda_ce_options_default();
  coda_tensor lse_bad = pool.make(CODA_FP32, {M + 1});
  EXPECT_REJECTED(f.call(&lse_bad), CODA_ERROR_SHAPE, "lse_out");
  // The workspace is bounded by the chunk, not by M x V.
  EXPECT_LT(coda_linear_cross_entropy_workspace_size(1 << 20, 128256, 8192),
            coda_linear_cross_entropy_workspace_size(1 << 20, 128256, 1 << 20) / 8);
  EXPECT_EQ(coda_linear_cross_entropy_workspace_size(1 << 20, 128256, 0),
            coda_linear_cross_entropy_workspace_size(1 << 20, 128256, 8192));
}

TEST(DeviceStage, LinearRowscaleLse) {
  Lse f;
  auto& pool = f.pool;
  EXPECT_DEVICE_STAGE(f.call(), "h:");
  coda_tensor logits = pool.make(CODA_BF16, {M, N});
  EXPECT_DEVICE_STAGE(f.call(&logits), "h:");
  coda_tensor t32 = pool.make(CODA_INT32, {M});
  f.t = t32;
  f.softcap = 30.0f;
  EXPECT_DEVICE_STAGE(f.call(), "h:");
}

TEST(DeviceStage, LinearRowscaleLseFp16) {
  Lse f;
  auto& pool = f.pool;
  f.h = pool.make(CODA_FP16, {M, K});
  f.w = pool.make(CODA_FP16, {N, K});
  EXPECT_DEVICE_STAGE(f.call(), "h:");
}

TEST(OpRules, LseWorkspace) {
  // Four fp32 [ceil(V/128), round_up(M,128)] partial buffers (the narrowest compiled N tile), each rounded up to
  // 256 bytes.
  EXPECT_EQ(coda_linear_rowscale_lse_workspace_size(M, N), size_t{4 * 512});  // T = 1, Mpad = 128
  EXPECT_EQ(coda_linear_rowscale_lse_workspace_size(1000, 1000), size_t{4 * 8 * 1024 * 4});
  EXPECT_EQ(coda_linear_rowscale_lse_workspace_size(1, 128256), size_t{4 * ((1002 * 128 * 4 + 255) / 256 * 256)});
  EXPECT_EQ(coda_linear_rowscale_lse_workspace_size(0, 1000), size_t{0});
  Lse f;
  auto& pool = f.pool;
  EXPECT_REJECTED(coda_linear_rowscale_lse(&f.h, &f.w, &f.rstd, &f.t, 0.0f, -100, &f.lse, &f.tl, nullptr, f.ws,
                                           f.wsb - 256, nullptr),
                  CODA_ERROR_WORKSPACE, "workspace", "coda_linear_rowscale_lse");
}

struct Ce {
  TensorPool pool;
  coda_tensor logits = pool.make(CODA_BF16, {M, N}), t = pool.make(CODA_INT32, {M});
  coda_tensor loss = pool.make(CODA_FP32, {}), dlogits = pool.make(CODA_BF16, {M, N});
  coda_tensor zdz = pool.make(CODA_FP32, {M});
  coda_ce_options o = coda_ce_options_default();
  size_t wsb = coda_cross_entropy_workspace_size(M, N);
  void* ws = pool.bytes(wsb);
  coda_status call(coda_tensor const* grad = nullptr, coda_tensor* d = nullptr, coda_tensor* z = nullptr,
                   int64_t hidden = 2048) {
    return coda_cross_entropy(&logits, &t, &o, grad, hidden, &loss, d, z, ws, wsb, nullptr);
  }
};

// ---- non-GEMM kernels (src/kernels): valid arguments reach the device stage ------------------------------------

TEST(DeviceStage, RmsnormRstd) {
  TensorPool pool;
  coda_tensor p = pool.make(CODA_FP32, {3, 256}), s = pool.make(CODA_FP32, {250});
  p.sizes[1] = 250;  // M = 250 with a padded stride of 256
  EXPECT_DEVICE_STAGE(coda_rmsnorm_rstd(&p, 384, 1e-6f, &s, nullptr), "partials:");
  coda_tensor p1 = pool.make(CODA_FP32, {1, 7}), s1 = pool.make(CODA_FP32, {7});  // one tile row
  EXPECT_DEVICE_STAGE(coda_rmsnorm_rstd(&p1, 8, 1e-5f, &s1, nullptr), "partials:");
}

TEST(DeviceStage, RmsnormPrepare) {
  TensorPool pool;
  coda_tensor x = pool.make(CODA_BF16, {M, N}), g = pool.make(CODA_BF16, {N});
  coda_tensor h = pool.make(CODA_BF16, {M, N}), s = pool.make(CODA_FP32, {M});
  EXPECT_DEVICE_STAGE(coda_rmsnorm_prepare(&x, &g, 1e-6f, &h, &s, nullptr), "x:");
  coda_tensor xf = pool.make(CODA_FP16, {M, N}), gf = pool.make(CODA_FP16, {N}), hf = pool.make(CODA_FP16, {M, N});
  EXPECT_DEVICE_STAGE(coda_rmsnorm_prepare(&xf, &gf, 1e-5f, &hf, &s, nullptr), "x:");
}

// ---- fused forward GEMMs (src/ops): bf16 valid arguments reach the device stage; fp16 is not built ------------

TEST(DeviceStage, LinearResidualRmsnorm) {
  TensorPool pool;
  coda_tensor a = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {N, K});
  coda_tensor r = pool.make(CODA_BF16, {M, N}), g = pool.make(CODA_BF16, {N});
  coda_tensor x = pool.make(CODA_BF16, {M, N}), h = pool.make(CODA_BF16, {M, N}), s = pool.make(CODA_FP32, {M});
  size_t const wsb = coda_linear_residual_rmsnorm_workspace_size(M, N);
  EXPECT_DEVICE_STAGE(coda_linear_residual_rmsnorm(&a, &w, &r, &g, 1e-6f, &x, &h, &s, pool.bytes(wsb), wsb, nullptr),
                      "a:");
  // in place: x_out aliases residual
  EXPECT_DEVICE_STAGE(coda_linear_residual_rmsnorm(&a, &w, &r, &g, 1e-6f, &r, &h, &s, pool.bytes(wsb), wsb, nullptr),
                      "a:");
}

TEST(DeviceStage, LinearResidualRmsnormFp16) {
  TensorPool pool;
  coda_tensor a = pool.make(CODA_FP16, {M, K}), w = pool.make(CODA_FP16, {N, K});
  coda_tensor r = pool.make(CODA_FP16, {M, N}), g = pool.make(CODA_FP16, {N});
  coda_tensor x = pool.make(CODA_FP16, {M, N}), h = pool.make(CODA_FP16, {M, N}), s = pool.make(CODA_FP32, {M});
  size_t const wsb = coda_linear_residual_rmsnorm_workspace_size(M, N);
  EXPECT_DEVICE_STAGE(coda_linear_residual_rmsnorm(&a, &w, &r, &g, 1e-6f, &x, &h, &s, pool.bytes(wsb), wsb, nullptr),
                      "a:");
}

TEST(DeviceStage, LinearRowscale) {
  TensorPool pool;
  coda_tensor h = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {N, K});
  coda_tensor rstd = pool.make(CODA_FP32, {M}), y = pool.make(CODA_BF16, {M, N});
  EXPECT_DEVICE_STAGE(coda_linear_rowscale(&h, &w, &rstd, &y, nullptr, 0, nullptr), "h:");
}

TEST(DeviceStage, CrossEntropy) {
  Ce f;
  auto& pool = f.pool;
  EXPECT_DEVICE_STAGE(f.call(), "logits:");                               // loss only, mean
  EXPECT_DEVICE_STAGE(f.call(nullptr, &f.logits, &f.zdz), "logits:");     // dlogits in place over logits
  coda_tensor g = pool.make(CODA_FP32, {});
  f.o.reduction = CODA_REDUCTION_SUM;
  EXPECT_DEVICE_STAGE(f.call(&g, &f.dlogits), "logits:");                 // scalar upstream gradient, no zdz
  f.o.reduction = CODA_REDUCTION_NONE;
  coda_tensor loss_rows = pool.make(CODA_FP32, {M}), grad_rows = pool.make(CODA_FP32, {M});
  f.loss = loss_rows;
  f.t = pool.make(CODA_INT64, {M});
  EXPECT_DEVICE_STAGE(f.call(&grad_rows, &f.dlogits, &f.zdz), "logits:");
}

TEST(DeviceStage, CrossEntropyAnyVocabulary) {
  // Rows that are not 16-byte vectors (odd V, or a row stride that is no multiple of 8) take the kernel's scalar
  // path: accepted, not refused by a TMA rule the kernel does not have.
  Ce f;
  auto& pool = f.pool;
  f.logits = pool.make(CODA_BF16, {M, 1003});
  f.dlogits = pool.make(CODA_BF16, {M, 1003});
  EXPECT_DEVICE_STAGE(f.call(), "logits:");
  EXPECT_DEVICE_STAGE(f.call(nullptr, &f.dlogits, &f.zdz), "logits:");
  EXPECT_DEVICE_STAGE(f.call(nullptr, &f.logits, &f.zdz), "logits:");  // in place
  coda_tensor strided = pool.make(CODA_BF16, {M, 1003});
  strided.sizes[1] = 1000;  // V = 1000 with a row stride of 1003 elements
  f.logits = strided;
  EXPECT_DEVICE_STAGE(f.call(), "logits:");
  coda_tensor col = pool.make(CODA_BF16, {M, 8});
  col.strides[0] = 1, col.strides[1] = M;  // column-major: still refused
  f.logits = col;
  EXPECT_REJECTED(f.call(), CODA_ERROR_LAYOUT, "logits", "row-major");
}

TEST(DeviceStage, CrossEntropyWorkspaceDependsOnRowsOnly) {
  EXPECT_EQ(coda_cross_entropy_workspace_size(0, 128256), 0u);
  for (int64_t rows : {1, 7, 1000, 8192}) {
    size_t const bytes = coda_cross_entropy_workspace_size(rows, 32000);
    EXPECT_GE(bytes, static_cast<size_t>(rows) * sizeof(float) + sizeof(uint64_t)) << rows;
    EXPECT_EQ(bytes % 256, 0u) << rows;
    EXPECT_EQ(bytes, coda_cross_entropy_workspace_size(rows, 8)) << rows;
  }
}

TEST(DeviceStage, RopeBwdZdz) {
  Rope f;
  auto& pool = f.pool;
  coda_tensor dqkv = pool.make(CODA_BF16, {M, f.W}), dz = pool.make(CODA_BF16, {M, f.W});
  coda_tensor zdz = pool.make(CODA_FP32, {M});
  EXPECT_DEVICE_STAGE(coda_rope_bwd_zdz(&f.qkv, &dqkv, &f.pos, &f.inv_freq, f.hq, f.hkv, f.hd, 2048, &dqkv, &zdz,
                                        nullptr),
                      "qkv:");  // dz in place over dqkv
  EXPECT_DEVICE_STAGE(coda_rope_bwd_zdz(&f.qkv, &dqkv, &f.pos, &f.inv_freq, f.hq, f.hkv, f.hd, 2048, &dz, &zdz,
                                        nullptr),
                      "qkv:");
}

struct ResidualRmsnormBwd {
  TensorPool pool;
  coda_tensor dz = pool.make(CODA_BF16, {M, N}), w = pool.make(CODA_BF16, {N, K});
  coda_tensor x = pool.make(CODA_BF16, {M, K}), gamma = pool.make(CODA_BF16, {K});
  coda_tensor rstd = pool.make(CODA_FP32, {M}), zdz = pool.make(CODA_FP32, {M});
  coda_tensor dx = pool.make(CODA_BF16, {M, K}), a = pool.make(CODA_BF16, {M, K});
  coda_tensor dgamma = pool.make(CODA_FP32, {K});
  size_t wsb = coda_linear_residual_rmsnorm_bwd_workspace_size(M, K);
  void* ws = pool.bytes(wsb);
  coda_status call(coda_tensor const* dx_in) {
    return coda_linear_residual_rmsnorm_bwd(&dz, &w, &x, &gamma, &rstd, &zdz, dx_in, 1.0f, &dx, &a, &dgamma, ws,
                                            wsb, nullptr);
  }
};

TEST(DeviceStage, LinearResidualRmsnormBwd) {
  ResidualRmsnormBwd f;
  auto& pool = f.pool;
  EXPECT_DEVICE_STAGE(f.call(nullptr), "dz:");
  EXPECT_DEVICE_STAGE(f.call(&f.dx), "dz:");  // in-place accumulation
}

TEST(DeviceStage, LinearSwigluBwdZdz) {
  TensorPool pool;
  int64_t const F = 96;
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    coda_tensor dx = pool.make(dt, {M, K}), w = pool.make(dt, {K, F});
    coda_tensor z = pool.make(dt, {M, 2 * F}), dz = pool.make(dt, {M, 2 * F});
    coda_tensor y = pool.make(dt, {M, F}), zdz = pool.make(CODA_FP32, {M});
    size_t const wsb = coda_linear_swiglu_bwd_zdz_workspace_size(M, F);
    void* ws = pool.bytes(wsb);
    EXPECT_DEVICE_STAGE(coda_linear_swiglu_bwd_zdz(&dx, &w, &z, &dz, &y, &zdz, ws, wsb, nullptr), "dx:");
    EXPECT_DEVICE_STAGE(coda_linear_swiglu_bwd_zdz(&dx, &w, &z, &z, &y, &zdz, ws, wsb, nullptr), "dx:");  // in place
  }
}

TEST(OpRules, SwigluBwdAliasing) {
  TensorPool pool;
  int64_t const F = 96;
  coda_tensor dx = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {K, F});
  coda_tensor z = pool.make(CODA_BF16, {M, 2 * F}), y = pool.make(CODA_BF16, {M, F}), zdz = pool.make(CODA_FP32, {M});
  size_t const wsb = coda_linear_swiglu_bwd_zdz_workspace_size(M, F);
  void* ws = pool.bytes(wsb);
  // dz over z shifted by one row: a partial overlap, not the in-place form.
  coda_tensor dz_shifted = z;
  dz_shifted.data = static_cast<char*>(z.data) + 2 * 2 * F;
  dz_shifted.sizes[0] = M - 1;
  coda_tensor z_short = z;
  z_short.sizes[0] = M - 1;
  coda_tensor dx_short = dx;
  dx_short.sizes[0] = M - 1;
  coda_tensor zdz_short = zdz;
  zdz_short.sizes[0] = M - 1;
  coda_tensor y_short = y;
  y_short.sizes[0] = M - 1;
  EXPECT_REJECTED(coda_linear_swiglu_bwd_zdz(&dx_short, &w, &z_short, &dz_shifted, &y_short, &zdz_short, ws, wsb,
                                             nullptr),
                  CODA_ERROR_ALIASING, "dz_out");
  // y over z.
  coda_tensor y_over_z = z;
  y_over_z.sizes[1] = F;
  coda_tensor dz = pool.make(CODA_BF16, {M, 2 * F});
  EXPECT_REJECTED(coda_linear_swiglu_bwd_zdz(&dx, &w, &z, &dz, &y_over_z, &zdz, ws, wsb, nullptr),
                  CODA_ERROR_ALIASING, "y_out");
}

// ---- op-specific rules ----------------------------------------------------------------------------------------

TEST(OpRules, SwigluWidthMultipleOf16) {
  TensorPool pool;
  coda_tensor h = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {24, K}), r = pool.make(CODA_FP32, {M});
  coda_tensor z = pool.make(CODA_BF16, {M, 24}), y = pool.make(CODA_BF16, {M, 12});
  EXPECT_REJECTED(coda_linear_rowscale_swiglu(&h, &w, &r, &z, &y, pool.bytes(256), 256, nullptr), CODA_ERROR_SHAPE,
                  "w_gu", "multiple of 16");
}

TEST(OpRules, SwigluOutputIsHalfWidth) {
  RowScale f;
  auto& pool = f.pool;
  coda_tensor z = pool.make(CODA_FP16, {M, N}), y = pool.make(CODA_FP16, {M, N});
  EXPECT_REJECTED(coda_linear_rowscale_swiglu(&f.h, &f.w, &f.rstd, &z, &y, f.ws, f.ws_bytes, nullptr),
                  CODA_ERROR_SHAPE, "y_out", "(F)");
}

TEST(OpRules, RopeHeadDim) {
  Rope f;
  auto& pool = f.pool;
  f.hd = 96;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "head_dim", "64 or 128");
}

TEST(OpRules, RopeKvHeadsDivideQHeads) {
  Rope f;
  auto& pool = f.pool;
  f.hkv = 3;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "n_kv_heads", "divide");
}

TEST(OpRules, RopeWeightRowsMatchHeads) {
  Rope f;
  auto& pool = f.pool;
  f.hq = 8;  // (8 + 4) * 64 != rows of w_qkv
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "w_qkv", "n_q_heads");
}

TEST(OpRules, RopePositionsAreInt32) {
  Rope f;
  auto& pool = f.pool;
  f.pos = pool.make(CODA_INT64, {M});
  EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "positions", "int32");
}

TEST(OpRules, RopeInvFreqLength) {
  Rope f;
  auto& pool = f.pool;
  f.inv_freq = pool.make(CODA_FP32, {64});
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "inv_freq", "head_dim/2");
}

TEST(OpRules, LseSoftcapNonNegative) {
  Lse f;
  auto& pool = f.pool;
  f.softcap = -1.0f;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "softcap", ">= 0");
}

TEST(OpRules, LseTargetsAreIntegers) {
  Lse f;
  auto& pool = f.pool;
  f.t = pool.make(CODA_FP32, {M});
  EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "targets", "int32 or int64");
}

TEST(OpRules, CrossEntropyReductionValue) {
  Ce f;
  auto& pool = f.pool;
  f.o.reduction = static_cast<coda_reduction>(9);
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "options->reduction");
}

TEST(OpRules, CrossEntropyLabelSmoothingRange) {
  Ce f;
  auto& pool = f.pool;
  f.o.label_smoothing = 1.5f;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "options->label_smoothing", "[0, 1]");
}

TEST(OpRules, CrossEntropyZLossNonNegative) {
  Ce f;
  auto& pool = f.pool;
  f.o.z_loss = -0.1f;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "options->z_loss");
}

TEST(OpRules, CrossEntropyLossShapeFollowsReduction) {
  Ce f;
  auto& pool = f.pool;
  f.loss = pool.make(CODA_FP32, {M});  // [M] loss with reduction mean
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "loss_out", "scalar");
  f.o.reduction = CODA_REDUCTION_NONE;
  f.loss = pool.make(CODA_FP32, {});
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "loss_out", "rank 1");
}

TEST(OpRules, CrossEntropyGradLossShapeFollowsReduction) {
  Ce f;
  auto& pool = f.pool;
  coda_tensor g = pool.make(CODA_FP32, {M});
  EXPECT_REJECTED(f.call(&g, &f.dlogits), CODA_ERROR_SHAPE, "grad_loss", "scalar");
}

TEST(OpRules, CrossEntropyZdzNeedsGradient) {
  Ce f;
  auto& pool = f.pool;
  EXPECT_REJECTED(f.call(nullptr, nullptr, &f.zdz), CODA_ERROR_INVALID_ARGUMENT, "zdz_out", "dlogits_out");
}

TEST(OpRules, CrossEntropyHiddenSizePositive) {
  Ce f;
  auto& pool = f.pool;
  EXPECT_REJECTED(f.call(nullptr, &f.dlogits, &f.zdz, 0), CODA_ERROR_INVALID_ARGUMENT, "hidden_size");
}

TEST(OpRules, CrossEntropyDlogitsPartialOverlap) {
  Ce f;
  auto& pool = f.pool;
  coda_tensor d = f.logits;
  d.data = static_cast<char*>(d.data) + 32;
  EXPECT_REJECTED(f.call(nullptr, &d), CODA_ERROR_ALIASING, "dlogits_out and logits", "partially overlap");
}

TEST(OpRules, RmsnormRstdPartialsUnitStride) {
  TensorPool pool;
  coda_tensor p = pool.make(CODA_FP32, {256, 3}), s = pool.make(CODA_FP32, {3});
  std::swap(p.sizes[0], p.sizes[1]);
  std::swap(p.strides[0], p.strides[1]);  // [3, 256] with strides [1, 3]
  s = pool.make(CODA_FP32, {256});
  EXPECT_REJECTED(coda_rmsnorm_rstd(&p, 128, 1e-6f, &s, nullptr), CODA_ERROR_LAYOUT, "partials", "unit stride");
}

TEST(OpRules, RmsnormRstdFeatureCountPositive) {
  TensorPool pool;
  coda_tensor p = pool.make(CODA_FP32, {2, 16}), s = pool.make(CODA_FP32, {16});
  EXPECT_REJECTED(coda_rmsnorm_rstd(&p, 0, 1e-6f, &s, nullptr), CODA_ERROR_INVALID_ARGUMENT, "n_features");
}

TEST(OpRules, DgradWeightRowsMatchGradientWidth) {
  ResidualRmsnormBwd f;
  auto& pool = f.pool;
  f.w = pool.make(CODA_BF16, {N + 8, K});
  EXPECT_REJECTED(f.call(nullptr), CODA_ERROR_SHAPE, "w:", "dz.sizes[1]");
}

TEST(OpRules, DgradOutputMustNotAliasSavedInput) {
  ResidualRmsnormBwd f;
  auto& pool = f.pool;
  f.dx = f.x;
  EXPECT_REJECTED(f.call(nullptr), CODA_ERROR_ALIASING, "dx_out and x", "overlap");
}

TEST(OpRules, SwigluBwdSavedZIsDoubleWidth) {
  TensorPool pool;
  int64_t const F = 96;
  coda_tensor dx = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {K, F});
  coda_tensor z = pool.make(CODA_BF16, {M, F}), dz = pool.make(CODA_BF16, {M, 2 * F});
  coda_tensor y = pool.make(CODA_BF16, {M, F}), zdz = pool.make(CODA_FP32, {M});
  EXPECT_REJECTED(coda_linear_swiglu_bwd_zdz(&dx, &w, &z, &dz, &y, &zdz, pool.bytes(1 << 16), 1 << 16, nullptr),
                  CODA_ERROR_SHAPE, "z:", "2F");
}

// ---- weight layout helpers (host tensors run on the CPU) ----------------------------------------------------

coda_tensor host_f32(std::vector<float>& v, int64_t rows, int64_t cols) {
  coda_tensor t{};
  t.data = v.data();
  t.dtype = CODA_FP32;
  t.rank = 2;
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = cols;
  t.strides[1] = 1;
  t.device = -1;
  return t;
}

TEST(Layout, InterleaveGateUpMovesRows) {
  int64_t const F = 5, C = 3;
  std::vector<float> in(2 * F * C), out(2 * F * C, -1.0f), back(2 * F * C, -1.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  coda_tensor ti = host_f32(in, 2 * F, C), to = host_f32(out, 2 * F, C), tb = host_f32(back, 2 * F, C);
  ASSERT_EQ(coda_interleave_gate_up(&ti, &to, nullptr), CODA_SUCCESS) << coda_last_error();
  for (int64_t i = 0; i < F; ++i) {
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(out[(2 * i) * C + c], in[i * C + c]);            // gate i -> row 2i
      EXPECT_EQ(out[(2 * i + 1) * C + c], in[(F + i) * C + c]);  // up i   -> row 2i+1
    }
  }
  ASSERT_EQ(coda_deinterleave_gate_up(&to, &tb, nullptr), CODA_SUCCESS) << coda_last_error();
  EXPECT_EQ(back, in);
}

TEST(Layout, PairRopeRowsPerHead) {
  int64_t const hd = 8, H = 3, C = 2;
  std::vector<float> in(H * hd * C), out(H * hd * C, -1.0f), back(H * hd * C, -1.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  coda_tensor ti = host_f32(in, H * hd, C), to = host_f32(out, H * hd, C), tb = host_f32(back, H * hd, C);
  ASSERT_EQ(coda_pair_rope_rows(&ti, static_cast<int32_t>(hd), &to, nullptr), CODA_SUCCESS) << coda_last_error();
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_EQ(out[(h * hd + 2 * i) * C + c], in[(h * hd + i) * C + c]);
        EXPECT_EQ(out[(h * hd + 2 * i + 1) * C + c], in[(h * hd + i + hd / 2) * C + c]);
      }
    }
  }
  ASSERT_EQ(coda_unpair_rope_rows(&to, static_cast<int32_t>(hd), &tb, nullptr), CODA_SUCCESS) << coda_last_error();
  EXPECT_EQ(back, in);
}

TEST(Layout, PairRopeBiasVector) {
  std::vector<float> in{0, 1, 2, 3, 4, 5, 6, 7}, out(8, -1.0f);
  coda_tensor ti = host_f32(in, 8, 1), to = host_f32(out, 8, 1);
  ti.rank = to.rank = 1;
  ti.strides[0] = to.strides[0] = 1;
  ASSERT_EQ(coda_pair_rope_rows(&ti, 4, &to, nullptr), CODA_SUCCESS) << coda_last_error();
  EXPECT_EQ(out, (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
}

TEST(Layout, OddGateUpRowsRejected) {
  TensorPool pool;
  coda_tensor in = pool.make(CODA_BF16, {7, 8}, -1), out = pool.make(CODA_BF16, {7, 8}, -1);
  EXPECT_REJECTED(coda_interleave_gate_up(&in, &out, nullptr), CODA_ERROR_SHAPE, "w_stacked", "even");
}

TEST(Layout, HeadDimMustDivideRows) {
  TensorPool pool;
  coda_tensor in = pool.make(CODA_BF16, {24, 8}, -1), out = pool.make(CODA_BF16, {24, 8}, -1);
  EXPECT_REJECTED(coda_pair_rope_rows(&in, 16, &out, nullptr), CODA_ERROR_SHAPE, "w:", "multiple of head_dim");
  EXPECT_REJECTED(coda_pair_rope_rows(&in, 3, &out, nullptr), CODA_ERROR_INVALID_ARGUMENT, "head_dim", "even");
}

TEST(Layout, HostAndDeviceMixRejected) {
  TensorPool pool;
  coda_tensor in = pool.make(CODA_BF16, {8, 8}, -1), out = pool.make(CODA_BF16, {8, 8}, 0);
  EXPECT_REJECTED(coda_interleave_gate_up(&in, &out, nullptr), CODA_ERROR_DEVICE, "w_out", "host tensors");
}

TEST(Layout, InPlaceRejected) {
  TensorPool pool;
  coda_tensor in = pool.make(CODA_BF16, {8, 8}, -1);
  EXPECT_REJECTED(coda_interleave_gate_up(&in, &in, nullptr), CODA_ERROR_ALIASING, "w_out", "overlap");
}

// ---- library functions and the C++ wrapper ------------------------------------------------------------------

TEST(Abi, HeaderCompilesAsC) { EXPECT_EQ(coda_c_header_check(), 2 + CODA_REDUCTION_MEAN); }

TEST(Abi, StatusStringsAreDistinct) {
  std::vector<std::string> names;
  for (int s = CODA_SUCCESS; s <= CODA_ERROR_INTERNAL; ++s) {
    names.emplace_back(coda_status_string(static_cast<coda_status>(s)));
    EXPECT_EQ(names.back().rfind("CODA_", 0), 0u) << names.back();
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
  EXPECT_STREQ(coda_status_string(static_cast<coda_status>(99)), "CODA_ERROR_UNKNOWN_STATUS");
}

TEST(Abi, VersionAndDtypeSizes) {
  EXPECT_EQ(coda_version(), CODA_VERSION_MAJOR * 10000 + CODA_VERSION_MINOR * 100 + CODA_VERSION_PATCH);
  EXPECT_EQ(coda_dtype_size(CODA_BF16), 2u);
  EXPECT_EQ(coda_dtype_size(CODA_FP16), 2u);
  EXPECT_EQ(coda_dtype_size(CODA_FP32), 4u);
  EXPECT_EQ(coda_dtype_size(CODA_INT32), 4u);
  EXPECT_EQ(coda_dtype_size(CODA_INT64), 8u);
  EXPECT_EQ(coda_dtype_size(static_cast<coda_dtype>(42)), 0u);
}

TEST(Abi, FusedOpConfigs) {
  EXPECT_STREQ(coda_fused_op_configs("linear_rowscale_swiglu", CODA_BF16),
               "coop_128x256x64_c2x1,pp_128x128x64_c2x1,pp_128x192x64_c2x1");
  EXPECT_STREQ(coda_fused_op_configs("coda_linear_rowscale_swiglu", CODA_FP16), "pp_128x128x64_c2x1");
  EXPECT_STREQ(coda_fused_op_configs("linear_swiglu_bwd_zdz", CODA_BF16),
               "pp_128x128x64_c2x1,pp_128x192x64_c2x1_e16,pp_128x192x64_c2x1_e16h");
  EXPECT_STREQ(coda_fused_op_configs("linear_swiglu_bwd_zdz", CODA_FP16), "pp_128x128x64_c2x1");
  EXPECT_STREQ(coda_fused_op_configs("linear_rowscale", CODA_BF16),
               "coop_128x256x64_c2x1,pp_128x128x64_c2x1,pp_192x128x64_c1x2,pp_192x128x64_c1x2_d3");
  // The QK-norm op's configs: 64x128 subtiles (also its fp16 config), and four with the accumulator prepass.
  EXPECT_STREQ(coda_fused_op_configs("linear_rowscale_qk_norm_rope", CODA_BF16),
               "pp_128x128x64_c2x1_e128,pp_128x128x64_c2x1,coop_128x256x64_c2x1,pp_192x128x64_c1x2,"
               "pp_192x128x64_c1x2_d3");
  EXPECT_STREQ(coda_fused_op_configs("linear_rowscale_rope", CODA_BF16),
               "pp_128x128x64_c2x1,coop_128x256x64_c2x1_sc,pp_192x128x64_c1x2,pp_192x128x64_c1x2_d3,"
               "pp_192x128x64_c1x2_e64,pp_192x128x64_c1x2_e64_d3");
  EXPECT_STREQ(coda_fused_op_configs("linear_rowscale_qk_norm_rope", CODA_FP16), "pp_128x128x64_c2x1_e128");
  EXPECT_EQ(coda_fused_op_configs("linear_rowscale_swiglu", CODA_FP32), nullptr);
  EXPECT_EQ(coda_fused_op_configs("gemm", CODA_BF16), nullptr);
  EXPECT_EQ(coda_fused_op_configs(nullptr, CODA_BF16), nullptr);
}

TEST(Abi, CrossEntropyDefaultsMatchPyTorch) {
  coda_ce_options const o = coda_ce_options_default();
  EXPECT_EQ(o.ignore_index, -100);
  EXPECT_EQ(o.reduction, CODA_REDUCTION_MEAN);
  EXPECT_EQ(o.label_smoothing, 0.0f);
  EXPECT_EQ(o.z_loss, 0.0f);
  EXPECT_EQ(o.softcap, 0.0f);
}

TEST(Abi, LastErrorClearedBySuccess) {
  TensorPool pool;
  coda_tensor in = pool.make(CODA_BF16, {7, 8}, -1), out = pool.make(CODA_BF16, {7, 8}, -1);
  ASSERT_NE(coda_interleave_gate_up(&in, &out, nullptr), CODA_SUCCESS);
  EXPECT_STRNE(coda_last_error(), "");
  coda_tensor in2 = pool.make(CODA_BF16, {8, 8}, -1), out2 = pool.make(CODA_BF16, {8, 8}, -1);
  ASSERT_EQ(coda_interleave_gate_up(&in2, &out2, nullptr), CODA_SUCCESS);
  EXPECT_STREQ(coda_last_error(), "");
}

TEST(Abi, DeviceSupportedNeedsOutputPointer) {
  EXPECT_EQ(coda_device_supported(-1, nullptr, nullptr, nullptr), CODA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("supported"), std::string::npos);
}

TEST(Abi, CppWrapperThrowsWithStatus) {
  TensorPool pool;
  coda::TensorView in(pool.make(CODA_BF16, {7, 8}, -1).data, CODA_BF16, {7, 8}, -1);
  coda::TensorView out(pool.make(CODA_BF16, {7, 8}, -1).data, CODA_BF16, {7, 8}, -1);
  try {
    coda::interleave_gate_up(in, out, nullptr);
    FAIL() << "expected coda::Error";
  } catch (coda::Error const& e) {
    EXPECT_EQ(e.status(), CODA_ERROR_SHAPE);
    EXPECT_NE(std::string(e.what()).find("w_stacked"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(pool.untouched());
}

TEST(Abi, CppLinearCrossEntropyWrapper) {
  TensorPool pool;
  coda::TensorView h(pool.make(CODA_BF16, {M, K}).data, CODA_BF16, {M, K}, 0);
  coda::TensorView w(pool.make(CODA_BF16, {N, K}).data, CODA_BF16, {N, K}, 0);
  coda::TensorView rstd(pool.make(CODA_FP32, {M}).data, CODA_FP32, {M}, 0);
  coda::TensorView t(pool.make(CODA_INT32, {M}).data, CODA_INT32, {M}, 0);
  coda::TensorView loss(pool.make(CODA_FP32, {}).data, CODA_FP32, {}, 0);
  coda::Workspace ws{pool.bytes(coda::linear_cross_entropy_workspace_size(M, N)),
                     coda::linear_cross_entropy_workspace_size(M, N)};
  try {
    coda::linear_cross_entropy(h, w, rstd, t, coda_ce_options_default(), -1, loss, nullptr, ws, nullptr);
    FAIL() << "expected coda::Error";
  } catch (coda::Error const& e) {
    EXPECT_EQ(e.status(), CODA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("chunk_rows"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(pool.untouched());
}

TEST(Abi, CppGenericCallPassesViewsAndThrows) {
  TensorPool pool;
  coda::TensorView const h(pool.make(CODA_BF16, {M, K}).data, CODA_BF16, {M, K}, 0);
  coda::TensorView const w(pool.make(CODA_BF16, {N, K}).data, CODA_BF16, {N, K}, 0);
  coda::TensorView const rstd(pool.make(CODA_FP32, {M}).data, CODA_FP32, {M}, 0);
  coda::TensorView y(pool.make(CODA_BF16, {M, N}).data, CODA_BF16, {M, N}, 0);
  try {  // valid arguments: the device stage (no sm_90 here, or host memory on one)
    coda::call(coda_linear_rowscale, h, w, rstd, y, nullptr, size_t{0}, nullptr);
    FAIL() << "expected coda::Error";
  } catch (coda::Error const& e) {
    EXPECT_TRUE(e.status() == CODA_ERROR_ARCH || e.status() == CODA_ERROR_DEVICE) << e.what();
  }
  coda::TensorView short_rstd(pool.make(CODA_FP32, {M - 1}).data, CODA_FP32, {M - 1}, 0);
  try {  // a rule: the status and the argument's name, as the C call gives them
    coda::call(coda_linear_rowscale, h, w, short_rstd, y, nullptr, size_t{0}, nullptr);
    FAIL() << "expected coda::Error";
  } catch (coda::Error const& e) {
    EXPECT_EQ(e.status(), CODA_ERROR_SHAPE);
    EXPECT_NE(std::string(e.what()).find("rstd"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(pool.untouched());
}

TEST(Abi, CppTensorViewTranspose) {
  coda::TensorView v(nullptr, CODA_BF16, {3, 5}, 0);
  coda::TensorView const t = v.t();
  EXPECT_EQ(t.size(0), 5);
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.stride(0), 1);
  EXPECT_EQ(t.stride(1), 5);
}

}  // namespace

namespace {

// ---- coda_scale_cast -----------------------------------------------------------------------------------------------

TEST(DeviceStage, ScaleCast) {
  TensorPool pool;
  coda_tensor src = pool.make(CODA_FP32, {300, 7}), g = pool.make(CODA_FP32, {}), out = pool.make(CODA_BF16, {300, 7});
  EXPECT_DEVICE_STAGE(coda_scale_cast(&src, &g, &out, nullptr), "src:");
  coda_tensor g1 = pool.make(CODA_FP32, {1}), o16 = pool.make(CODA_FP16, {300, 7});
  EXPECT_DEVICE_STAGE(coda_scale_cast(&src, &g1, &o16, nullptr), "src:");
}

TEST(OpRules, ScaleCastArguments) {
  TensorPool pool;
  coda_tensor src = pool.make(CODA_FP32, {64, 8}), g = pool.make(CODA_FP32, {}), out = pool.make(CODA_BF16, {64, 8});
  coda_tensor src16 = pool.make(CODA_BF16, {64, 8}), g16 = pool.make(CODA_BF16, {});
  coda_tensor out32 = pool.make(CODA_FP32, {64, 8}), g2 = pool.make(CODA_FP32, {2});
  coda_tensor wrong = pool.make(CODA_BF16, {8, 64}), flat = pool.make(CODA_BF16, {512});
  EXPECT_REJECTED(coda_scale_cast(&src16, &g, &out, nullptr), CODA_ERROR_DTYPE, "src");
  EXPECT_REJECTED(coda_scale_cast(&src, &g16, &out, nullptr), CODA_ERROR_DTYPE, "scale");
  EXPECT_REJECTED(coda_scale_cast(&src, &g, &out32, nullptr), CODA_ERROR_DTYPE, "out");
  EXPECT_REJECTED(coda_scale_cast(&src, &g2, &out, nullptr), CODA_ERROR_SHAPE, "scale", "one element");
  EXPECT_REJECTED(coda_scale_cast(&src, &g, &wrong, nullptr), CODA_ERROR_SHAPE, "out", "must equal src");
  EXPECT_REJECTED(coda_scale_cast(&src, &g, &flat, nullptr), CODA_ERROR_SHAPE, "out", "must equal src");
  EXPECT_REJECTED(coda_scale_cast(nullptr, &g, &out, nullptr), CODA_ERROR_INVALID_ARGUMENT, "src");
  coda_tensor strided = pool.make(CODA_FP32, {64, 16});
  strided.sizes[1] = 8;  // rows padded to 16: not contiguous
  EXPECT_REJECTED(coda_scale_cast(&strided, &g, &out, nullptr), CODA_ERROR_LAYOUT, "src", "contiguous");
  coda_tensor inside = out;  // out over the first bytes of src: overlap
  inside.data = src.data;
  EXPECT_REJECTED(coda_scale_cast(&src, &g, &inside, nullptr), CODA_ERROR_ALIASING, "out", "src");
  coda_tensor over_scale = out;  // out starting at the scale's bytes
  over_scale.data = g.data;
  EXPECT_REJECTED(coda_scale_cast(&src, &g, &over_scale, nullptr), CODA_ERROR_ALIASING, "out", "scale");
}

}  // namespace

namespace {

// ---- CODA_OP_CONFIG: the whole value is checked with the arguments, before the device stage --------------------

/// Sets CODA_OP_CONFIG for the object's lifetime, then restores the previous value (or its absence).
class OpConfigEnv {
 public:
  explicit OpConfigEnv(char const* value) {
    if (char const* outer = std::getenv("CODA_OP_CONFIG")) outer_ = outer, had_ = true;
    setenv("CODA_OP_CONFIG", value, 1);
  }
  ~OpConfigEnv() {
    if (had_) {
      setenv("CODA_OP_CONFIG", outer_.c_str(), 1);
    } else {
      unsetenv("CODA_OP_CONFIG");
    }
  }
  OpConfigEnv(OpConfigEnv const&) = delete;
  OpConfigEnv& operator=(OpConfigEnv const&) = delete;

 private:
  std::string outer_;
  bool had_ = false;
};

TEST(OpRules, OpConfigValidValuesReachTheDeviceStage) {
  RowScale f;
  auto& pool = f.pool;
  coda_tensor y = pool.make(CODA_FP16, {M, N});
  for (char const* v : {"pp_128x128x64_c2x1", "coop_128x256x64_c2x1:raster=m,swizzle=4",
                        "linear_rowscale_swiglu=coop_128x256x64_c2x1:raster=m,swizzle=8",
                        ";coda_linear_rowscale=pp_128x128x64_c2x1;"
                        "linear_swiglu_bwd_zdz=pp_128x128x64_c2x1:raster=n;"}) {
    SCOPED_TRACE(v);
    OpConfigEnv const env(v);
    EXPECT_DEVICE_STAGE(coda_linear_rowscale(&f.h, &f.w, &f.rstd, &y, f.ws, f.ws_bytes, nullptr), "h:");
  }
}

TEST(OpRules, OpConfigAcceptsEveryListedConfigAndNoOther) {
  // coda_fused_op_configs is what the GPU tests and benchmarks pin: each listed config passes the check, and a
  // config an op does not list (pp_64x256x64_c2x1: a plain-GEMM config) is refused for it.
  RowScale f;
  auto& pool = f.pool;
  coda_tensor y = pool.make(CODA_FP16, {M, N});
  for (char const* op : {"linear_rowscale", "linear_residual_rmsnorm", "linear_rowscale_swiglu", "linear_rowscale_rope",
                         "linear_rowscale_qk_norm_rope", "linear_rowscale_lse", "linear_residual_rmsnorm_bwd",
                         "linear_swiglu_bwd_zdz"}) {
    char const* list = coda_fused_op_configs(op, CODA_BF16);
    ASSERT_NE(list, nullptr) << op;
    std::string const all = list;
    for (size_t begin = 0; begin <= all.size();) {
      size_t end = all.find(',', begin);
      if (end == std::string::npos) end = all.size();
      std::string const config = all.substr(begin, end - begin);
      begin = end + 1;
      std::string const pin = std::string(op) + "=" + config;
      SCOPED_TRACE(pin);
      OpConfigEnv const env(pin.c_str());
      EXPECT_DEVICE_STAGE(coda_linear_rowscale(&f.h, &f.w, &f.rstd, &y, f.ws, f.ws_bytes, nullptr), "h:");
    }
    std::string const pin = std::string(op) + "=pp_64x256x64_c2x1";
    SCOPED_TRACE(pin);
    OpConfigEnv const env(pin.c_str());
    EXPECT_REJECTED(coda_linear_rowscale(&f.h, &f.w, &f.rstd, &y, f.ws, f.ws_bytes, nullptr),
                    CODA_ERROR_INVALID_ARGUMENT, "CODA_OP_CONFIG", "compiles no config 'pp_64x256x64_c2x1'");
  }
}

TEST(OpRules, OpConfigBadValuesAreRefusedWhicheverOpRuns) {
  RowScale f;
  auto& pool = f.pool;
  coda_tensor y = pool.make(CODA_FP16, {M, N});
  struct Bad {
    char const* value;
    char const* says;
  };
  // Each names an op other than coda_linear_rowscale or none: linear_rowscale refuses them all the same.
  for (Bad const b : {Bad{"sk_128x256x64_c2x1", "the fused ops compile no config"},
                      Bad{"pp_128x128x64_c2x1;", "no config 'pp_128x128x64_c2x1;'"},
                      Bad{"pp_128x128x64_c2x1:raster=q", "raster"},
                      Bad{"raster=n", "'raster' is not a fused op"},
                      Bad{"linear_rowscale_swiglu=coop_128x256x64_c2x1:raster=q", "raster"},
                      Bad{"linear_swiglu_bwd_zdz=coop_128x256x64_c2x1",
                          "coda_linear_swiglu_bwd_zdz compiles no config 'coop_128x256x64_c2x1'"},
                      Bad{"linear_rowscale_rope=pp_128x192x64_c2x1",
                          "coda_linear_rowscale_rope compiles no config 'pp_128x192x64_c2x1'"},
                      Bad{"linear_rowscal=pp_128x128x64_c2x1", "is not a fused op"},
                      Bad{"linear_rowscale_rope=pp_128x128x64_c2x1;coda_linear_rowscale_rope=pp_128x128x64_c2x1",
                          "named twice"},
                      Bad{"linear_rowscale_rope=pp_128x128x64_c2x1;junk", "'junk' is not <op>=<config>"},
                      Bad{"linear_rowscale_lse=", "no config after '='"}}) {
    SCOPED_TRACE(b.value);
    OpConfigEnv const env(b.value);
    EXPECT_REJECTED(coda_linear_rowscale(&f.h, &f.w, &f.rstd, &y, f.ws, f.ws_bytes, nullptr),
                    CODA_ERROR_INVALID_ARGUMENT, "CODA_OP_CONFIG", b.says);
  }
}

}  // namespace

// Each op's tile policy (its op.cmake's DEFAULT and RULE lines, generated into choose*()) at the llama3 shapes: the
// choices the hand-written dispatchers made before the registry (stop 32), as coda_fused_op_choice reports them.
TEST(Abi, FusedOpChoiceFollowsEachOpsTilePolicy) {
  struct Case {
    char const* op;
    coda_dtype dt;
    int64_t M, N, K;
    char const* want;
  };
  char const* const pp = "pp_128x128x64_c2x1";
  std::string const pp_n8 = std::string(pp) + ":raster=n,swizzle=8";
  std::string const coop_n8 = "coop_128x256x64_c2x1:raster=n,swizzle=8";
  Case const cases[] = {
      // linear_rowscale: pingpong 128x128, raster N, swizzle 8 from N = 16384, else 4; below (ordered as the rules)
      // cooperative 128x256 raster M from K = 4096 and M = 4096, then pingpong 192x128 raster M from M = 4096 up to
      // N = 8192 (bf16).
      {"linear_rowscale", CODA_BF16, 8192, 28672, 4096, pp_n8.c_str()},
      {"linear_rowscale", CODA_BF16, 8192, 3072, 2048, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"coda_linear_rowscale", CODA_FP16, 8192, 28672, 4096, pp_n8.c_str()},
      // linear_residual_rmsnorm: out-projection (K <= 2N) pingpong raster N; down-projection at M >= 4096 or
      // K >= 16384 cooperative.
      {"linear_residual_rmsnorm", CODA_BF16, 8192, 4096, 4096, "pp_128x128x64_c2x1:raster=n"},
      {"linear_residual_rmsnorm", CODA_BF16, 8192, 4096, 14336, coop_n8.c_str()},
      {"linear_residual_rmsnorm", CODA_BF16, 1000, 4096, 14336, pp},
      {"linear_residual_rmsnorm", CODA_BF16, 1000, 8192, 28672,  // 8 M tiles, 16 at swizzle 8: swizzle 4
       "coop_128x256x64_c2x1:raster=n,swizzle=4"},
      {"linear_residual_rmsnorm", CODA_FP16, 8192, 4096, 14336, pp},
      {"linear_residual_rmsnorm", CODA_FP16, 8192, 4096, 4096, "pp_128x128x64_c2x1:raster=n"},
      {"linear_residual_rmsnorm", CODA_BF16, 8192, 4096, 8192, "pp_128x128x64_c2x1:raster=n"},   // K == 2N
      {"linear_residual_rmsnorm", CODA_BF16, 4096, 4096, 8200, coop_n8.c_str()},                 // M == 4096
      {"linear_residual_rmsnorm", CODA_BF16, 4095, 4096, 8200, pp},
      {"linear_residual_rmsnorm", CODA_BF16, 4095, 4096, 16384, coop_n8.c_str()},                // K == 16384
      // linear_rowscale_swiglu: pingpong 128x192 raster N, raster M from K = 8192; fp16 pingpong 128x128.
      {"linear_rowscale_swiglu", CODA_BF16, 8192, 28672, 4096, "pp_128x192x64_c2x1:raster=n,swizzle=8"},
      {"linear_rowscale_swiglu", CODA_BF16, 8192, 57344, 8192, "pp_128x192x64_c2x1:raster=m,swizzle=8"},
      {"linear_rowscale_swiglu", CODA_FP16, 8192, 57344, 8192, pp_n8.c_str()},
      {"linear_rowscale_swiglu", CODA_BF16, 8192, 57344, 8191, "pp_128x192x64_c2x1:raster=n,swizzle=8"},
      {"linear_rowscale", CODA_BF16, 8192, 16383, 2048, "pp_128x128x64_c2x1:raster=n,swizzle=4"},
      {"linear_rowscale", CODA_BF16, 8192, 16384, 4096, pp_n8.c_str()},
      // linear_rowscale below N = 16384: cooperative 128x256 raster M from K = 4096 and M = 4096 (bf16), else
      // pingpong 192x128 raster M from M = 4096 up to N = 8192.
      {"linear_rowscale", CODA_BF16, 8192, 16383, 4096, "coop_128x256x64_c2x1:raster=m,swizzle=8"},
      {"linear_rowscale", CODA_BF16, 4096, 10240, 8192, "coop_128x256x64_c2x1:raster=m,swizzle=8"},
      {"linear_rowscale", CODA_BF16, 4095, 10240, 8192, "pp_128x128x64_c2x1:raster=n,swizzle=4"},
      {"linear_rowscale", CODA_BF16, 8192, 6144, 4095, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"linear_rowscale", CODA_BF16, 8192, 8192, 2048, "pp_192x128x64_c1x2:raster=m,swizzle=8"},   // N == 8192
      {"linear_rowscale", CODA_BF16, 8192, 10240, 2048, "pp_128x128x64_c2x1:raster=n,swizzle=4"},  // N > 8192
      {"linear_rowscale", CODA_BF16, 4095, 3072, 2048, "pp_128x128x64_c2x1:raster=n,swizzle=4"},
      {"linear_rowscale", CODA_FP16, 8192, 3072, 2048, "pp_128x128x64_c2x1:raster=n,swizzle=4"},
      {"linear_rowscale", CODA_FP16, 8192, 6144, 4096, "pp_128x128x64_c2x1:raster=n,swizzle=4"},
      // linear_rowscale_rope: the cooperative _sc kernel raster M from K = 4096 and M = 4096 (bf16), else pingpong
      // 192x128 (cluster 1x2, ragged scheduler: swizzle as given) raster M from M = 4096, else pingpong 128x128
      // raster N.
      {"linear_rowscale_rope", CODA_BF16, 8192, 6144, 4096, "coop_128x256x64_c2x1_sc:raster=m,swizzle=8"},
      {"linear_rowscale_rope", CODA_BF16, 8192, 6144, 4095, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"linear_rowscale_rope", CODA_BF16, 8192, 3072, 2048, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"linear_rowscale_rope", CODA_BF16, 4096, 6144, 2560, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"linear_rowscale_rope", CODA_BF16, 4095, 3072, 2048, pp_n8.c_str()},
      {"linear_rowscale_rope", CODA_FP16, 8192, 3072, 2048, pp_n8.c_str()},
      {"linear_rowscale_rope", CODA_BF16, 8192, 10240, 8192, "coop_128x256x64_c2x1_sc:raster=m,swizzle=8"},
      {"linear_rowscale_rope", CODA_BF16, 8192, 7168, 5120, "coop_128x256x64_c2x1_sc:raster=m,swizzle=4"},
      {"linear_rowscale_rope", CODA_BF16, 4095, 10240, 8192, pp_n8.c_str()},
      {"linear_rowscale_rope", CODA_FP16, 8192, 10240, 8192, pp_n8.c_str()},
      // linear_rowscale_qk_norm_rope: cooperative 128x256 raster M from K = 8192 and M = 4096 (bf16), else pingpong
      // 192x128 (cluster 1x2, prepass, ragged scheduler: swizzle as given) raster M from M = 4096, else e128.
      {"linear_rowscale_qk_norm_rope", CODA_BF16, 4096, 10240, 8192, "coop_128x256x64_c2x1:raster=m,swizzle=8"},
      {"linear_rowscale_qk_norm_rope", CODA_BF16, 4096, 6144, 4096, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"linear_rowscale_qk_norm_rope", CODA_BF16, 4095, 6144, 4096, "pp_128x128x64_c2x1_e128:raster=n,swizzle=8"},
      {"linear_rowscale_qk_norm_rope", CODA_BF16, 8192, 6144, 4095, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"linear_rowscale_qk_norm_rope", CODA_BF16, 8192, 3072, 2048, "pp_192x128x64_c1x2:raster=m,swizzle=8"},
      {"linear_rowscale_qk_norm_rope", CODA_FP16, 8192, 6144, 4096, "pp_128x128x64_c2x1_e128:raster=n,swizzle=8"},
      {"linear_rowscale_qk_norm_rope", CODA_FP16, 1, 256, 64, "pp_128x128x64_c2x1_e128:raster=n"},  // 1 M tile
      {"linear_rowscale_qk_norm_rope", CODA_BF16, 8192, 7168, 5120,
       "pp_192x128x64_c1x2:raster=m,swizzle=8"},  // Qwen3-14B's q/k/v
      // linear_rowscale_lse: with logits raster N; without, swizzle 8 and cooperative from K = 8192 (bf16).
      {"linear_rowscale_lse", CODA_BF16, 8192, 128256, 8192, "pp_128x128x64_c2x1:raster=n"},
      {"linear_rowscale_lse/nologits", CODA_BF16, 8192, 128256, 4096, pp_n8.c_str()},
      {"linear_rowscale_lse/nologits", CODA_BF16, 8192, 128256, 8192, coop_n8.c_str()},
      {"linear_rowscale_lse/nologits", CODA_FP16, 8192, 128256, 8192, pp_n8.c_str()},
      {"linear_rowscale_lse/nologits", CODA_BF16, 8192, 128256, 8191, pp_n8.c_str()},
      // linear_residual_rmsnorm_bwd (K = Nd): cooperative from K = 8192, the row-scaled twins alike.
      {"linear_residual_rmsnorm_bwd", CODA_BF16, 8192, 4096, 28672, coop_n8.c_str()},
      {"linear_residual_rmsnorm_bwd", CODA_BF16, 8192, 4096, 6144, pp_n8.c_str()},
      {"linear_residual_rmsnorm_bwd", CODA_FP16, 8192, 4096, 28672, pp_n8.c_str()},
      {"linear_residual_rmsnorm_bwd/rowscaled", CODA_BF16, 8192, 2048, 128256, coop_n8.c_str()},
      {"linear_residual_rmsnorm_bwd/rowscaled", CODA_BF16, 8192, 2048, 4096, pp_n8.c_str()},
      {"linear_residual_rmsnorm_bwd", CODA_BF16, 8192, 4096, 8191, pp_n8.c_str()},
      {"linear_residual_rmsnorm_bwd", CODA_BF16, 8192, 4096, 8192, coop_n8.c_str()},
      // linear_swiglu_bwd_zdz (M x F x d): 128x192 with 64x16 subtiles (e16h) from d = 4096 and M = 4096 (bf16).
      {"linear_swiglu_bwd_zdz", CODA_BF16, 8192, 14336, 4096, "pp_128x192x64_c2x1_e16h:raster=n,swizzle=8"},
      {"linear_swiglu_bwd_zdz", CODA_BF16, 4095, 14336, 4096, pp_n8.c_str()},
      {"linear_swiglu_bwd_zdz", CODA_BF16, 8192, 8192, 2048, pp_n8.c_str()},
      {"linear_swiglu_bwd_zdz", CODA_BF16, 8192, 14336, 4095, pp_n8.c_str()},
      {"linear_swiglu_bwd_zdz", CODA_BF16, 4096, 14336, 4096, "pp_128x192x64_c2x1_e16h:raster=n,swizzle=8"},
      {"linear_swiglu_bwd_zdz", CODA_FP16, 8192, 14336, 4096, pp_n8.c_str()},
  };
  for (Case const& c : cases) {
    SCOPED_TRACE(std::string(c.op) + " " + std::to_string(c.M) + "x" + std::to_string(c.N) + "x" +
                 std::to_string(c.K) + (c.dt == CODA_FP16 ? " fp16" : " bf16"));
    char const* got = coda_fused_op_choice(c.op, c.dt, c.M, c.N, c.K);
    ASSERT_NE(got, nullptr) << coda_last_error();
    EXPECT_STREQ(got, c.want);
  }
  {  // a pin wins, for its op only
    OpConfigEnv const env("linear_swiglu_bwd_zdz=pp_128x128x64_c2x1:raster=m");
    EXPECT_STREQ(coda_fused_op_choice("linear_swiglu_bwd_zdz", CODA_BF16, 8192, 14336, 4096),
                 "pp_128x128x64_c2x1:raster=m");
    EXPECT_STREQ(coda_fused_op_choice("linear_rowscale", CODA_BF16, 8192, 28672, 4096), pp_n8.c_str());
  }
  {  // since the registry a pin applies to linear_residual_rmsnorm_bwd's row-scaled twins too (the hand-written
     // dispatcher overrode it)
    OpConfigEnv const env("linear_residual_rmsnorm_bwd=pp_128x128x64_c2x1:raster=m,swizzle=2");
    EXPECT_STREQ(coda_fused_op_choice("linear_residual_rmsnorm_bwd/rowscaled", CODA_BF16, 8192, 2048, 128256),
                 "pp_128x128x64_c2x1:raster=m,swizzle=2");
  }
  {
    OpConfigEnv const env("linear_rowscale=pp_64x256x64_c2x1");
    EXPECT_EQ(coda_fused_op_choice("linear_rowscale", CODA_BF16, 8192, 28672, 4096), nullptr);
    EXPECT_NE(std::string(coda_last_error()).find("CODA_OP_CONFIG"), std::string::npos) << coda_last_error();
  }
  EXPECT_EQ(coda_fused_op_choice("gemm", CODA_BF16, 8, 8, 8), nullptr);
  EXPECT_NE(std::string(coda_last_error()).find("known: linear_"), std::string::npos) << coda_last_error();
  EXPECT_EQ(coda_fused_op_choice(nullptr, CODA_BF16, 8, 8, 8), nullptr);
  EXPECT_EQ(coda_fused_op_choice("linear_rowscale", CODA_FP32, 8, 8, 8), nullptr);
  EXPECT_NE(std::string(coda_last_error()).find("dtype"), std::string::npos) << coda_last_error();
  EXPECT_EQ(coda_fused_op_choice("linear_rowscale", CODA_BF16, -1, 8, 8), nullptr);
  EXPECT_NE(std::string(coda_last_error()).find("M, N, K"), std::string::npos) << coda_last_error();
  EXPECT_EQ(coda_fused_op_choice("linear_residual_rmsnorm_bwd/rowscaled", CODA_FP16, 8, 8, 8), nullptr);
  EXPECT_NE(std::string(coda_last_error()).find("dtype: linear_residual_rmsnorm_bwd/rowscaled"), std::string::npos)
      << coda_last_error();
  EXPECT_NE(std::string(coda_last_error()).find("bf16 only"), std::string::npos) << coda_last_error();
}
