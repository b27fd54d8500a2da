// Tap: a custom sm90 EVT node that feeds a side output (a stock store or reduction node, `Inner`) with
// Fn(acc, inputs...) and returns its first input unchanged, so one value can flow on to further consumers while a
// function of it (and of the accumulator) leaves through another node:
//
//   Sm90EVT<Sm90Tap<Sm90AuxStore<...>, Times>, C, Gamma>          stores R(c * gamma), returns c
//   Sm90EVT<Sm90Tap<Sm90ColumnPartials<...>, AccTimes>, C>        column sums of acc * c over the tile's rows, returns c
//
// Why: a value shared by several consumers otherwise needs Sm90TopologicalVisitor, which converts every node's
// output to one compute type and keeps a fragment per DAG node; a tree of taps passes only direct children's
// fragments and lets the inner node keep its own state. Unlike Sm90SplitTreeVisitor (whose output and aux trees
// receive the input tree's value as their "accumulator"), every node of the tree still sees the real accumulator.
// (linear_residual_rmsnorm_bwd's stack frame was not the DAG's: the stock Sm90RowReduction caused it, as a tree too;
// column_partials.hpp.)
//
// Fn is a default-constructible functor template instantiated as Fn<cutlass::Array<float, N>> and called as
// fn(acc, first, rest...) on fp32 fragments (acc converted to fp32, the inputs as their children return them); its
// result goes to Inner's visit. Inner keeps its Arguments, Params, SharedStorage and every other callback
// (begin, reduce, postreduce, tma_store, end, ...); only visit is replaced.
//
// Checked through linear_residual_rmsnorm_bwd (tests/gpu/test_fused_backward.cpp): its a output is Tap<AuxStore> and
// the raw dgamma partials in FusedBackward.ColumnPartialsNode are Tap<ColumnPartials, acc * c>, both against float64
// references.
#pragma once

#include <utility>

#if defined(__CUDACC__)
#include <cutlass/array.h>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/numeric_conversion.h>
#endif

namespace coda::epilogue {

#if defined(__CUDACC__)

template <class Inner, template <class> class Fn>
struct Sm90Tap : Inner {
  using Inner::Inner;

  template <class InnerCallbacks>
  struct ConsumerStoreCallbacks : InnerCallbacks {
    CUTLASS_DEVICE explicit ConsumerStoreCallbacks(InnerCallbacks&& inner)
        : InnerCallbacks(std::forward<InnerCallbacks>(inner)) {}

    template <class ElementAccumulator, class ElementFirst, class... ElementRest, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementFirst, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementFirst, FragmentSize> const& frg_first,
        cutlass::Array<ElementRest, FragmentSize> const&... frg_rest) {
      using Frag = cutlass::Array<float, FragmentSize>;
      cutlass::NumericArrayConverter<float, ElementAccumulator, FragmentSize> to_float_acc;
      cutlass::NumericArrayConverter<float, ElementFirst, FragmentSize> to_float_first;
      Frag const side = Fn<Frag>{}(to_float_acc(frg_acc), to_float_first(frg_first),
                                   cutlass::NumericArrayConverter<float, ElementRest, FragmentSize>{}(frg_rest)...);
      InnerCallbacks::visit(frg_acc, epi_v, epi_m, epi_n, side);
      return frg_first;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto inner = Inner::template get_consumer_store_callbacks<ReferenceSrc>(args);
    return ConsumerStoreCallbacks<decltype(inner)>(std::move(inner));
  }
};

#endif  // __CUDACC__

}  // namespace coda::epilogue
