// ColumnVectorLdg: a value per row m of the problem ([M] fp32, unit stride), read by each visit for the two rows its
// fragment holds (__ldg, L1-resident), where CUTLASS's Sm90ColBroadcast loads every row of the thread's tile once at
// the tile's start and keeps them in registers through all its subtiles (two per 64-row block: six on a 192-row
// pingpong tile). For programs whose live set beside the accumulators is the limit (the QK-norm prepass on the
// 192x128 tile); the same values as Sm90ColBroadcast. CUTLASS-heavy: include only from epilogue programs.
//
// Fragment layout (the sm90 epilogue's narrow subtiles, CUTLASS_EVT.md section 4): element 4j + 2h + e at row
// r + 8h, r the fragment's first row. Rows >= M read row M - 1 (their results are never stored).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"

namespace coda::epilogue {

struct Sm90ColumnVectorLdg : Sm90StoreOnlyNode {
  /// The fields of Sm90ColBroadcast's Arguments that set_column_vector (broadcast.hpp) fills.
  struct Arguments {
    float const* ptr_col = nullptr;  ///< [M] fp32, unit stride; required
    float null_default = 0.0f;       ///< unused: a null ptr_col is rejected
    cute::Stride<cute::_1, cute::_0, int64_t> dCol{};
  };
  struct Params {
    float const* ptr_col = nullptr;
    int M = 0;
  };
  struct SharedStorage {};

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    return {args.ptr_col, static_cast<int>(cute::get<0>(problem_shape))};
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.ptr_col != nullptr;
  }

  CUTLASS_HOST_DEVICE Sm90ColumnVectorLdg() {}
  CUTLASS_HOST_DEVICE Sm90ColumnVectorLdg(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  template <class CoordTensor>
  struct ConsumerStoreCallbacks : CoordCallbacks<CoordTensor, Params> {
    using Base = CoordCallbacks<CoordTensor, Params>;
    using Base::Base;
    using Base::params;
    using Base::tC_cD;

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int epi_m, int epi_n) {
      static_assert(FragmentSize % 4 == 0, "ColumnVectorLdg: fragments of (2 columns x 2 rows) groups");
      int const r = cute::get<0>(fragment_origin(tC_cD, epi_m, epi_n));
      int const last = params->M - 1;
      float const v[2] = {__ldg(params->ptr_col + min(r, last)), __ldg(params->ptr_col + min(r + 8, last))};
      cutlass::Array<float, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < FragmentSize; ++k) out[k] = v[(k >> 1) & 1];
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    // Rows r and r + 8 per visit hold where a subtile is 64 rows per warpgroup (one m64 MMA block): a taller subtile
    // would put a visit's fragment in several MMA blocks.
    static_assert(cute::size<0>(decltype(args.epi_tile){}) * 128 == 64 * decltype(cute::size(args.tiled_copy))::value,
                  "ColumnVectorLdg: an epilogue subtile of 64 rows per 128 threads");
    auto coords = fragment_coords<ReferenceSrc>(args);
    return ConsumerStoreCallbacks<decltype(coords)>(cute::move(coords), params_ptr);
  }
};

}  // namespace coda::epilogue
