// C ABI entry points of the ops without a GEMM (coda.h): the norms' kernels (rmsnorm_rstd, rmsnorm_prepare), the
// cross-entropy over stored logits, and the RoPE backwards (rope_bwd_zdz, qk_norm_rope_bwd_zdz). Each validates
// every argument, then launches its kernel (src/kernels/). The fused GEMM ops keep their entry points in their own
// folders (src/ops/<op>/<op>.cu).
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "kernels/kernels.hpp"

using coda::api::Arg;
using coda::api::guarded;
using coda::detail::fail;
namespace api = coda::api;

extern "C" {

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

CODA_API coda_status coda_rope_bwd_zdz(const coda_tensor* qkv, const coda_tensor* dqkv,
                                       const coda_tensor* positions, const coda_tensor* inv_freq,
                                       int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                                       int64_t hidden_size, coda_tensor* dz_out, coda_tensor* zdz_out,
                                       void* stream) {
  return guarded("coda_rope_bwd_zdz", [&] {
    Arg const Q{qkv, "qkv"}, DQ{dqkv, "dqkv"}, P{positions, "positions"}, F{inv_freq, "inv_freq"};
    Arg const DZ{dz_out, "dz_out"}, Z{zdz_out, "zdz_out"};
    int64_t const M = api::check_rope_input(Q, P, F, n_q_heads, n_kv_heads, head_dim);
    int64_t const width = Q.size(1);
    api::check_activation(DQ, Q, M, width, "M", "qkv width");
    if (hidden_size <= 0) fail(CODA_ERROR_INVALID_ARGUMENT, "hidden_size: must be > 0, got ", hidden_size);
    api::check_activation(DZ, Q, M, width, "M", "qkv width");
    api::check_vector(Z, M, {CODA_FP32}, "M", "qkv.sizes[0]");
    api::require_same_or_disjoint(DZ, DQ);  // in place over dqkv is allowed
    api::check_disjoint({DZ}, {Q, P, F});
    api::check_disjoint({Z}, {Q, DQ, P, F, DZ});
    int const device = api::require_same_device({Q, DQ, P, F, DZ, Z});
    api::require_kernel_device(device, {Q, DQ, P, F, DZ, Z});
    if (M == 0) return;
    coda::kernels::rope_bwd_zdz(
        coda::kernels::rope_bwd_args({.qkv = *qkv, .dqkv = *dqkv, .positions = *positions, .inv_freq = *inv_freq,
                                      .n_q_heads = n_q_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                                      .hidden_size = hidden_size, .dz = *dz_out,
                                      .zdz = static_cast<float*>(zdz_out->data)}),
        static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_qk_norm_rope_bwd_zdz_workspace_size(int64_t M, int64_t head_dim) {
  return coda::kernels::qk_norm_rope_bwd_workspace_bytes(M, head_dim);
}

CODA_API coda_status coda_qk_norm_rope_bwd_zdz(const coda_tensor* z, const coda_tensor* dqkv,
                                               const coda_tensor* q_gamma, const coda_tensor* k_gamma,
                                               const coda_tensor* positions, const coda_tensor* inv_freq,
                                               int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, float qk_eps,
                                               int64_t hidden_size, coda_tensor* dz_out, coda_tensor* zdz_out,
                                               coda_tensor* dq_gamma_out, coda_tensor* dk_gamma_out,
                                               void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("coda_qk_norm_rope_bwd_zdz", [&] {
    Arg const Zi{z, "z"}, DQ{dqkv, "dqkv"}, GQ{q_gamma, "q_gamma"}, GK{k_gamma, "k_gamma"};
    Arg const P{positions, "positions"}, F{inv_freq, "inv_freq"}, DZ{dz_out, "dz_out"}, ZD{zdz_out, "zdz_out"};
    Arg const DGQ{dq_gamma_out, "dq_gamma_out"}, DGK{dk_gamma_out, "dk_gamma_out"};
    int64_t const M = api::check_rope_input(Zi, P, F, n_q_heads, n_kv_heads, head_dim);
    int64_t const width = Zi.size(1);
    api::check_activation(DQ, Zi, M, width, "M", "qkv width");
    for (Arg const& g : {GQ, GK, DGQ, DGK}) api::check_vector(g, head_dim, {CODA_FP32}, "head_dim", "head_dim");
    api::check_eps(qk_eps, "qk_eps");
    if (hidden_size <= 0) fail(CODA_ERROR_INVALID_ARGUMENT, "hidden_size: must be > 0, got ", hidden_size);
    api::check_activation(DZ, Zi, M, width, "M", "qkv width");
    api::check_vector(ZD, M, {CODA_FP32}, "M", "z.sizes[0]");
    api::require_same_or_disjoint(DZ, DQ);  // in place over dqkv is allowed
    api::check_disjoint({DZ}, {Zi, GQ, GK, P, F});
    api::check_disjoint({ZD, DGQ, DGK}, {Zi, DQ, GQ, GK, P, F, DZ});  // the three outputs pairwise too
    api::require_workspace("coda_qk_norm_rope_bwd_zdz", workspace, workspace_bytes,
                           coda_qk_norm_rope_bwd_zdz_workspace_size(M, head_dim));
    int const device = api::require_same_device({Zi, DQ, GQ, GK, P, F, DZ, ZD, DGQ, DGK});
    api::require_kernel_device(device, {Zi, DQ, GQ, GK, P, F, DZ, ZD, DGQ, DGK});
    if (M == 0) return;
    coda::kernels::qk_norm_rope_bwd_zdz(
        coda::kernels::qk_norm_rope_bwd_args({.z = *z, .dqkv = *dqkv, .q_gamma = *q_gamma, .k_gamma = *k_gamma,
                                              .positions = *positions, .inv_freq = *inv_freq,
                                              .n_q_heads = n_q_heads, .n_kv_heads = n_kv_heads,
                                              .head_dim = head_dim, .eps = qk_eps, .hidden_size = hidden_size,
                                              .dz = *dz_out, .zdz = static_cast<float*>(zdz_out->data),
                                              .dq_gamma = static_cast<float*>(dq_gamma_out->data),
                                              .dk_gamma = static_cast<float*>(dk_gamma_out->data),
                                              .workspace = workspace}),
        static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
