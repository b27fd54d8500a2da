// linear_rowscale's epilogue program (CUTLASS-heavy; included only by the instances generated from op.cmake):
//
//   y = multiplies(ColBroadcast(rstd), acc)      fp32 product, one rounding to bf16; no C tile
//
// Sm90ColBroadcast loads the CTA tile's rows of rstd into registers once per tile (begin()), no smem.
#pragma once

#include "epilogue/broadcast.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/functional.h>
#include <cutlass/numeric_types.h>

namespace coda::ops {

struct RowscaleEpilogue {
  using Args = RowscaleArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = void;
    static constexpr auto kRound = Traits::kRound;

    using Rstd = epilogue::RstdOf<Traits>;  // read per visit on the 192x128 tile
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>, Rstd,
        cutlass::epilogue::fusion::Sm90AccFetch>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      epilogue::set_column_vector(epilogue::node_args<Rstd, Fusion>(out), args.rstd, op.M);
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t>
using RowscaleKernel = gemm::FusedLinear<Config, RowscaleEpilogue, Element, Element,
                                         cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
