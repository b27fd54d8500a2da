# F4 with QK-norm coda_linear_rowscale_qk_norm_rope: its kernels and tile policy (src/ops/registry.cmake says what
# this generates). One config: the per-head norm needs a whole 128-column N tile per epilogue visit (the 64 x 128
# subtile of pp_128x128x64_c2x1_e128); raster along N, swizzle 8 as F4's pingpong 128x128.
coda_fused_op(linear_rowscale_qk_norm_rope ARGS QkNormRopeArgs NAMESPACE qk_norm_rope_kernels LAYOUT fwd
  KERNEL QkNormRopeKernel BF16 pp_128x128x64_c2x1_e128 FP16 pp_128x128x64_c2x1_e128
    DEFAULT pp_128x128x64_c2x1_e128 n 8)
