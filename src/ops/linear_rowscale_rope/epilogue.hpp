// linear_rowscale_rope's epilogue program (CUTLASS-heavy; included only by the instances generated from op.cmake):
//
//   D = Sm90Compute<RopeRowscale>(acc, ColBroadcast(rstd), ColBroadcast(pos: int32 -> float),
//                                 RowBroadcast(inv_freq per column))                         ElementC = void
//
// One compute node: z = rstd * acc and the rotation of each adjacent (2i, 2i+1) pair (src/epilogue/rope_pair.hpp),
// rounded once to bf16. No custom node: pairs are thread-local and the angle needs only per-row and per-column
// broadcasts (CUTLASS_EVT.md section 5(e)). A config naming kCacheSinCos, or a tile of more than 128 accumulators per
// thread, runs RopeHeadsEpilogue (below) instead.
#pragma once

#include "epilogue/broadcast.hpp"
#include "epilogue/rope_heads.hpp"
#include "epilogue/rope_pair.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale_rope/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace coda::ops {

struct RopeEpilogue {
  using Args = RopeArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = void;
    static constexpr auto kRound = Traits::kRound;
    using TileShape = typename Traits::TileShape;

    using Rstd = epilogue::Rstd<TileShape>;
    using Pos = epilogue::Positions<TileShape>;
    using InvFreq = epilogue::InvFreq<TileShape>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<epilogue::RopeRowscale, ElementD, float, kRound>,
        cutlass::epilogue::fusion::Sm90AccFetch, Rstd, Pos, InvFreq>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      epilogue::set_column_vector(epilogue::node_args<Rstd, Fusion>(out), args.rstd, op.M);
      epilogue::set_column_vector(epilogue::node_args<Pos, Fusion>(out), args.positions, op.M);
      epilogue::set_row_vector(epilogue::node_args<InvFreq, Fusion>(out), args.inv_freq_cols, op.N);
    }
  };
};

/// The head-aware program, for configs that name kCacheSinCos (coop_128x256x64_c2x1_sc, the op's pick from d = 4096)
/// and tiles of more than 128 accumulators per thread (pp_192x128x64_c1x2, the op's pick below d = 4096):
///   D = RopeHeads(multiplies(acc, rstd))      rstd: ColBroadcast, or read per visit on the 192x128 tile (RstdOf)
/// the same values as RopeEpilogue's (but for zero frequencies in q/k heads: rope_heads.hpp); on the _sc config the
/// tile's first q/k head's sin and cos serve its later heads. The node reads the caller's [head_dim / 2] inv_freq, not
/// the expanded one.
struct RopeHeadsEpilogue {
  using Args = RopeArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = void;
    static constexpr auto kRound = Traits::kRound;
    using TileShape = typename Traits::TileShape;

    using Rstd = epilogue::RstdOf<Traits>;  // read per visit on the 192x128 tile
    using U = epilogue::RowScaledAcc<TileShape, kRound, Rstd>;
    // The node's angle cache needs every subtile of a tile in one store() call, which stream-K's separate reduction
    // does not make.
    static_assert(!Traits::Config::kStreamK, "RopeHeads: not on a stream-K config");
    using Node = epilogue::Sm90RopeHeads<TileShape, epilogue::detail::CacheSinCos<typename Traits::Config>::value>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<Node, U>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      epilogue::set_column_vector(epilogue::node_args<Rstd, Fusion>(out), args.rstd, op.M);
      auto& node = epilogue::node_args<Node, Fusion>(out);
      node.positions = args.positions;
      node.inv_freq = args.inv_freq;
      node.n_rot_heads = args.n_rot_heads;
      node.head_dim = args.head_dim;
    }
  };
};

/// The head-aware program on the _sc config and on tiles of more than 128 accumulators per thread (pingpong 192x128,
/// where the functor's three broadcast operands would hold their rows and columns in registers through the tile),
/// else the functor.
template <class Config, class Element = cutlass::bfloat16_t>
using RopeKernel = gemm::FusedLinear<
    Config,
    std::conditional_t<(epilogue::detail::CacheSinCos<Config>::value ||
                        gemm::EpilogueTraits<Config, Element>::kAccumulatorsPerThread >
                            epilogue::kAccumulatorsWithRoom),
                       RopeHeadsEpilogue, RopeEpilogue>,
    Element, Element, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
