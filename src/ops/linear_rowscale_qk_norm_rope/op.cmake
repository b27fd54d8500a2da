# coda_linear_rowscale_qk_norm_rope: its kernels and tile policy (src/ops/registry.cmake says what this generates).
# pp_128x128x64_c2x1_e128 (the DEFAULT below M = 4096, and fp16's one config): 64 x 128 subtiles, a whole 128-column N
# tile per visit (Sm90QkNormRope); raster N, swizzle 8 as linear_rowscale_rope's pingpong 128x128. The other four run
# the prepass program (the heads' sums taken over the accumulators before the subtile loop, epilogue.hpp).
# Under sustained load, time / cuBLAS:
# - pp_192x128x64_c1x2 (64 x 32 subtiles, 192 accumulators per thread: rstd read per visit and no angle reuse across
#   heads; the ragged scheduler), raster M, swizzle 8: the rule below d = 8192 at M >= 4096 (H100, two runs of pins
#   and one of the rule, bench/results/vs_quack/qk_192/). Raster N ran 0.7-3.9 % slower (but 1.3 % faster at 8B in
#   one run), cluster 2x1 3-10 % slower, 64 x 16 subtiles (no spill) -0.5 to +9 % (all three dropped).
# - coop_128x256x64_c2x1 (128 x 32 subtiles; 0.75x the 128 x 128 tile's operand bytes per FLOP), raster M, swizzle 8
#   (the rule from d = 8192): 0.84-0.87 of e128's time at 70B on an H100 (f4qk runs 5-7; 1.02-1.03x cuBLAS), 1.014x
#   against the 192x128 tile's 1.027x (qk_192 run 2). At llama3-1B (K = 2048: 32 k-steps per tile, and the
#   cooperative epilogue does not overlap the MMA) 1.63x cuBLAS against e128's 1.17x. Large M only (measured at 8192
#   tokens): a 128x256 tile halves the CTA count, which a short M cannot spare.
# - pp_128x128x64_c2x1 (64 x 32 subtiles; a pin, the rule for d = 4096..8191 before qk_192): on the H200 1.039 / 1.046x
#   at llama3-8B / Qwen3-14B (one run, b2c6e10); on an H100 1.050-1.084 / 1.205-1.233x where the 192x128 tile ran
#   0.986-1.025 / 1.049-1.068x (qk_192 runs 1-2). Not yet timed beside the 192x128 tile on an H200.
# Tried and dropped: e128 on a 1x2 cluster (1.55 / 1.08 / 1.03x at 1B / 8B / 70B where 2x1 ran 1.17 / 1.06 / 1.02,
# H200); a 192-row tile at 64 x 128 subtiles (428 bytes of spill); the cooperative kernel keeping the first head's sin
# and cos (coop_128x256x64_c2x1_sc: tied the cooperative kernel at 8B and 70B, H100, qk_angle_reuse/; still
# linear_rowscale_rope's).
coda_fused_op(linear_rowscale_qk_norm_rope ARGS QkNormRopeArgs NAMESPACE qk_norm_rope_kernels LAYOUT fwd
  KERNEL QkNormRopeKernel BF16 pp_128x128x64_c2x1_e128 pp_128x128x64_c2x1 coop_128x256x64_c2x1 pp_192x128x64_c1x2
    pp_192x128x64_c1x2_d3
    FP16 pp_128x128x64_c2x1_e128
    # pp_192x128x64_c1x2: 116 bytes of spill stores (144 with Sm90ColBroadcast's rstd; SASS: about seven words stored
    # and reloaded around the tile's first epilogue visit, where all 192 accumulators are still live, and one reload
    # per k-step).
    ACCEPT_SPILL pp_192x128x64_c1x2 116
    # pp_192x128x64_c1x2_d3 (a pin; gemm/configs.hpp): 3 D and 3 z store buffers, 5 mainloop stages as
    # pp_192x128x64_c1x2's; 112 bytes of spill stores.
    ACCEPT_SPILL pp_192x128x64_c1x2_d3 112
    DEFAULT pp_128x128x64_c2x1_e128 n 8
    RULE "K >= 8192 && M >= 4096" coop_128x256x64_c2x1 m 8 "d >= 8192: cooperative 128x256 (f4qk runs 5-7)"
    # Below d = 8192 at M >= 4096: the prepass on pingpong 192x128, cluster 1x2 (quack's qk_rope tile), raster M.
    # H100, sustained load, two runs of pins (bench/results/vs_quack/qk_192/): time / cuBLAS llama3-1B 1.111 / 1.119
    # where e128 ran 1.155 / 1.152, Qwen3-4B 1.054 / 1.057 (e128 1.084 / 1.097), llama3-8B 1.025 / 0.986 (pingpong
    # 128x128 prepass 1.050 / 1.084), Qwen3-14B 1.049 / 1.068 (1.205 / 1.233); Qwen3-1.7B 1.115 against e128's 1.108
    # (a tie within the runs' spread). The rule's own run: 1.079 / 1.054 / 1.048 at 1B / 8B / Qwen3-14B.
    RULE "M >= 4096" pp_192x128x64_c1x2 m 8 "d < 8192, M >= 4096: pingpong 192x128, cluster 1x2, prepass (qk_192)")
