// F3 dispatch (host only, no CUTLASS): pick a compiled config, build Operands, launch one GEMM.
#include "ops/linear_rowscale_swiglu/kernels.hpp"

#include "common/error.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

void linear_rowscale_swiglu(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w_gu,
                            int64_t ldw, float const* rstd, void* z, int64_t ldz, void* y, int64_t ldy, bool fp16,
                            cudaStream_t stream) {
  namespace kn = swiglu_kernels;
  auto choice = choose_kernel<2>("coda_linear_rowscale_swiglu", fp16,
                              {&kn::fwd_bf16_coop_128x256x64_c2x1(), &kn::fwd_bf16_pp_128x128x64_c2x1(),
                               &kn::fwd_bf16_pp_128x192x64_c2x1()},
                              kn::fwd_fp16_pp_128x128x64_c2x1());
  // bf16: pingpong 128x192 (1.5x the 128x128 tile's FLOPs for 1.25x its operand bytes; the SwiGLU epilogue, 1.5x
  // the plain GEMM's output bytes, overlaps the other warpgroup's MMA), swizzle 8, raster along N, along M at
  // K >= 8192.
  // Under sustained load (bench/python/vs_quack.py, M = 8192, one run; bench/results/vs_quack/f3_192/), time /
  // cuBLAS: 1B 0.984 (n/8) against 1.003 for the former default (pingpong 128x128, raster N, swizzle 8), 8B 1.014
  // against 1.047, 70B 1.008 (m/8; n/8 1.023) against 1.044 for the former cooperative 128x256 at raster M,
  // swizzle 8. fp16: pingpong 128x128 (the one fp16 config), raster N, swizzle 8.
  if (!choice.pinned) choice.knobs = K >= 8192 && !fp16 ? raster_m(8) : raster_n(8);
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
