// linear_swiglu_bwd_zdz's epilogue program (CUTLASS-heavy; included only by the instances generated from op.cmake):
//   Sm90SwigluBwdPair(acc, C)  -> D = y
// C is z viewed as [M, F] 32-bit words (ElementC = float as a container of the (g, u) bits; the op sets C = z,
// ldc = ldz / 2), so the producer warp loads it through TMA during the mainloop. The node writes dz and the zdz
// row partials itself (src/epilogue/swiglu_bwd_pair.hpp); the collective stores its returned y as D through TMA.
#pragma once

#include "epilogue/swiglu_bwd_pair.hpp"
#include "epilogue/tree_args.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_swiglu_bwd_zdz/kernels.hpp"

#include <type_traits>

namespace coda::ops {

namespace swiglu_bwd {
/// The node's dz chunk at 64x16 subtiles: a config's `kNarrowChunk` when it names one (e16h: 4, this op's pick),
/// else 2.
template <class Config, class = void>
struct NarrowChunk : std::integral_constant<int, 2> {};
template <class Config>
struct NarrowChunk<Config, std::void_t<decltype(Config::kNarrowChunk)>>
    : std::integral_constant<int, Config::kNarrowChunk> {};
}  // namespace swiglu_bwd

struct SwigluBwdEpilogue {
  using Args = SwigluBwdArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = float;  // z's (g, u) pairs as 32-bit words, copied bit for bit (float to float)
    using Node = epilogue::Sm90SwigluBwdPair<typename Traits::TileShape, ElementD, 128,
                                             swiglu_bwd::NarrowChunk<typename Traits::Config>::value>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<Node, cutlass::epilogue::fusion::Sm90AccFetch,
                                                      cutlass::epilogue::fusion::Sm90SrcFetch<float>>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const&) {
      auto& node = epilogue::node_args<Node, Fusion>(out);
      node.ptr_dz = static_cast<ElementD*>(args.dz);
      node.lddz = args.lddz;
      node.ptr_partials = args.zdz_partials;
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t>
using SwigluBwdKernel = gemm::FusedLinear<Config, SwigluBwdEpilogue, Element, Element, cutlass::layout::RowMajor,
                                          cutlass::layout::RowMajor>;

}  // namespace coda::ops
