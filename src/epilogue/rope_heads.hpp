// RopeHeads: a custom sm90 EVT node for linear_rowscale_rope's head-aware kernels: on the q/k/v projection's fragment
// u = rstd[m] * acc (its child), each adjacent column pair (2i, 2i+1) of a q or k head is turned by
// theta = pos[m] * inv_freq[i] (RopeRowscale's rotation, rope_pair.hpp), v heads and columns past N pass through.
// The same values as the stateless RopeRowscale program, bit for bit, except at a zero frequency inside a q or k head
// (none in RoPE's inv_freq): RopeRowscale passes such a pair through, this node turns it by angle 0, which can flip
// the sign of a zero and turns an infinite input into NaN.
//
// Why a node: RopeRowscale sees one fragment at a time and takes the angle's reduction and sin/cos for every pair of
// every head, though every q and k head of a row turns pair i by the same angle. This node keeps the tile's first
// head's angles across the epilogue's visits (detail::HeadAngleCache, qk_norm_rope.hpp) and the later heads read them
// back; with kCacheSinCos it keeps their sine and cosine, so the later heads issue no MUFU (the quarter-rate XU pipe,
// the epilogue's narrowest), at two registers per pair and row. On a tile of more than 128 accumulators per thread
// (pingpong 192x128) there are no registers for the cache: each visit takes its own angles
// (NarrowSubtiles::kReuseAngles).
//
// Requirements (checked by can_implement and the op's validation): narrow subtiles (at most 64 columns: 64 x 32 and
// 64 x 64 pingpong, 128 x 32 cooperative; 16 or 32 fragment elements per thread per visit), an N tile that is a
// multiple of 128 (the tile's N origin falls on a head boundary); head_dim 64 or 128; inv_freq [head_dim / 2] fp32;
// positions [M] int32, 0 <= pos < 2^24. Host reference of the semantics: rope_pair_reference() per pair.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#include "epilogue/qk_norm_rope.hpp"

namespace coda::epilogue {

/// Arguments of Sm90RopeHeads (device pointers; the op validates them).
struct RopeHeadsArguments {
  int32_t const* positions = nullptr;  ///< [M] int32, 0 <= pos < 2^24
  float const* inv_freq = nullptr;     ///< [head_dim / 2] fp32: pair i of every q/k head turns by pos * inv_freq[i]
  int n_rot_heads = 0;                 ///< q heads + k heads (the heads RoPE turns; the v heads follow them)
  int head_dim = 0;                    ///< 64 or 128
};

/// Params = Arguments plus M, as the QK-norm nodes' (QkNormRopeNodeBase, whose argument rule is theirs, not used).
template <class CtaTileShapeMNK, bool kCacheSinCos = false>
struct Sm90RopeHeads : QkNormRopeNodeBase<RopeHeadsArguments> {
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  static_assert(kTileN % 128 == 0, "RopeHeads: an N tile of whole 128-column groups (heads never straddle tiles)");

  struct SharedStorage {};

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.positions != nullptr && args.inv_freq != nullptr && args.n_rot_heads > 0 &&
           (args.head_dim == 64 || args.head_dim == 128);
  }

  CUTLASS_HOST_DEVICE Sm90RopeHeads() {}
  CUTLASS_HOST_DEVICE Sm90RopeHeads(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  /// kEpiM: the tile's subtiles along M; kEpiN: a subtile's columns; kJ: a thread's column pairs per row per visit.
  template <class CoordTensor, int kEpiM, int kEpiN, int kJ, bool kReuseAngles>
  struct ConsumerStoreCallbacks : CoordCallbacks<CoordTensor, Params> {
    using Base = CoordCallbacks<CoordTensor, Params>;
    using Base::Base;
    using Base::params;
    using Base::tC_cD;
    detail::HeadAngleCache<kEpiM, kEpiN, kJ, kCacheSinCos, kReuseAngles> angles;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& u) {
      static_assert(FragmentSize == 4 * kJ, "column groups x 2 rows x 2 per thread");
      int const hd = params->head_dim;
      auto const [r, c, head] = detail::head_visit(tC_cD, epi_m, epi_n, hd);
      cutlass::Array<float, FragmentSize> out;
      if (head >= params->n_rot_heads) {
        detail::pass_through(u, out);
        return out;
      }
      int32_t const* const positions = params->positions;
      int const M = params->M;
      if (hd == 128) {
        detail::rotate_with<0, kJ>(
            u, out, angles.template at<128 / kEpiN>(epi_m, epi_n, positions, r, M, params->inv_freq, c));
      } else {
        detail::rotate_with<0, kJ>(
            u, out, angles.template at<64 / kEpiN>(epi_m, epi_n, positions, r, M, params->inv_freq, c));
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using G = detail::NarrowSubtiles<kTileM, kTileN, decltype(args.epi_tile),
                                     decltype(cute::size(args.tiled_copy))::value>;
    auto coords = fragment_coords<ReferenceSrc>(args);
    return ConsumerStoreCallbacks<decltype(coords), G::kEpiM, G::kEpiN, G::kJ, G::kReuseAngles>(cute::move(coords),
                                                                                                params_ptr);
  }
};

}  // namespace coda::epilogue
