# coda_linear_rowscale_swiglu: its kernels and tile policy (src/ops/registry.cmake says what this generates).
coda_fused_op(linear_rowscale_swiglu ARGS SwigluArgs NAMESPACE swiglu_kernels LAYOUT fwd
  KERNEL SwigluKernel BF16 coop_128x256x64_c2x1 pp_128x128x64_c2x1 pp_128x192x64_c2x1 FP16 pp_128x128x64_c2x1
    # bf16: pingpong 128x192 (1.5x the 128x128 tile's FLOPs for 1.25x its operand bytes; the SwiGLU epilogue, 1.5x
    # the plain GEMM's output bytes, overlaps the other warpgroup's MMA), swizzle 8, raster along N, along M at
    # K >= 8192. Under sustained load (bench/python/vs_quack.py, M = 8192, one run; bench/results/vs_quack/f3_192/),
    # time / cuBLAS: 1B 0.984 (n/8) against 1.003 for the former default (pingpong 128x128, raster N, swizzle 8), 8B
    # 1.014 against 1.047, 70B 1.008 (m/8; n/8 1.023) against 1.044 for the former cooperative 128x256 at raster M,
    # swizzle 8. fp16: pingpong 128x128 (the one fp16 config), raster N, swizzle 8.
    DEFAULT pp_128x192x64_c2x1 n 8
    RULE "K >= 8192" pp_128x192x64_c2x1 m 8 "llama3-70B: raster M (f3_192: 1.008 against n/8's 1.023)")
