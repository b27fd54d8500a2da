// QkNormRopePrepass: linear_rowscale_qk_norm_rope's node (the math of qk_norm_rope.hpp) for the builder's narrow
// epilogue subtiles (64 x 32 pingpong, 128 x 32 cooperative: 16 elements per thread per visit), with the heads' sums
// of squares taken before the subtile loop by its Prepass over the accumulators (accumulator_prepass.hpp). Per q and
// k head of row m:
//   S = sum_j acc_j^2 over the head's columns (the prepass),   r = 1 / sqrt(rstd[m]^2 S / head_dim + eps),
//   n_j = u_j r gamma[j] with u = rstd[m] acc (the node's child),   out = RoPE(n);   v heads: out = u.
//
// Why: whole heads per visit take 64 x 128 subtiles (Sm90QkNormRope: 64 fragment elements per thread beside the
// accumulators) on a pingpong tile, and 128 x 128 subtiles on the cooperative 128x256 tile (32 KiB per D and per z
// buffer: two mainloop stages fewer); here a visit holds 16, as every other fused op's.
//
// Prepass: each thread sums the squares of its accumulators per (row, 64-column group of the N tile) (its rows are
// r + 8 h + 64 mm of the MMA layout: 2 per 64-row block), the quad's xor-shuffles complete the rows, and lane 0 of
// the quad writes the sums to shared memory, [tile row][group]; a __syncwarp later the quad's lanes read them back
// in visit() (a row is only ever read by the warp that wrote it). One buffer serves both consumer warpgroups: the
// pingpong kernel runs their store() calls one after the other (its math order barrier), and a warpgroup's prepass
// writes only after the other's last read; the cooperative kernel splits the tile's rows between its warpgroups, so
// every row has one warp for good. head_dim 128 adds two neighbouring groups. rstd (the input norm's row scale)
// multiplies in visit, not in the prepass: S is of acc, not u.
//
// Angles: every q and k head of a row turns pair i by the same angle, so the visits of the tile's first head keep
// their reduced angles (rope_reduce, one register per pair and row) and the visits of its later heads reuse them; each
// visit still takes the hardware sin/cos. A tile of two or more heads (cooperative 128x256, or head_dim 64) reduces
// once per row and pair instead of once per head; the values are the same bit for bit. With kCacheSinCos the node
// keeps the sine and cosine instead (two registers per pair and row), and the later heads issue no MUFU for them:
// sin/cos share the quarter-rate XU pipe, the epilogue's narrowest. On a tile of more than 128 accumulators per thread
// (pingpong 192x128) each visit takes its own angles instead (NarrowSubtiles::kReuseAngles): the cache's registers
// would spill there.
//
// Requirements: pingpong (two consumer warpgroups of 128 epilogue threads, one tile each) or cooperative (256
// threads on one tile), an N tile that is a multiple of 128 (a head never straddles two tiles), a subtile of at most
// 64 columns; head_dim 64 or 128. Host reference: coda::ref::linear_rowscale_qk_norm_rope.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#include "epilogue/qk_norm_rope.hpp"
#include "epilogue/rope_pair.hpp"

namespace coda::epilogue {

/// Arguments of Sm90QkNormRopePrepass: those of Sm90QkNormRope and the input norm's row scale.
struct QkNormRopePrepassArguments : QkNormRopeArguments {
  float const* rstd = nullptr;  ///< [M] fp32
};

/// kCacheSinCos: keep the first head's sine and cosine for the tile's later heads (two registers per pair and row)
/// instead of the reduced angle (one); see "Angles" above.
template <class CtaTileShapeMNK, bool kCacheSinCos = false>
struct Sm90QkNormRopePrepass : QkNormRopeNodeBase<QkNormRopePrepassArguments> {
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  static constexpr int kGroups = kTileN / 64;  // 64-column groups per N tile
  static_assert(kTileN % 128 == 0, "QkNormRopePrepass: an N tile of whole 128-column heads");

  struct SharedStorage {
    alignas(16) float sumsq[kTileM][kGroups];  // [tile row][64-column group]
  };

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return valid(args) && args.rstd != nullptr;
  }

  CUTLASS_HOST_DEVICE Sm90QkNormRopePrepass() {}
  CUTLASS_HOST_DEVICE Sm90QkNormRopePrepass(Params const& params, SharedStorage const& smem)
      : params_ptr(&params), smem_ptr(&smem) {}

  Params const* params_ptr = nullptr;
  SharedStorage const* smem_ptr = nullptr;

  /// The pass over the accumulators (Sm90PrepassCollective); StorageOf::get(tensor_storage) is this node's
  /// SharedStorage in the collective's TensorStorage.
  template <class StorageOf>
  struct Prepass {
    template <class Acc, class TiledMma, class TensorStorage>
    static CUTLASS_DEVICE void run(Acc const& acc, TiledMma const& tiled_mma, int thread_idx, TensorStorage& ts) {
      using namespace cute;
      // The GMMA accumulator fragment: ((2 columns, 2 row halves, kTileN / 8 column groups), 64-row blocks, 1):
      // value (e, h, j) of block mm at tile row r0 + 64 mm + 8 h, column c0 + 8 j + e; v = e + 2 h + 4 j, so the
      // 64-column group of value v is v / 32. A cooperative kernel's warpgroups hold 64-row blocks of their own.
      constexpr int kV = decltype(size<0>(acc))::value, kMM = decltype(size<1>(acc))::value;
      constexpr int kWarpGroups = decltype(size(tiled_mma))::value / 128;
      static_assert(kV == kTileN / 2 && kMM * 64 * kWarpGroups == kTileM && decltype(size<2>(acc))::value == 1,
                    "QkNormRopePrepass: one m64 x (N tile) GMMA fragment per 64-row block");
      float s[kMM][2][kGroups] = {};  // [mm][h][64-column group]
      CUTLASS_PRAGMA_UNROLL
      for (int mm = 0; mm < kMM; ++mm) {
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < kV; ++v) {
          float const x = acc(v, mm, 0);
          float& t = s[mm][(v >> 1) & 1][v >> 5];
          t = fmaf(x, x, t);
        }
      }
      // The rows, from the MMA's own coordinates (value 2 h of block mm is column group 0 of row half h).
      Tensor const cAcc = tiled_mma.get_thread_slice(thread_idx)
                              .partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
      auto& smem = StorageOf::get(ts);
      bool const writer = (thread_idx & 3) == 0;
      CUTLASS_PRAGMA_UNROLL
      for (int mm = 0; mm < kMM; ++mm) {
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          int const row = get<0>(cAcc(2 * h, mm, 0));
          CUTLASS_PRAGMA_UNROLL
          for (int g = 0; g < kGroups; ++g) {
            float t = s[mm][h][g];
            t += __shfl_xor_sync(0xffffffffu, t, 1);
            t += __shfl_xor_sync(0xffffffffu, t, 2);
            if (writer) smem.sumsq[row][g] = t;
          }
        }
      }
      __syncwarp();
    }
  };

  /// kEpiM: the tile's subtiles along M; kEpiN: a subtile's columns; kJ: a thread's column pairs per row per visit.
  template <class CoordTensor, int kEpiM, int kEpiN, int kJ, bool kReuseAngles>
  struct ConsumerStoreCallbacks : CoordCallbacks<CoordTensor, Params> {
    using Base = CoordCallbacks<CoordTensor, Params>;
    using Base::params;
    using Base::tC_cD;
    CUTLASS_DEVICE ConsumerStoreCallbacks(CoordTensor&& coords, Params const* params, SharedStorage const* smem)
        : Base(cute::forward<CoordTensor>(coords), params), smem(smem) {}

    SharedStorage const* smem;
    detail::HeadAngleCache<kEpiM, kEpiN, kJ, kCacheSinCos, kReuseAngles> angles;  // see "Angles" above
    // The current head's norm scale of rows r and r + 8, per epi_m: set by the head's first subtile, read by its
    // later ones (the collective visits epi_n in order, epi_m inside), so rstd, the sums and the rsqrt are taken
    // once per row and head rather than once per visit.
    float rh_[kEpiM][2];

    /// Norm and RoPE of one visit with kSub subtiles per head (head_dim / kEpiN): rows r and r + 8, the head's
    /// 64-column group g of the tile.
    template <int kSub, class In, class Out>
    CUTLASS_DEVICE void rotate(In const& u, Out& out, float const* gamma, int r, int c, int g, int epi_m, int epi_n) {
      int const M = params->M;
      float(&rh)[2] = rh_[epi_m];
      if (epi_n % kSub == 0) {
        constexpr float kInvHd = 1.0f / (kSub * kEpiN);
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          int const m = r + 8 * h;
          float const* const sums = smem->sumsq[m % kTileM];
          float const sum = kSub * kEpiN == 128 ? sums[g & ~1] + sums[g | 1] : sums[g];
          float const x = __ldg(params->rstd + min(m, M - 1));
          rh[h] = rsqrtf(fmaf(x * x, sum * kInvHd, params->eps));
        }
      }
      detail::norm_rotate_with<0, kJ>(
          u, out, rh, gamma, c, kSub * kEpiN,
          angles.template at<kSub>(epi_m, epi_n, params->positions, r, M, params->inv_freq, c));
    }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& u) {
      static_assert(FragmentSize == 4 * kJ && FragmentSize <= 32,
                    "expects a subtile of at most 64 columns: column groups x 2 rows x 2 per thread");
      int const hd = params->head_dim;
      auto const [r, c, head] = detail::head_visit(tC_cD, epi_m, epi_n, hd);
      cutlass::Array<float, FragmentSize> out;
      if (head >= params->n_q_heads + params->n_kv_heads) {
        detail::pass_through(u, out);
        return out;
      }
      float const* const gamma = head < params->n_q_heads ? params->q_gamma : params->k_gamma;
      int const g = (c % kTileN) >> 6;  // the tile's N origin is a multiple of kTileN
      if (hd == 128) {
        rotate<128 / kEpiN>(u, out, gamma, r, c, g, epi_m, epi_n);
      } else {
        rotate<64 / kEpiN>(u, out, gamma, r, c, g, epi_m, epi_n);
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
    return ConsumerStoreCallbacks<decltype(coords), G::kEpiM, G::kEpiN, G::kJ, G::kReuseAngles>(
        cute::move(coords), params_ptr, smem_ptr);
  }
};

}  // namespace coda::epilogue
