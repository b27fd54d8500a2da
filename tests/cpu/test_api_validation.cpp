// One test per validation rule of the C ABI: each asserts the status, that the message names the argument (and
// the rule), and that nothing was written. Valid arguments reach the device stage (EXPECT_DEVICE_STAGE) for built
// ops and CODA_ERROR_NOT_IMPLEMENTED for ops whose kernels are not built yet.
#include <coda/block.h>
#include <coda/coda.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include "cpu/tensor_pool.hpp"

namespace {

using coda::test::TensorPool;

// The Python binding packs coda_tensor itself (python/coda/_C.py: struct "=Qii4q4qi4x", size 88, fields at
// 0/8/12/16/48/80; its import asserts the same against the ctypes declaration): a change of the C struct must
// change both, and this is the C side of that check.
TEST(ApiLayout, TensorDescriptorMatchesThePythonPacking) {
  static_assert(CODA_MAX_RANK == 4, "python/coda/_C.py packs 4 sizes and 4 strides");
  EXPECT_EQ(sizeof(coda_tensor), 88u);
  EXPECT_EQ(offsetof(coda_tensor, data), 0u);
  EXPECT_EQ(offsetof(coda_tensor, dtype), 8u);
  EXPECT_EQ(offsetof(coda_tensor, rank), 12u);
  EXPECT_EQ(offsetof(coda_tensor, sizes), 16u);
  EXPECT_EQ(offsetof(coda_tensor, strides), 48u);
  EXPECT_EQ(offsetof(coda_tensor, device), 80u);
  EXPECT_EQ(sizeof(coda_dtype), 4u);  // packed as a 32-bit int
  // The block structs (version 2) are struct_size and descriptors only, in the field order of _C.BlockWeights /
  // BlockGrads / BlockSaved (filled by _C.tensors from one joined buffer): eight, eight and seven, the version-1 six
  // first.
  EXPECT_EQ(sizeof(coda_block_weights), 8 + 8 * sizeof(coda_tensor));
  EXPECT_EQ(sizeof(coda_block_grads), 8 + 8 * sizeof(coda_tensor));
  EXPECT_EQ(sizeof(coda_block_saved), 8 + 7 * sizeof(coda_tensor));
  EXPECT_EQ(offsetof(coda_block_weights, w_o), 8u);
  EXPECT_EQ(offsetof(coda_block_weights, w_qkv), 8 + 5 * sizeof(coda_tensor));
  EXPECT_EQ(offsetof(coda_block_weights, q_gamma), 8 + 6 * sizeof(coda_tensor));
  EXPECT_EQ(offsetof(coda_block_grads, w_qkv), 8 + 5 * sizeof(coda_tensor));
  EXPECT_EQ(offsetof(coda_block_grads, k_gamma), 8 + 7 * sizeof(coda_tensor));
  EXPECT_EQ(offsetof(coda_block_saved, qkv), 8 + 5 * sizeof(coda_tensor));
  EXPECT_EQ(offsetof(coda_block_saved, z), 8 + 6 * sizeof(coda_tensor));
  EXPECT_EQ(offsetof(coda_block_config, hidden_size), 8u);
  EXPECT_EQ(offsetof(coda_block_config, qk_eps), 40u);  // version 1's size
  EXPECT_EQ(sizeof(coda_block_config), 48u);
}


// coda_linear_residual_rmsnorm with valid arguments: M=16, K=32, N=64, bf16.
struct ResidualRmsnorm {
  TensorPool pool;
  int64_t M = 16, K = 32, N = 64;
  coda_tensor a = pool.make(CODA_BF16, {M, K}), w = pool.make(CODA_BF16, {N, K});
  coda_tensor residual = pool.make(CODA_BF16, {M, N}), gamma = pool.make(CODA_BF16, {N});
  coda_tensor x = pool.make(CODA_BF16, {M, N}), h = pool.make(CODA_BF16, {M, N});
  coda_tensor rstd = pool.make(CODA_FP32, {M});
  size_t ws_bytes = coda_linear_residual_rmsnorm_workspace_size(M, N);
  void* ws = pool.bytes(ws_bytes);
  float eps = 1e-5f;
  coda_status call() {
    return coda_linear_residual_rmsnorm(&a, &w, &residual, &gamma, eps, &x, &h, &rstd, ws, ws_bytes, nullptr);
  }
};

// coda_gemm with valid arguments: M=24, N=40, K=16.
struct Gemm {
  TensorPool pool;
  coda_tensor a = pool.make(CODA_BF16, {24, 16}), b = pool.make(CODA_BF16, {40, 16});
  coda_tensor d = pool.make(CODA_BF16, {24, 40});
  size_t ws_bytes = coda_gemm_workspace_size(24, 40, 16);
  void* ws = pool.bytes(ws_bytes);
  coda_status call(float alpha = 1.0f, int accumulate = 0) {
    return coda_gemm(&a, &b, &d, alpha, accumulate, ws, ws_bytes, nullptr);
  }
};

coda_tensor transposed(coda_tensor t) {
  std::swap(t.sizes[0], t.sizes[1]);
  std::swap(t.strides[0], t.strides[1]);
  return t;
}


// ---- descriptor rules -----------------------------------------------------------------------------------------

TEST(Validation, NullDescriptorIsNamed) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  EXPECT_REJECTED(coda_linear_residual_rmsnorm(&f.a, nullptr, &f.residual, &f.gamma, f.eps, &f.x, &f.h, &f.rstd,
                                               f.ws, f.ws_bytes, nullptr),
                  CODA_ERROR_INVALID_ARGUMENT, "w:", "NULL");
}

TEST(Validation, UnknownDtypeValue) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.gamma.dtype = static_cast<coda_dtype>(77);
  EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "gamma", "unknown dtype");
}

TEST(Validation, RankOutOfRange) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.a.rank = 5;
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "a:", "rank 5");
}

TEST(Validation, NegativeSize) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.residual.sizes[0] = -1;
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "residual", "negative");
}

TEST(Validation, NegativeStride) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.x.strides[0] = -64;
  EXPECT_REJECTED(f.call(), CODA_ERROR_LAYOUT, "x_out", "negative");
}

TEST(Validation, NullDataPointer) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.h.data = nullptr;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "h_out", "data pointer is NULL");
}

TEST(Validation, WrongRank) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.gamma = f.pool.make(CODA_BF16, {1, f.N});
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "gamma", "expected rank 1");
}

// ---- dtype rules ----------------------------------------------------------------------------------------------

TEST(Validation, DtypeNotAccepted) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.a = f.pool.make(CODA_FP32, {f.M, f.K});
  EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "a:", "bf16 or fp16", "got fp32");
}

TEST(Validation, DtypesMustMatch) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.w = f.pool.make(CODA_FP16, {f.N, f.K});
  EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "w:", "must match a");
}

TEST(Validation, StatisticsMustBeFp32) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.rstd = f.pool.make(CODA_BF16, {f.M});
  EXPECT_REJECTED(f.call(), CODA_ERROR_DTYPE, "rstd_out", "fp32");
}

// ---- shape rules ----------------------------------------------------------------------------------------------

TEST(Validation, InnerDimensionsMustAgree) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.w = f.pool.make(CODA_BF16, {f.N, f.K + 8});
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "w:", "(K)", "32");
}

TEST(Validation, OutputShapeMustMatch) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.h = f.pool.make(CODA_BF16, {f.M + 1, f.N});
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "h_out", "(M)");
}

TEST(Validation, VectorLengthMustMatch) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.gamma = f.pool.make(CODA_BF16, {f.N - 8});
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "gamma", "(N)");
}

TEST(Validation, EmptyReductionDimensionRejected) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.a = f.pool.make(CODA_BF16, {f.M, 0});
  f.w = f.pool.make(CODA_BF16, {f.N, 0});
  EXPECT_REJECTED(f.call(), CODA_ERROR_SHAPE, "a:", "K");
}

// ---- layout rules ---------------------------------------------------------------------------------------------

TEST(Validation, MustBeRowMajor) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.residual.strides[0] = 1;
  f.residual.strides[1] = f.M;
  EXPECT_REJECTED(f.call(), CODA_ERROR_LAYOUT, "residual", "row-major");
}

TEST(Validation, RowStrideShorterThanRow) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.x.strides[0] = f.N - 8;
  EXPECT_REJECTED(f.call(), CODA_ERROR_LAYOUT, "x_out", "row stride");
}

TEST(Validation, VectorMustBeContiguous) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.rstd.strides[0] = 2;
  EXPECT_REJECTED(f.call(), CODA_ERROR_LAYOUT, "rstd_out", "contiguous");
}

TEST(Validation, PaddedRowStrideAccepted) {
  // A row stride larger than the row (a slice of a wider buffer) is legal: validation passes it on.
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.a = f.pool.make(CODA_BF16, {f.M, f.K + 16});
  f.a.sizes[1] = f.K;
  EXPECT_DEVICE_STAGE(f.call(), "a:");
}

// ---- alignment rules (TMA) ------------------------------------------------------------------------------------

TEST(Validation, MisalignedPointer) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.a.data = static_cast<char*>(f.a.data) + 2;
  EXPECT_REJECTED(f.call(), CODA_ERROR_MISALIGNED, "a:", "16-byte aligned");
}

TEST(Validation, MisalignedElementPointer) {
  // Vectors need no TMA alignment, but every element must be naturally aligned.
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.rstd.data = static_cast<char*>(f.rstd.data) + 2;
  EXPECT_REJECTED(f.call(), CODA_ERROR_MISALIGNED, "rstd_out", "4-byte fp32");
}

TEST(Validation, MisalignedRowStride) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.x = f.pool.make(CODA_BF16, {f.M, f.N + 4});
  f.x.sizes[1] = f.N;
  EXPECT_REJECTED(f.call(), CODA_ERROR_MISALIGNED, "x_out", "strides[0]", "16 bytes");
}

TEST(Validation, FeatureCountNotMultipleOf8) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.a = f.pool.make(CODA_BF16, {f.M, 40});  // aligned row stride, but K = 36 contiguous elements
  f.w = f.pool.make(CODA_BF16, {f.N, 40});
  f.a.sizes[1] = f.w.sizes[1] = 36;
  EXPECT_REJECTED(f.call(), CODA_ERROR_MISALIGNED, "a:", "multiple of 8");
}

// ---- device rules ---------------------------------------------------------------------------------------------

TEST(Validation, HostTensorRejected) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.gamma.device = -1;
  EXPECT_REJECTED(f.call(), CODA_ERROR_DEVICE, "gamma", "host tensor");
}

TEST(Validation, TensorsOnDifferentDevices) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.h.device = 1;
  EXPECT_REJECTED(f.call(), CODA_ERROR_DEVICE, "h_out", "device 1", "device 0");
}

TEST(Validation, KernelNeedsSm90OrNamesTheDevice) {
  // Valid coda_gemm arguments in host memory: without an sm_90 GPU the device stage refuses with CODA_ERROR_ARCH;
  // with one, it sees that the "device" pointers are host memory.
  Gemm g;
  auto& pool = g.pool;
  EXPECT_DEVICE_STAGE(g.call(), "a:");
}

// ---- aliasing rules -------------------------------------------------------------------------------------------

TEST(Validation, OutputsMustNotOverlap) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.h = f.x;
  EXPECT_REJECTED(f.call(), CODA_ERROR_ALIASING, "h_out", "overlap");
}

TEST(Validation, OutputMustNotOverlapInput) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.h = f.residual;  // h_out may never share memory with an input
  EXPECT_REJECTED(f.call(), CODA_ERROR_ALIASING, "h_out and residual", "overlap");
}

TEST(Validation, InPlaceMustBeTheExactView) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.x = f.residual;
  f.x.data = static_cast<char*>(f.residual.data) + 32;  // shifted by 16 elements: partial overlap
  EXPECT_REJECTED(f.call(), CODA_ERROR_ALIASING, "x_out and residual", "partially overlap");
}

TEST(Validation, InPlaceResidualAccepted) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.x = f.residual;  // the documented in-place update
  EXPECT_DEVICE_STAGE(f.call(), "a:");
}

TEST(Validation, GemmOutputMustNotOverlapOperands) {
  Gemm g;
  auto& pool = g.pool;
  g.d = g.pool.make(CODA_BF16, {24, 40});
  g.a = g.d;
  g.a.sizes[1] = 16;
  g.a.strides[0] = 40;
  EXPECT_REJECTED(g.call(), CODA_ERROR_ALIASING, "d and a", "overlap");
}

// ---- scalar and workspace rules -------------------------------------------------------------------------------

TEST(Validation, EpsMustBePositive) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.eps = 0.0f;
  EXPECT_REJECTED(f.call(), CODA_ERROR_INVALID_ARGUMENT, "eps", "> 0");
}

TEST(Validation, WorkspaceTooSmall) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  ASSERT_GT(f.ws_bytes, 0u);
  f.ws_bytes -= 1;
  EXPECT_REJECTED(f.call(), CODA_ERROR_WORKSPACE, "workspace", "needs");
}

TEST(Validation, WorkspaceNull) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.ws = nullptr;
  EXPECT_REJECTED(f.call(), CODA_ERROR_WORKSPACE, "workspace", "NULL");
}

TEST(Validation, WorkspaceMisaligned) {
  ResidualRmsnorm f;
  auto& pool = f.pool;
  f.ws = f.pool.bytes(f.ws_bytes + 256);
  f.ws = static_cast<char*>(f.ws) + 16;
  EXPECT_REJECTED(f.call(), CODA_ERROR_WORKSPACE, "workspace", "256-byte aligned");
}

TEST(Validation, GemmAlphaMustBeFinite) {
  Gemm g;
  auto& pool = g.pool;
  EXPECT_REJECTED(g.call(std::numeric_limits<float>::infinity()), CODA_ERROR_INVALID_ARGUMENT, "alpha", "finite");
}

TEST(Validation, GemmAccumulateIsABool) {
  Gemm g;
  auto& pool = g.pool;
  EXPECT_REJECTED(g.call(1.0f, 2), CODA_ERROR_INVALID_ARGUMENT, "accumulate", "0 or 1");
}

// ---- plain GEMM operand layouts -------------------------------------------------------------------------------

TEST(Validation, GemmRejectsFullyStridedOperand) {
  Gemm g;
  auto& pool = g.pool;
  g.b = g.pool.make(CODA_BF16, {40, 32});
  g.b.sizes[1] = 16;
  g.b.strides[1] = 2;  // every other element: neither row- nor column-major
  EXPECT_REJECTED(g.call(), CODA_ERROR_LAYOUT, "b:", "row-major", "column-major");
}

TEST(Validation, GemmAcceptsTransposedViews) {
  // dW = dz^T a: a is dz^T (column-major view), b is a^T (column-major view): both valid layouts.
  Gemm g;
  auto& pool = g.pool;
  g.a = transposed(g.pool.make(CODA_BF16, {16, 24}));
  g.b = transposed(g.pool.make(CODA_BF16, {16, 40}));
  coda_status const s = g.call();
  EXPECT_TRUE(s == CODA_ERROR_ARCH || s == CODA_ERROR_DEVICE) << coda_status_string(s) << ": " << coda_last_error();
  EXPECT_TRUE(pool.untouched());
}

TEST(Validation, GemmOutputDtypeFp32Allowed) {
  Gemm g;
  g.d = g.pool.make(CODA_FP32, {24, 40});
  coda_status const s = g.call(1.0f, 1);
  EXPECT_TRUE(s == CODA_ERROR_ARCH || s == CODA_ERROR_DEVICE) << coda_status_string(s) << ": " << coda_last_error();
  EXPECT_TRUE(g.pool.untouched());
}

TEST(Validation, GemmOutputDtypeInt32Rejected) {
  Gemm g;
  auto& pool = g.pool;
  g.d = g.pool.make(CODA_INT32, {24, 40});
  EXPECT_REJECTED(g.call(), CODA_ERROR_DTYPE, "d:", "bf16 or fp32", "got int32");
}

TEST(Validation, GemmOutputMustKeepThe16BitType) {
  // bf16 inputs with an fp16 output (or the reverse) mix two 16-bit formats: no kernel takes that.
  Gemm g;
  auto& pool = g.pool;
  g.d = g.pool.make(CODA_FP16, {24, 40});
  EXPECT_REJECTED(g.call(), CODA_ERROR_DTYPE, "d:", "bf16 or fp32", "got fp16");
}

}  // namespace
