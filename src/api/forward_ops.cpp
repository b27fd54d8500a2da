// C ABI entry points of the forward ops (coda.h F1-F6): validation, then dispatch to the kernels.
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cmath>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "kernels/kernels.hpp"
#include "ops/linear_residual_rmsnorm/kernels.hpp"
#include "ops/linear_rowscale/kernels.hpp"
#include "ops/linear_rowscale_lse/kernels.hpp"
#include "ops/linear_rowscale_swiglu/kernels.hpp"
#include "ops/linear_rowscale_qk_norm_rope/kernels.hpp"
#include "ops/linear_rowscale_rope/kernels.hpp"
#include "ops/op_config.hpp"

using coda::api::Arg;
using coda::api::guarded;
using coda::detail::fail;
namespace api = coda::api;

namespace {

// F2-F5 share the "h [M,K] x w [N,K] scaled by rstd [M]" inputs.
api::LinearShape check_rowscale_inputs(Arg h, Arg w, Arg rstd) {
  api::LinearShape const s = api::check_linear(h, w);
  api::check_vector(rstd, s.M, {CODA_FP32}, "M", "h.sizes[0]");
  return s;
}

// Row stride of a validated row-major [rows, cols] tensor (a single row may carry any stride).
int64_t row_stride(Arg t, int64_t cols) { return t.size(0) > 1 ? t.stride(0) : cols; }

}  // namespace

extern "C" {

CODA_API size_t coda_linear_residual_rmsnorm_workspace_size(int64_t M, int64_t N) {
  return api::row_partials_bytes(M, N);
}

CODA_API coda_status coda_linear_residual_rmsnorm(const coda_tensor* a, const coda_tensor* w,
                                                  const coda_tensor* residual, const coda_tensor* gamma, float eps,
                                                  coda_tensor* x_out, coda_tensor* h_out, coda_tensor* rstd_out,
                                                  void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_residual_rmsnorm", [&] {
    Arg const A{a, "a"}, W{w, "w"}, R{residual, "residual"}, G{gamma, "gamma"};
    Arg const X{x_out, "x_out"}, H{h_out, "h_out"}, S{rstd_out, "rstd_out"};
    api::LinearShape const s = api::check_linear(A, W);
    api::check_activation(R, A, s.M, s.N, "M", "N");
    api::check_vector(G, s.N, {A.dtype()}, "N", "w.sizes[0]");
    api::check_eps(eps);
    api::check_activation(X, A, s.M, s.N, "M", "N");
    api::check_activation(H, A, s.M, s.N, "M", "N");
    api::check_vector(S, s.M, {CODA_FP32}, "M", "a.sizes[0]");
    api::require_same_or_disjoint(X, R);  // the residual stream may be updated in place
    api::check_disjoint({X}, {A, W, G});
    api::check_disjoint({H, S}, {A, W, R, G, X});
    api::require_workspace("coda_linear_residual_rmsnorm", workspace, workspace_bytes,
                           coda_linear_residual_rmsnorm_workspace_size(s.M, s.N));
    int const device = api::require_same_device({A, W, R, G, X, H, S});
    bool const fp16 = A.dtype() == CODA_FP16;
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {A, W, R, G, X, H, S});
    if (s.M == 0) return;
    coda::ops::linear_residual_rmsnorm(s.M, s.N, s.K, a->data, row_stride(A, s.K), w->data, row_stride(W, s.K),
                                       residual->data, row_stride(R, s.N), gamma->data, eps, x_out->data,
                                       row_stride(X, s.N), h_out->data, row_stride(H, s.N),
                                       static_cast<float*>(rstd_out->data), workspace, workspace_bytes, fp16,
                                       static_cast<cudaStream_t>(stream));
  });
}

CODA_API coda_status coda_rmsnorm_rstd(const coda_tensor* partials, int64_t n_features, float eps,
                                       coda_tensor* rstd_out, void* stream) {
  return guarded("coda_rmsnorm_rstd", [&] {
    Arg const P{partials, "partials"}, S{rstd_out, "rstd_out"};
    api::require_tensor(P);
    api::require_rank(P, 2);
    api::require_dtype(P, {CODA_FP32});
    if (P.size(0) == 0) fail(CODA_ERROR_SHAPE, "partials: needs at least one tile row (sizes[0] > 0)");
    if (P.size(1) > 1 && P.stride(1) != 1) {
      fail(CODA_ERROR_LAYOUT, "partials: must have unit stride along M (strides[1] == 1), got ", P.stride(1));
    }
    if (P.size(0) > 1 && P.stride(0) < P.size(1)) {
      fail(CODA_ERROR_LAYOUT, "partials: row stride ", P.stride(0), " is smaller than M = ", P.size(1));
    }
    if (n_features <= 0) fail(CODA_ERROR_INVALID_ARGUMENT, "n_features: must be > 0, got ", n_features);
    api::check_eps(eps);
    api::check_vector(S, P.size(1), {CODA_FP32}, "M", "partials.sizes[1]");
    api::check_disjoint({S}, {P});
    int const device = api::require_same_device({P, S});
    api::require_kernel_device(device, {P, S});
    int64_t const T = P.size(0), M = P.size(1);
    if (M == 0) return;
    coda::kernels::rmsnorm_rstd(static_cast<float const*>(partials->data), T, M, T > 1 ? P.stride(0) : M, n_features,
                                eps, static_cast<float*>(rstd_out->data), static_cast<cudaStream_t>(stream));
  });
}

CODA_API coda_status coda_rmsnorm_prepare(const coda_tensor* x, const coda_tensor* gamma, float eps,
                                          coda_tensor* h_out, coda_tensor* rstd_out, void* stream) {
  return guarded("coda_rmsnorm_prepare", [&] {
    Arg const X{x, "x"}, G{gamma, "gamma"}, H{h_out, "h_out"}, S{rstd_out, "rstd_out"};
    api::require_tensor(X);
    api::require_rank(X, 2);
    api::require_dtype(X, {CODA_BF16, CODA_FP16});
    api::require_row_major(X);
    api::require_tma_aligned(X, true);
    if (X.size(1) == 0) fail(CODA_ERROR_SHAPE, "x: N (sizes[1]) must be > 0");
    api::check_vector(G, X.size(1), {X.dtype()}, "N", "x.sizes[1]");
    api::check_eps(eps);
    api::check_activation(H, X, X.size(0), X.size(1), "M", "N");
    api::check_vector(S, X.size(0), {CODA_FP32}, "M", "x.sizes[0]");
    api::check_disjoint({H, S}, {X, G});
    int const device = api::require_same_device({X, G, H, S});
    api::require_kernel_device(device, {X, G, H, S});
    int64_t const M = X.size(0), N = X.size(1);
    if (M == 0) return;
    coda::kernels::RmsnormPrepareArgs k;
    k.dtype = X.dtype();
    k.M = M;
    k.N = N;
    k.x = x->data;
    k.ldx = M > 1 ? X.stride(0) : N;
    k.gamma = gamma->data;
    k.eps = eps;
    k.h = h_out->data;
    k.ldh = M > 1 ? H.stride(0) : N;
    k.rstd = static_cast<float*>(rstd_out->data);
    coda::kernels::rmsnorm_prepare(k, static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_linear_rowscale_workspace_size(int64_t M, int64_t N) { return 0; }

CODA_API coda_status coda_linear_rowscale(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                          coda_tensor* y_out, void* workspace, size_t workspace_bytes,
                                          void* stream) {
  return guarded("coda_linear_rowscale", [&] {
    Arg const Hh{h, "h"}, W{w, "w"}, S{rstd, "rstd"}, Y{y_out, "y_out"};
    api::LinearShape const s = check_rowscale_inputs(Hh, W, S);
    api::check_activation(Y, Hh, s.M, s.N, "M", "N");
    api::check_disjoint({Y}, {Hh, W, S});
    api::require_workspace("coda_linear_rowscale", workspace, workspace_bytes,
                           coda_linear_rowscale_workspace_size(s.M, s.N));
    int const device = api::require_same_device({Hh, W, S, Y});
    bool const fp16 = Hh.dtype() == CODA_FP16;
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {Hh, W, S, Y});
    if (s.M == 0) return;
    coda::ops::linear_rowscale(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w->data, row_stride(W, s.K),
                               static_cast<float const*>(rstd->data), y_out->data, row_stride(Y, s.N), fp16,
                               static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_linear_rowscale_swiglu_workspace_size(int64_t M, int64_t N) { return 0; }

CODA_API coda_status coda_linear_rowscale_swiglu(const coda_tensor* h, const coda_tensor* w_gu,
                                                 const coda_tensor* rstd, coda_tensor* z_out, coda_tensor* y_out,
                                                 void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_rowscale_swiglu", [&] {
    Arg const Hh{h, "h"}, W{w_gu, "w_gu"}, S{rstd, "rstd"}, Z{z_out, "z_out"}, Y{y_out, "y_out"};
    api::LinearShape const s = check_rowscale_inputs(Hh, W, S);
    if (s.N % 16 != 0) {
      fail(CODA_ERROR_SHAPE, "w_gu: sizes[0] = 2F = ", s.N,
           " must be a multiple of 16 (interleaved gate/up pairs, and y = [M,F] needs F a multiple of 8)");
    }
    api::check_activation(Z, Hh, s.M, s.N, "M", "2F");
    api::check_activation(Y, Hh, s.M, s.N / 2, "M", "F");
    api::check_disjoint({Z, Y}, {Hh, W, S});
    api::require_workspace("coda_linear_rowscale_swiglu", workspace, workspace_bytes,
                           coda_linear_rowscale_swiglu_workspace_size(s.M, s.N));
    int const device = api::require_same_device({Hh, W, S, Z, Y});
    bool const fp16 = Hh.dtype() == CODA_FP16;
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {Hh, W, S, Z, Y});
    if (s.M == 0) return;
    coda::ops::linear_rowscale_swiglu(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w_gu->data, row_stride(W, s.K),
                                      static_cast<float const*>(rstd->data), z_out->data, row_stride(Z, s.N),
                                      y_out->data, row_stride(Y, s.N / 2), fp16, static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_linear_rowscale_rope_workspace_size(int64_t M, int64_t N) {
  // The inv_freq vector expanded per output column (N floats); independent of M.
  return M <= 0 ? 0 : coda::ops::linear_rowscale_rope_workspace_bytes(N);
}

CODA_API coda_status coda_linear_rowscale_rope(const coda_tensor* h, const coda_tensor* w_qkv,
                                               const coda_tensor* rstd, const coda_tensor* positions,
                                               const coda_tensor* inv_freq, int32_t n_q_heads, int32_t n_kv_heads,
                                               int32_t head_dim, coda_tensor* qkv_out, void* workspace,
                                               size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_rowscale_rope", [&] {
    Arg const Hh{h, "h"}, W{w_qkv, "w_qkv"}, S{rstd, "rstd"}, P{positions, "positions"}, F{inv_freq, "inv_freq"};
    Arg const Q{qkv_out, "qkv_out"};
    api::LinearShape const s = check_rowscale_inputs(Hh, W, S);
    int64_t const width = api::check_rope_args(P, F, n_q_heads, n_kv_heads, head_dim, s.M);
    api::require_size(W, 0, width, "(n_q_heads + 2*n_kv_heads)*head_dim", "the head counts");
    api::check_activation(Q, Hh, s.M, s.N, "M", "qkv width");
    api::check_disjoint({Q}, {Hh, W, S, P, F});
    api::require_workspace("coda_linear_rowscale_rope", workspace, workspace_bytes,
                           coda_linear_rowscale_rope_workspace_size(s.M, s.N));
    int const device = api::require_same_device({Hh, W, S, P, F, Q});
    bool const fp16 = Hh.dtype() == CODA_FP16;
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {Hh, W, S, P, F, Q});
    if (s.M == 0) return;
    coda::ops::linear_rowscale_rope(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w_qkv->data, row_stride(W, s.K),
                                    static_cast<float const*>(rstd->data),
                                    static_cast<int32_t const*>(positions->data),
                                    static_cast<float const*>(inv_freq->data), n_q_heads, n_kv_heads, head_dim,
                                    qkv_out->data, row_stride(Q, s.N), workspace, workspace_bytes, fp16,
                                    static_cast<cudaStream_t>(stream));
  });
}

CODA_API coda_status coda_linear_rowscale_qk_norm_rope(const coda_tensor* h, const coda_tensor* w_qkv,
                                                       const coda_tensor* rstd, const coda_tensor* q_gamma,
                                                       const coda_tensor* k_gamma, const coda_tensor* positions,
                                                       const coda_tensor* inv_freq, int32_t n_q_heads,
                                                       int32_t n_kv_heads, int32_t head_dim, float qk_eps,
                                                       coda_tensor* qkv_out, coda_tensor* z_out, void* stream) {
  return guarded("coda_linear_rowscale_qk_norm_rope", [&] {
    Arg const Hh{h, "h"}, W{w_qkv, "w_qkv"}, S{rstd, "rstd"}, GQ{q_gamma, "q_gamma"}, GK{k_gamma, "k_gamma"};
    Arg const P{positions, "positions"}, F{inv_freq, "inv_freq"}, Q{qkv_out, "qkv_out"}, Z{z_out, "z_out"};
    api::LinearShape const s = check_rowscale_inputs(Hh, W, S);
    int64_t const width = api::check_rope_args(P, F, n_q_heads, n_kv_heads, head_dim, s.M);
    api::require_size(W, 0, width, "(n_q_heads + 2*n_kv_heads)*head_dim", "the head counts");
    for (Arg const& g : {GQ, GK}) {
      api::check_vector(g, head_dim, {CODA_FP32}, "head_dim", "head_dim");
      if ((reinterpret_cast<uintptr_t>(g.t->data) & 7u) != 0) {
        fail(CODA_ERROR_MISALIGNED, g.name, ": data must be 8-byte aligned (read as float pairs)");
      }
    }
    if (!(qk_eps > 0.0f) || !std::isfinite(qk_eps)) {
      fail(CODA_ERROR_INVALID_ARGUMENT, "qk_eps: must be finite and > 0, got ", qk_eps);
    }
    api::check_activation(Q, Hh, s.M, s.N, "M", "qkv width");
    if (z_out != nullptr) api::check_activation(Z, Hh, s.M, s.N, "M", "qkv width");  // NULL: z not stored
    api::check_disjoint({Q, Z}, {Hh, W, S, GQ, GK, P, F});
    int const device = api::require_same_device({Hh, W, S, GQ, GK, P, F, Q, Z});
    bool const fp16 = Hh.dtype() == CODA_FP16;
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {Hh, W, S, GQ, GK, P, F, Q, Z});
    if (s.M == 0) return;
    coda::ops::QkNormRopeArgs args;
    args.rstd = static_cast<float const*>(rstd->data);
    args.z = z_out != nullptr ? z_out->data : nullptr;
    args.ldz = z_out != nullptr ? row_stride(Z, s.N) : 0;
    args.q_gamma = static_cast<float const*>(q_gamma->data);
    args.k_gamma = static_cast<float const*>(k_gamma->data);
    args.inv_freq = static_cast<float const*>(inv_freq->data);
    args.positions = static_cast<int32_t const*>(positions->data);
    args.n_q_heads = n_q_heads;
    args.n_kv_heads = n_kv_heads;
    args.head_dim = head_dim;
    args.eps = qk_eps;
    coda::ops::linear_rowscale_qk_norm_rope(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w_qkv->data,
                                            row_stride(W, s.K), args, qkv_out->data, row_stride(Q, s.N), fp16,
                                            static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_linear_rowscale_lse_workspace_size(int64_t M, int64_t V) {
  // Four fp32 [T, Mpad] partial buffers of the F5 kernels' CTA tile (max, sum-exp, logit sum, target logit), each
  // 256-byte aligned: exactly ops::lse_workspace(M, V, kLseTileM, kLseTileN).bytes().
  return 4 * api::row_partials_bytes(M, V, coda::ops::kLseTileM, coda::ops::kLseTileN);
}

CODA_API coda_status coda_linear_rowscale_lse(const coda_tensor* h, const coda_tensor* w, const coda_tensor* rstd,
                                              const coda_tensor* targets, float softcap, int64_t ignore_index,
                                              coda_tensor* lse_out, coda_tensor* target_logit_out,
                                              coda_tensor* logits_out, void* workspace, size_t workspace_bytes,
                                              void* stream) {
  return guarded("coda_linear_rowscale_lse", [&] {
    Arg const Hh{h, "h"}, W{w, "w"}, S{rstd, "rstd"}, T{targets, "targets"};
    Arg const L{lse_out, "lse_out"}, TL{target_logit_out, "target_logit_out"}, LG{logits_out, "logits_out"};
    api::LinearShape const s = check_rowscale_inputs(Hh, W, S);
    api::check_vector(T, s.M, {CODA_INT32, CODA_INT64}, "M", "h.sizes[0]");
    if (!(softcap >= 0.0f) || !std::isfinite(softcap)) {
      fail(CODA_ERROR_INVALID_ARGUMENT, "softcap: must be finite and >= 0 (0 = off), got ", softcap);
    }
    api::check_vector(L, s.M, {CODA_FP32}, "M", "h.sizes[0]");
    api::check_vector(TL, s.M, {CODA_FP32}, "M", "h.sizes[0]");
    if (logits_out != nullptr) api::check_activation(LG, Hh, s.M, s.N, "M", "V");
    api::check_disjoint({L, TL, LG}, {Hh, W, S, T});
    api::require_workspace("coda_linear_rowscale_lse", workspace, workspace_bytes,
                           coda_linear_rowscale_lse_workspace_size(s.M, s.N));
    int const device = api::require_same_device({Hh, W, S, T, L, TL, LG});
    bool const fp16 = Hh.dtype() == CODA_FP16;
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {Hh, W, S, T, L, TL, LG});
    if (s.M == 0) return;
    coda::ops::linear_rowscale_lse(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w->data, row_stride(W, s.K),
                                   static_cast<float const*>(rstd->data), targets->data, T.dtype() == CODA_INT64,
                                   softcap, ignore_index, static_cast<float*>(lse_out->data),
                                   static_cast<float*>(target_logit_out->data),
                                   logits_out != nullptr ? logits_out->data : nullptr,
                                   logits_out != nullptr ? row_stride(LG, s.N) : 0, workspace, workspace_bytes, fp16,
                                   static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_cross_entropy_workspace_size(int64_t M, int64_t V) {
  // Per-row losses (fp32 [M]) and the non-ignored row count; independent of V.
  return coda::kernels::cross_entropy_workspace_size(M);
}

CODA_API coda_status coda_cross_entropy(const coda_tensor* logits, const coda_tensor* targets,
                                        const coda_ce_options* options, const coda_tensor* grad_loss,
                                        int64_t hidden_size, coda_tensor* loss_out, coda_tensor* dlogits_out,
                                        coda_tensor* zdz_out, void* workspace, size_t workspace_bytes,
                                        void* stream) {
  return guarded("coda_cross_entropy", [&] {
    Arg const LG{logits, "logits"}, T{targets, "targets"}, GL{grad_loss, "grad_loss"};
    Arg const L{loss_out, "loss_out"}, D{dlogits_out, "dlogits_out"}, Z{zdz_out, "zdz_out"};
    coda_ce_options const o = options != nullptr ? *options : coda_ce_options_default();
    api::require_tensor(LG);
    api::require_rank(LG, 2);
    api::require_dtype(LG, {CODA_BF16, CODA_FP16});
    api::require_row_major(LG);  // any V and row stride: rows that are not 16-byte vectors take the scalar path
    int64_t const M = LG.size(0), V = LG.size(1);
    if (V == 0) fail(CODA_ERROR_SHAPE, "logits: V (sizes[1]) must be > 0");
    api::check_vector(T, M, {CODA_INT32, CODA_INT64}, "M", "logits.sizes[0]");
    api::check_ce_options(o);
    bool const per_row = o.reduction == CODA_REDUCTION_NONE;
    api::check_grad_loss(GL, M, per_row, "logits.sizes[0] (reduction none)");
    api::check_loss_out(L, M, per_row, "logits.sizes[0] (reduction none)");
    if (dlogits_out != nullptr) {
      api::require_tensor(D);
      api::require_rank(D, 2);
      api::require_same_dtype(D, LG);
      api::require_size(D, 0, M, "M", "logits.sizes[0]");
      api::require_size(D, 1, V, "V", "logits.sizes[1]");
      api::require_row_major(D);
      api::require_same_or_disjoint(D, LG);  // in place over the logits is allowed
    }
    if (zdz_out != nullptr) {
      if (dlogits_out == nullptr) fail(CODA_ERROR_INVALID_ARGUMENT, "zdz_out: requires dlogits_out (the gradient)");
      if (hidden_size <= 0) fail(CODA_ERROR_INVALID_ARGUMENT, "hidden_size: must be > 0, got ", hidden_size);
      api::check_vector(Z, M, {CODA_FP32}, "M", "logits.sizes[0]");
    }
    api::check_disjoint({L, Z}, {LG, T, GL, D});
    api::check_disjoint({D}, {T, GL});
    api::require_workspace("coda_cross_entropy", workspace, workspace_bytes, coda_cross_entropy_workspace_size(M, V));
    int const device = api::require_same_device({LG, T, GL, L, D, Z});
    api::require_kernel_device(device, {LG, T, GL, L, D, Z});
    auto const s = static_cast<cudaStream_t>(stream);
    if (M == 0) {
      // Nothing to launch; a mean or sum over no rows is 0.
      if (!per_row) CODA_CUDA_CHECK(cudaMemsetAsync(loss_out->data, 0, sizeof(float), s));
      return;
    }
    coda::kernels::CrossEntropyArgs k;
    k.dtype = LG.dtype();
    k.M = M;
    k.V = V;
    k.logits = logits->data;
    k.ld_logits = LG.stride(0);
    k.targets = targets->data;
    k.targets_int64 = T.dtype() == CODA_INT64;
    k.options = o;
    k.grad_loss = grad_loss != nullptr ? static_cast<float const*>(grad_loss->data) : nullptr;
    k.hidden_size = zdz_out != nullptr ? hidden_size : 1;
    k.loss = static_cast<float*>(loss_out->data);
    k.dlogits = dlogits_out != nullptr ? dlogits_out->data : nullptr;
    k.ld_dlogits = dlogits_out != nullptr ? D.stride(0) : 0;
    k.zdz = zdz_out != nullptr ? static_cast<float*>(zdz_out->data) : nullptr;
    k.workspace = workspace;
    coda::kernels::cross_entropy(k, s);
  });
}

}  // extern "C"
