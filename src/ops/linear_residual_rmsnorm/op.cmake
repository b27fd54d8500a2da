# coda_linear_residual_rmsnorm: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_residual_rmsnorm ARGS ResidualRmsnormArgs NAMESPACE residual_rmsnorm_kernels LAYOUT fwd
  KERNEL ResidualRmsnormKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 FP16 pp_128x128x64_c2x1
    # Below M = 4096 (not measured: a 128x256 tile halves the CTA count, which a short M cannot spare) and for fp16:
    # pingpong, the scheduler's default knobs.
    DEFAULT pp_128x128x64_c2x1 h 1
    # Out-projection (K <= 2N): pingpong 128x128 (one warpgroup's epilogue, with its C load, two stores and row
    # sums, overlaps the other's MMA), raster along N, swizzle 1: best or within 3 % of the best config x knobs at
    # every LLaMA shape of the sweep (bench/results/fused_h200_*).
    RULE "K <= 2 * N" pp_128x128x64_c2x1 n 1 "out-projection: pingpong, raster N, no swizzle (fused_h200 sweep)"
    # Down-projection (K > 2N, bf16) with M >= 4096 or K >= 16384: cooperative 128x256, raster along N, swizzle 8.
    # Under sustained load (bench/python/vs_quack.py, M = 8192; bench/results/vs_quack/f1_b3/), time / cuBLAS: 1B
    # 1.043-1.068 against 1.045-1.100 for pingpong 128x128 (the scheduler's default knobs), 8B 1.013-1.047 against
    # 1.073-1.130, 70B 1.000-1.010 (the 70B default since stop 17: 0.971-0.979 against pingpong's 1.144-1.165 in
    # sweep_ops). The pingpong kernel ran at 1380-1436 MHz there, the cooperative one at 1430-1472 MHz at the same
    # 690 W: 128x128 tiles load 1.33x the operand bytes per FLOP.
    RULE "M >= 4096 || K >= 16384" coop_128x256x64_c2x1 n 8 "down-projection: fewer operand bytes per FLOP (f1_b3)")
