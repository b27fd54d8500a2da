// B2's epilogue program (CUTLASS-heavy; include only from the per-config .cu files of this directory), a DAG in
// fp32 (Sm90TopologicalVisitor, nodes in topological order; the last one is D):
//
//    0 acc                      1 alpha (scalar)          2 Dv = acc * alpha
//    3 x (aux load)             4 rstd (per row)          5 c = x * rstd
//    6 gamma (per column)       7 c * gamma               8 aux store a = R(c * gamma)
//    9 Dv * c                  10 dgamma column partials (row reduction over the tile's rows, no final reduce)
//   11 zdz' (per row)          12 c * zdz'               13 Dv * gamma
//   14 Dv * gamma - c * zdz'   15 dx_in (C)              16 dx = rstd * (14) + dx_in  -> D
//
// coda.h B2: D = alpha acc, dx = dx_in + rstd * (D * gamma - alpha * c * zdz), a = c * gamma, dgamma = sum_m D c,
// with c = x * rstd. zdz' = alpha * zdz is prepared by the dispatch (alpha scales zdz too: it is the row dot of the
// dz passed in); folding alpha into the DAG as one more node made the pingpong kernel spill 32 bytes.
#pragma once

#include "gemm/fused_linear.hpp"
#include "ops/linear_residual_rmsnorm_bwd/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/functional.h>
#include <cutlass/numeric_types.h>

namespace coda::ops {

/// kTmaX: x arrives through TMA into a smem ring (Sm90AuxLoad with the C pipeline's stages), else through
/// predicated vector loads at the start of each subtile (stage 0, no smem: one more mainloop stage).
template <bool kTmaX>
struct ResidualRmsnormBwdEpilogue {
  using Args = ResidualRmsnormBwdArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = ElementD;  // dx_in
    using TileShape = typename Traits::TileShape;
    static constexpr auto kRound = Traits::kRound;
    template <template <class> class Fn>
    using Op = cutlass::epilogue::fusion::Sm90Compute<Fn, float, float, kRound>;
    using RowVec = cute::Stride<cute::_0, cute::_1, int64_t>;
    using ColVec = cute::Stride<cute::_1, cute::_0, int64_t>;
    using MatStride = cute::Stride<int64_t, cute::_1, int64_t>;

    using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
    using Alpha = cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>;
    // TMA x: a smem ring filled ahead by the epilogue load warp (on the C pipeline). The stage-0 loads leave the
    // epilogue waiting on global memory (ncu at the llama3-1B q/k/v dgrad: 70 % of stalls on the L1TEX
    // scoreboard, 3.0x the cuBLAS time; TMA: 2.1x), but TMA's smem costs a mainloop stage, which the LM-head dgrad
    // (K = V) pays more than it saves (1.00-1.10x stage 0 vs 1.01-1.18x TMA). The dispatch picks by K.
    using EpiDesc = cutlass::epilogue::collective::detail::EpilogueDescriptor<
        TileShape, cutlass::epilogue::collective::EpilogueTileAuto, ElementC, ElementD,
        typename Traits::EpilogueSchedule>;
    using XDesc = cutlass::epilogue::collective::detail::AuxLoadDescriptor<EpiDesc, cutlass::layout::RowMajor, ElementD>;
    static_assert(cute::is_same_v<typename XDesc::Stride, MatStride>, "x stride type");
    using XTma = cutlass::epilogue::fusion::Sm90AuxLoad<XDesc::Stages, typename EpiDesc::EpilogueTile, ElementD,
                                                        MatStride, typename XDesc::SmemLayoutAtom,
                                                        typename XDesc::CopyOpS2R>;
    using XVec = cutlass::epilogue::fusion::Sm90AuxLoad<0, typename Traits::EpilogueTile, ElementD, MatStride, void,
                                                        void>;
    using X = cute::conditional_t<kTmaX, XTma, XVec>;
    using Rstd = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, ColVec>;
    using Gamma = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, float, RowVec>;
    // a leaves like D when x arrives by TMA (R2S in postreduce, TMA store), else through vector stores.
    using ADesc = cutlass::epilogue::collective::detail::AuxStoreDescriptor<EpiDesc, cutlass::layout::RowMajor,
                                                                           ElementD>;
    using AStoreTma = cutlass::epilogue::fusion::Sm90AuxStore<ADesc::Stages, typename EpiDesc::EpilogueTile, ElementD,
                                                              kRound, MatStride, typename ADesc::SmemLayoutAtom,
                                                              typename ADesc::CopyOpR2S>;
    using AStoreVec = cutlass::epilogue::fusion::Sm90AuxStore<0, typename Traits::EpilogueTile, ElementD, kRound,
                                                              MatStride, void, void>;
    using AStore = cute::conditional_t<kTmaX, AStoreTma, AStoreVec>;
    using DgammaPartials = cutlass::epilogue::fusion::Sm90RowReduction<
        cutlass::plus, cutlass::plus, cutlass::plus, 0, TileShape, float, float, kRound, RowVec, 4, true,
        /*FinalReduction=*/false>;
    using Zdz = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, ColVec>;
    using DxIn = cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>;

    using Edges = cute::tuple<cute::seq<>,         //  0 acc
                              cute::seq<>,         //  1 alpha
                              cute::seq<0, 1>,     //  2 Dv
                              cute::seq<>,         //  3 x
                              cute::seq<>,         //  4 rstd
                              cute::seq<3, 4>,     //  5 c
                              cute::seq<>,         //  6 gamma
                              cute::seq<5, 6>,     //  7 c * gamma
                              cute::seq<7>,        //  8 store a
                              cute::seq<2, 5>,     //  9 Dv * c
                              cute::seq<9>,        // 10 dgamma partials
                              cute::seq<>,         // 11 zdz
                              cute::seq<5, 11>,    // 12 c * zdz
                              cute::seq<2, 6>,     // 13 Dv * gamma
                              cute::seq<13, 12>,   // 14 difference
                              cute::seq<>,         // 15 dx_in
                              cute::seq<4, 14, 15>>;  // 16 dx
    using Fusion = cutlass::epilogue::fusion::Sm90TopologicalVisitor<
        float, Edges, Acc, Alpha, Op<cutlass::multiplies>, X, Rstd, Op<cutlass::multiplies>, Gamma,
        Op<cutlass::multiplies>, AStore, Op<cutlass::multiplies>, DgammaPartials, Zdz, Op<cutlass::multiplies>,
        Op<cutlass::multiplies>, Op<cutlass::minus>, DxIn, Op<cutlass::homogeneous_multiply_add>>;

    /// Arguments: a cute::tuple with one entry per node, in the order above.
    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      cute::get<1>(out).scalars[0] = args.alpha;
      auto& x = cute::get<3>(out);
      x.ptr_aux = static_cast<ElementD const*>(args.x);
      x.dAux = MatStride{gemm::detail::effective_ld(args.ldx, op.M, op.N, 8), cute::_1{}, 0};
      auto& rstd = cute::get<4>(out);
      rstd.ptr_col = args.rstd;
      rstd.dCol = {cute::_1{}, cute::_0{}, op.M};
      auto& gamma = cute::get<6>(out);
      gamma.ptr_row = static_cast<ElementD const*>(args.gamma);
      gamma.dRow = {cute::_0{}, cute::_1{}, op.N};
      auto& a = cute::get<8>(out);
      a.ptr_aux = static_cast<ElementD*>(args.a);
      a.dAux = MatStride{gemm::detail::effective_ld(args.lda, op.M, op.N, 8), cute::_1{}, 0};
      auto& dgamma = cute::get<10>(out);
      dgamma.ptr_row = args.dgamma_partials;
      dgamma.reduction_identity = 0.0f;
      dgamma.dRow = {cute::_0{}, cute::_1{}, 0};
      auto& zdz = cute::get<11>(out);
      zdz.ptr_col = args.zdz;
      zdz.dCol = {cute::_1{}, cute::_0{}, op.M};
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t, bool kTmaX = true>
using ResidualRmsnormBwdKernel = gemm::FusedLinear<Config, ResidualRmsnormBwdEpilogue<kTmaX>, Element, Element,
                                                   cutlass::layout::RowMajor, cutlass::layout::RowMajor>;

}  // namespace coda::ops
