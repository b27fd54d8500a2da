// linear_residual_rmsnorm_bwd's epilogue program (CUTLASS-heavy; included only by the instances generated from
// op.cmake): a tree of stock nodes and taps (src/epilogue/tap.hpp), all in fp32:
//
//   c  = x * rstd                                           x through the aux load, rstd per row
//   c' = Tap<AuxStore a>(c, gamma): stores a = R(c * gamma), value c
//   c" = Tap<ColumnPartials dgamma>(c'): column partials of acc * c over the tile's rows, value c
//   D  = dx = fma(rstd * alpha, acc * gamma - c" * zdz, dx_in)          (Dx below; dx_in is C)
//
// coda.h's linear_residual_rmsnorm_bwd with D = alpha acc: dx = dx_in + rstd (D gamma - alpha c zdz), a = c gamma,
// dgamma = sum_m D c, c = x rstd.
//
// With a row scale v (kRowScale, the LM head's exponential form, where dz = v (.) E and E is the stored GEMM operand):
// D = alpha v acc, and zdz arrives divided by v (kernels::ce_exp_finish), so
//   a = R(v c gamma) (the wgrad's operand: dW = E^T (v (.) c gamma)),  dgamma partials of acc * v c,
//   dx = fma(rstd * v * alpha, acc * gamma - c * zdz, dx_in);
// v enters as one more ColBroadcast child of the two taps and of the root. alpha multiplies the finished column sums (column_sum's scale), not every partial. The previous program
// (a 17-node Sm90TopologicalVisitor with a stock Sm90RowReduction for dgamma) compiled to a 1136-byte stack frame;
// the RowReduction was the cause (0 bytes without it, 1216 with it in this tree), hence Sm90ColumnPartials.
#pragma once

#include "epilogue/broadcast.hpp"
#include "epilogue/column_partials.hpp"
#include "epilogue/tap.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_residual_rmsnorm_bwd/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/functional.h>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace coda::ops {

namespace rmsnorm_bwd {

/// c * gamma: what the a store receives (Tap functor: acc, c, gamma).
template <class Frag>
struct TimesGamma {
  CUTLASS_DEVICE Frag operator()(Frag const&, Frag const& c, Frag const& gamma) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Frag::kElements; ++i) out[i] = c[i] * gamma[i];
    return out;
  }
};

/// acc * c: what the dgamma column reduction receives (Tap functor: acc, c).
template <class Frag>
struct AccTimes {
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& c) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Frag::kElements; ++i) out[i] = acc[i] * c[i];
    return out;
  }
};

/// v * c * gamma and acc * v * c: the taps' functors with the row scale as their last input.
template <class Frag>
struct TimesGammaV {
  CUTLASS_DEVICE Frag operator()(Frag const&, Frag const& c, Frag const& gamma, Frag const& v) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Frag::kElements; ++i) out[i] = (v[i] * c[i]) * gamma[i];
    return out;
  }
};
template <class Frag>
struct AccTimesV {
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& c, Frag const& v) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Frag::kElements; ++i) out[i] = acc[i] * (v[i] * c[i]);
    return out;
  }
};

struct DxArguments {
  float alpha = 1.0f;
};

/// dx = fma(rstd * alpha, acc * gamma - c * zdz, dx_in) (Sm90Compute functor with run-time alpha; instantiated
/// as Dx<float> for its Arguments and as Dx<Array<float, N>> to compute).
template <class T>
struct Dx {
  using Arguments = DxArguments;
};
template <int N>
struct Dx<cutlass::Array<float, N>> {
  using Arguments = DxArguments;
  using Frag = cutlass::Array<float, N>;
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& c, Frag const& gamma, Frag const& rstd,
                                 Frag const& zdz, Frag const& dx_in, Arguments const& args) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      out[i] = __fmaf_rn(rstd[i] * args.alpha, __fmaf_rn(acc[i], gamma[i], -c[i] * zdz[i]), dx_in[i]);
    }
    return out;
  }
};

/// Dx with the row scale v as its last input: fma(rstd * v * alpha, acc * gamma - c * zdz, dx_in).
template <class T>
struct DxV {
  using Arguments = DxArguments;
};
template <int N>
struct DxV<cutlass::Array<float, N>> {
  using Arguments = DxArguments;
  using Frag = cutlass::Array<float, N>;
  CUTLASS_DEVICE Frag operator()(Frag const& acc, Frag const& c, Frag const& gamma, Frag const& rstd,
                                 Frag const& zdz, Frag const& dx_in, Frag const& v, Arguments const& args) const {
    Frag out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      out[i] = __fmaf_rn(rstd[i] * v[i] * args.alpha, __fmaf_rn(acc[i], gamma[i], -c[i] * zdz[i]), dx_in[i]);
    }
    return out;
  }
};

}  // namespace rmsnorm_bwd

template <bool kRowScale>
struct ResidualRmsnormBwdEpilogueT {
  using Args = ResidualRmsnormBwdArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = ElementD;  // dx_in
    using TileShape = typename Traits::TileShape;
    static constexpr auto kRound = Traits::kRound;
    template <template <class> class Fn>
    using Op = cutlass::epilogue::fusion::Sm90Compute<Fn, float, float, kRound>;
    using MatStride = cute::Stride<int64_t, cute::_1, int64_t>;

    using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
    // x arrives through TMA into a smem ring filled ahead by the epilogue load warp (on the C pipeline, the
    // builder's stages). Stage-0 vector loads instead left the epilogue waiting on global memory (ncu at the
    // llama3-1B q/k/v dgrad: 70 % of stalls on the L1TEX scoreboard); since the program is a tap tree, TMA x is
    // also the faster one at the LM-head dgrad (K = V), where stage 0 used to win by keeping a mainloop stage.
    // Own C/x rings without the D smem reuse (4 subtiles ahead) measured the same (bench_backward --sweep).
    using BuilderDesc = cutlass::epilogue::collective::detail::EpilogueDescriptor<
        TileShape, typename Traits::EpilogueTile, ElementC, ElementD, typename Traits::EpilogueSchedule>;
    // The cooperative 128x256 kernel (long K: the gate/up and LM-head dgrads) keeps 3 C/x stages instead of the
    // builder's 4: with four 128x32 rings (dx_in as C, shared with dx; x; a) the builder's epilogue left the
    // mainloop 2 stages (stop 19's trial, 4-8 % slower in the block); this keeps it 3. Pingpong: the builder's.
    static constexpr bool kCoop =
        cutlass::epilogue::collective::detail::sm90_is_cooperative_v<typename Traits::EpilogueSchedule>;
    struct EpiDesc {
      using EpilogueTile = typename BuilderDesc::EpilogueTile;
      static constexpr int StagesD = BuilderDesc::StagesD;
      // StagesD + 1: the builder's least when D reuses C's smem (this op's C and D are the same element type).
      static constexpr int StagesC = kCoop ? StagesD + 1 : BuilderDesc::StagesC;
    };
    using EpilogueDispatchPolicy = std::conditional_t<
        kCoop,
        cutlass::epilogue::Sm90TmaWarpSpecialized<EpiDesc::StagesC, EpiDesc::StagesD,
                                                  BuilderDesc::DispatchPolicy::FragmentSize,
                                                  BuilderDesc::DispatchPolicy::ReuseSmemC,
                                                  BuilderDesc::DispatchPolicy::DelayTmaStore>,
        typename BuilderDesc::DispatchPolicy>;
    using XDesc = cutlass::epilogue::collective::detail::AuxLoadDescriptor<EpiDesc, cutlass::layout::RowMajor, ElementD>;
    static_assert(cute::is_same_v<typename XDesc::Stride, MatStride>, "x stride type");
    using X = cutlass::epilogue::fusion::Sm90AuxLoad<XDesc::Stages, typename EpiDesc::EpilogueTile, ElementD,
                                                     MatStride, typename XDesc::SmemLayoutAtom,
                                                     typename XDesc::CopyOpS2R>;
    using Rstd = epilogue::Rstd<TileShape>;
    using Gamma = epilogue::Gamma<TileShape, ElementD>;
    // a leaves like D: R2S in postreduce, then a TMA store.
    using ADesc = cutlass::epilogue::collective::detail::AuxStoreDescriptor<EpiDesc, cutlass::layout::RowMajor,
                                                                           ElementD>;
    using AStore = cutlass::epilogue::fusion::Sm90AuxStore<ADesc::Stages, typename EpiDesc::EpilogueTile, ElementD,
                                                           kRound, MatStride, typename ADesc::SmemLayoutAtom,
                                                           typename ADesc::CopyOpR2S>;
    using DgammaPartials = epilogue::Sm90ColumnPartials<
        TileShape, cutlass::epilogue::collective::detail::sm90_is_cooperative_v<typename Traits::EpilogueSchedule>
                       ? 8
                       : 4>;
    using Zdz = epilogue::Zdz<TileShape>;
    using DxIn = cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>;

    template <class Node, class... Children>
    using EVT = cutlass::epilogue::fusion::Sm90EVT<Node, Children...>;
    using V = epilogue::RowScale<TileShape>;
    using C = EVT<Op<cutlass::multiplies>, X, Rstd>;
    using ATap = std::conditional_t<kRowScale, epilogue::Sm90Tap<AStore, rmsnorm_bwd::TimesGammaV>,
                                    epilogue::Sm90Tap<AStore, rmsnorm_bwd::TimesGamma>>;
    using DgammaTap = std::conditional_t<kRowScale, epilogue::Sm90Tap<DgammaPartials, rmsnorm_bwd::AccTimesV>,
                                         epilogue::Sm90Tap<DgammaPartials, rmsnorm_bwd::AccTimes>>;
    using DxNode = std::conditional_t<kRowScale, Op<rmsnorm_bwd::DxV>, Op<rmsnorm_bwd::Dx>>;
    using CA = std::conditional_t<kRowScale, EVT<ATap, C, Gamma, V>, EVT<ATap, C, Gamma>>;
    using CG = std::conditional_t<kRowScale, EVT<DgammaTap, CA, V>, EVT<DgammaTap, CA>>;
    using Fusion = std::conditional_t<kRowScale, EVT<DxNode, Acc, CG, Gamma, Rstd, Zdz, DxIn, V>,
                                      EVT<DxNode, Acc, CG, Gamma, Rstd, Zdz, DxIn>>;

    /// rstd, gamma and v are read at two or three places of the tree: each place gets the same vector.
    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      namespace epi = epilogue;
      epi::for_each_node<Rstd, Fusion>(out, [&](auto& a) { epi::set_column_vector(a, args.rstd, op.M); });
      epi::for_each_node<Gamma, Fusion>(
          out, [&](auto& a) { epi::set_row_vector(a, static_cast<ElementD const*>(args.gamma), op.N); });
      if constexpr (kRowScale) {
        epi::for_each_node<V, Fusion>(out, [&](auto& a) { epi::set_column_vector(a, args.row_scale, op.M); });
      }
      epi::set_column_vector(epi::node_args<Zdz, Fusion>(out), args.zdz, op.M);
      auto& x = epi::node_args<X, Fusion>(out);
      x.ptr_aux = static_cast<ElementD const*>(args.x);
      x.dAux = MatStride{gemm::detail::effective_ld(args.ldx, op.M, op.N, 8), cute::_1{}, 0};
      auto& a_store = epi::node_args<ATap, Fusion>(out);
      a_store.ptr_aux = static_cast<ElementD*>(args.a);
      a_store.dAux = MatStride{gemm::detail::effective_ld(args.lda, op.M, op.N, 8), cute::_1{}, 0};
      auto& dgamma = epi::node_args<DgammaTap, Fusion>(out);
      dgamma.ptr = args.dgamma_partials;
      dgamma.ld = (op.N + cute::size<1>(TileShape{}) - 1) / cute::size<1>(TileShape{}) * cute::size<1>(TileShape{});
      epi::node_args<DxNode, Fusion>(out).alpha = args.alpha;
    }
  };
};

using ResidualRmsnormBwdEpilogue = ResidualRmsnormBwdEpilogueT<false>;
using ResidualRmsnormBwdRowScaledEpilogue = ResidualRmsnormBwdEpilogueT<true>;

template <class Config, class Element = cutlass::bfloat16_t>
using ResidualRmsnormBwdKernel = gemm::FusedLinear<Config, ResidualRmsnormBwdEpilogue, Element, Element,
                                                   cutlass::layout::RowMajor, cutlass::layout::RowMajor>;
template <class Config, class Element = cutlass::bfloat16_t>
using ResidualRmsnormBwdRowScaledKernel =
    gemm::FusedLinear<Config, ResidualRmsnormBwdRowScaledEpilogue, Element, Element, cutlass::layout::RowMajor,
                      cutlass::layout::RowMajor>;

}  // namespace coda::ops
