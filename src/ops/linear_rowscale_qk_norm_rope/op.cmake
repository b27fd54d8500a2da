# coda_linear_rowscale_qk_norm_rope: its kernels and tile policy (src/ops/registry.cmake says what this generates). The
# per-head norm needs a whole 128-column N tile per epilogue visit (64 x 128 subtiles); raster along N, swizzle 8 as
# linear_rowscale_rope's pingpong 128x128. Tried and dropped: the same tile on a 1x2 cluster (1.55 / 1.08 / 1.03x cuBLAS
# at llama3-1B / 8B / 70B where this one ran 1.17 / 1.06 / 1.02, bench/results/vs_quack/f4qk/); 192 x 128 does not fit
# (192 accumulators and a 64-element subtile spill 428 bytes at the kernel's 168-register cap).
# pp_128x128x64_c2x1 (64 x 32 subtiles) and pp_192x128x64_c2x1_e16 (64 x 16; at 64 x 32 the 192-row tile spilled
# 84 bytes) run the prepass program instead: the heads' sums taken over the accumulators before the subtile loop
# (epilogue.hpp). Both compile to 168 registers, 0 spill; pin only until measured on the GPU.
# pp_128x192x64_c2x1_e16: the prepass on quack's default tile (its qk_rope epilogue ran 0.979x cuBLAS on it at
# llama3-1B); head_dim 64 only (a 128-wide head would straddle two tiles: the kernel refuses head_dim 128).
coda_fused_op(linear_rowscale_qk_norm_rope ARGS QkNormRopeArgs NAMESPACE qk_norm_rope_kernels LAYOUT fwd
  KERNEL QkNormRopeKernel BF16 pp_128x128x64_c2x1_e128 pp_128x128x64_c2x1 pp_192x128x64_c2x1_e16
    pp_128x192x64_c2x1_e16
    FP16 pp_128x128x64_c2x1_e128
    DEFAULT pp_128x128x64_c2x1_e128 n 8)
