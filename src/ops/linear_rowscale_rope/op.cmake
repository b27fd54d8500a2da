# coda_linear_rowscale_rope: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_rowscale_rope ARGS RopeArgs NAMESPACE rope_kernels LAYOUT fwd
  KERNEL RopeKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 FP16 pp_128x128x64_c2x1
    # Pingpong 128x128 (the sin/cos epilogue overlaps the other warpgroup's MMA), raster along N, swizzle 8:
    # 0.98-0.99 x cuBLAS on the LLaMA qkv shapes, cooperative 128x256 1.09-1.24 x (bench/results/fused_h200_*).
    DEFAULT pp_128x128x64_c2x1 n 8)
