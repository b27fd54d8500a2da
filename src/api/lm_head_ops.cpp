// C ABI entry point of the LM head + cross-entropy loss without logits (coda_linear_cross_entropy): validation,
// then the chunked dispatch (src/ops/linear_cross_entropy).
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "ops/linear_cross_entropy/linear_cross_entropy.hpp"
#include "ops/op_config.hpp"

using coda::api::Arg;
using coda::api::guarded;
using coda::detail::fail;
namespace api = coda::api;

extern "C" {

CODA_API size_t coda_linear_cross_entropy_workspace_size(int64_t M, int64_t V, int64_t chunk_rows) {
  if (chunk_rows < 0) return 0;
  return coda::ops::linear_cross_entropy_workspace_bytes(M, V, chunk_rows);
}

CODA_API coda_status coda_linear_cross_entropy(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                               const coda_tensor* targets, const coda_ce_options* options,
                                               int64_t chunk_rows, coda_tensor* loss_out, coda_tensor* lse_out,
                                               void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_cross_entropy", [&] {
    Arg const Hh{h, "h"}, W{w, "w"}, S{rstd, "rstd"}, T{targets, "targets"};
    Arg const L{loss_out, "loss_out"}, LS{lse_out, "lse_out"};
    coda_ce_options const o = options != nullptr ? *options : coda_ce_options_default();
    api::LinearShape const s = api::check_linear(Hh, W);
    api::check_vector(S, s.M, {CODA_FP32}, "M", "h.sizes[0]");
    api::check_vector(T, s.M, {CODA_INT32, CODA_INT64}, "M", "h.sizes[0]");
    api::check_ce_options(o);
    if (chunk_rows < 0) fail(CODA_ERROR_INVALID_ARGUMENT, "chunk_rows: must be >= 1, or 0 for the default, got ", chunk_rows);
    bool const per_row = o.reduction == CODA_REDUCTION_NONE;
    api::check_loss_out(L, s.M, per_row, "h.sizes[0] (reduction none)");
    if (lse_out != nullptr) api::check_vector(LS, s.M, {CODA_FP32}, "M", "h.sizes[0]");
    api::check_disjoint({L, LS}, {Hh, W, S, T});
    api::require_workspace("coda_linear_cross_entropy", workspace, workspace_bytes,
                           coda_linear_cross_entropy_workspace_size(s.M, s.N, chunk_rows));
    bool const fp16 = Hh.dtype() == CODA_FP16;
    api::require_fused_launch({Hh, W, S, T, L, LS});
    auto const st = static_cast<cudaStream_t>(stream);
    if (s.M == 0) {
      // Like coda_cross_entropy: an empty mean/sum is 0.
      if (!per_row) CODA_CUDA_CHECK(cudaMemsetAsync(loss_out->data, 0, sizeof(float), st));
      return;
    }
    coda::ops::LinearCrossEntropyArgs a;
    a.M = s.M, a.V = s.N, a.K = s.K;
    a.h = h->data, a.ldh = s.M > 1 ? Hh.stride(0) : s.K;
    a.w = w->data, a.ldw = s.N > 1 ? W.stride(0) : s.K;
    a.rstd = static_cast<float const*>(rstd->data);
    a.targets = targets->data;
    a.targets_int64 = T.dtype() == CODA_INT64;
    a.options = o;
    a.fp16 = fp16;
    a.chunk_rows = chunk_rows;
    a.loss = static_cast<float*>(loss_out->data);
    a.lse = lse_out != nullptr ? static_cast<float*>(lse_out->data) : nullptr;
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    coda::ops::linear_cross_entropy(a, st);
  });
}

}  // extern "C"
