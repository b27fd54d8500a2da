# coda_linear_swiglu_bwd_zdz: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_swiglu_bwd_zdz ARGS SwigluBwdArgs NAMESPACE swiglu_bwd_kernels LAYOUT dgrad
  KERNEL SwigluBwdKernel BF16 pp_128x128x64_c2x1 pp_128x192x64_c2x1_e16 pp_128x192x64_c2x1_e16h
    FP16 pp_128x128x64_c2x1
    # pp_128x192x64_c2x1_e16 keeps one 32-bit word of per-tile state in local memory: 12 bytes of spill stores.
    ACCEPT_SPILL pp_128x192x64_c2x1_e16 12
    # pp_128x192x64_c2x1_e16h: dz in chunks of two pairs with the row pointers kept: 60 bytes of spill stores, and
    # still the faster of the two (the RULE below).
    ACCEPT_SPILL pp_128x192x64_c2x1_e16h 60
    # Raster along N, swizzle 8 (bench_backward --sweep at 128x128, H200: 1.13 -> 1.08x cuBLAS at llama3-8B,
    # 1.09 -> 1.04x at 70B; every setting within 1 % at 1B).
    DEFAULT pp_128x128x64_c2x1 n 8
    # 128x192 with 64x16 subtiles from d = K = 4096: e16 ran 0.98-1.01 of 128x128 (llama3-8B/70B, 8192 and 16384
    # tokens; llama3-1B, d = 2048: 1.08; bench/results/vs_quack/b3_192/), and e16h 0.945-0.977 of e16 in one
    # sustained-load run at the same shapes (bench/results/vs_quack/b3_e16h/). Large M only: decode-sized M was not
    # measured.
    RULE "K >= 4096 && M >= 4096" pp_128x192x64_c2x1_e16h n 8 "llama3-8B/70B: 0.95-0.98 of e16 (b3_e16h)")
