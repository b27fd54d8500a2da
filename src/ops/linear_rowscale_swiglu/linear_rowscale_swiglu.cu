// F3 dispatch (host only, no CUTLASS): pick a compiled config, build Operands, launch one GEMM.
#include "ops/linear_rowscale_swiglu/kernels.hpp"

#include "common/error.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

void linear_rowscale_swiglu(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_gu,
                            int64_t ldw, float const* rstd, void* z, int64_t ldz, void* y, int64_t ldy, bool fp16,
                            cudaStream_t stream) {
  namespace kn = swiglu_kernels;
  auto choice = choose_kernel("coda_linear_rowscale_swiglu", fp16, kn::fwd_bf16_coop_128x256x64_c2x1(),
                              kn::fwd_bf16_pp_128x128x64_c2x1(), kn::fwd_fp16_pp_128x128x64_c2x1());
  // Pingpong 128x128 (the SwiGLU epilogue, with 1.5x the plain GEMM's output bytes, overlaps the other
  // warpgroup's MMA), raster along N, swizzle 8: 0.98-1.01 x cuBLAS on the LLaMA gate/up shapes, where the
  // cooperative 128x256 took 1.16-1.28 x and the default raster up to 1.4 x (bench/results/fused_h200_*).
  // At K >= 8192 (llama3-70B, bf16) the cooperative 128x256, raster along M, swizzle 8: under sustained load
  // (bench/python/sweep_ops.py, back-to-back calls at the 700 W limit, M = 8192; bench/results/sweep_ops_h200/)
  // 1.057 and 1.040 x cuBLAS in two runs against the pingpong default's 1.083 and 1.101 x; the pingpong kernel
  // ran at ~1235 MHz, the cooperative one at ~1435 MHz (the cooperative kernel's exposed epilogue was not
  // profiled). At 8B (K = 4096) and 1B the pingpong default was the best candidate or within noise of it.
  if (!choice.pinned) {
    if (K >= 8192 && !fp16) {
      choice.ops = &kn::fwd_bf16_coop_128x256x64_c2x1();
      choice.knobs = raster_m(8);
    } else {
      choice.knobs = raster_n(8);
    }
  }
  gemm::Knobs const& knobs = choice.knobs;
  gemm::Operands op;
  op.M = M, op.N = N, op.K = K;
  op.A = h, op.lda = ldh;
  op.B = w_gu, op.ldb = ldw;
  op.D = z, op.ldd = ldz;
  SwigluArgs args;
  args.rstd = rstd;
  args.y = y;
  args.ldy = ldy;
  gemm::KernelOps<SwigluArgs> const& k = *choice.ops;
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
}

}  // namespace coda::ops
