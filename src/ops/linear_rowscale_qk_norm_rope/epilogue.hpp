// linear_rowscale_qk_norm_rope's epilogue program (CUTLASS-heavy; included only by the instances generated from
// op.cmake):
//
//   u = multiplies(acc, ColBroadcast(rstd))          fp32
//   z = AuxStore(u)                                  R(u) through its own TMA store (skipped for a null z: the
//                                                    stock node's EnableNullptr); passes u on
//   D = QkNormRope(u)                                per-head norm of q/k, gamma, RoPE; v = u (qk_norm_rope.hpp,
//                                                    or qk_norm_rope_prepass.hpp with the heads' sums taken by a
//                                                    pass over the accumulators before the subtile loop)
//
// The node sees u in fp32 (z's rounding is not in qkv's path), as MATH.md's one-rounding rule asks.
#pragma once

#include "epilogue/accumulator_prepass.hpp"
#include "epilogue/broadcast.hpp"
#include "epilogue/qk_norm_rope.hpp"
#include "epilogue/qk_norm_rope_prepass.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale_qk_norm_rope/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace coda::ops {

/// kPrepass: the builder's narrow subtiles with the heads' sums taken before the subtile loop
/// (Sm90QkNormRopePrepass in a Sm90PrepassCollective), else 64 x 128 subtiles holding whole heads (Sm90QkNormRope).
template <bool kPrepass>
struct QkNormRopeEpilogueT {
  using Args = QkNormRopeArgs;

  static char const* check_args(Args const& a) {
    if (a.head_dim != 64 && a.head_dim != 128) return "head_dim must be 64 or 128";
    return nullptr;
  }

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = void;
    static constexpr auto kRound = Traits::kRound;
    using TileShape = typename Traits::TileShape;
    static_assert(kPrepass || cute::size<1>(typename Traits::EpilogueTile{}) == 128,
                  "QK-norm: a 64 x 128 epilogue subtile, or the prepass");

    // z's smem buffers: as many as D's (EpilogueDescriptorOf), with a config's kStagesD too.
    using ZStore = cutlass::epilogue::collective::detail::AuxStoreDescriptor<
        gemm::EpilogueDescriptorOf<Traits, ElementC>, cutlass::layout::RowMajor, ElementD>;
    using Config = typename Traits::Config;
    using Rstd = epilogue::RstdOf<Traits>;  // read per visit on the 192x128 tile
    using U = epilogue::RowScaledAcc<TileShape, kRound, Rstd>;
    using ZStoreNode =
        cutlass::epilogue::fusion::Sm90AuxStore<ZStore::Stages, typename ZStore::EpilogueTile, ElementD, kRound,
                                                typename ZStore::Stride, typename ZStore::SmemLayoutAtom,
                                                typename ZStore::CopyOpR2S>;
    using Z = cutlass::epilogue::fusion::Sm90EVT<ZStoreNode, U>;
    // The prepass node's angle cache needs every subtile of a tile in one store() call, which stream-K's separate
    // reduction does not make.
    static_assert(!(kPrepass && Config::kStreamK), "QK-norm prepass: not on a stream-K config");
    using Node = std::conditional_t<
        kPrepass, epilogue::Sm90QkNormRopePrepass<TileShape, epilogue::detail::CacheSinCos<Config>::value>,
        epilogue::Sm90QkNormRope<TileShape>>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<Node, Z>;

    /// The node's SharedStorage in the collective's: the tree's storage is the tuple {z subtree, node}.
    struct NodeStorage {
      template <class TensorStorage>
      static CUTLASS_DEVICE auto& get(TensorStorage& ts) {
        return cute::get<1>(ts.thread);
      }
    };
    /// The builder's collective, with the node's prepass when kPrepass (named only then: Sm90QkNormRope has none).
    template <class Built, class N = Node, bool = kPrepass>
    struct WrapOf {
      using type = Built;
    };
    template <class Built, class N>
    struct WrapOf<Built, N, true> {
      using type = epilogue::Sm90PrepassCollective<Built, typename N::template Prepass<NodeStorage>>;
    };
    template <class Built>
    using WrapCollective = typename WrapOf<Built>::type;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      epilogue::set_column_vector(epilogue::node_args<Rstd, Fusion>(out), args.rstd, op.M);
      auto& z = epilogue::node_args<ZStoreNode, Fusion>(out);
      z.ptr_aux = static_cast<ElementD*>(args.z);  // null: no z store
      int64_t const ldz = args.z != nullptr ? gemm::detail::effective_ld(args.ldz, op.M, op.N, 8) : 0;
      z.dAux = gemm::detail::make_stride_from_ld<typename ZStore::Stride>(ldz, ldz * op.M);
      auto& node = epilogue::node_args<Node, Fusion>(out);
      node.q_gamma = args.q_gamma;
      node.k_gamma = args.k_gamma;
      node.inv_freq = args.inv_freq;
      node.positions = args.positions;
      node.n_q_heads = args.n_q_heads;
      node.n_kv_heads = args.n_kv_heads;
      node.head_dim = args.head_dim;
      node.eps = args.eps;
      if constexpr (kPrepass) node.rstd = args.rstd;
    }
  };
};

using QkNormRopeEpilogue = QkNormRopeEpilogueT<false>;
using QkNormRopePrepassEpilogue = QkNormRopeEpilogueT<true>;

/// A config with 64 x 128 subtiles (`_e128`) runs Sm90QkNormRope; any other the prepass program.
template <class Config, class Element = cutlass::bfloat16_t>
using QkNormRopeKernel = gemm::FusedLinear<
    Config,
    std::conditional_t<cute::size<1>(typename gemm::EpilogueTileOf<Config, Element>::type{}) == 128,
                       QkNormRopeEpilogue, QkNormRopePrepassEpilogue>,
    Element, Element, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
