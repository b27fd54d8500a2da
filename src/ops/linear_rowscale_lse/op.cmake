# coda_linear_rowscale_lse: its kernels and tile policy (src/ops/registry.cmake says what this generates).
# LseKernel stores the raw logits R(rstd * acc) as D; its twin LseNoLogitsKernel (D = void) writes only the partials:
# the LM head's loss path.
coda_fused_op(linear_rowscale_lse ARGS LseArgs NAMESPACE lse_kernels LAYOUT fwd
  KERNEL LseKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 FP16 pp_128x128x64_c2x1
    # Raster N without swizzle: the best of bench_fused's one-after-another sweep (not measured under sustained load).
    DEFAULT pp_128x128x64_c2x1 n 1
  KERNEL LseNoLogitsKernel VARIANT nologits
    BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 FP16 pp_128x128x64_c2x1
    # Pingpong (the exp-per-element epilogue overlaps the other warpgroup's MMA), raster along N, swizzle 8; at
    # K >= 8192 (llama3-70B, bf16) the cooperative 128x256, same knobs. Measured under sustained load
    # (bench/python/sweep_ops.py: back-to-back calls at the 700 W limit, M = 8192, V = 128256;
    # bench/results/sweep_ops_h200/): pingpong n/8 1.007 x cuBLAS at 1B and 1.062 x at 8B, cooperative n/8 1.045 x
    # at 70B, where raster N without swizzle took 1.125 / 1.189 / 1.187 x, at 1155 MHz against 1395-1425 MHz. The
    # likely reason (from the tile order, not profiled): without swizzle a wave of tiles spans one 128-row band and
    # hundreds of vocabulary columns, so the weight streams from DRAM once per row band.
    DEFAULT pp_128x128x64_c2x1 n 8
    RULE "K >= 8192" coop_128x256x64_c2x1 n 8 "llama3-70B: cooperative 1.045 x cuBLAS (sweep_ops_h200)")
