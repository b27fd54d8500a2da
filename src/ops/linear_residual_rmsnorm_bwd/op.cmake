# coda_linear_residual_rmsnorm_bwd: its kernels and tile policy (src/ops/registry.cmake says what this generates). The
# cooperative 128x256 has a leaner epilogue (3 C/x stages) for long K; the row-scaled twins (the row scale v, bf16 only)
# serve the LM head's exponential form, under the same policy.
#
# Raster along N, swizzle 8 (bench_backward --sweep on the H200, llama3-1B/8B/70B, M = 16384: within 5 % of the best pin
# at every linear_residual_rmsnorm_bwd shape, mostly within 2 %; swizzle 1 was up to 7 % slower (70B LM head) and at
# most 2 % faster (1B q/k/v); bench/results/backward_sweep_h200_b2tree.jsonl).
# bf16 with K >= 8192 (the gate/up dgrad, K = 2F, and the LM head's, K = V) on the cooperative 128x256 kernel, which
# moves 1.5x fewer L2-to-SM bytes per FLOP than the pingpong 128x128 (computed from the tiles) and, with its leaner
# epilogue, keeps 3 mainloop stages. H200, interleaved with the pingpong-only default (bench/results/b2_coop_h200/):
# LM head f+b 0.973x and 0.989x the time; the block backward 0.95-0.99x in every run and config, the block f+b
# 0.986-1.008x at llama3-1B/8B and 0.996x at 70B (within the runs' spread). Shorter K (q/k/v) stays pingpong, whose
# epilogue hides behind the other warpgroup's MMA (not measured on its own here).
coda_fused_op(linear_residual_rmsnorm_bwd ARGS ResidualRmsnormBwdArgs NAMESPACE residual_rmsnorm_bwd_kernels
  LAYOUT dgrad
  KERNEL ResidualRmsnormBwdKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 FP16 pp_128x128x64_c2x1
    DEFAULT pp_128x128x64_c2x1 n 8
    RULE "K >= 8192" coop_128x256x64_c2x1 n 8 "long K: 1.5x fewer L2-to-SM bytes per FLOP (b2_coop_h200)"
  KERNEL ResidualRmsnormBwdRowScaledKernel VARIANT rowscaled BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1
    DEFAULT pp_128x128x64_c2x1 n 8
    RULE "K >= 8192" coop_128x256x64_c2x1 n 8 "long K: 1.5x fewer L2-to-SM bytes per FLOP (b2_coop_h200)")
