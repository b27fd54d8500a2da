# coda_linear_rowscale: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_rowscale ARGS RowscaleArgs NAMESPACE rowscale_kernels LAYOUT fwd
  KERNEL RowscaleKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 pp_192x128x64_c1x2 pp_192x128x64_c1x2_d3
    FP16 pp_128x128x64_c2x1
    # pp_192x128x64_c1x2_d3: a pin (3 D store buffers; gemm/configs.hpp), the row-scaled GEMM alone beside the RoPE
    # and QK-norm ops' d3 pins (vs_quack's coda_rowscale:<pin> rows).
    # Pingpong 128x128, raster along N: 0.92-1.00 x cuBLAS on the LLaMA shapes (bench/results/fused_h200_*).
    DEFAULT pp_128x128x64_c2x1 n 4
    RULE "N >= 16384" pp_128x128x64_c2x1 n 8 "wide N (gate/up, LM head): swizzle 8"
    # d >= 4096 (the q/k/v shapes of llama3-8B/70B): cooperative 128x256, raster M, 0.86-0.94 of pingpong's time on an
    # H100 (bench/results/vs_quack/h100_bc3ad2e/, f4qk runs 5-7); not yet timed on the H200. At d = 2048 it ran 1.4x
    # pingpong's (not taken); at Qwen3-14B (N = 7168) 1.12x at swizzle 8, its padding (now fitted to swizzle 4).
    RULE "K >= 4096 && M >= 4096" coop_128x256x64_c2x1 m 8 "d and M >= 4096: cooperative 128x256 (h100_bc3ad2e)"
    # Below d = 4096 at M >= 4096 and N <= 8192 (the q/k/v widths): pingpong 192x128, cluster 1x2 (the QK-norm op's
    # tile), raster M. H100, sustained load, c549700 (bench/results/vs_quack/qk_192/, runs 4-7, the coda_rowscale rows
    # of the QK-norm and RoPE cases): time / cuBLAS llama3-1B (N = 3072, K = 2048) 0.964-1.000 where the policy above
    # ran 1.053-1.088 (four runs), Qwen3-1.7B (4096, 2048) 1.017 (1.068), Qwen3-4B (6144, 2560) 0.947-0.977
    # (1.036-1.072, three runs). From d = 4096 it tied the cooperative tile (8B, Qwen3-14B) or lost (70B: 1.013
    # against 0.987).
    RULE "M >= 4096 && N <= 8192" pp_192x128x64_c1x2 m 8 "d < 4096, M >= 4096, N <= 8192: pingpong 192x128, c1x2")
