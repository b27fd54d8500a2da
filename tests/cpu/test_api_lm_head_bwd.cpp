// coda_linear_cross_entropy_bwd's validation: valid arguments reach the device stage; every rule names the argument;
// nothing is written on rejection.
#include <coda/coda.h>
#include <gtest/gtest.h>

#include "cpu/tensor_pool.hpp"

namespace {

using coda::test::TensorPool;

constexpr int64_t kM = 24, kV = 96, kD = 64;

struct HeadBwd {
  TensorPool pool;
  coda_tensor h = pool.make(CODA_BF16, {kM, kD}), w = pool.make(CODA_BF16, {kV, kD});
  coda_tensor rstd = pool.make(CODA_FP32, {kM}), x = pool.make(CODA_BF16, {kM, kD});
  coda_tensor gamma = pool.make(CODA_BF16, {kD}), targets = pool.make(CODA_INT32, {kM});
  coda_tensor dx = pool.make(CODA_BF16, {kM, kD}), dw = pool.make(CODA_FP32, {kV, kD});
  coda_tensor dgamma = pool.make(CODA_FP32, {kD});
  coda_ce_options o = coda_ce_options_default();
  int64_t chunk = 10;
  size_t wsb = coda_linear_cross_entropy_bwd_workspace_size(kM, kV, kD, 10);
  void* ws = pool.bytes(wsb);
  coda_tensor* loss = nullptr;
  coda_status call(coda_tensor const* grad = nullptr, coda_tensor const* dx_in = nullptr) {
    return coda_linear_cross_entropy_bwd(&h, &w, &rstd, &x, &gamma, &targets, &o, grad, chunk, dx_in, &dx, &dw,
                                         &dgamma, loss, ws, wsb, nullptr);
  }
};

TEST(LinearCrossEntropyBwdApi, ValidArgumentsReachTheDevice) {
  HeadBwd f;
  auto& pool = f.pool;
  EXPECT_DEVICE_STAGE(f.call(), "h:");
  EXPECT_DEVICE_STAGE(f.call(nullptr, &f.dx), "h:");  // dx in place over dx_in
  f.o.reduction = CODA_REDUCTION_NONE;
  coda_tensor grad = pool.make(CODA_FP32, {kM});
  EXPECT_DEVICE_STAGE(f.call(&grad), "h:");
  coda_tensor loss_rows = pool.make(CODA_FP32, {kM});
  f.loss = &loss_rows;
  EXPECT_DEVICE_STAGE(f.call(&grad), "h:");
  f.o.reduction = CODA_REDUCTION_MEAN;
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "loss_out", "scalar");  // mean: a rank-0 loss
}

TEST(LinearCrossEntropyBwdApi, AnyVocabularySize) {
  // V not a multiple of 8 runs on a zero-padded copy of w (Vp rows) in the workspace: accepted, and the workspace
  // holds that copy, the Vp-wide logits chunk and the 8-row fp32 dW tail.
  for (int64_t V : {int64_t{1}, int64_t{7}, kV - 4, kV + 3}) {
    HeadBwd f;
    auto& pool = f.pool;
    f.w = pool.make(CODA_BF16, {V, kD});
    f.dw = pool.make(CODA_FP32, {V, kD});
    f.wsb = coda_linear_cross_entropy_bwd_workspace_size(kM, V, kD, 0);
    f.ws = pool.bytes(f.wsb);
    int64_t const Vp = (V + 7) / 8 * 8;
    EXPECT_GE(f.wsb, coda_linear_cross_entropy_bwd_workspace_size(kM, Vp, kD, 0) +
                         static_cast<size_t>(Vp * kD) * 2 + static_cast<size_t>(8 * kD) * 4) << V;
    EXPECT_DEVICE_STAGE(f.call(), "h:");
  }
}

TEST(LinearCrossEntropyBwdApi, Rules) {
  HeadBwd f;
  auto& pool = f.pool;
  f.w = pool.make(CODA_BF16, {kV, kD});
  f.dw = pool.make(CODA_BF16, {kV, kD});
  EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "dw_out");
  f.dw = pool.make(CODA_FP32, {kV, kD});
  coda_tensor vec_grad = pool.make(CODA_FP32, {kM});  // mean needs a scalar
  EXPECT_REJECTED(f.call(&vec_grad), CODA_ERROR_SHAPE, "grad_loss", "scalar");
  f.chunk = -1;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "chunk_rows");
  f.chunk = 10;
  coda_tensor dw_over_w = f.w;
  dw_over_w.dtype = CODA_FP32;
  dw_over_w.sizes[0] = kV / 2;  // an fp32 [V/2, d] view over w's bytes: wrong rows first
  EXPECT_REJECTED(coda_linear_cross_entropy_bwd(&f.h, &f.w, &f.rstd, &f.x, &f.gamma, &f.targets, &f.o, nullptr, 10,
                                                nullptr, &f.dx, &dw_over_w, &f.dgamma, nullptr, f.ws, f.wsb, nullptr),
                  CODA_ERROR_SHAPE, "dw_out");
  f.dgamma = f.rstd;  // dgamma over rstd (both fp32): wrong size first
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "dgamma_out");
  f.dgamma = pool.make(CODA_FP32, {kD});
  EXPECT_REJECTED(coda_linear_cross_entropy_bwd(&f.h, &f.w, &f.rstd, &f.x, &f.gamma, &f.targets, &f.o, nullptr, 10,
                                                nullptr, &f.dx, &f.dw, &f.dgamma, nullptr, f.ws, f.wsb - 256, nullptr),
                  CODA_ERROR_WORKSPACE, "coda_linear_cross_entropy_bwd");
  coda_tensor dx_over_x = f.x;  // an output over an input
  EXPECT_REJECTED(coda_linear_cross_entropy_bwd(&f.h, &f.w, &f.rstd, &f.x, &f.gamma, &f.targets, &f.o, nullptr, 10,
                                                nullptr, &dx_over_x, &f.dw, &f.dgamma, nullptr, f.ws, f.wsb, nullptr),
                  CODA_ERROR_ALIASING, "dx_out");
}

}  // namespace
