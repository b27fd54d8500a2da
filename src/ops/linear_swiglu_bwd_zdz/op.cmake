# B3 coda_linear_swiglu_bwd_zdz: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_swiglu_bwd_zdz ARGS SwigluBwdArgs NAMESPACE swiglu_bwd_kernels LAYOUT dgrad
  KERNEL SwigluBwdKernel BF16 pp_128x128x64_c2x1 pp_128x192x64_c2x1_e16 pp_128x192x64_c2x1_e16h
    FP16 pp_128x128x64_c2x1
    # pp_128x192x64_c2x1_e16 keeps one 32-bit word of per-tile state in local memory: 12 bytes of spill stores.
    ACCEPT_SPILL pp_128x192x64_c2x1_e16 12
    # pp_128x192x64_c2x1_e16h (pin only, no RULE picks it): the earlier 64x16 code, dz in chunks of two pairs with the
    # row pointers kept, to A/B against e16 in one run (its build measured 0.95-0.98 of 128x128, e16 0.98-1.01, in
    # different runs).
    ACCEPT_SPILL pp_128x192x64_c2x1_e16h 60
    # Raster along N, swizzle 8 (bench_backward --sweep at 128x128, H200: 1.13 -> 1.08x cuBLAS at llama3-8B,
    # 1.09 -> 1.04x at 70B; every setting within 1 % at 1B).
    DEFAULT pp_128x128x64_c2x1 n 8
    # 128x192 with 64x16 subtiles from d = K = 4096 (sustained load, llama3-8B/70B at 8192 and 16384 tokens, time
    # over 128x128's in the same run: 0.98-1.01; a 60-byte-spill build: 0.95-0.98; llama3-1B, d = 2048: 1.08;
    # bench/results/vs_quack/b3_192/). Large M only: decode-sized M was not measured.
    RULE "K >= 4096 && M >= 4096" pp_128x192x64_c2x1_e16 n 8 "llama3-8B/70B: 0.98-1.01 of 128x128 (b3_192)")
