# coda_linear_rowscale: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_rowscale ARGS RowscaleArgs NAMESPACE rowscale_kernels LAYOUT fwd
  KERNEL RowscaleKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 pp_192x128x64_c1x2 FP16 pp_128x128x64_c2x1
    # pp_192x128x64_c1x2 (a pin, not yet GPU-tested or timed): the QK-norm op's tile below d = 8192, for timing the
    # row-scaled GEMM alone on it (vs_quack's coda_rowscale pin rows: the mainloop's share of that op's time).
    # Pingpong 128x128, raster along N: 0.92-1.00 x cuBLAS on the LLaMA shapes (bench/results/fused_h200_*).
    DEFAULT pp_128x128x64_c2x1 n 4
    RULE "N >= 16384" pp_128x128x64_c2x1 n 8 "wide N (gate/up, LM head): swizzle 8"
    # d >= 4096 (the q/k/v shapes of llama3-8B/70B): cooperative 128x256, raster M, 0.86-0.94 of pingpong's time on an
    # H100 (bench/results/vs_quack/h100_bc3ad2e/, f4qk runs 5-7); not yet timed on the H200. At d = 2048 it ran 1.4x
    # pingpong's (not taken); at Qwen3-14B (N = 7168) 1.12x at swizzle 8, its padding (now fitted to swizzle 4).
    RULE "K >= 4096 && M >= 4096" coop_128x256x64_c2x1 m 8 "d and M >= 4096: cooperative 128x256 (h100_bc3ad2e)")
