// The exponential-form LM-head logits program (CUTLASS-heavy; included only by the instances generated from
// op.cmake):
//
//   D = R(ExpCe(acc))     l = rstd acc in fp32, then s (.) exp(c - K), one rounding to bf16; partials
//                         (epilogue/exp_ce.hpp); kMaskColumns: columns >= vocab left out of the partials
#pragma once

#include "epilogue/exp_ce.hpp"
#include "epilogue/softcap.hpp"  // inverse_softcap
#include "epilogue/tree_args.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale_exp/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/functional.h>
#include <cutlass/numeric_types.h>

namespace coda::ops {

template <bool kMaskColumns, epilogue::SoftcapMode kSoftcap>
struct ExpCeEpilogue {
  using Args = ExpCeArgs;

  template <class Traits>
  struct Program {
    using ElementC = void;
    using Node = epilogue::ExpCe<typename Traits::TileShape, kMaskColumns, kSoftcap>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<Node, cutlass::epilogue::fusion::Sm90AccFetch>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const&) {
      epilogue::ExpCeArguments& e = epilogue::node_args<Node, Fusion>(out);
      e.rstd = args.rstd;
      e.cap = args.softcap;
      e.inv_cap = epilogue::inverse_softcap(args.softcap);
      e.offset = args.offset;
      e.vocab = args.vocab;
      e.tile_base = args.tile_base;
      e.m_pad = args.m_pad;
      e.ptr_sumexp = args.part_sumexp;
      e.ptr_dot = args.part_dot;
      e.ptr_target = args.target_e;
      e.targets = args.targets;
      e.targets_int64 = args.targets_int64;
      e.col_base = args.col_base;
    }
  };
};

template <class Config, class Element, bool kMaskColumns, epilogue::SoftcapMode kSoftcap>
using ExpCeKernelOf = gemm::FusedLinear<Config, ExpCeEpilogue<kMaskColumns, kSoftcap>, Element, Element,
                                        cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
/// The three kernels of src/ops/linear_rowscale_exp/op.cmake: no softcap, a softcap, and the column-masked tail.
template <class Config, class Element>
using ExpCeKernel = ExpCeKernelOf<Config, Element, false, epilogue::SoftcapMode::kOff>;
template <class Config, class Element>
using ExpCeSoftcapKernel = ExpCeKernelOf<Config, Element, false, epilogue::SoftcapMode::kOn>;
template <class Config, class Element>
using ExpCeMaskedKernel = ExpCeKernelOf<Config, Element, true, epilogue::SoftcapMode::kRunTime>;

}  // namespace coda::ops
