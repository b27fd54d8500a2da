# The LM head backward's exp/CE epilogue (internal to coda_linear_cross_entropy_bwd; no DEFAULT: not pinnable, its
# dispatcher picks by the softcap and the vocabulary's tail): the kernels the build compiles (src/ops/registry.cmake
# generates one .cu per kernel), bf16 only:
#   ExpCeKernel         cooperative 128x256, no column mask, no softcap: whole 256-column tiles of the vocabulary;
#   ExpCeSoftcapKernel  pingpong 128x128 with the softcap compiled in: whole 128-column tiles (the epilogue's tanh
#                       and exp per element overlap the other warpgroup's MMA);
#   ExpCeMaskedKernel   pingpong 128x64 with the column mask: the vocabulary's last V % 128 columns and the padding
#                       after them.
coda_fused_op(linear_rowscale_exp ARGS ExpCeArgs NAMESPACE exp_ce_kernels LAYOUT fwd
  KERNEL ExpCeKernel BF16 coop_128x256x64_c2x1
  KERNEL ExpCeSoftcapKernel VARIANT softcap BF16 pp_128x128x64_c2x1
  KERNEL ExpCeMaskedKernel VARIANT masked BF16 pp_128x64x64_c2x1)
