// ColumnPartials: a custom sm90 EVT node that writes per-(M-tile, column) sums of its input over the tile's rows,
// partials[t * ld + n] = sum_{m in M-tile t} v[m, n], and returns its input unchanged (linear_residual_rmsnorm_bwd's
// dgamma partials, finished by kernels::column_sum in a fixed order: deterministic, no atomics, no CUTLASS workspace).
//
// Why not Sm90RowReduction, which computes the same partials: in the pingpong kernel its per-thread state went to the
// stack (linear_residual_rmsnorm_bwd with it: a 1136-byte frame and local loads/stores every subtile, 59 % of warp
// stalls on L1TEX at the llama3-1B q/k/v dgrad; without it: 0 bytes). This node keeps only the current epilogue column
// strip in registers (one register per column the thread owns in the subtile, the rows folded in by stride-0 M modes):
//   visit   adds the fragment (rows >= M and columns >= N masked to 0) into the strip registers;
//   reduce  after the strip's last M-subtile: xor butterfly over the lanes along M (all lanes of the warp take
//           part), lane m = 0 writes the warp's sums to its own smem row [warp][column], registers reset;
//           after the tile's last subtile: barrier, thread t < TileN adds the warps' rows in order 0, 1, ... and
//           writes partials[t_m * ld + n0 + t] (coalesced), barrier.
// The smem rows are written by one lane per (warp, column) and read after a barrier: no races, and every bit of
// the result is fixed by the tile order alone. Pingpong's two consumer warpgroups share the buffer; their
// epilogues are serialized by the kernel's order barrier.
//
// Requirements: warps stacked along M in the epilogue subtile (one warp along N, as in the sm90 pingpong and
// cooperative kernels); ld >= round_up(N, TileN) (every column of an in-bounds tile is written, 0 past N).
//
// Host reference of the node's semantics: column_partials_reference() below.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/numeric_conversion.h>

#include "epilogue/node_base.hpp"
#endif

namespace coda::epilogue {

/// Host reference: partials[t * ld + n] = sum_{m in [t*tile_m, min(M, (t+1)*tile_m))} v[m * ldv + n] for n < N,
/// 0 for N <= n < ld (summation order differs from the node's; compare with a tolerance).
template <class T>
std::vector<T> column_partials_reference(std::vector<T> const& v, int64_t M, int64_t N, int64_t ldv, int64_t tile_m,
                                         int64_t ld) {
  int64_t const tiles = (M + tile_m - 1) / tile_m;
  std::vector<T> out(static_cast<size_t>(tiles * ld), T(0));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) out[static_cast<size_t>((m / tile_m) * ld + n)] += v[static_cast<size_t>(m * ldv + n)];
  }
  return out;
}

#if defined(__CUDACC__)

/// kWarps: the epilogue's warps (4 for pingpong, 8 for cooperative), one smem row each.
template <class TileShape, int kWarps>
struct Sm90ColumnPartials : Sm90StoreOnlyNode {
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static_assert(kWarps * kTileN * sizeof(float) % 128 == 0, "smem rows: a multiple of 128 bytes");

  struct SharedStorage {
    alignas(128) float rows[kWarps][kTileN];
  };
  struct Arguments {
    float* ptr = nullptr;  ///< [ceil(M / TileM), ld] fp32
    int64_t ld = 0;        ///< >= round_up(N, TileN)
  };
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto const N = cute::get<1>(problem_shape);
    return args.ptr != nullptr && args.ld >= (static_cast<int64_t>(N) + kTileN - 1) / kTileN * kTileN;
  }

  CUTLASS_HOST_DEVICE Sm90ColumnPartials() {}
  CUTLASS_HOST_DEVICE Sm90ColumnPartials(Params const& params, SharedStorage const& shared)
      : params_ptr(&params), smem(const_cast<SharedStorage*>(&shared)) {}

  Params const* params_ptr = nullptr;
  SharedStorage* smem = nullptr;


  /// STensor: the strip accumulator (CPY, CPY_M, CPY_N), stride 0 along M; CTensor: the thread's fragment
  /// coordinates relative to its first element; Residue: (M, N) minus that first element's coordinate.
  template <class STensor, class CTensor, class Residue, class TileResidue, class LaneLayout, class LaneCoord>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(STensor&& strip, CTensor crd, Residue residue, TileResidue tile_residue,
                                          LaneLayout lane_layout, LaneCoord lane_mn, int col0, int warp,
                                          int thread_idx, float* out, SharedStorage* smem)
        : tCrStrip(cute::forward<STensor>(strip)),
          tCcD(crd),
          residue_tCcD(residue),
          residue_cD(tile_residue),
          lane_layout_MN(lane_layout),
          lane_mn(lane_mn),
          col0(col0),
          warp(warp),
          thread_idx(thread_idx),
          out(out),
          smem(smem) {}

    STensor tCrStrip;
    CTensor tCcD;
    Residue residue_tCcD;
    TileResidue residue_cD;
    LaneLayout lane_layout_MN;
    LaneCoord lane_mn;
    int col0;        // tile column of the thread's first fragment element
    int warp;        // warp index along M (smem row)
    int thread_idx;  // in the epilogue's thread group
    float* out;      // this tile's partials row: partials + t_m * ld + n0
    SharedStorage* smem;

    CUTLASS_DEVICE void begin() { cute::fill(tCrStrip, 0.0f); }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m,
                              int epi_n, cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      using cute::_;
      cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> convert{};
      cutlass::Array<float, FragmentSize> const v = convert(frg_input);
      auto crd = tCcD(_, _, _, epi_m, epi_n);
      int const base = epi_v * FragmentSize;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        if (cute::elem_less(crd(base + i), residue_tCcD)) tCrStrip(base + i) += v[i];
      }
      return frg_input;
    }

    template <class STensorD, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensorD&&, SyncFn const& sync_fn, int epi_m, int epi_n, bool is_last_iteration,
                               VTensor) {
      using cute::_;
      constexpr int kEpiM = decltype(cute::size<3>(tCcD))::value;
      // A CTA entirely outside the problem (a partially out-of-bounds cluster) writes nothing; the condition is
      // uniform over the CTA, so every thread skips the same barriers.
      if (!cute::elem_less(cute::make_coord(0, 0), residue_cD)) return;
      if (epi_m == kEpiM - 1) {
        auto sums = cute::filter_zeros(tCrStrip);
        auto crd = cute::filter_zeros(tCcD(_, _, _, epi_m, epi_n), tCrStrip.stride());
        constexpr int kLanesM = decltype(cute::size<0>(lane_layout_MN))::value;
        static_assert((kLanesM & (kLanesM - 1)) == 0, "lanes along M must be a power of two");
        CUTLASS_PRAGMA_UNROLL
        for (int k = kLanesM / 2; k > 0; k /= 2) {
          int const lane_mask = static_cast<int>(lane_layout_MN(k, 0));
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < cute::size(sums); ++r) sums(r) += __shfl_xor_sync(0xffffffffu, sums(r), lane_mask);
        }
        if (cute::get<0>(lane_mn) == 0) {
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < cute::size(sums); ++r) {
            smem->rows[warp][col0 + static_cast<int>(cute::get<1>(crd(r)))] = sums(r);
          }
        }
        cute::fill(tCrStrip, 0.0f);
      }
      if (is_last_iteration) {
        sync_fn();
        for (int t = thread_idx; t < kTileN; t += kWarps * cutlass::NumThreadsPerWarp) {
          float s = 0.0f;
          CUTLASS_PRAGMA_UNROLL
          for (int w = 0; w < kWarps; ++w) s += smem->rows[w][t];
          out[t] = s;
        }
        sync_fn();
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;

    // Strip accumulator: one subtile of a per-column partition (stride 0 along M), so rows fold into one register
    // per owned column.
    Tensor tCrStrip =
        make_tensor_like<float>(line_partition<ReferenceSrc, /*kPerRow=*/false>(args)(_, _, _, _0{}, _0{}));

    // Lanes sharing a column: those along M of the warp (one warp along N: lanes_of_warp checks it).
    auto lanes = lanes_of_warp<ReferenceSrc>(args.tiled_copy);
    auto lane_layout_MN = get<0>(lanes);
    auto lane_mn = get<1>(lanes);
    constexpr int kThreads = decltype(args.tiled_copy)::TiledNumThr::value;
    static_assert(kThreads == kWarps * cutlass::NumThreadsPerWarp, "kWarps must be the epilogue's warp count");

    // Tile column of the thread's first element: absolute (N - residue) minus the tile's first column.
    int const n0 = static_cast<int>(n) * kTileN;
    int const col0 = static_cast<int>(static_cast<int64_t>(N) - get<1>(args.residue_tCcD)) - n0;
    int64_t const tiles_m = (static_cast<int64_t>(M) + kTileM - 1) / kTileM;
    float* const out = params_ptr->ptr + (static_cast<int64_t>(m) + tiles_m * static_cast<int64_t>(l)) * params_ptr->ld + n0;

    return ConsumerStoreCallbacks<decltype(tCrStrip), decltype(args.tCcD), decltype(args.residue_tCcD),
                                  decltype(args.residue_cD), decltype(lane_layout_MN), decltype(lane_mn)>(
        cute::move(tCrStrip), args.tCcD, args.residue_tCcD, args.residue_cD, lane_layout_MN, lane_mn, col0,
        args.thread_idx / cutlass::NumThreadsPerWarp, args.thread_idx, out, smem);
  }
};

#endif  // __CUDACC__

}  // namespace coda::epilogue
