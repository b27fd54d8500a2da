// What CODA's custom sm90 EVT nodes share (CUTLASS-heavy; include only from epilogue node headers):
//
// * Sm90StoreOnlyNode: the base of a node that loads nothing through the producer warp, reads no C and uses no
//   CUTLASS workspace (its outputs are the caller's buffers): the workspace and producer-load members every node
//   must have, as no-ops, and Params = Arguments. A node derives from it and defines Arguments, Params,
//   SharedStorage, can_implement, its constructors and get_consumer_store_callbacks (and to_underlying_arguments
//   when its Params differ).
// * line_partition(): the thread's partition of an (M, N, L) layout that is stride 0 along N (kPerRow) or along M,
//   as Sm90ColReduction / Sm90RowReduction build their register state: make_tensor_like<float> of it (or of one
//   subtile of it) keeps one register per row / column the thread owns.
// * fragment_origin(), CoordCallbacks: a visit's first row and column; the callbacks' coordinates and Params.
// * kAccumulatorsWithRoom: when a program may keep per-tile state in registers beside the accumulators.
// * lanes_of_warp(): for a consumer-store callback's tiled copy, the (m, n) -> lane layout of one epilogue subtile
//   and this lane's (m, n) in it (how Sm90RowReduction / Sm90ColReduction find the lanes sharing a row or a column),
//   with the check that every warp covers the subtile's full width (warps stacked along M, as in the sm90
//   pingpong and cooperative kernels): then merging the lanes along N covers a whole row, and the lanes along M
//   of one warp hold one column's share of that warp.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>  // before the visitor header, which uses it without including it
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include <cstddef>

namespace coda::epilogue {

struct Sm90StoreOnlyNode {
  /// Params = Arguments (a node with derived Params defines its own).
  template <class ProblemShape, class Arguments>
  static constexpr Arguments to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape, class Arguments>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape, class Arguments>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }
};

/// (CPY, CPY_M, CPY_N, EPI_M, EPI_N) partition of a per-row (kPerRow: stride 0 along N) or per-column (stride 0
/// along M) fp32 layout over the problem; only its layout is used (the pointer is null).
template <bool ReferenceSrc, bool kPerRow, class Args>
CUTLASS_DEVICE auto line_partition(Args const& args) {
  using namespace cute;
  auto const M = get<0>(args.problem_shape_mnkl), N = get<1>(args.problem_shape_mnkl);
  auto const L = get<3>(args.problem_shape_mnkl);
  auto const partition = [&args](auto const& layout) {
    return cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        make_tensor(make_gmem_ptr<float>(nullptr), layout), args.tile_shape_mnk, args.tile_coord_mnkl,
        args.epi_tile, args.tiled_copy, args.thread_idx);
  };
  if constexpr (kPerRow) {
    return partition(make_layout(make_layout(M), make_layout(N, _0{}), make_layout(L, _0{})));
  } else {
    return partition(make_layout(make_layout(M, _0{}), make_layout(N), make_layout(L, _0{})));
  }
}

/// (CPY, CPY_M, CPY_N, EPI_M, EPI_N) partition of the problem's (m, n, l) coordinates for the thread: each fragment
/// element's absolute position (an identity tensor, so no registers per element beyond the tile's origin).
template <bool ReferenceSrc, class Args>
CUTLASS_DEVICE auto fragment_coords(Args const& args) {
  auto const M = cute::get<0>(args.problem_shape_mnkl), N = cute::get<1>(args.problem_shape_mnkl);
  auto const L = cute::get<3>(args.problem_shape_mnkl);
  return cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
      cute::make_identity_tensor(cute::make_shape(M, N, L)), args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile,
      args.tiled_copy, args.thread_idx);
}

/// Row r and column c of fragment element 0 of subtile (epi_m, epi_n), from the thread's (CPY, CPY_M, CPY_N, EPI_M,
/// EPI_N) coordinate partition (sm90_partition_for_epilogue of an identity tensor).
template <class CoordTensor>
CUTLASS_DEVICE cute::tuple<int, int> fragment_origin(CoordTensor const& tC_cD, int epi_m, int epi_n) {
  auto const c = tC_cD(0, 0, 0, epi_m, epi_n);
  return {static_cast<int>(cute::get<0>(c)), static_cast<int>(cute::get<1>(c))};
}

/// The consumer-store callbacks' common half of a node that reads, per visit, its fragment's coordinates and its Params
/// (through the pointer: the constant bank, no register copies through the tile). A node's callbacks derive from it
/// and add visit().
template <class CoordTensor, class Params>
struct CoordCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
  CUTLASS_DEVICE CoordCallbacks(CoordTensor&& coords, Params const* params)
      : tC_cD(cute::forward<CoordTensor>(coords)), params(params) {}

  CoordTensor tC_cD;     // absolute (m, n, l) of every fragment element, per (epi_m, epi_n)
  Params const* params;
};

/// The most fp32 accumulators per consumer thread that leave registers for per-tile epilogue state kept across visits
/// (Sm90ColBroadcast's rows, the head-aware nodes' angle cache): the 128x128 pingpong and 128x256 cooperative tiles
/// hold 128; the 192-accumulator tiles (pingpong 128x192, 192x128) spill such state (the QK-norm prepass on 192x128:
/// 144 bytes with Sm90ColBroadcast's rstd, 116 with it read per visit).
inline constexpr int kAccumulatorsWithRoom = 128;

/// {lane_layout_MN, lane_mn}: the subtile's (m, n) -> lane layout and this lane's coordinate in it.
template <bool ReferenceSrc, class TiledCopy>
CUTLASS_DEVICE auto lanes_of_warp(TiledCopy const& tiled_copy) {
  using namespace cute;
  auto mn_shape = shape(typename TiledCopy::Tiler_MN{});
  auto ref_layout_MN = [&]() {
    if constexpr (ReferenceSrc) {
      return right_inverse(tiled_copy.get_layoutS_TV()).with_shape(mn_shape);
    } else {
      return right_inverse(tiled_copy.get_layoutD_TV()).with_shape(mn_shape);
    }
  }();  // subtile (m, n) -> thread-value index
  using Warps = Int<TiledCopy::TiledNumThr::value / cutlass::NumThreadsPerWarp>;
  auto tv2lane = Layout<Shape<Int<cutlass::NumThreadsPerWarp>, Warps, _1>, Stride<_1, _0, _0>>{};
  auto ref2lane = composition(tv2lane, ref_layout_MN);
  auto lane_layout_MN = make_layout(filter(get<0>(ref2lane)), filter(get<1>(ref2lane)));  // (m, n) -> lane
  auto lane_mn = idx2crd(right_inverse(lane_layout_MN)(cutlass::canonical_lane_idx()), shape(lane_layout_MN));
  auto tv2warp = Layout<Shape<Int<cutlass::NumThreadsPerWarp>, Warps, _1>, Stride<_0, _1, _0>>{};
  auto ref2warp = composition(tv2warp, ref_layout_MN);
  static_assert(decltype(size(filter(get<1>(ref2warp))))::value == 1,
                "one warp along N per epilogue subtile (warps stacked along M) is assumed");
  return make_tuple(lane_layout_MN, lane_mn);
}

}  // namespace coda::epilogue
