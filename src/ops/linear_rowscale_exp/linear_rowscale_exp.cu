// Dispatch of the exponential-form LM-head logits GEMM (host only, no CUTLASS): whole tiles of the vocabulary on the
// unmasked kernel, the rest (V % tile columns and the padding to N) on the masked narrow one, both
// writing into one set of partials carved out of the caller's workspace.
#include "ops/linear_rowscale_exp/instances.hpp"

#include "common/error.hpp"
#include "ops/op_config.hpp"

#include <cstdint>

namespace coda::ops {

namespace {
// The tiles the partials are laid out for: the main kernel's (128 wide with softcap, 256 without) and the tail's.
constexpr int64_t kTileM = 128, kSoftcapTileN = 128, kPlainTileN = 256, kTailTileN = 64;

void require_tile(gemm::KernelOps<ExpCeArgs> const& k, int64_t tile_n) {
  if (k.info.tile_m != kTileM || k.info.tile_n != tile_n) {
    coda::detail::fail(CODA_ERROR_INTERNAL, "linear_rowscale_exp: kernel ", k.info.config,
                       " does not have the tile its partials are laid out for");
  }
}

ExpCeWorkspace layout(int64_t M, int64_t N, int64_t V, int64_t main_tile_n) {
  ExpCeWorkspace w;
  if (M <= 0 || N <= 0) return w;
  int64_t const vm = V / main_tile_n * main_tile_n;
  w.tiles = vm / main_tile_n + (N - vm + kTailTileN - 1) / kTailTileN;
  w.m_pad = (M + kTileM - 1) / kTileM * kTileM;
  w.slot = (static_cast<size_t>(w.tiles * w.m_pad) * sizeof(float) + 255) / 256 * 256;
  return w;
}
}  // namespace

ExpCeWorkspace exp_ce_workspace(int64_t M, int64_t N, int64_t V) {
  ExpCeWorkspace const a = layout(M, N, V, kSoftcapTileN), b = layout(M, N, V, kPlainTileN);
  return a.bytes() >= b.bytes() ? a : b;
}

ExpCeWorkspace linear_rowscale_exp(int64_t M, int64_t N, int64_t K, void const* h, int64_t ldh, void const* w,
                                   int64_t ldw, ExpCeArgs args, void* e, int64_t ld_e, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  bool const softcap = args.softcap > 0.0f;
  gemm::KernelOps<ExpCeArgs> const& main = softcap ? exp_ce_kernels::fwd_bf16_softcap_pp_128x128x64_c2x1()
                                                   : exp_ce_kernels::fwd_bf16_coop_128x256x64_c2x1();
  gemm::KernelOps<ExpCeArgs> const& tail = exp_ce_kernels::fwd_bf16_masked_pp_128x64x64_c2x1();
  int64_t const main_tile_n = softcap ? kSoftcapTileN : kPlainTileN;
  require_tile(main, main_tile_n);
  require_tile(tail, kTailTileN);
  int64_t const V = args.vocab;
  if (V < 1 || V > N) {
    coda::detail::fail(CODA_ERROR_INTERNAL, "linear_rowscale_exp: vocab ", V, " outside [1, ", N, "]");
  }
  ExpCeWorkspace const ws = layout(M, N, V, main_tile_n);  // <= exp_ce_workspace(M, N, V): the larger of the two
  if (workspace_bytes < ws.bytes() || workspace == nullptr || (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "linear_rowscale_exp: needs ", ws.bytes(),
                       " bytes of 16-byte aligned workspace for the partials, got ", workspace_bytes);
  }
  args.part_sumexp = ws.buffer(workspace, 0);
  args.part_dot = ws.buffer(workspace, 1);
  args.m_pad = ws.m_pad;
  int64_t const vm = V / main_tile_n * main_tile_n;  // whole main tiles
  gemm::Operands op;
  op.M = M, op.K = K;
  op.A = h, op.lda = ldh;
  op.ldb = ldw;
  op.ldd = ld_e;
  // Raster along N, swizzle 8: linear_rowscale_lse's measured default for the same GEMM with an exp per element (the
  // weight streams from DRAM once per wave of row bands; linear_rowscale_lse.cu).
  if (vm > 0) {
    op.N = vm;
    op.B = w;
    op.D = e;
    args.tile_base = 0;
    args.col_base = 0;
    main.run(op, args, raster_n(8), nullptr, 0, stream);
  }
  if (N > vm) {  // the columns' offset keeps the TMA bases 16-byte aligned: vm rows of w, vm elements of E
    op.N = N - vm;
    op.B = static_cast<char const*>(w) + vm * ldw * 2;
    op.D = static_cast<char*>(e) + vm * 2;
    args.vocab = V - vm;
    args.tile_base = vm / main_tile_n;
    args.col_base = vm;
    tail.run(op, args, raster_n(8), nullptr, 0, stream);
  }
  return ws;
}

}  // namespace coda::ops
