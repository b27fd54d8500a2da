// F4's epilogue program (CUTLASS-heavy; included only by the instances generated from op.cmake):
//
//   D = Sm90Compute<RopeRowscale>(acc, ColBroadcast(rstd), ColBroadcast(pos: int32 -> float),
//                                 RowBroadcast(inv_freq per column))                         ElementC = void
//
// One compute node: z = rstd * acc and the rotation of each adjacent (2i, 2i+1) pair (src/epilogue/rope_pair.hpp),
// rounded once to bf16. No custom node: pairs are thread-local and the angle needs only per-row and per-column
// broadcasts (CUTLASS_EVT.md section 5(e)).
#pragma once

#include "epilogue/broadcast.hpp"
#include "epilogue/rope_pair.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale_rope/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/numeric_types.h>

namespace coda::ops {

struct RopeEpilogue {
  using Args = RopeArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = void;
    static constexpr auto kRound = Traits::kRound;
    using TileShape = typename Traits::TileShape;

    using Rstd = epilogue::ColumnVector<TileShape>;
    using Pos = epilogue::ColumnVector<TileShape, int32_t>;
    using InvFreq = epilogue::RowVector<TileShape>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<epilogue::RopeRowscale, ElementD, float, kRound>,
        cutlass::epilogue::fusion::Sm90AccFetch, Rstd, Pos, InvFreq>;

    /// {op_0 = acc, op_1 = rstd, op_2 = positions, op_3 = inv_freq, op_4 = compute} (5 ops: a cute::tuple)
    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      auto& rstd = cute::get<1>(out);
      rstd.ptr_col = args.rstd;
      rstd.null_default = 0.0f;
      rstd.dCol = {cute::_1{}, cute::_0{}, op.M};
      auto& pos = cute::get<2>(out);
      pos.ptr_col = args.positions;
      pos.null_default = 0;
      pos.dCol = {cute::_1{}, cute::_0{}, op.M};
      auto& freq = cute::get<3>(out);
      freq.ptr_row = args.inv_freq_cols;
      freq.null_default = 0.0f;
      freq.dRow = {cute::_0{}, cute::_1{}, op.N};
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t>
using RopeKernel = gemm::FusedLinear<Config, RopeEpilogue, Element, Element,
                                     cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
