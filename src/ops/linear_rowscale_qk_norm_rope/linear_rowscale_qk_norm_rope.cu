// linear_rowscale_qk_norm_rope (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: pick
// the compiled config, launch one GEMM.
#include "ops/linear_rowscale_qk_norm_rope/instances.hpp"

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

void linear_rowscale_qk_norm_rope(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_qkv,
                                  int64_t ldw, QkNormRopeArgs const& args, void* qkv, int64_t ldq, bool fp16,
                                  cudaStream_t stream) {
  auto const choice = qk_norm_rope_kernels::choose(fp16, M, N, K);  // op.cmake: the tile policy
  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = h, op.lda = ldh;
  op.B = w_qkv, op.ldb = ldw;
  op.D = qkv, op.ldd = ldq;
  choice.ops->run(op, args, choice.knobs, nullptr, 0, stream);
}

}  // namespace coda::ops

// The C ABI entry point (coda.h): every argument validated, then the dispatch above.
namespace api = coda::api;
using coda::api::Arg;
using coda::api::guarded;
using coda::api::row_stride;

extern "C" {

CODA_API coda_status coda_linear_rowscale_qk_norm_rope(const coda_tensor* h, const coda_tensor* w_qkv,
                                                       const coda_tensor* rstd, const coda_tensor* q_gamma,
                                                       const coda_tensor* k_gamma, const coda_tensor* positions,
                                                       const coda_tensor* inv_freq, int32_t n_q_heads,
                                                       int32_t n_kv_heads, int32_t head_dim, float qk_eps,
                                                       coda_tensor* qkv_out, coda_tensor* z_out, void* stream) {
  return guarded("coda_linear_rowscale_qk_norm_rope", [&] {
    Arg const Hh{h, "h"}, W{w_qkv, "w_qkv"}, S{rstd, "rstd"}, GQ{q_gamma, "q_gamma"}, GK{k_gamma, "k_gamma"};
    Arg const P{positions, "positions"}, F{inv_freq, "inv_freq"}, Q{qkv_out, "qkv_out"}, Z{z_out, "z_out"};
    api::LinearShape const s = api::check_rowscale_inputs(Hh, W, S);
    int64_t const width = api::check_rope_args(P, F, n_q_heads, n_kv_heads, head_dim, s.M);
    api::require_size(W, 0, width, "(n_q_heads + 2*n_kv_heads)*head_dim", "the head counts");
    api::check_qk_norm_args(GQ, GK, head_dim, qk_eps, "qk_eps");
    api::check_activation(Q, Hh, s.M, s.N, "M", "qkv width");
    if (z_out != nullptr) api::check_activation(Z, Hh, s.M, s.N, "M", "qkv width");  // NULL: z not stored
    api::check_disjoint({Q, Z}, {Hh, W, S, GQ, GK, P, F});
    bool const fp16 = Hh.dtype() == CODA_FP16;
    api::require_fused_launch({Hh, W, S, GQ, GK, P, F, Q, Z});
    if (s.M == 0) return;
    coda::ops::QkNormRopeArgs const args =
        coda::ops::qk_norm_rope_args(static_cast<float const*>(rstd->data), z_out, *q_gamma, *k_gamma, *positions,
                                     *inv_freq, n_q_heads, n_kv_heads, head_dim, qk_eps);
    coda::ops::linear_rowscale_qk_norm_rope(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w_qkv->data,
                                            row_stride(W, s.K), args, qkv_out->data, row_stride(Q, s.N), fp16,
                                            static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
