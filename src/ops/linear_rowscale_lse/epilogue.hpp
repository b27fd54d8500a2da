// linear_rowscale_lse's epilogue programs (CUTLASS-heavy; include only from the per-kernel .cu files of this
// directory):
//
//   l   = multiplies(ColBroadcast(rstd), acc)                   fp32, evaluated once
//   D   = R(l)                                                   raw logits (LseEpilogue only)
//   lse partials = OnlineLse( Compute<Softcap>(l) )              fp32, per (row, N-tile), epilogue/online_lse.hpp
//
// LseEpilogue:         Sm90SplitTreeVisitor<input: l, output: SplitTreeFetch -> D, aux: OnlineLse(Softcap(fetch))>
// LseNoLogitsEpilogue: Sm90EVT<OnlineLse, Sm90EVT<Softcap, l>> with ElementD = void; the root's OnlineLse names
//                      the collective's (unused) D element through its ElementAux (CUTLASS_EVT.md section 8).
// The statistics use l in fp32 before any rounding (like linear_residual_rmsnorm's sums of squares): only fp32 GEMM and
// exp/log rounding separate them from the float64 reference; the stored logits are rounded once.
#pragma once

#include "epilogue/broadcast.hpp"
#include "epilogue/online_lse.hpp"
#include "epilogue/softcap.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale_lse/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/functional.h>
#include <cutlass/numeric_types.h>

namespace coda::ops {

namespace lse_detail {

template <class Traits>
using Rstd = epilogue::Rstd<typename Traits::TileShape>;
template <class Traits>
using Logits = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, Traits::kRound>, Rstd<Traits>,
    cutlass::epilogue::fusion::Sm90AccFetch>;
template <class Traits>
using Softcap = cutlass::epilogue::fusion::Sm90Compute<epilogue::Softcap, float, float, Traits::kRound>;
template <class Traits>
using Lse = epilogue::OnlineLse<typename Traits::TileShape, cutlass::bfloat16_t>;

/// Both programs' arguments, by node: rstd, the softcap's constants, the online-LSE partials.
template <class Traits, class Fusion, class FusionArguments>
void make_args(FusionArguments& out, LseArgs const& args, gemm::Operands const& op) {
  epilogue::set_column_vector(epilogue::node_args<Rstd<Traits>, Fusion>(out), args.rstd, op.M);
  epilogue::SoftcapArguments& cap = epilogue::node_args<Softcap<Traits>, Fusion>(out);
  cap.cap = args.softcap;
  cap.inv_cap = epilogue::inverse_softcap(args.softcap);
  epilogue::OnlineLseArguments& lse = epilogue::node_args<Lse<Traits>, Fusion>(out);
  lse.ptr_max = args.part_max;
  lse.ptr_sumexp = args.part_sumexp;
  lse.ptr_sum = args.part_sum;
  lse.ptr_target = args.part_target;
  lse.targets = args.targets;
  lse.targets_int64 = args.targets_int64;
}

}  // namespace lse_detail

/// Logits stored as D (bf16, raw) plus the partials.
struct LseEpilogue {
  using Args = LseArgs;

  template <class Traits>
  struct Program {
    using ElementC = void;
    using Aux = cutlass::epilogue::fusion::Sm90EVT<
        lse_detail::Lse<Traits>,
        cutlass::epilogue::fusion::Sm90EVT<lse_detail::Softcap<Traits>, cutlass::epilogue::fusion::Sm90SplitTreeFetch>>;
    using Fusion = cutlass::epilogue::fusion::Sm90SplitTreeVisitor<lse_detail::Logits<Traits>,
                                                                   cutlass::epilogue::fusion::Sm90SplitTreeFetch, Aux>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      lse_detail::make_args<Traits, Fusion>(out, args, op);
    }
  };
};

/// No logits: D = void, only the partials.
struct LseNoLogitsEpilogue {
  using Args = LseArgs;

  template <class Traits>
  struct Program {
    using ElementC = void;
    using Capped = cutlass::epilogue::fusion::Sm90EVT<lse_detail::Softcap<Traits>, lse_detail::Logits<Traits>>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<lse_detail::Lse<Traits>, Capped>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      lse_detail::make_args<Traits, Fusion>(out, args, op);
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t>
using LseKernel = gemm::FusedLinear<Config, LseEpilogue, Element, Element,
                                    cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
template <class Config, class Element = cutlass::bfloat16_t>
using LseNoLogitsKernel = gemm::FusedLinear<Config, LseNoLogitsEpilogue, Element, void,
                                            cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
