# coda_linear_rowscale: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_rowscale ARGS RowscaleArgs NAMESPACE rowscale_kernels LAYOUT fwd
  KERNEL RowscaleKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 FP16 pp_128x128x64_c2x1
    # Pingpong 128x128, raster along N: 0.92-1.00 x cuBLAS on the LLaMA shapes (bench/results/fused_h200_*).
    DEFAULT pp_128x128x64_c2x1 n 4
    RULE "N >= 16384" pp_128x128x64_c2x1 n 8 "wide N (gate/up, LM head): swizzle 8")
