// C ABI entry points of the backward ops (coda.h B1-B3): validation, then dispatch to the kernels.
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cmath>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "kernels/kernels.hpp"
#include "ops/linear_residual_rmsnorm_bwd/kernels.hpp"
#include "ops/linear_swiglu_bwd_zdz/kernels.hpp"
#include "ops/op_config.hpp"

using coda::api::Arg;
using coda::api::guarded;
using coda::detail::fail;
namespace api = coda::api;

namespace {

// Bytes of per-(M-tile, column) fp32 partials (dgamma), an upper bound over the tile configs (M tile >= 64,
// N padded to 256).
size_t col_partials_bytes(int64_t M, int64_t N) {
  if (M <= 0 || N <= 0) return 0;
  size_t const tiles = static_cast<size_t>((M + 63) / 64);
  size_t const n_pad = static_cast<size_t>((N + 255) / 256 * 256);
  return api::round_up_256(tiles * n_pad * sizeof(float));
}

// dgrad inputs: dz [M,K] row-major, w [K,N] row-major (the GEMM is dz w). Returns (M, N, K).
api::LinearShape check_dgrad(Arg dz, Arg w) {
  api::require_tensor(dz);
  api::require_tensor(w);
  api::require_rank(dz, 2);
  api::require_rank(w, 2);
  api::require_dtype(dz, {CODA_BF16, CODA_FP16});
  api::require_same_dtype(w, dz);
  api::require_size(w, 0, dz.size(1), "rows = dz features", "dz.sizes[1]");
  if (dz.size(1) == 0) fail(CODA_ERROR_SHAPE, dz.name, ": sizes[1] must be > 0");
  if (w.size(1) == 0) fail(CODA_ERROR_SHAPE, w.name, ": sizes[1] must be > 0");
  api::require_row_major(dz);
  api::require_row_major(w);
  api::require_tma_aligned(dz, true);
  api::require_tma_aligned(w, true);
  return {dz.size(0), w.size(1), dz.size(1)};
}

}  // namespace

extern "C" {

CODA_API coda_status coda_rope_bwd_zdz(const coda_tensor* qkv, const coda_tensor* dqkv,
                                       const coda_tensor* positions, const coda_tensor* inv_freq,
                                       int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                                       int64_t hidden_size, coda_tensor* dz_out, coda_tensor* zdz_out,
                                       void* stream) {
  return guarded("coda_rope_bwd_zdz", [&] {
    Arg const Q{qkv, "qkv"}, DQ{dqkv, "dqkv"}, P{positions, "positions"}, F{inv_freq, "inv_freq"};
    Arg const DZ{dz_out, "dz_out"}, Z{zdz_out, "zdz_out"};
    api::require_tensor(Q);
    api::require_rank(Q, 2);
    api::require_dtype(Q, {CODA_BF16, CODA_FP16});
    api::require_row_major(Q);
    api::require_tma_aligned(Q, true);
    int64_t const M = Q.size(0);
    int64_t const width = api::check_rope_args(P, F, n_q_heads, n_kv_heads, head_dim, M);
    api::require_size(Q, 1, width, "(n_q_heads + 2*n_kv_heads)*head_dim", "the head counts");
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
        coda::kernels::rope_bwd_args(*qkv, *dqkv, *positions, *inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size,
                                     *dz_out, static_cast<float*>(zdz_out->data)),
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
    api::require_tensor(Zi);
    api::require_rank(Zi, 2);
    api::require_dtype(Zi, {CODA_BF16, CODA_FP16});
    api::require_row_major(Zi);
    api::require_tma_aligned(Zi, true);
    int64_t const M = Zi.size(0);
    int64_t const width = api::check_rope_args(P, F, n_q_heads, n_kv_heads, head_dim, M);
    api::require_size(Zi, 1, width, "(n_q_heads + 2*n_kv_heads)*head_dim", "the head counts");
    api::check_activation(DQ, Zi, M, width, "M", "qkv width");
    for (Arg const& g : {GQ, GK, DGQ, DGK}) api::check_vector(g, head_dim, {CODA_FP32}, "head_dim", "head_dim");
    if (!(qk_eps > 0.0f) || !std::isfinite(qk_eps)) {
      fail(CODA_ERROR_INVALID_ARGUMENT, "qk_eps: must be finite and > 0, got ", qk_eps);
    }
    if (hidden_size <= 0) fail(CODA_ERROR_INVALID_ARGUMENT, "hidden_size: must be > 0, got ", hidden_size);
    api::check_activation(DZ, Zi, M, width, "M", "qkv width");
    api::check_vector(ZD, M, {CODA_FP32}, "M", "z.sizes[0]");
    api::require_same_or_disjoint(DZ, DQ);  // in place over dqkv is allowed
    api::check_disjoint({DZ}, {Zi, GQ, GK, P, F});
    api::check_disjoint({ZD, DGQ, DGK}, {Zi, DQ, GQ, GK, P, F, DZ});
    api::check_disjoint({ZD}, {DGQ, DGK});
    api::check_disjoint({DGQ}, {DGK});
    api::require_workspace("coda_qk_norm_rope_bwd_zdz", workspace, workspace_bytes,
                           coda_qk_norm_rope_bwd_zdz_workspace_size(M, head_dim));
    int const device = api::require_same_device({Zi, DQ, GQ, GK, P, F, DZ, ZD, DGQ, DGK});
    api::require_kernel_device(device, {Zi, DQ, GQ, GK, P, F, DZ, ZD, DGQ, DGK});
    if (M == 0) return;
    coda::kernels::QkNormRopeBwdArgs k;
    k.dtype = Zi.dtype();
    k.M = M;
    k.n_q_heads = n_q_heads;
    k.n_kv_heads = n_kv_heads;
    k.head_dim = head_dim;
    k.z = z->data;
    k.ld_z = Zi.stride(0);
    k.dqkv = dqkv->data;
    k.ld_dqkv = DQ.stride(0);
    k.q_gamma = static_cast<float const*>(q_gamma->data);
    k.k_gamma = static_cast<float const*>(k_gamma->data);
    k.positions = static_cast<int32_t const*>(positions->data);
    k.inv_freq = static_cast<float const*>(inv_freq->data);
    k.eps = qk_eps;
    k.hidden_size = hidden_size;
    k.dz = dz_out->data;
    k.ld_dz = DZ.stride(0);
    k.zdz = static_cast<float*>(zdz_out->data);
    k.dq_gamma = static_cast<float*>(dq_gamma_out->data);
    k.dk_gamma = static_cast<float*>(dk_gamma_out->data);
    k.workspace = workspace;
    coda::kernels::qk_norm_rope_bwd_zdz(k, static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_linear_residual_rmsnorm_bwd_workspace_size(int64_t M, int64_t N) {
  // Column partials (an upper bound over the CTA tiles); alpha is applied in the epilogue and the finishing sum.
  return M <= 0 ? 0 : col_partials_bytes(M, N);
}

CODA_API coda_status coda_linear_residual_rmsnorm_bwd(const coda_tensor* dz, const coda_tensor* w,
                                                      const coda_tensor* x, const coda_tensor* gamma,
                                                      const coda_tensor* rstd, const coda_tensor* zdz,
                                                      const coda_tensor* dx_in, float alpha, coda_tensor* dx_out,
                                                      coda_tensor* a_out, coda_tensor* dgamma_out, void* workspace,
                                                      size_t workspace_bytes, void* stream) {
  return guarded("coda_linear_residual_rmsnorm_bwd", [&] {
    Arg const DZ{dz, "dz"}, W{w, "w"}, X{x, "x"}, G{gamma, "gamma"}, S{rstd, "rstd"}, ZD{zdz, "zdz"};
    Arg const DXI{dx_in, "dx_in"}, DX{dx_out, "dx_out"}, A{a_out, "a_out"}, DG{dgamma_out, "dgamma_out"};
    api::LinearShape const s = check_dgrad(DZ, W);
    api::check_activation(X, DZ, s.M, s.N, "M", "N = w.sizes[1]");
    api::check_vector(G, s.N, {DZ.dtype()}, "N", "w.sizes[1]");
    api::check_vector(S, s.M, {CODA_FP32}, "M", "dz.sizes[0]");
    api::check_vector(ZD, s.M, {CODA_FP32}, "M", "dz.sizes[0]");
    if (dx_in != nullptr) api::check_activation(DXI, DZ, s.M, s.N, "M", "N");
    if (!std::isfinite(alpha)) fail(CODA_ERROR_INVALID_ARGUMENT, "alpha: must be finite, got ", alpha);
    api::check_activation(DX, DZ, s.M, s.N, "M", "N");
    api::check_activation(A, DZ, s.M, s.N, "M", "N");
    api::check_vector(DG, s.N, {CODA_FP32}, "N", "w.sizes[1]");
    api::require_same_or_disjoint(DX, DXI);  // residual gradient accumulated in place
    api::check_disjoint({DX}, {DZ, W, X, G, S, ZD});
    api::check_disjoint({A, DG}, {DZ, W, X, G, S, ZD, DXI, DX});
    api::require_workspace("coda_linear_residual_rmsnorm_bwd", workspace, workspace_bytes,
                           coda_linear_residual_rmsnorm_bwd_workspace_size(s.M, s.N));
    int const device = api::require_same_device({DZ, W, X, G, S, ZD, DXI, DX, A, DG});
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {DZ, W, X, G, S, ZD, DXI, DX, A, DG});
    if (s.M == 0) {  // nothing to launch but dgamma = 0 (an empty sum)
      CODA_CUDA_CHECK(cudaMemsetAsync(dgamma_out->data, 0, static_cast<size_t>(s.N) * sizeof(float),
                                      static_cast<cudaStream_t>(stream)));
      return;
    }
    auto ld = [](Arg t, int64_t cols) { return t.size(0) > 1 ? t.stride(0) : cols; };
    coda::ops::linear_residual_rmsnorm_bwd(
        s.M, s.N, s.K, dz->data, ld(DZ, s.K), w->data, ld(W, s.N), x->data, ld(X, s.N), gamma->data,
        static_cast<float const*>(rstd->data), static_cast<float const*>(zdz->data),
        dx_in != nullptr ? dx_in->data : nullptr, dx_in != nullptr ? ld(DXI, s.N) : 0, alpha, dx_out->data,
        ld(DX, s.N), a_out->data, ld(A, s.N), static_cast<float*>(dgamma_out->data), DZ.dtype() == CODA_FP16,
        workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
  });
}

CODA_API size_t coda_linear_swiglu_bwd_zdz_workspace_size(int64_t M, int64_t N) {
  return api::row_partials_bytes(M, N);
}

CODA_API coda_status coda_linear_swiglu_bwd_zdz(const coda_tensor* dx, const coda_tensor* w_down,
                                                const coda_tensor* z, coda_tensor* dz_out, coda_tensor* y_out,
                                                coda_tensor* zdz_out, void* workspace, size_t workspace_bytes,
                                                void* stream) {
  return guarded("coda_linear_swiglu_bwd_zdz", [&] {
    Arg const DX{dx, "dx"}, W{w_down, "w_down"}, Z{z, "z"}, DZ{dz_out, "dz_out"}, Y{y_out, "y_out"};
    Arg const ZD{zdz_out, "zdz_out"};
    api::LinearShape const s = check_dgrad(DX, W);  // N = F
    if (s.N % 8 != 0) {
      fail(CODA_ERROR_SHAPE, "w_down: sizes[1] (F) must be a multiple of 8 (16-byte rows of y), got ", s.N);
    }
    api::check_activation(Z, DX, s.M, 2 * s.N, "M", "2F = 2 * w_down.sizes[1]");
    api::check_activation(DZ, DX, s.M, 2 * s.N, "M", "2F");
    api::check_activation(Y, DX, s.M, s.N, "M", "F = w_down.sizes[1]");
    api::check_vector(ZD, s.M, {CODA_FP32}, "M", "dx.sizes[0]");
    api::require_same_or_disjoint(DZ, Z);  // dz may overwrite the saved z in place
    api::check_disjoint({DZ}, {DX, W});
    api::check_disjoint({Y, ZD}, {DX, W, Z, DZ});
    api::require_workspace("coda_linear_swiglu_bwd_zdz", workspace, workspace_bytes,
                           coda_linear_swiglu_bwd_zdz_workspace_size(s.M, s.N));
    int const device = api::require_same_device({DX, W, Z, DZ, Y, ZD});
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {DX, W, Z, DZ, Y, ZD});
    if (s.M == 0) return;  // nothing to compute (zdz, dz and y are empty)
    auto ld = [](Arg t, int64_t cols) { return t.size(0) > 1 ? t.stride(0) : cols; };
    coda::ops::linear_swiglu_bwd_zdz(s.M, s.N, s.K, dx->data, ld(DX, s.K), w_down->data, ld(W, s.N), z->data,
                                     ld(Z, 2 * s.N), dz_out->data, ld(DZ, 2 * s.N), y_out->data, ld(Y, s.N),
                                     static_cast<float*>(zdz_out->data), DX.dtype() == CODA_FP16, workspace,
                                     workspace_bytes, static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
