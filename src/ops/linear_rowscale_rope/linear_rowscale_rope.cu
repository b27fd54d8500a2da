// linear_rowscale_rope (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: expand inv_freq
// per column into the workspace, pick a compiled config, launch one GEMM.
#include "ops/linear_rowscale_rope/instances.hpp"

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

size_t linear_rowscale_rope_workspace_bytes(int64_t N) {
  return N <= 0 ? 0 : (static_cast<size_t>(N) * sizeof(float) + 255) / 256 * 256;
}

void linear_rowscale_rope(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_qkv,
                          int64_t ldw, float const* rstd, int32_t const* positions, float const* inv_freq,
                          int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, void* qkv, int64_t ldq,
                          void* workspace, size_t workspace_bytes, bool fp16, cudaStream_t stream) {
  namespace kn = rope_kernels;
  auto const choice = kn::choose(fp16, M, N, K);  // op.cmake: the tile policy
  gemm::Knobs const& knobs = choice.knobs;
  if (workspace_bytes < linear_rowscale_rope_workspace_bytes(N) || workspace == nullptr ||
      (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_rowscale_rope: needs ",
                       linear_rowscale_rope_workspace_bytes(N), " bytes of 16-byte aligned workspace, got ",
                       workspace_bytes);
  }
  float* const freq = static_cast<float*>(workspace);
  kernels::expand_rope_inv_freq(inv_freq, n_q_heads, n_kv_heads, head_dim, freq, stream);

  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = h, op.lda = ldh;
  op.B = w_qkv, op.ldb = ldw;
  op.D = qkv, op.ldd = ldq;
  RopeArgs args;
  args.rstd = rstd;
  args.positions = positions;
  args.inv_freq_cols = freq;
  args.inv_freq = inv_freq;
  args.n_rot_heads = n_q_heads + n_kv_heads;
  args.head_dim = head_dim;
  gemm::KernelOps<RopeArgs> const& k = *choice.ops;
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
}

}  // namespace coda::ops

// The C ABI entry point (coda.h): every argument validated, then the dispatch above.
namespace api = coda::api;
using coda::api::Arg;
using coda::api::guarded;
using coda::api::row_stride;

extern "C" {

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
    api::LinearShape const s = api::check_rowscale_inputs(Hh, W, S);
    int64_t const width = api::check_rope_args(P, F, n_q_heads, n_kv_heads, head_dim, s.M);
    api::require_size(W, 0, width, "(n_q_heads + 2*n_kv_heads)*head_dim", "the head counts");
    api::check_activation(Q, Hh, s.M, s.N, "M", "qkv width");
    api::check_disjoint({Q}, {Hh, W, S, P, F});
    api::require_workspace("coda_linear_rowscale_rope", workspace, workspace_bytes,
                           coda_linear_rowscale_rope_workspace_size(s.M, s.N));
    bool const fp16 = Hh.dtype() == CODA_FP16;
    api::require_fused_launch({Hh, W, S, P, F, Q});
    if (s.M == 0) return;
    coda::ops::linear_rowscale_rope(s.M, s.N, s.K, h->data, row_stride(Hh, s.K), w_qkv->data, row_stride(W, s.K),
                                    static_cast<float const*>(rstd->data),
                                    static_cast<int32_t const*>(positions->data),
                                    static_cast<float const*>(inv_freq->data), n_q_heads, n_kv_heads, head_dim,
                                    qkv_out->data, row_stride(Q, s.N), workspace, workspace_bytes, fp16,
                                    static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
