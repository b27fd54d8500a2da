# coda_linear_rowscale_qk_norm_rope: its kernels and tile policy (src/ops/registry.cmake says what this generates). The
# per-head norm needs a whole 128-column N tile per epilogue visit (64 x 128 subtiles); raster along N, swizzle 8 as
# linear_rowscale_rope's pingpong 128x128. Tried and dropped: the same tile on a 1x2 cluster (1.55 / 1.08 / 1.03x cuBLAS
# at llama3-1B / 8B / 70B where this one ran 1.17 / 1.06 / 1.02, bench/results/vs_quack/f4qk/); 192 x 128 does not fit
# (192 accumulators and a 64-element subtile spill 428 bytes at the kernel's 168-register cap).
# pp_128x128x64_c2x1 (64 x 32 subtiles) runs the prepass program instead: the heads' sums taken over the accumulators
# before the subtile loop (epilogue.hpp); 168 registers, 0 spill; a pin: on an H100 (one run, 1e6840d,
# bench/results/vs_quack/f4qk/) it ran 1.189 / 1.062x cuBLAS at llama3-1B / 8B where this default ran 1.127 / 1.088.
# Tried and dropped there: the prepass on 64 x 16 subtiles of a 192-row tile (pp_192x128x64_c2x1_e16: 1.455 / 1.243x)
# and of a 192-column tile (pp_128x192x64_c2x1_e16, head_dim 64 only: 1.234x at 1B); not profiled (a likely cause: 24
# subtiles per tile, each with its z and qkv TMA stores, against 2 at 64 x 128).
# coop_128x256x64_c2x1 (128 x 32 subtiles) runs the prepass program on the cooperative kernel: 0.75x the 128 x 128
# tile's operand bytes per FLOP (the trade that made it F1's down-projection default, linear_residual_rmsnorm's
# op.cmake). On an H100 under sustained load (bench/results/vs_quack/f4qk/ runs 5-7, 6b37e54 / 662ee49), raster M
# swizzle 8 took 0.93-0.98 of the e128 kernel's time at llama3-8B and 0.84-0.87 at 70B (1.04-1.10 / 1.02-1.03x
# cuBLAS), raster N 0.99-1.01 / 0.85-0.89 of it; at llama3-1B (K = 2048: 32 k-steps per tile, and the cooperative
# epilogue does not overlap the MMA) it ran 1.63x cuBLAS against e128's 1.17x. Large M only (measured at 8192 tokens): a
# 128x256 tile halves the CTA count, which a short M cannot spare.
coda_fused_op(linear_rowscale_qk_norm_rope ARGS QkNormRopeArgs NAMESPACE qk_norm_rope_kernels LAYOUT fwd
  KERNEL QkNormRopeKernel BF16 pp_128x128x64_c2x1_e128 pp_128x128x64_c2x1 coop_128x256x64_c2x1
    FP16 pp_128x128x64_c2x1_e128
    DEFAULT pp_128x128x64_c2x1_e128 n 8
    RULE "K >= 4096 && M >= 4096" coop_128x256x64_c2x1 m 8 "d >= 4096 at M >= 4096: cooperative 128x256, raster M (f4qk runs 5-7)")
