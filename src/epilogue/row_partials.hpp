// RowPartials: a custom sm90 EVT node that writes per-(row, N-tile) sums of f(v) over the tile's columns,
// partials[t * Mpad + m] = sum_{n in N-tile t} f(v[m, n]) (fp32), and returns its input unchanged
// (linear_residual_rmsnorm's sums of squares, finished by kernels::rmsnorm_rstd in a fixed order: deterministic, no
// atomics, no CUTLASS workspace).
// The layout is that of Sm90ColReduction<..., FinalReduction = false>: Mpad = round_up(M, CTA_M), batch L = 1.
//
// Why not Sm90ColReduction, which computes the same partials: it keeps one register per row the thread owns in the tile
// (4 in a 128-row pingpong tile) through the whole epilogue; with the 192 accumulators of a pingpong 128x192 tile that
// spilled (12 bytes; without the reduction, none). Here the running sums live in thread-private shared-memory words
// (smem_row_sums.hpp, shared with linear_swiglu_bwd_zdz's node).
//
// Requirements: those of SmemRowSums (a wgmma fragment of 64-row subtiles per 128 threads, kThreads the epilogue's
// thread count, not stream-K); batch L = 1; f(0) = 0 and an input of 0 at columns >= N, which the node sums unmasked.
// linear_residual_rmsnorm's x there is 0 + 0: TMA zero-fills the weight rows and the residual columns past N.
// (Per-element column masks, even behind a per-subtile branch, made pingpong 128x192 spill 68 bytes; without them,
// none. So where a row of A holds an infinity, its padding columns give Inf * 0 = NaN and the row's rstd is NaN, where
// Sm90ColReduction's masks gave 0; either way that row's outputs are not finite.) Rows >= M are not written.
// linear_residual_rmsnorm's GPU tests check the partials through rstd (every compiled config, awkward M and N).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#include "epilogue/smem_row_sums.hpp"
#endif

namespace coda::epilogue {

#if defined(__CUDACC__)

/// f(v) = v * v (linear_residual_rmsnorm's sums of squares).
struct Square {
  template <class T>
  CUTLASS_HOST_DEVICE T operator()(T v) const {
    return v * v;
  }
};

/// Arguments of Sm90RowPartials.
struct RowPartialsArguments {
  float* ptr_partials = nullptr;  ///< [ceil(N / CTA_N), Mpad] fp32 out
};

/// The node: Fn is a default-constructible `float operator()(float) const` (device).
template <class Fn, class CtaTileShapeMNK, int kThreads>
struct Sm90RowPartials
    : SmemRowSumsNode<Sm90RowPartials<Fn, CtaTileShapeMNK, kThreads>, RowPartialsArguments,
                      cute::size<0>(CtaTileShapeMNK{}), kThreads> {
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  using Base = SmemRowSumsNode<Sm90RowPartials, RowPartialsArguments, kTileM, kThreads>;
  using typename Base::Arguments;
  using typename Base::Params;
  using Base::Base;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return cute::get<3>(problem_shape) == 1 && args.ptr_partials != nullptr;
  }

  /// CoordTensor: absolute (m, n, l) of every fragment element, per (epi_m, epi_n).
  template <class CoordTensor>
  struct ConsumerStoreCallbacks : RowSumsCallbacks<kTileM, kTileN, kThreads, Params, CoordTensor> {
    using RowSumsCallbacks<kTileM, kTileN, kThreads, Params, CoordTensor>::RowSumsCallbacks;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      static_assert(FragmentSize == 16, "expects the EpilogueTileAuto wgmma fragment: 4 column groups x 2 rows x 2 cols");
      Fn f{};
      float part[2] = {0.0f, 0.0f};
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < FragmentSize; ++k) part[(k >> 1) & 1] += f(static_cast<float>(frg_input[k]));
      this->add(epi_m, epi_n, part[0], part[1]);
      return frg_input;
    }
  };
};

#endif  // __CUDACC__

}  // namespace coda::epilogue
