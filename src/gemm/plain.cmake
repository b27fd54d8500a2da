# The plain GEMM's compiled kernels (src/ops/registry.cmake generates one .cu per kernel, their declarations and
# gemm.cu's table). Naming: <layout>_bf16_<out>_<config>; layouts and configs: src/gemm/plain_kernels.hpp,
# docs/GEMM.md (which combinations are instantiated and why; every other one runs on cuBLAS). Order matters: within
# a layout the first kernel is the untuned default, and stage 1 of tuning lists them in this order.
coda_plain_gemm(fwd bf16 PlainGemm coop_128x256x64_c2x1 coop_128x256x64_c1x1 pp_128x128x64_c2x1 pp_64x256x64_c2x1
                coop_256x128x64_c1x2 sk_128x256x64_c2x1 pp_128x192x64_c2x1)
# Overwrite only (beta = 0) with 6 D store buffers.
coda_plain_gemm(fwd bf16 PlainStore6Gemm pp_128x192x64_c2x1_d6)
coda_plain_gemm(dgrad bf16 PlainGemm sk_128x256x64_c2x1 pp_128x128x64_c2x1 coop_128x256x64_c2x1 coop_256x128x64_c1x2)
# wgrad into bf16, and into fp32 (fp32 master-gradient accumulation).
coda_plain_gemm(wgrad bf16 PlainGemm sk_128x256x64_c2x1 pp_128x128x64_c2x1 coop_128x256x64_c2x1)
coda_plain_gemm(wgrad fp32 PlainGemm sk_128x256x64_c2x1 pp_128x128x64_c2x1)
# Adding into fp32 D only (beta = 1): TMA reduce-add, no C loads (ReduceAddEpilogue).
coda_plain_gemm(wgrad fp32 PlainReduceAdd4Gemm pp_128x128x64_c2x1_radd)
