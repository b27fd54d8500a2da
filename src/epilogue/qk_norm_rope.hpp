// QkNormRope: a custom sm90 EVT node for linear_rowscale_qk_norm_rope (MATH.md): on the q/k projection's fragment
// u = rstd[m] * acc (its child), per q and k head of row m
//   r = 1 / sqrt(mean_j u_j^2 + eps),   n_j = u_j r gamma[j],   out = RoPE(n) (linear_rowscale_rope's pair rotation)
// with gamma = q_gamma on q heads and k_gamma on k heads ([head_dim] fp32, in the paired column layout of the
// heads); v heads pass through (out = u). Returns out; the collective rounds it once to D.
//
// Why a custom node: the head's mean square needs every column of the head for a row, which no stock node
// reduces. The config's epilogue subtile is 64 x 128, the whole N tile (gemm/configs.hpp, `_e128`), so one visit
// holds 64 accumulator elements per thread: element 4j + 2h + e at (r + 8h, c + 8j + e), j < 16, c = the subtile's
// first column + 2 (lane % 4) (CUTLASS_EVT.md section 4). The 4 lanes of a quad share rows r and r + 8 and
// together cover all 128 columns: a head's sum is the thread's squares plus two xor-shuffles. head_dim 128 is one
// head per subtile, 64 two (j < 8 and j >= 8); head boundaries fall on 64-column multiples of the tile, since the
// tile's N origin is a multiple of 128. Which heads are q, k or v depends on the tile's column origin alone, so the
// branches are uniform over the warp.
//
// Angles as linear_rowscale_rope's (rope_pair.hpp: exact for positions < 2^24); gamma and inv_freq are read per column
// pair with __ldg (L1-resident, 1 KiB), the positions per row (two per visit; rows >= M read row M - 1 and are never
// stored). At head_dim 64 with both heads of the subtile q or k, columns j and j + 8 are the same pair of their heads:
// one sin/cos serves both. Columns >= N hold zero accumulators (TMA zero fill); their heads are past the last v head
// and pass through.
//
// Requirements (checked by can_implement and the op's validation): pingpong (128 epilogue threads), a 128-wide N
// tile and a 64 x 128 subtile; head_dim 64 or 128; inv_freq [head_dim / 2] fp32.
//
// Host reference of the node's semantics: coda::ref::linear_rowscale_qk_norm_rope (src/reference/qk_norm.cpp).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#include "epilogue/rope_pair.hpp"

namespace coda::epilogue {

/// Arguments of Sm90QkNormRope (all device pointers; the op validates them).
struct QkNormRopeArguments {
  float const* q_gamma = nullptr;     ///< [head_dim] fp32, paired layout
  float const* k_gamma = nullptr;     ///< [head_dim] fp32, paired layout
  float const* inv_freq = nullptr;    ///< [head_dim / 2] fp32: pair i of every q/k head turns by pos * inv_freq[i]
  int32_t const* positions = nullptr; ///< [M] int32, 0 <= pos < 2^24
  int n_q_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  ///< 64 or 128
  float eps = 0.0f;  ///< the per-head norm's epsilon
};

namespace detail {

/// One pair's norm and rotation: fragment elements (k, k + 1) of one row, out = R(u rh gamma) by the angle (s, co).
template <class In, class Out>
CUTLASS_DEVICE void norm_rotate_pair(In const& u, Out& out, int k, float rh, float2 g, float s, float co) {
  float const n0 = static_cast<float>(u[k]) * rh * g.x;
  float const n1 = static_cast<float>(u[k + 1]) * rh * g.y;
  rope_rotate(n0, n1, s, co, out[k], out[k + 1]);
}

/// The per-head norm's scale and RoPE on fragment pairs J0 <= j < J1 (element 4j + 2h + e at row r + 8h, column
/// first_col + 8j + e): out = R(u rh[h] gamma), the pair's angle pos[h] * inv_freq[its column within the head / 2].
template <int J0, int J1, class In, class Out>
CUTLASS_DEVICE void norm_rotate_pairs(In const& u, Out& out, float const (&rh)[2], float const (&pos)[2],
                                      float const* gamma, float const* inv_freq, int first_col, int head_dim) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = J0; j < J1; ++j) {
    int const col = (first_col + 8 * j) & (head_dim - 1);  // even: the pair's first column within its head
    float2 const g = __ldg(reinterpret_cast<float2 const*>(gamma + col));
    float const f = __ldg(inv_freq + col / 2);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      float s, co;
      rope_sincos(pos[h], f, &s, &co);
      norm_rotate_pair(u, out, 4 * j + 2 * h, rh[h], g, s, co);
    }
  }
}

/// What a head-aware RoPE node (QK-norm prepass, RopeHeads) keeps of one pair's angle for a tile's later heads: the
/// reduced angle (one register; each use takes the hardware sin/cos of it) or its sine and cosine (two registers, no
/// MUFU on reuse). The same values either way.
template <bool kSinCos>
struct PairAngle {
  float r;
  CUTLASS_DEVICE void set(float pos, float f) { r = rope_reduce(pos, f); }
  CUTLASS_DEVICE void get(float* s, float* co) const { __sincosf(r, s, co); }
};
template <>
struct PairAngle<true> {
  float s, co;
  CUTLASS_DEVICE void set(float pos, float f) { rope_sincos(pos, f, &s, &co); }
  CUTLASS_DEVICE void get(float* s_out, float* co_out) const {
    *s_out = s;
    *co_out = co;
  }
};

/// The angles of fragment pairs J0 <= j < J1 (column first_col + 8j, rows r + 8h): a[j - J0][h] is pos[h] *
/// inv_freq[the pair's column within its head / 2].
template <int J0, int J1, bool kSinCos>
CUTLASS_DEVICE void rope_angles(float const (&pos)[2], float const* inv_freq, int first_col, int head_dim,
                                PairAngle<kSinCos> (&a)[J1 - J0][2]) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = J0; j < J1; ++j) {
    int const col = (first_col + 8 * j) & (head_dim - 1);  // even: the pair's first column within its head
    float const f = __ldg(inv_freq + col / 2);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) a[j - J0][h].set(pos[h], f);
  }
}

/// The per-head norm's scale and RoPE on fragment pairs J0 <= j < J1 (element 4j + 2h + e at row r + 8h, column
/// first_col + 8j + e) by the angles of rope_angles: out = R(u rh[h] gamma).
template <int J0, int J1, bool kSinCos, class In, class Out>
CUTLASS_DEVICE void norm_rotate_with(In const& u, Out& out, float const (&rh)[2], float const* gamma, int first_col,
                                     int head_dim, PairAngle<kSinCos> const (&a)[J1 - J0][2]) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = J0; j < J1; ++j) {
    int const col = (first_col + 8 * j) & (head_dim - 1);
    float2 const g = __ldg(reinterpret_cast<float2 const*>(gamma + col));
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      float s, co;
      a[j - J0][h].get(&s, &co);
      norm_rotate_pair(u, out, 4 * j + 2 * h, rh[h], g, s, co);
    }
  }
}

/// A config's `kCacheSinCos` when it names one (coop_128x256x64_c2x1_sc), else false: the head-aware RoPE nodes keep
/// the sine and cosine of the tile's first head (PairAngle<true>) instead of its reduced angles.
template <class Config, class = void>
struct CacheSinCos : std::false_type {};
template <class Config>
struct CacheSinCos<Config, std::void_t<decltype(Config::kCacheSinCos)>>
    : std::integral_constant<bool, Config::kCacheSinCos> {};

/// RoPE alone (no norm) on fragment pairs J0 <= j < J1 by the angles of rope_angles: out = R(u).
template <int J0, int J1, bool kSinCos, class In, class Out>
CUTLASS_DEVICE void rotate_with(In const& u, Out& out, PairAngle<kSinCos> const (&a)[J1 - J0][2]) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = J0; j < J1; ++j) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      int const k = 4 * j + 2 * h;
      float s, co;
      a[j - J0][h].get(&s, &co);
      rope_rotate(static_cast<float>(u[k]), static_cast<float>(u[k + 1]), s, co, out[k], out[k + 1]);
    }
  }
}

/// The visit geometry of a head-aware node on narrow subtiles (QK-norm prepass, RopeHeads): kEpiM subtiles along M of
/// a kTileM-row tile, kEpiN columns per subtile, kJ column pairs per thread, row and visit (the MMA fragment's layout:
/// element 4j + 2h + e at row r + 8h, column c + 8j + e), from the collective's subtile and epilogue thread count.
/// kReuseAngles: whether the tile's later heads may keep its first head's angles (HeadAngleCache) across visits, up
/// to 64 registers beside the accumulators; only where a thread holds at most 128 of them (the 192-row pingpong tile
/// holds 192 and recomputes the angles per visit instead).
template <int kTileM, int kTileN, class EpiTile, int kThreads>
struct NarrowSubtiles {
  static_assert(kThreads % 128 == 0, "head-aware RoPE node: whole warpgroups of epilogue threads (a quad's lanes "
                                     "share rows)");
  static constexpr int kRows = cute::size<0>(EpiTile{});
  static constexpr int kEpiN = cute::size<1>(EpiTile{});
  static_assert(kTileM % kRows == 0 && 64 % kEpiN == 0 && (kRows * kEpiN) % (4 * kThreads) == 0,
                "head-aware RoPE node: subtiles that divide the tile and a 64-column group");
  static constexpr int kEpiM = kTileM / kRows;
  static constexpr int kJ = kRows * kEpiN / (4 * kThreads);
  static constexpr bool kReuseAngles = kTileM * kTileN / kThreads <= kAccumulatorsWithRoom;
};

/// Where a narrow-subtile visit lies: rows r and r + 8 of its fragment, its first column c, and the head its columns
/// lie in (head_dim 64 or 128: a subtile of at most 64 columns never straddles two heads).
struct HeadVisit {
  int r, c, head;
};
template <class CoordTensor>
CUTLASS_DEVICE HeadVisit head_visit(CoordTensor const& tC_cD, int epi_m, int epi_n, int head_dim) {
  auto const origin = fragment_origin(tC_cD, epi_m, epi_n);
  int const c = cute::get<1>(origin);
  return {cute::get<0>(origin), c, head_dim == 128 ? c >> 7 : c >> 6};
}

/// out = u element by element: the columns a head-aware node does not turn (v heads, and columns past N).
template <class ElementInput, int N>
CUTLASS_DEVICE void pass_through(cutlass::Array<ElementInput, N> const& u, cutlass::Array<float, N>& out) {
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < N; ++k) out[k] = static_cast<float>(u[k]);
}

/// The angles of a tile's q and k heads across its epilogue visits (narrow subtiles: kEpiN <= 64 columns, kEpiM
/// subtiles along M, kJ column pairs per row and visit). Every q and k head of a row turns pair i by the same angle,
/// so the visits of the tile's first head compute them and the visits of its later heads read them back: slot =
/// (epi_m, the visit's subtile within its head). A q or k head is never preceded by a v head, so whenever a later
/// head reads a slot, the first head's visit filled it. Indexed by constants once the collective's unrolled subtile
/// loop inlines the visit (registers, no local memory). !kReuse: one slot, every visit computes its own angles (the
/// same values).
template <int kEpiM, int kEpiN, int kJ, bool kSinCos, bool kReuse = true>
struct HeadAngleCache {
  static constexpr int kSlots = kReuse ? kEpiM * (128 / kEpiN) : 1;
  PairAngle<kSinCos> slot_[kSlots][kJ][2];

  /// The angles of the visit (epi_m, epi_n) of a q or k head with kSub subtiles per head (head_dim / kEpiN); the
  /// fragment's rows r and r + 8 (their positions read only by the first head's visits; rows >= M read row M - 1),
  /// its first column first_col.
  template <int kSub>
  CUTLASS_DEVICE auto const& at(int epi_m, int epi_n, int32_t const* positions, int r, int M, float const* inv_freq,
                                int first_col) {
    int const slot = kReuse ? epi_m * kSub + epi_n % kSub : 0;
    if (!kReuse || epi_n < kSub) {
      float const pos[2] = {static_cast<float>(__ldg(positions + min(r, M - 1))),
                            static_cast<float>(__ldg(positions + min(r + 8, M - 1)))};
      rope_angles<0, kJ>(pos, inv_freq, first_col, kSub * kEpiN, slot_[slot]);
    }
    return slot_[slot];
  }
};

}  // namespace detail

/// What both QK-norm nodes share on the host: Params = their Arguments plus M, and the argument rule.
template <class Args>
struct QkNormRopeNodeBase : Sm90StoreOnlyNode {
  using Arguments = Args;
  struct Params : Arguments {
    int M = 0;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    Params p;
    static_cast<Arguments&>(p) = args;
    p.M = static_cast<int>(cute::get<0>(problem_shape));
    return p;
  }

  static bool valid(QkNormRopeArguments const& args) {
    return args.q_gamma != nullptr && args.k_gamma != nullptr && args.inv_freq != nullptr &&
           args.positions != nullptr && (args.head_dim == 64 || args.head_dim == 128) && args.n_q_heads > 0 &&
           args.n_kv_heads > 0 && args.eps >= 0.0f;
  }
};

template <class CtaTileShapeMNK>
struct Sm90QkNormRope : QkNormRopeNodeBase<QkNormRopeArguments> {
  static_assert(cute::size<1>(CtaTileShapeMNK{}) == 128, "QkNormRope: one 128-wide N tile is one epilogue subtile");

  struct SharedStorage {};

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return valid(args);
  }

  CUTLASS_HOST_DEVICE Sm90QkNormRope() {}
  CUTLASS_HOST_DEVICE Sm90QkNormRope(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  template <class CoordTensor>
  struct ConsumerStoreCallbacks : CoordCallbacks<CoordTensor, Params> {
    using Base = CoordCallbacks<CoordTensor, Params>;
    using Base::Base;
    using Base::params;
    using Base::tC_cD;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& u) {
      static_assert(FragmentSize == 64, "expects a 64 x 128 subtile over 128 threads: 16 column groups x 2 rows x 2");
      auto const origin = fragment_origin(tC_cD, epi_m, epi_n);
      int const r = cute::get<0>(origin), c = cute::get<1>(origin);
      int const lane2 = c & 127;  // 2 (lane % 4): the tile's N origin is a multiple of 128
      int const base = c - lane2;

      // Sums of squares of rows r, r + 8 over columns [64 t, 64 t + 64) of the subtile, merged over the quad.
      float ss[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [t][h]
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < FragmentSize; ++k) {
        float const v = static_cast<float>(u[k]);
        ss[k / 32][(k >> 1) & 1] = fmaf(v, v, ss[k / 32][(k >> 1) & 1]);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < 2; ++t) {
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          ss[t][h] += __shfl_xor_sync(0xffffffffu, ss[t][h], 1);
          ss[t][h] += __shfl_xor_sync(0xffffffffu, ss[t][h], 2);
        }
      }
      int const hd = params->head_dim;
      bool const whole = hd == 128;  // one head over both halves
      float const inv_hd = whole ? 1.0f / 128.0f : 1.0f / 64.0f;
      int const n_rot = params->n_q_heads + params->n_kv_heads;
      int const M = params->M;
      float const pos[2] = {static_cast<float>(__ldg(params->positions + min(r, M - 1))),
                            static_cast<float>(__ldg(params->positions + min(r + 8, M - 1)))};

      cutlass::Array<float, FragmentSize> out;
      int const head1 = (base + 64) / hd;
      if (!whole && head1 < n_rot) {
        // head_dim 64, both halves q or k heads: column j and j + 8 hold the same pair of their heads, so one angle
        // serves both (half the sin/cos of the general path below; the same values, bit for bit).
        int const head0 = head1 - 1;
        float const* const gamma0 = head0 < params->n_q_heads ? params->q_gamma : params->k_gamma;
        float const* const gamma1 = head1 < params->n_q_heads ? params->q_gamma : params->k_gamma;
        float rh[2][2];  // [t][h]
        CUTLASS_PRAGMA_UNROLL
        for (int t = 0; t < 2; ++t) {
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < 2; ++h) rh[t][h] = rsqrtf(fmaf(ss[t][h], inv_hd, params->eps));
        }
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 8; ++j) {
          int const col = (lane2 + 8 * j) & 63;
          float const f = __ldg(params->inv_freq + col / 2);
          float2 const g0 = __ldg(reinterpret_cast<float2 const*>(gamma0 + col));
          float2 const g1 = __ldg(reinterpret_cast<float2 const*>(gamma1 + col));
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < 2; ++h) {
            float s, co;
            detail::rope_sincos(pos[h], f, &s, &co);
            detail::norm_rotate_pair(u, out, 4 * j + 2 * h, rh[0][h], g0, s, co);
            detail::norm_rotate_pair(u, out, 4 * (j + 8) + 2 * h, rh[1][h], g1, s, co);
          }
        }
        return out;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < 2; ++t) {
        int const head = (base + 64 * t) / hd;
        if (head >= n_rot) {  // v heads, and columns past N: pass through
          CUTLASS_PRAGMA_UNROLL
          for (int k = 32 * t; k < 32 * t + 32; ++k) out[k] = static_cast<float>(u[k]);
          continue;
        }
        float const* const gamma = head < params->n_q_heads ? params->q_gamma : params->k_gamma;
        float rh[2];
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          float const sum = whole ? ss[0][h] + ss[1][h] : ss[t][h];
          rh[h] = rsqrtf(fmaf(sum, inv_hd, params->eps));
        }
        if (t == 0) {
          detail::norm_rotate_pairs<0, 8>(u, out, rh, pos, gamma, params->inv_freq, lane2, hd);
        } else {
          detail::norm_rotate_pairs<8, 16>(u, out, rh, pos, gamma, params->inv_freq, lane2, hd);
        }
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    static_assert(decltype(cute::size(args.tiled_copy))::value == 128,
                  "QkNormRope: a pingpong epilogue (128 threads; a quad's lanes share rows)");
    auto coords = fragment_coords<ReferenceSrc>(args);
    return ConsumerStoreCallbacks<decltype(coords)>(cute::move(coords), params_ptr);
  }
};

}  // namespace coda::epilogue
