// F4 dispatch (host only, no CUTLASS): expand inv_freq per column into the workspace, pick a compiled config,
// launch one GEMM.
#include "ops/linear_rowscale_rope/instances.hpp"

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
  gemm::KernelOps<RopeArgs> const& k = *choice.ops;
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
}

}  // namespace coda::ops
