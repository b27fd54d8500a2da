// The named mainloop configs of CODA's fixed GEMM (CUTLASS types: include only from the generated kernel instances
// and other kernel translation units). A config fixes the CTA tile, the cluster, the warp-specialized schedule and the
// tile scheduler; everything else (operand types and layouts, the epilogue program) is a FusedLinear parameter.
// docs/GEMM.md gives the reasons for this set.
#pragma once

#include "gemm/ragged_scheduler.hpp"

#include <cute/tensor.hpp>
#include <cutlass/epilogue/dispatch_policy.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include <type_traits>

namespace coda::gemm::config {

/// Mainloop config: CTA tile TileM x TileN x 64 (64 bf16 = one 128-byte swizzle row of K), cluster
/// ClusterM x ClusterN, pingpong or cooperative schedule, persistent or stream-K tile scheduler.
template <int TileM, int TileN, int ClusterM, int ClusterN, bool Pingpong, bool StreamK>
struct Mainloop {
  static_assert(!(Pingpong && StreamK), "CUTLASS sm90 pingpong kernels do not support the stream-K scheduler");
  static_assert(Pingpong || TileM >= 128, "cooperative kernels stack two consumer warpgroups along M: tile M >= 128");

  static constexpr int kTileM = TileM, kTileN = TileN, kTileK = 64;
  static constexpr int kClusterM = ClusterM, kClusterN = ClusterN;
  static constexpr bool kPingpong = Pingpong, kStreamK = StreamK;
  /// D smem buffers of the epilogue: 0 for the builder's (2); more for programs without a C source that name no
  /// policy of their own (gemm::DeepStorePolicy, fused_linear.hpp). pp_128x192x64_c2x1_d6's 6 come from its program.
  static constexpr int kStagesD = 0;

  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using KernelSchedule = std::conditional_t<Pingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                            cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<Pingpong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using Scheduler = std::conditional_t<StreamK, cutlass::gemm::StreamKScheduler, cutlass::gemm::PersistentScheduler>;
};

/// Default: 731-797 TFLOP/s plain bf16 on H200 (CUTLASS_EVT.md section 7).
struct Coop128x256x64C2x1 : Mainloop<128, 256, 2, 1, false, false> {
  static constexpr char const* kName = "coop_128x256x64_c2x1";
};
/// Same tile without multicast: no cluster-pair rounding of the grid (small or odd tile counts).
struct Coop128x256x64C1x1 : Mainloop<128, 256, 1, 1, false, false> {
  static constexpr char const* kName = "coop_128x256x64_c1x1";
};
/// Pingpong overlaps one warpgroup's epilogue with the other's MMA: epilogue-heavy ops and small K.
struct Pp128x128x64C2x1 : Mainloop<128, 128, 2, 1, true, false> {
  static constexpr char const* kName = "pp_128x128x64_c2x1";
};
/// Pingpong 128x192 (192 fp32 accumulators per consumer thread): 1.5x the 128x128 tile's FLOPs for 1.25x its operand
/// bytes, while one warpgroup's epilogue still hides behind the other's MMA; quack's fastest sm90 config on the LLaMA
/// gate/up shapes (bench/results/vs_quack/). 192 divides few LLaMA widths (gate/up 16384 / 192 = 85.3 tiles), so
/// it runs on the tile scheduler without swizzle padding (ragged_scheduler.hpp): CUTLASS's pads 86 N tiles to 88
/// with swizzle 8, and llama3-1B down (N = 2048: 11 tiles to 16) ran 1.88x cuBLAS on it against 1.10x ragged.
struct Pp128x192x64C2x1 : Mainloop<128, 192, 2, 1, true, false> {
  static constexpr char const* kName = "pp_128x192x64_c2x1";
  using Scheduler = RaggedPersistentScheduler;
};
/// The same mainloop for the overwrite-only plain epilogue with 6 D store buffers (ScaleEpilogue<6>), where
/// pp_128x192x64_c2x1's bf16 C source shares 4 buffers with D and keeps one TMA store in flight. Pinned at raster m,
/// swizzle 8 on the llama3 gate/up shapes under sustained load: 0.94-0.96x cuBLAS at 1B, 0.94-1.04x at 8B/70B over
/// three runs (bench/results/vs_quack/deep_store_ab/); not better than the tuner's picks on the down shapes.
struct Pp128x192x64C2x1D6 : Pp128x192x64C2x1 {
  static constexpr char const* kName = "pp_128x192x64_c2x1_d6";
};
/// The same mainloop with 64x16 epilogue subtiles (8 accumulator elements per thread per visit, half of
/// EpilogueTileAuto's 64x32): a smaller epilogue live set beside the 192 accumulators, for programs that load C
/// and would spill at the automatic subtile (linear_swiglu_bwd_zdz: 124 bytes at 64x32).
struct Pp128x192x64C2x1E16 : Pp128x192x64C2x1 {
  static constexpr char const* kName = "pp_128x192x64_c2x1_e16";
  using EpilogueTile = cute::Shape<cute::_64, cute::_16>;
};
/// Pingpong 128x128 with one 64x128 epilogue subtile per half tile (64 accumulator elements per thread per visit):
/// every visit holds whole rows of the N tile, for programs that reduce over 64- or 128-column groups of a row (the
/// per-head norm of linear_rowscale_qk_norm_rope, epilogue/qk_norm_rope.hpp).
struct Pp128x128x64C2x1E128 : Pp128x128x64C2x1 {
  static constexpr char const* kName = "pp_128x128x64_c2x1_e128";
  using EpilogueTile = cute::Shape<cute::_64, cute::_128>;
};
/// The same 128x192 tile with linear_swiglu_bwd_zdz's earlier 64x16 epilogue code: dz in chunks of two pairs with
/// both row pointers kept (`kNarrowChunk`, epilogue/swiglu_bwd_pair.hpp): 60 bytes of spill stores where e16 has 12,
/// yet 0.95-0.98 of e16's time under sustained load in one run at llama3-8B/70B (bench/results/vs_quack/b3_e16h/):
/// linear_swiglu_bwd_zdz's pick there.
struct Pp128x192x64C2x1E16h : Pp128x192x64C2x1E16 {
  static constexpr char const* kName = "pp_128x192x64_c2x1_e16h";
  static constexpr int kNarrowChunk = 4;
};
/// The cooperative 128x256 tile with the head-aware RoPE nodes keeping the tile's first head's sine and cosine for its
/// later heads (`kCacheSinCos`: linear_rowscale_qk_norm_rope's prepass node, linear_rowscale_rope's RopeHeads), two
/// registers per pair and row, for half the MUFU (the quarter-rate XU pipe) at head_dim 128. linear_rowscale_rope's
/// pick from d = 4096 (the QK-norm op no longer compiles it: it tied coop_128x256x64_c2x1 there,
/// bench/results/vs_quack/qk_angle_reuse/).
struct Coop128x256x64C2x1Sc : Coop128x256x64C2x1 {
  static constexpr char const* kName = "coop_128x256x64_c2x1_sc";
  static constexpr bool kCacheSinCos = true;
};
/// Pingpong 192x128 (192 fp32 accumulators per consumer thread, three m64 GMMA blocks per warpgroup) on a 2-CTA cluster
/// along N (the A tile multicast): quack's fastest qk_rope tile at Qwen3-4B to llama3-70B (pp_192x128_c1x2,
/// 0.98-1.04x cuBLAS on an H100, bench/results/vs_quack/qk_192/). 128 columns hold whole heads of 64 and 128, as the
/// head-aware nodes need. 8192 / 192 leaves a partial M tile: the ragged scheduler (no swizzle padding) as for the
/// 128x192 tile.
struct Pp192x128x64C1x2 : Mainloop<192, 128, 1, 2, true, false> {
  static constexpr char const* kName = "pp_192x128x64_c1x2";
  using Scheduler = RaggedPersistentScheduler;
};
/// The same mainloop with 3 D store buffers (and 3 for the QK-norm program's z store): two of a tile's TMA stores
/// drain behind the next subtiles' math, where with the builder's 2 the epilogue waits after every one of the tile's
/// 12 subtiles until at most one is in flight (quack keeps ~5 in flight on this tile, with 4 mainloop stages). 3 keeps
/// the QK-norm kernel's 5 mainloop stages (4 buffers each for D and z leave room for 4). Pins of linear_rowscale_rope,
/// linear_rowscale_qk_norm_rope and linear_rowscale, to time beside the 2-buffer kernel.
struct Pp192x128x64C1x2D3 : Pp192x128x64C1x2 {
  static constexpr char const* kName = "pp_192x128x64_c1x2_d3";
  static constexpr int kStagesD = 3;
};
/// The same mainloop with 64x64 epilogue subtiles: 6 visits per tile instead of EpilogueTileAuto's 12 at 64x32, so half
/// the epilogue's named barriers, TMA stores and store waits, for 32 accumulator elements per thread per visit.
/// linear_rowscale_rope's head-aware program fits it without spill (5 mainloop stages); the QK-norm program would spill
/// 220 bytes and drop to 4 stages (D and z at 8 KB a buffer), so it does not compile it. A pin of linear_rowscale_rope.
struct Pp192x128x64C1x2E64 : Pp192x128x64C1x2 {
  static constexpr char const* kName = "pp_192x128x64_c1x2_e64";
  using EpilogueTile = cute::Shape<cute::_64, cute::_64>;
};
/// The 64x64 subtiles with 3 D store buffers (24 KB; 5 mainloop stages kept): a pin of linear_rowscale_rope.
struct Pp192x128x64C1x2E64D3 : Pp192x128x64C1x2E64 {
  static constexpr char const* kName = "pp_192x128x64_c1x2_e64_d3";
  static constexpr int kStagesD = 3;
};
/// The fp32 wgrad's add-into-D kernel (plain::ReduceAddEpilogue): the same mainloop under its own name.
struct Pp128x128x64C2x1Radd : Pp128x128x64C2x1 {
  static constexpr char const* kName = "pp_128x128x64_c2x1_radd";
};
/// Pingpong 128x64 (64 accumulators per consumer thread): room for an epilogue's per-element masks, on a sliver of
/// a problem (the LM head's last vocabulary columns, ops/linear_rowscale_exp).
struct Pp128x64x64C2x1 : Mainloop<128, 64, 2, 1, true, false> {
  static constexpr char const* kName = "pp_128x64x64_c2x1";
};
/// Pingpong with wide N tiles (each warpgroup owns 64 x 256): fewer B loads per FLOP at small M tiles.
struct Pp64x256x64C2x1 : Mainloop<64, 256, 2, 1, true, false> {
  static constexpr char const* kName = "pp_64x256x64_c2x1";
};
/// Tall cooperative tile; cluster along N so a cluster covers 256 x 256.
struct Coop256x128x64C1x2 : Mainloop<256, 128, 1, 2, false, false> {
  static constexpr char const* kName = "coop_256x128x64_c1x2";
};
/// Cooperative 128x256 with the stream-K scheduler: Decomposition picks data-parallel, stream-K or split-K at run
/// time (3-5 % on wave-quantised shapes, CUTLASS_EVT.md section 7).
struct Sk128x256x64C2x1 : Mainloop<128, 256, 2, 1, false, true> {
  static constexpr char const* kName = "sk_128x256x64_c2x1";
};

}  // namespace coda::gemm::config
