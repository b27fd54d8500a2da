# F4 with QK-norm coda_linear_rowscale_qk_norm_rope: its kernels and tile policy (src/ops/registry.cmake says what
# this generates). The per-head norm needs a whole 128-column N tile per epilogue visit (64 x 128 subtiles); raster
# along N, swizzle 8 as F4's pingpong 128x128. pp_128x128x64_c1x2_e128 (cluster along N) is pin-only until measured. A 192 x 128 tile does not fit: its 192
# accumulators and a 64-element subtile spill 428 bytes at the kernel's 168-register cap.
coda_fused_op(linear_rowscale_qk_norm_rope ARGS QkNormRopeArgs NAMESPACE qk_norm_rope_kernels LAYOUT fwd
  KERNEL QkNormRopeKernel BF16 pp_128x128x64_c2x1_e128 pp_128x128x64_c1x2_e128 FP16 pp_128x128x64_c2x1_e128
    DEFAULT pp_128x128x64_c2x1_e128 n 8)
