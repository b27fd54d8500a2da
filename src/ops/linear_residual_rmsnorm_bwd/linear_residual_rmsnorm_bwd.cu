// B2 dispatch (host only, no CUTLASS): the fused dgrad GEMM (dx, a, dgamma column partials), then the dgamma
// finishing reduce. bf16: pingpong 128x128 and cooperative 128x256 (the default at K >= 8192); fp16: pingpong.
#include "ops/linear_residual_rmsnorm_bwd/kernels.hpp"

#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

#include <cstdint>

namespace coda::ops {

void linear_residual_rmsnorm_bwd(int64_t M, int64_t N, int64_t Nd, void const* dz, int64_t ldz, void const* w,
                                 int64_t ldw, void const* x, int64_t ldx, void const* gamma, float const* rstd,
                                 float const* zdz, void const* dx_in, int64_t ld_dx_in, float alpha, void* dx,
                                 int64_t ld_dx, void* a, int64_t ld_a, float* dgamma, bool fp16, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream, float const* row_scale) {
  namespace kn = residual_rmsnorm_bwd_kernels;
  auto choice = choose_kernel("coda_linear_residual_rmsnorm_bwd", fp16, kn::dgrad_bf16_coop_128x256x64_c2x1(),
                              kn::dgrad_bf16_pp_128x128x64_c2x1(), kn::dgrad_fp16_pp_128x128x64_c2x1());
  // Raster along N, swizzle 8 (bench_backward --sweep on the H200, llama3-1B/8B/70B, M = 16384: within 5 % of the
  // best pin at every B2 shape, mostly within 2 %; swizzle 1 was up to 7 % slower (70B LM head) and at most 2 %
  // faster (1B q/k/v); bench/results/backward_sweep_h200_b2tree.jsonl).
  // Default: bf16 with K >= 8192 (the gate/up dgrad, K = 2F, and the LM head's, K = V) on the cooperative
  // 128x256 kernel, which moves 1.5x fewer L2-to-SM bytes per FLOP than the pingpong 128x128 (computed from the
  // tiles) and, with its leaner epilogue, keeps 3 mainloop stages. H200, interleaved with the pingpong-only default
  // (bench/results/b2_coop_h200/): LM head f+b 0.973x and 0.989x the time; the block backward 0.95-0.99x in every
  // run and config, the block f+b 0.986-1.008x at llama3-1B/8B and 0.996x at 70B (within the runs' spread). Shorter
  // K (q/k/v) stays pingpong, whose epilogue hides behind the other warpgroup's MMA (not measured on its own here).
  if (!choice.pinned) {
    if (!fp16 && Nd >= 8192) choice.ops = &kn::dgrad_bf16_coop_128x256x64_c2x1();
    choice.knobs = raster_n(8);
  }
  if (row_scale != nullptr) {  // the same shape rule and knobs, on the row-scaled twins
    if (fp16) coda::detail::fail(CODA_ERROR_INTERNAL, "linear_residual_rmsnorm_bwd: row_scale is bf16 only");
    choice.ops = Nd >= 8192 ? &kn::dgrad_bf16_rowscaled_coop_128x256x64_c2x1()
                            : &kn::dgrad_bf16_rowscaled_pp_128x128x64_c2x1();
    choice.knobs = raster_n(8);
  }
  gemm::KernelOps<ResidualRmsnormBwdArgs> const& k = *choice.ops;
  gemm::Knobs const& knobs = choice.knobs;

  // Workspace: column partials [ceil(M / CTA_M), round_up(N, CTA_N)] fp32, n-major (the ColumnPartials node of
  // acc * c; column_sum applies alpha to the finished sums).
  int64_t const tiles = (M + k.info.tile_m - 1) / k.info.tile_m;
  int64_t const n_pad = (N + k.info.tile_n - 1) / k.info.tile_n * k.info.tile_n;
  size_t const need_partials = static_cast<size_t>(tiles * n_pad) * sizeof(float);
  if (workspace_bytes < need_partials || workspace == nullptr ||
      (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_residual_rmsnorm_bwd: kernel ", k.info.config, " needs ",
                       need_partials, " bytes of 16-byte aligned workspace for the dgamma partials, got ",
                       workspace_bytes);
  }
  // Without dx_in the epilogue still reads C: give it dx itself, zero-filled (dx = 0 + ...).
  void const* c = dx_in;
  int64_t ldc = ld_dx_in;
  if (c == nullptr) {
    CODA_CUDA_CHECK(cudaMemset2DAsync(dx, static_cast<size_t>(ld_dx) * 2, 0, static_cast<size_t>(N) * 2,  // 16-bit
                                      static_cast<size_t>(M), stream));
    c = dx;
    ldc = ld_dx;
  }

  gemm::Operands op;
  op.M = M, op.N = N, op.K = Nd;
  op.A = dz, op.lda = ldz;
  op.B = w, op.ldb = ldw;
  op.C = c, op.ldc = ldc;
  op.D = dx, op.ldd = ld_dx;
  ResidualRmsnormBwdArgs args;
  args.alpha = alpha;
  args.x = x;
  args.ldx = ldx;
  args.gamma = gamma;
  args.rstd = rstd;
  args.zdz = zdz;
  args.a = a;
  args.lda = ld_a;
  args.dgamma_partials = static_cast<float*>(workspace);
  args.row_scale = row_scale;
  // No CUTLASS workspace: the epilogues reduce into the caller's buffers; run() rejects a kernel that would
  // need one (CODA_ERROR_WORKSPACE), so no separate workspace_size() query (a second argument build per call).
  k.run(op, args, knobs, nullptr, 0, stream);
  kernels::column_sum(args.dgamma_partials, tiles, n_pad, N, dgamma, stream, alpha);
}

}  // namespace coda::ops
