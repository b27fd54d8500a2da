# coda_linear_rowscale_rope: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_rowscale_rope ARGS RopeArgs NAMESPACE rope_kernels LAYOUT fwd
  KERNEL RopeKernel BF16 pp_128x128x64_c2x1 coop_128x256x64_c2x1_sc pp_192x128x64_c1x2 pp_192x128x64_c1x2_d3
    pp_192x128x64_c1x2_e64 pp_192x128x64_c1x2_e64_d3
    FP16 pp_128x128x64_c2x1
    # Pins of pingpong 192x128 c1x2 (gemm/configs.hpp), each without spill and with 5 mainloop stages: _d3 (3 D store
    # buffers), _e64 (64x64 subtiles: 6 visits per tile instead of 12), _e64_d3 (both). Not yet timed.
    # The functor program on coop_128x256x64_c2x1 is no longer compiled: the _sc kernel replaced it from d = 4096
    # (1.01x cuBLAS at llama3-70B where it ran 1.03x, H100, qk_angle_reuse/), and no rule picked it since.
    # coop_128x256x64_c2x1_sc: 32 bytes of spill stores, an 8-byte frame (two words across the k-loop).
    ACCEPT_SPILL coop_128x256x64_c2x1_sc 32
    # Pingpong 128x128 (the sin/cos epilogue overlaps the other warpgroup's MMA), raster along N, swizzle 8:
    # 0.98-0.99 x cuBLAS on the LLaMA qkv shapes, cooperative 128x256 1.09-1.24 x (bench/results/fused_h200_*).
    DEFAULT pp_128x128x64_c2x1 n 8
    # From d = 4096: cooperative 128x256 on the head-aware program (epilogue/rope_heads.hpp), the tile's first q/k
    # head's sin and cos kept for its later heads (half the MUFU of the stateless functor). H100, sustained load, two
    # rounds (bench/results/vs_quack/qk_angle_reuse/): llama3-8B 0.98-1.00x cuBLAS where pingpong ran 1.05-1.10x,
    # llama3-70B 1.01x where the plain cooperative kernel ran 1.03x. On the H200 (one run, b2c6e10) it tied pingpong:
    # 1.022 / 0.994 / 1.027x at 8B / 70B / Qwen3-14B against 1.012 / 1.001 / 1.030x. At llama3-1B (K = 2048) the
    # cooperative tile ran 1.53x on the H100 (its epilogue does not overlap the MMA): pingpong stays below d = 4096.
    RULE "K >= 4096 && M >= 4096" coop_128x256x64_c2x1_sc m 8 "d and M >= 4096: cooperative 128x256, sin/cos kept"
    # Below d = 4096 at M >= 4096: the head-aware program (rstd read per visit, angles per visit; 0 spill) on pingpong
    # 192x128, cluster 1x2 (linear_rowscale_qk_norm_rope's tile), raster M. H100, sustained load, three runs at
    # c549700 (bench/results/vs_quack/qk_192/, runs 4, 6, 7): time / cuBLAS llama3-1B 1.039 / 1.052 / 1.043 where
    # pingpong 128x128 ran 1.100 / 1.093 / 1.074, Qwen3-4B 1.027 / 1.018 (1.077 / 1.045), Qwen3-1.7B 1.065 (1.087).
    # From d = 4096 it tied the cooperative _sc kernel (8B 1.015 / 1.009 against 1.016 / 1.013, Qwen3-14B 1.023
    # against 1.022) and lost at 70B (1.013 against 0.990).
    RULE "M >= 4096" pp_192x128x64_c1x2 m 8 "d < 4096, M >= 4096: pingpong 192x128, cluster 1x2, head-aware")
