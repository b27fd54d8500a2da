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
  // Default by the reduction length K (bench_fused --sweep on the H200, llama3-1B/8B/70B gate/up shapes at M = 8192
  // and 16384, each config x 8 raster/swizzle settings in one process, bench/results/fused_sweep_h200_d6e113e/):
  // * K < 4096 (1B): pingpong 128x128 (the SwiGLU epilogue overlaps the other warpgroup's MMA), raster along N,
  //   swizzle 8: 0.985 / 1.015 x cuBLAS; the cooperative 128x256 took 1.27-1.33 x (its epilogue is exposed).
  // * 4096 <= K < 8192 (8B): pingpong, raster along M, swizzle 8: 0.953 / 0.866 x, where raster N took 0.981 / 0.969.
  // * K >= 8192 (70B, bf16: the only dtype with the cooperative kernel): cooperative 128x256, raster along N,
  //   swizzle 2: 0.963 / 1.009 x (two more runs at M = 8192: 0.947, and 0.947-0.953 over swizzles), where the
  //   pingpong kernel's best setting took 1.015 / 1.024 x and varied up to 1.45 x with the knobs. The longer
  //   mainloop hides the exposed epilogue, and the larger tile reads fewer operand bytes per FLOP: at the 700 W
  //   limit the pingpong F3 ran ~6 % below cuBLAS's SM clock (1350-1380 vs 1470 MHz), losing ~4 % of its time.
  if (!choice.pinned) {
    if (K >= 8192 && !fp16) {
      choice.ops = &kn::fwd_bf16_coop_128x256x64_c2x1();
      choice.knobs = raster_n(2);
    } else {
      // fp16 at K >= 8192 keeps raster N: the pingpong kernel along M took 1.12-1.28 x at 70B (bf16).
      choice.knobs = K >= 4096 && K < 8192 ? raster_m(8) : raster_n(8);
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
