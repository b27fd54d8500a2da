// linear_residual_rmsnorm's epilogue program (CUTLASS-heavy; included only by the instances generated from op.cmake):
//
//   x  = plus(acc, C = residual)                   fp32, evaluated once (split-tree input)
//   h  = AuxStore(R(multiplies(x, RowBroadcast(gamma))))
//   D  = RowPartials<Square>(x), which returns x: D = R(x)
//
// An Sm90SplitTreeVisitor<input, output, aux> evaluates x once and hands the *fp32* fragment to both consumers:
// x is rounded to bf16 exactly once (by the collective, for D), h = R(x * gamma) is rounded once, and the sums of
// squares use x before rounding. This is the rounding decision of docs/OPS.md ("rounding"): it keeps every
// output within one rounding of the float64 reference, while the unfused pipeline rounds x twice and takes its
// statistics from the rounded x. The sums go to a compact m-major [ceil(N/CTA_N), round_up(M, CTA_M)] buffer of
// per-(row, N-tile) fp32 partials (src/epilogue/row_partials.hpp: no atomics, no workspace, deterministic).
#pragma once

#include "epilogue/broadcast.hpp"
#include "epilogue/row_partials.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_residual_rmsnorm/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/numeric_types.h>

namespace coda::ops {

struct ResidualRmsnormEpilogue {
  using Args = ResidualRmsnormArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = ElementD;  // residual
    static constexpr auto kRound = Traits::kRound;
    using TileShape = typename Traits::TileShape;

    // x = acc + residual, kept in fp32 (rounded once, on the way to D)
    using X = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, float, float, kRound>,
        cutlass::epilogue::fusion::Sm90AccFetch, cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>>;

    // h = R(x * gamma), stored through its own TMA store (same stages/smem atom as D would use)
    using HStore = cutlass::epilogue::collective::detail::AuxStoreDescriptor<
        gemm::EpilogueDescriptorOf<Traits, ElementC>, cutlass::layout::RowMajor, ElementD>;
    using Gamma = epilogue::Gamma<TileShape, ElementD>;
    using HStoreNode =
        cutlass::epilogue::fusion::Sm90AuxStore<HStore::Stages, typename HStore::EpilogueTile, ElementD, kRound,
                                                typename HStore::Stride, typename HStore::SmemLayoutAtom,
                                                typename HStore::CopyOpR2S>;
    using H = cutlass::epilogue::fusion::Sm90EVT<
        HStoreNode,
        cutlass::epilogue::fusion::Sm90EVT<
            cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>,
            cutlass::epilogue::fusion::Sm90SplitTreeFetch, Gamma>>;

    // D = R(x) (the collective converts the fp32 fragment), partials[m + Mpad * t] = sum_{n in tile t} x^2. The
    // running sums sit in shared memory, not registers (Sm90ColReduction's made pingpong 128x192 spill).
    static constexpr bool kCoop =
        cutlass::epilogue::collective::detail::sm90_is_cooperative_v<typename Traits::EpilogueSchedule>;
    using SumSq = epilogue::Sm90RowPartials<epilogue::Square, TileShape, kCoop ? 256 : 128>;
    using Out = cutlass::epilogue::fusion::Sm90EVT<SumSq, cutlass::epilogue::fusion::Sm90SplitTreeFetch>;

    using Fusion = cutlass::epilogue::fusion::Sm90SplitTreeVisitor<X, Out, H>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      epilogue::set_row_vector(epilogue::node_args<Gamma, Fusion>(out), static_cast<ElementD const*>(args.gamma), op.N);
      auto& h = epilogue::node_args<HStoreNode, Fusion>(out);
      h.ptr_aux = static_cast<ElementD*>(args.h);
      int64_t const ldh = gemm::detail::effective_ld(args.ldh, op.M, op.N, 8);
      h.dAux = gemm::detail::make_stride_from_ld<typename HStore::Stride>(ldh, ldh * op.M);
      epilogue::node_args<SumSq, Fusion>(out).ptr_partials = args.partials;
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t>
using ResidualRmsnormKernel =
    gemm::FusedLinear<Config, ResidualRmsnormEpilogue, Element, Element,
                      cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
