// RowPartials: a custom sm90 EVT node that writes per-(row, N-tile) sums of f(v) over the tile's columns,
// partials[t * Mpad + m] = sum_{n in N-tile t} f(v[m, n]) (fp32), and returns its input unchanged (F1's sums of
// squares, finished by kernels::rmsnorm_rstd in a fixed order: deterministic, no atomics, no CUTLASS workspace).
// The layout is that of Sm90ColReduction<..., FinalReduction = false>: Mpad = round_up(M, CTA_M), batch L = 1.
//
// Why not Sm90ColReduction, which computes the same partials: it keeps one register per row the thread owns in
// the tile (4 in a 128-row pingpong tile) through the whole epilogue; with the 192 accumulators of a pingpong
// 128x192 tile that spilled (12 bytes; without the reduction, none). Here the running sums live in thread-private
// shared-memory words, as B3's row terms do (swiglu_bwd_pair.hpp): each visit adds its subtile's two row sums
// (rows r and r + 8 of the wgmma fragment) to the thread's pair for that epi_m, and end() merges the quad (the 4
// lanes sharing a row; one warp along N) with two xor-shuffles, lane 0 of the quad writing the row's partial.
// Pingpong's two consumer warpgroups share the words; their epilogues are serialized by the kernel's order
// barrier, and a tile's first subtile along N writes its words without reading them.
//
// Requirements: the EpilogueTileAuto fragment of 16 elements per thread (element 4j + 2h + e at (r + 8h,
// c + 8j + e), CUTLASS_EVT.md section 4); kThreads the epilogue's thread count (128 pingpong, 256 cooperative),
// whose epilogue subtile is 64 * kThreads / 128 rows tall; batch L = 1; f(0) = 0 and an input of 0 at columns
// >= N, which the node sums unmasked. F1's x there is 0 + 0: TMA zero-fills the weight rows and the residual
// columns past N. (Per-element column masks, even behind a per-subtile branch, made pingpong 128x192 spill 68
// bytes; without them, none. So where a row of A holds an infinity, its padding columns give Inf * 0 = NaN and
// the row's rstd is NaN, where Sm90ColReduction's masks gave 0; either way that row's outputs are not finite.)
// Rows >= M are not written. Not for stream-K kernels: their separate-reduction subtiles (subtile_idx != -1)
// visit one subtile per call, which the first-subtile-writes rule above does not cover.
// F1's GPU tests check the partials through rstd (every compiled config, awkward M and N).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#endif

namespace coda::epilogue {

#if defined(__CUDACC__)

/// f(v) = v * v (F1's sums of squares).
struct Square {
  template <class T>
  CUTLASS_HOST_DEVICE T operator()(T v) const {
    return v * v;
  }
};

/// The node: Fn is a default-constructible `float operator()(float) const` (device).
template <class Fn, class CtaTileShapeMNK, int kThreads>
struct Sm90RowPartials : Sm90StoreOnlyNode {
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  // Subtiles along M: the sm90 epilogue tile is 64 rows per 128 threads (EpilogueTileAuto).
  static constexpr int kEpiMMax = kTileM * 128 / (64 * kThreads) > 0 ? kTileM * 128 / (64 * kThreads) : 1;

  struct SharedStorage {
    alignas(128) float rows[2 * kEpiMMax * kThreads];  // [epi_m][thread][h]: running sums of rows r, r + 8
  };
  struct Arguments {
    float* ptr_partials = nullptr;  ///< [ceil(N / CTA_N), Mpad] fp32 out
  };
  /// Arguments plus the extents, so the per-thread callbacks keep no copies of them in registers.
  struct Params : Arguments {
    int M = 0;
    int N = 0;
    int64_t m_pad = 0;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    Params p;
    static_cast<Arguments&>(p) = args;
    p.M = static_cast<int>(cute::get<0>(problem_shape));
    p.N = static_cast<int>(cute::get<1>(problem_shape));
    p.m_pad = (static_cast<int64_t>(p.M) + kTileM - 1) / kTileM * kTileM;
    return p;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return cute::get<3>(problem_shape) == 1 && args.ptr_partials != nullptr;
  }

  CUTLASS_HOST_DEVICE Sm90RowPartials() {}
  CUTLASS_HOST_DEVICE Sm90RowPartials(Params const& params, SharedStorage const& shared)
      : params_ptr(&params), smem_rows(const_cast<float*>(shared.rows)) {}

  Params const* params_ptr = nullptr;
  float* smem_rows = nullptr;

  /// CoordTensor: absolute (m, n, l) of every fragment element, per (epi_m, epi_n).
  template <class CoordTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    static constexpr int kEpiM = decltype(cute::size<3>(cute::declval<CoordTensor>()))::value;
    static_assert(kEpiM <= kEpiMMax, "SharedStorage::rows is sized for the EpilogueTileAuto subtiles along M");

    CUTLASS_DEVICE ConsumerStoreCallbacks(CoordTensor&& coords, Params const* params, uint32_t smem_thread)
        : tC_cD(cute::forward<CoordTensor>(coords)), params(params), smem_thread(smem_thread) {}

    CoordTensor tC_cD;
    Params const* params;
    uint32_t smem_thread;  // shared-window address of this thread's pair of epi_m = 0; epi_m e is e * kThreads * 8 on

    CUTLASS_DEVICE uint32_t rows_addr(int e) const { return smem_thread + static_cast<uint32_t>(e * kThreads * 8); }

    /// Row r and column c of fragment element 0 of subtile (epi_m, epi_n).
    CUTLASS_DEVICE cute::tuple<int, int> origin(int epi_m, int epi_n) const {
      auto const c = tC_cD(0, 0, 0, epi_m, epi_n);
      return {static_cast<int>(cute::get<0>(c)), static_cast<int>(cute::get<1>(c))};
    }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      static_assert(FragmentSize == 16, "expects the EpilogueTileAuto wgmma fragment: 4 column groups x 2 rows x 2 cols");
      Fn f{};
      float part[2] = {0.0f, 0.0f};
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < FragmentSize; ++k) part[(k >> 1) & 1] += f(static_cast<float>(frg_input[k]));
      // Static smem indices only (a dynamic epi_m index would move the pair into local memory).
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < kEpiM; ++e) {
        if (e == epi_m) {
          float r0 = 0.0f, r8 = 0.0f;
          if (epi_n != 0) asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(r0), "=f"(r8) : "r"(rows_addr(e)));
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(rows_addr(e)), "f"(r0 + part[0]), "f"(r8 + part[1])
                       : "memory");
        }
      }
      return frg_input;
    }

    CUTLASS_DEVICE void end() {
      Params const& p = *params;
      auto const [r0, c0] = origin(0, 0);
      int const tile_m0 = r0 / kTileM * kTileM, tile_n = c0 / kTileN;
      // A CTA entirely outside the problem (a partially out-of-bounds cluster) writes nothing; the condition is
      // uniform over the CTA, so no lane skips a shuffle another takes.
      if (tile_m0 >= p.M || tile_n * kTileN >= p.N) return;
      float* const partials = p.ptr_partials + p.m_pad * tile_n;
      bool const writer = (threadIdx.x & 3) == 0;
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < kEpiM; ++e) {
        int const r = cute::get<0>(origin(e, 0));
        float rows[2];
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(rows[0]), "=f"(rows[1]) : "r"(rows_addr(e)));
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          float v = rows[h];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          int const m = r + 8 * h;
          if (writer && m < p.M) partials[m] = v;
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto coords = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        cute::make_identity_tensor(cute::make_shape(M, N, L)), args.tile_shape_mnk, args.tile_coord_mnkl,
        args.epi_tile, args.tiled_copy, args.thread_idx);
    static_assert(decltype(cute::size(args.tiled_copy))::value == kThreads,
                  "Sm90RowPartials: kThreads must be the epilogue's thread count (one smem word pair per thread)");
    uint32_t const smem_thread = static_cast<uint32_t>(__cvta_generic_to_shared(smem_rows)) +
                                 static_cast<uint32_t>(args.thread_idx % kThreads) * 8u;
    return ConsumerStoreCallbacks<decltype(coords)>(cute::move(coords), params_ptr, smem_thread);
  }
};

#endif  // __CUDACC__

}  // namespace coda::epilogue
