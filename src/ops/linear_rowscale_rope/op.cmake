# coda_linear_rowscale_rope: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_rowscale_rope ARGS RopeArgs NAMESPACE rope_kernels LAYOUT fwd
  # coop_128x256x64_c2x1_sc (a pin, not yet timed): the head-aware program (epilogue/rope_heads.hpp), the tile's
  # first q/k head's sin and cos kept for its later heads (bench/results/vs_quack/qk_angle_reuse/).
  KERNEL RopeKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 coop_128x256x64_c2x1_sc FP16 pp_128x128x64_c2x1
    # coop_128x256x64_c2x1_sc: 32 bytes of spill stores, an 8-byte frame (as linear_rowscale_qk_norm_rope's _sc).
    ACCEPT_SPILL coop_128x256x64_c2x1_sc 32
    # Pingpong 128x128 (the sin/cos epilogue overlaps the other warpgroup's MMA), raster along N, swizzle 8:
    # 0.98-0.99 x cuBLAS on the LLaMA qkv shapes, cooperative 128x256 1.09-1.24 x (bench/results/fused_h200_*).
    DEFAULT pp_128x128x64_c2x1 n 8
    # llama3-70B's q/k/v (K = 8192) on an H100: cooperative 128x256 at raster M, swizzle 8 ran 0.87 of pingpong's
    # time (pingpong 1.17-1.18x cuBLAS there); at 8B 1.03-1.05x pingpong's (bench/results/vs_quack/h100_bc3ad2e/).
    # Not yet timed on the H200 at these knobs (the 1.09-1.24 above: heuristic raster, swizzle 1).
    RULE "K >= 8192 && M >= 4096" coop_128x256x64_c2x1 m 8 "llama3-70B: cooperative 128x256 (h100_bc3ad2e)")
