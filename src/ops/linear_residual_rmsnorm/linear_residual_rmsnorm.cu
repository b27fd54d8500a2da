// F1 dispatch (host only, no CUTLASS): pick a compiled config, run the fused GEMM (x, h, partials), then the
// deterministic rstd finishing kernel over the partials.
#include "ops/linear_residual_rmsnorm/kernels.hpp"

#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

#include <cstdint>

namespace coda::ops {

PartialsLayout partials_layout(gemm::KernelInfo const& info, int64_t M, int64_t N) {
  PartialsLayout p;
  p.tiles = (N + info.tile_n - 1) / info.tile_n;
  p.m_pad = (M + info.tile_m - 1) / info.tile_m * info.tile_m;
  return p;
}

void linear_residual_rmsnorm(int64_t M, int64_t N, int64_t K, void const* a, int64_t lda, void const* w,
                             int64_t ldw, void const* residual, int64_t ldr, void const* gamma, float eps, void* x,
                             int64_t ldx, void* h, int64_t ldh, float* rstd, void* workspace,
                             size_t workspace_bytes, bool fp16, cudaStream_t stream) {
  namespace kn = residual_rmsnorm_kernels;
  auto choice = choose_kernel("coda_linear_residual_rmsnorm", fp16, kn::fwd_bf16_coop_128x256x64_c2x1(),
                              kn::fwd_bf16_pp_128x128x64_c2x1(), kn::fwd_fp16_pp_128x128x64_c2x1());
  // Out-projection (K <= 2N): pingpong 128x128 (one warpgroup's epilogue, with its C load, two stores and row
  // sums, overlaps the other's MMA), raster along N, swizzle 1: best or within 3 % of the best config x knobs at
  // every LLaMA shape of the sweep (bench/results/fused_h200_*).
  // Down-projection (K > 2N, bf16) with M >= 4096 or K >= 16384: cooperative 128x256, raster along N, swizzle 8.
  // Under sustained load (bench/python/vs_quack.py, M = 8192; bench/results/vs_quack/f1_b3/), time / cuBLAS: 1B
  // 1.043-1.068 against 1.045-1.100 for pingpong 128x128 (the scheduler's default knobs), 8B 1.013-1.047 against
  // 1.073-1.130, 70B 1.000-1.010 (the 70B default since stop 17: 0.971-0.979 against pingpong's 1.144-1.165 in
  // sweep_ops). The pingpong kernel ran at 1380-1436 MHz there, the cooperative one at 1430-1472 MHz at the same
  // 690 W: 128x128 tiles load 1.33x the operand bytes per FLOP. Below M = 4096 (not measured: a 128x256 tile
  // halves the CTA count, which a short M cannot spare) and for fp16 (pingpong only): pingpong, the scheduler's
  // default knobs.
  if (!choice.pinned) {
    if (K <= 2 * N) {
      choice.knobs = raster_n(1);
    } else if (!fp16 && (M >= 4096 || K >= 16384)) {
      choice.ops = &kn::fwd_bf16_coop_128x256x64_c2x1();
      choice.knobs = raster_n(8);
    }
  }
  gemm::Knobs const& knobs = choice.knobs;
  gemm::KernelOps<ResidualRmsnormArgs> const& k = *choice.ops;

  PartialsLayout const layout = partials_layout(k.info, M, N);
  if (workspace_bytes < layout.bytes() || workspace == nullptr ||
      (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_residual_rmsnorm: kernel ", k.info.config, " needs ",
                       layout.bytes(), " bytes of 16-byte aligned workspace for the partials, got ",
                       workspace_bytes);
  }
  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = a, op.lda = lda;
  op.B = w, op.ldb = ldw;
  op.C = residual, op.ldc = ldr;
  op.D = x, op.ldd = ldx;
  ResidualRmsnormArgs args;
  args.gamma = gamma;
  args.h = h;
  args.ldh = ldh;
  args.partials = static_cast<float*>(workspace);
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
  kernels::rmsnorm_rstd(args.partials, layout.tiles, M, layout.m_pad, N, eps, rstd, stream);
}

}  // namespace coda::ops
