# coda_linear_rowscale_qk_norm_rope: its kernels and tile policy (src/ops/registry.cmake says what this generates).
# pp_128x128x64_c2x1_e128 (the DEFAULT, and fp16's one config): 64 x 128 subtiles, a whole 128-column N tile per visit
# (Sm90QkNormRope); raster N, swizzle 8 as linear_rowscale_rope's pingpong 128x128. The other two run the prepass
# program (the heads' sums taken over the accumulators before the subtile loop, epilogue.hpp); all three 0 spill.
# Under sustained load, time / cuBLAS (bench/results/vs_quack/f4qk/, runs 4-7 on an H100):
# - coop_128x256x64_c2x1 (128 x 32 subtiles; 0.75x the 128 x 128 tile's operand bytes per FLOP), raster M, swizzle 8
#   (the rule from d = 8192):
#   0.93-0.98 of e128's time at llama3-8B and 0.84-0.87 at 70B (1.04-1.10 / 1.02-1.03x cuBLAS; raster N 0.99-1.01 /
#   0.85-0.89 of e128's); at llama3-1B (K = 2048: 32 k-steps per tile, and the cooperative epilogue does not overlap
#   the MMA) 1.63x cuBLAS against e128's 1.17x. Large M only (measured at 8192 tokens): a 128x256 tile halves the CTA
#   count, which a short M cannot spare.
# - pp_128x128x64_c2x1 (64 x 32 subtiles; the rule for d = 4096..8191): 1.189 / 1.062x at llama3-1B / 8B where e128
#   ran 1.127 / 1.088.
# Tried and dropped: e128 on a 1x2 cluster (1.55 / 1.08 / 1.03x at 1B / 8B / 70B where 2x1 ran 1.17 / 1.06 / 1.02,
# H200); the prepass on 64 x 16 subtiles of 192-row and 192-column tiles (1.24-1.46x); a 192-row tile at 64 x 128
# subtiles (428 bytes of spill) and the prepass on a 128 x 192 tile at 64 x 32 (80 bytes).
# - coop_128x256x64_c2x1_sc (a pin): the same kernel keeping the tile's first head's sin and cos (two registers per pair
#   and row) where the default keeps the reduced angle (one) and takes sin/cos again per head; on an H100 it tied the
#   cooperative kernel at llama3-8B and 70B (bench/results/vs_quack/qk_angle_reuse/).
coda_fused_op(linear_rowscale_qk_norm_rope ARGS QkNormRopeArgs NAMESPACE qk_norm_rope_kernels LAYOUT fwd
  KERNEL QkNormRopeKernel BF16 pp_128x128x64_c2x1_e128 pp_128x128x64_c2x1 coop_128x256x64_c2x1
      coop_128x256x64_c2x1_sc pp_192x128x64_c1x2 pp_192x128x64_c2x1
      pp_192x128x64_c1x2_e16
    FP16 pp_128x128x64_c2x1_e128
    # coop_128x256x64_c2x1_sc: 32 bytes of spill stores, an 8-byte frame (SASS: two words stored at the kernel's setup
    # and reloaded at the epilogue's start, none in the k-loop or the subtile loop).
    ACCEPT_SPILL coop_128x256x64_c2x1_sc 32
    # pp_192x128 (pins): 116 / 120 bytes of spill stores with rstd read per visit (144 / 148 with Sm90ColBroadcast;
    # SASS: words stored and reloaded around the tile's first epilogue visit, where all 192 accumulators are still
    # live, and one reload per k-step).
    ACCEPT_SPILL pp_192x128x64_c1x2 116
    ACCEPT_SPILL pp_192x128x64_c2x1 120
    DEFAULT pp_128x128x64_c2x1_e128 n 8
    RULE "K >= 8192 && M >= 4096" coop_128x256x64_c2x1 m 8 "d >= 8192: cooperative 128x256 (f4qk runs 5-7)"
    # Below d = 8192 at M >= 4096: the prepass on pingpong 192x128, cluster 1x2 (quack's qk_rope tile), raster M.
    # H100, sustained load, two runs (bench/results/vs_quack/qk_192/): time / cuBLAS llama3-1B 1.112 / 1.117 where
    # e128 ran 1.155 / 1.148, Qwen3-4B 1.056 / 1.057 (e128 1.085 / 1.097), llama3-8B 1.026 / 0.986 (pingpong
    # 128x128 prepass 1.050 / 1.084), Qwen3-14B 1.049 / 1.068 (1.205 / 1.233); Qwen3-1.7B 1.116 against e128's 1.106.
    RULE "M >= 4096" pp_192x128x64_c1x2 m 8 "d < 8192, M >= 4096: pingpong 192x128, cluster 1x2, prepass (qk_192)")
