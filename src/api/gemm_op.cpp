// C ABI entry point of the plain GEMM: validation, layout decoding, then src/gemm (autotuned CUTLASS or cuBLAS).
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cmath>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "gemm/gemm.hpp"

using coda::api::Arg;
using coda::api::guarded;
using coda::detail::fail;
namespace api = coda::api;

namespace {

struct Operand {
  bool col_major;  // unit stride along dim 0 (M or N) instead of K
  int64_t ld;      // stride of the non-unit dimension
};

// Reads a rank-2 operand [rows, K] that is either row-major (strides [ld,1]) or column-major (strides [1,ld]).
// A dimension of size 1 has no meaningful stride, so the other one decides.
Operand decode_operand(Arg t) {
  api::require_rank(t, 2);
  int64_t const rows = t.size(0), cols = t.size(1);
  if (cols > 1 && t.stride(1) == 1) return {false, rows <= 1 ? cols : t.stride(0)};
  if (rows > 1 && t.stride(0) == 1) return {true, cols <= 1 ? rows : t.stride(1)};
  if (cols <= 1) return {false, rows <= 1 ? cols : t.stride(0)};  // a single column: K <= 1
  fail(CODA_ERROR_LAYOUT, t.name, ": must be row-major (strides[1] == 1) or column-major (strides[0] == 1), got "
       "strides [", t.stride(0), ",", t.stride(1), "]; make it contiguous");
}

void check_leading_dim(Arg t, Operand op) {
  int64_t const inner = op.col_major ? t.size(0) : t.size(1);
  if (op.ld < inner) {
    fail(CODA_ERROR_LAYOUT, t.name, ": leading dimension ", op.ld, " is smaller than the contiguous extent ", inner);
  }
}

}  // namespace

extern "C" {

CODA_API size_t coda_gemm_workspace_size(int64_t M, int64_t N, int64_t K) {
  return coda::gemm::workspace_size_for_shape(M, N, K);
}

CODA_API coda_status coda_gemm(const coda_tensor* a, const coda_tensor* b, coda_tensor* d, float alpha,
                               int accumulate, void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("coda_gemm", [&] {
    Arg const A{a, "a"}, B{b, "b"}, D{d, "d"};
    api::require_tensor(A);
    api::require_tensor(B);
    api::require_tensor(D);
    api::require_dtype(A, {CODA_BF16, CODA_FP16});
    api::require_same_dtype(B, A);
    api::require_dtype(D, {A.dtype(), CODA_FP32});  // same 16-bit type as the inputs, or fp32
    Operand const oa = decode_operand(A);
    Operand const ob = decode_operand(B);
    api::require_rank(D, 2);
    api::require_size(B, 1, A.size(1), "K", "a.sizes[1]");
    api::require_size(D, 0, A.size(0), "M", "a.sizes[0]");
    api::require_size(D, 1, B.size(0), "N", "b.sizes[0]");
    api::require_row_major(D);
    check_leading_dim(A, oa);
    check_leading_dim(B, ob);
    api::require_tma_aligned(A, true);
    api::require_tma_aligned(B, true);
    api::require_tma_aligned(D, true);
    if (!std::isfinite(alpha)) fail(CODA_ERROR_INVALID_ARGUMENT, "alpha: must be finite, got ", alpha);
    if (accumulate != 0 && accumulate != 1) {
      fail(CODA_ERROR_INVALID_ARGUMENT, "accumulate: must be 0 or 1, got ", accumulate);
    }
    api::check_disjoint({D}, {A, B});
    coda::gemm::GemmArgs args;
    args.M = A.size(0);
    args.N = B.size(0);
    args.K = A.size(1);
    args.dtype_ab = A.dtype();
    args.dtype_d = D.dtype();
    args.A = a->data;
    args.lda = oa.ld;
    args.a_col_major = oa.col_major;
    args.B = b->data;
    args.ldb = ob.ld;
    args.b_col_major = ob.col_major;
    args.D = d->data;
    args.ldd = args.M <= 1 ? args.N : D.stride(0);
    args.alpha = alpha;
    args.accumulate = accumulate == 1;
    api::require_workspace("coda_gemm", workspace, workspace_bytes, coda::gemm::workspace_size(args));
    int const device = api::require_same_device({A, B, D});
    api::require_kernel_device(device, {A, B, D});
    if (args.M == 0 || args.N == 0) return;
    auto const s = static_cast<cudaStream_t>(stream);
    if (args.K == 0) {  // empty sum: D = 0, or D unchanged when accumulating
      if (!args.accumulate) {
        size_t const es = coda_dtype_size(args.dtype_d);
        CODA_CUDA_CHECK(cudaMemset2DAsync(args.D, static_cast<size_t>(args.ldd) * es, 0,
                                          static_cast<size_t>(args.N) * es, static_cast<size_t>(args.M), s));
      }
      return;
    }
    coda::gemm::run(args, workspace, workspace_bytes, s);
  });
}

}  // extern "C"
