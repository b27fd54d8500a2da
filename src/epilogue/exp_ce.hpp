// ExpCe: a custom sm90 EVT node for the LM head's backward (linear_cross_entropy_bwd's "exponential form", MATH.md): it
// turns its input fragment l (the fp32 logits rstd * acc) into the scaled exponentials the two gradient GEMMs read,
// with one offset per row known before the GEMM, and per-(row, CTA N-tile) sums for the finishing kernel.
//
// Per element (m, n) (n < vocab with kMaskColumns; the LM head's GEMM N may be V rounded up to 8):
//   c = cap tanh(l / cap), s = 1 - tanh^2(l / cap)    (c = l, s = 1 without softcap; tanh_ex2 below)
//   e = exp(c - K[m])                                   (ex2.approx.ftz: terms below 2^-126 flush to 0)
//   returned (the stored D):  s * e
// Per row m and CTA N-tile t (tile_base + the tile's index), over its columns, fp32 buffers [T, Mpad] (element
// (t, m) at m + Mpad * t):
//   sumexp[t][m] = sum_n e
//   dot[t][m]    = sum_n l s e                          (the row dot of the gradient, MATH.md rewrite 2)
// K[m] = +inf (an ignored row) gives e = 0 everywhere, a NaN K gives NaN. Rows >= M are never written. No atomics,
// no smem: deterministic.
//
// Why one offset per row: dl = v (.) E' with a per-row v once lse is known (kernels::ce_exp_finish), so both consumer
// GEMMs keep plain smem-sourced mainloops and no pass over [M, V] runs between them (the logits path's cross_entropy).
// The offset (the target's capped logit) bounds nothing from above: the finishing kernel sends rows whose lse - K is
// too large to a recompute (kernels::ce_exp_rescue).
//
// Also target[m] = e at column targets[m] (the fp32 value inside the sums), written by the one thread that sees it.
//
// How: as OnlineLse (online_lse.hpp): per-row register state through stride-0 tensors, quad xor-shuffle merge in
// reduce() on the last subtile, K * log2e, rstd and the target column loaded once per owned row in begin(), the
// target's e kept until reduce() in the register that held its column (on pingpong 128x128, whose 128 accumulators
// leave 40 of 168 registers, a store straight from visit() spilled 96 bytes and a register of its own 8; without
// softcap even this spilled 4, so that variant runs on the cooperative 128x256 tile: ops/linear_rowscale_exp).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>  // before the visitor header, which uses it without including it
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#include "epilogue/online_lse.hpp"  // ex2_approx

namespace coda::epilogue {

/// tanh(x) = 1 - 2 / (2^(2x log2e) + 1) with the bare MUFU ex2 and the MUFU reciprocal: absolute error ~2e-7 (tanhf's
/// accurate path needs more registers than the pingpong kernel has left beside its 128 accumulators: it spilled).
/// Saturates to +-1 (ex2 gives +inf or 0).
CUTLASS_DEVICE float tanh_ex2(float x) {
  float const e2 = ex2_approx(x * 2.8853900817779268f);  // 2 log2(e)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e2 + 1.0f));  // rcp(+inf) = 0
  return fmaf(-2.0f, r, 1.0f);
}

/// Softcap compiled in (kOn), out (kOff: cap ignored), or chosen per call (kRunTime: both paths in one register
/// allocation, which the pingpong 128x128 kernel has no room for; only the masked 128x64 kernel uses it).
enum class SoftcapMode { kOff, kOn, kRunTime };

/// Run-time arguments of ExpCe (all pointers device memory).
struct ExpCeArguments {
  float const* rstd = nullptr;    ///< [M] row scale of the accumulator: l = rstd acc
  float cap = 0.0f;               ///< softcap c >= 0 (0 = off)
  float inv_cap = 0.0f;           ///< inverse_softcap(c) (epilogue/softcap.hpp)
  float const* offset = nullptr;  ///< [M] K, fp32
  int64_t vocab = 0;              ///< kMaskColumns: columns >= vocab (of this problem) are left out of the sums
  int64_t tile_base = 0;          ///< N-tile index of the problem's first column in the partials
  int64_t m_pad = 0;              ///< Mpad of the partials (M rounded up to the partials' M tile)
  float* ptr_sumexp = nullptr;    ///< [T, Mpad]
  float* ptr_dot = nullptr;       ///< [T, Mpad]
  float* ptr_target = nullptr;    ///< [M] e at the target column (this GEMM's own fp32 value), by its owner tile
  void const* targets = nullptr;  ///< [M] int32 or int64
  bool targets_int64 = false;
  int64_t col_base = 0;           ///< vocabulary column of the problem's first column
};

/// The node, unary: its child is the accumulator fetch (l = rstd acc is formed here: one fragment fewer in flight
/// than a separate multiply node). `CtaTileShapeMNK` is the kernel's CTA tile. kMaskColumns: columns >= vocab are
/// left out of the sums; without it every column of the problem is a real one (the caller makes N a multiple of
/// the tile width). The per-element column mask costs registers that the pingpong 128x128 kernel does not have (it
/// spilled 12 bytes, with or without softcap), so the masked node runs on a narrow tile over the vocabulary's last
/// columns only (ops/linear_rowscale_exp). Rows >= M need no mask: their partials are never written and TMA clips
/// their D.
template <class CtaTileShapeMNK, bool kMaskColumns, SoftcapMode kSoftcap>
struct ExpCe : Sm90StoreOnlyNode {
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kLn2 = 0.6931471805599453f;

  struct SharedStorage {};
  using Arguments = ExpCeArguments;
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem, Arguments const& args) {
    int64_t const tiles = (static_cast<int64_t>(cute::get<1>(problem)) + kTileN - 1) / kTileN;
    if (args.m_pad * (args.tile_base + tiles) > int64_t{INT32_MAX}) return false;  // 32-bit partial indices
    return args.rstd != nullptr && args.offset != nullptr && args.ptr_sumexp != nullptr &&
           args.ptr_dot != nullptr && args.ptr_target != nullptr && args.targets != nullptr && args.m_pad > 0 &&
           (!kMaskColumns || args.vocab > 0);
  }

  CUTLASS_HOST_DEVICE ExpCe() {}
  CUTLASS_HOST_DEVICE ExpCe(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  /// FTensor: per-row float state (stride 0 along N); CTensor: the thread's fragment coordinates relative to its
  /// first element; Residue: (M, N) minus that first element's coordinate.
  template <class FTensor, class ITensor, class CTensor, class Residue, class TileResidue, class LaneLayout,
            class LaneCoord>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(FTensor&& rs, FTensor&& k, FTensor&& se, FTensor&& dt, ITensor&& tc,
                                          CTensor crd,
                                          Residue residue, TileResidue tile_residue, LaneLayout lane_layout,
                                          LaneCoord lane_mn, int m_first, int64_t n_first, int n_valid,
                                          int part_offset,
                                          Params const* params)
        : tCrRstd(cute::forward<FTensor>(rs)),
          tCrK(cute::forward<FTensor>(k)),
          tCrSumExp(cute::forward<FTensor>(se)),
          tCrDot(cute::forward<FTensor>(dt)),
          tCrTargetCol(cute::forward<ITensor>(tc)),
          tCcD(crd),
          residue_tCcD(residue),
          residue_cD(tile_residue),
          lane_layout_MN(lane_layout),
          lane_mn(lane_mn),
          m_first(m_first),
          n_first(n_first),
          n_valid(n_valid),
          part_offset(part_offset),
          params(params) {}

    FTensor tCrRstd;  // rstd per owned row
    FTensor tCrK;     // K * log2e per owned row
    FTensor tCrSumExp, tCrDot;
    // Per row: the target column relative to the thread's first column (>= 0), -1 (none here), or once seen the
    // bits of -e (sign bit set, so < -1 for any e >= 0): one register holds both.
    ITensor tCrTargetCol;
    CTensor tCcD;
    Residue residue_tCcD;
    TileResidue residue_cD;
    LaneLayout lane_layout_MN;
    LaneCoord lane_mn;
    int m_first;          // absolute row of the thread's first fragment element (32-bit: registers are scarce)
    int64_t n_first;      // vocabulary column of the thread's first fragment element
    int n_valid;          // kMaskColumns: columns relative to the thread's first one that are < vocab
    int part_offset;      // Mpad * (tile_base + n): start of this tile's partials (< 2^31: can_implement)
    Params const* params;

    CUTLASS_DEVICE void begin() {
      cute::fill(tCrSumExp, 0.0f);
      cute::fill(tCrDot, 0.0f);
      cute::fill(tCrK, 0.0f);
      cute::fill(tCrRstd, 0.0f);
      cute::fill(tCrTargetCol, -1);
      auto ks = cute::filter_zeros(tCrK);
      auto rs = cute::filter_zeros(tCrRstd);
      auto tcs = cute::filter_zeros(tCrTargetCol);
      auto crd = cute::filter_zeros(tCcD, tCrK.stride());
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(ks); ++i) {
        int const m_rel = static_cast<int>(cute::get<0>(crd(i)));
        if (m_rel < cute::get<0>(residue_tCcD)) {
          int const m = m_first + m_rel;
          ks(i) = params->offset[m] * kLog2e;  // +inf stays +inf, NaN stays NaN
          // kOff: rstd log2e, so that x = acc rstd log2e - k2 is one FMA, e = 2^x, and the dot sums x e (reduce()
          // adds k2 sum e and scales by ln 2: l = (x + k2) ln 2): fewer values live per element.
          rs(i) = kSoftcap == SoftcapMode::kOff ? params->rstd[m] * kLog2e : params->rstd[m];
          int64_t const t = params->targets_int64
                                ? static_cast<int64_t const*>(params->targets)[m]
                                : static_cast<int64_t>(static_cast<int32_t const*>(params->targets)[m]);
          int64_t const rel = t - n_first;  // ignored / out-of-range targets never match a column below
          tcs(i) = (t >= 0 && rel >= 0 && rel < kTileN) ? static_cast<int>(rel) : -1;
        }
      }
    }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize> visit(cutlass::Array<ElementAccumulator, FragmentSize> const&,
                                                             int epi_v, int epi_m, int epi_n,
                                                             cutlass::Array<ElementInput, FragmentSize> const& frg_acc) {
      using cute::_;
      cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> convert{};
      cutlass::Array<float, FragmentSize> l = convert(frg_acc);  // overwritten in place with the result
      auto rs = tCrRstd(_, _, _, epi_m, epi_n);
      auto k2 = tCrK(_, _, _, epi_m, epi_n);
      auto se = tCrSumExp(_, _, _, epi_m, epi_n);
      auto dt = tCrDot(_, _, _, epi_m, epi_n);
      auto tc = tCrTargetCol(_, _, _, epi_m, epi_n);
      auto crd = tCcD(_, _, _, epi_m, epi_n);
      int const base = epi_v * FragmentSize;

      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        bool valid = true;
        if constexpr (kMaskColumns) valid = static_cast<int>(cute::get<1>(crd(base + i))) < n_valid;
        float li = l[i], s = 1.0f, e;
        if constexpr (kSoftcap == SoftcapMode::kOff) {
          li = fmaf(li, rs(base + i), -k2(base + i));  // x: the exponent in base 2
          e = valid ? ex2_approx(li) : 0.0f;
        } else {
          li *= rs(base + i);
          float c = li;
          float const cap = params->cap, inv_cap = params->inv_cap;
          if (kSoftcap == SoftcapMode::kOn || cap != 0.0f) {
            float const t = tanh_ex2(li * inv_cap);
            c = cap * t;
            s = fmaf(-t, t, 1.0f);
          }
          e = valid ? ex2_approx(fmaf(c, kLog2e, -k2(base + i))) : 0.0f;
        }
        // The target's e (one thread per row sees it): the finish needs this GEMM's own value, the one inside the
        // sums (a recomputed l_t differs by fp32 summation order, ~1e-5 of e_t at l ~ 25).
        if (static_cast<int>(cute::get<1>(crd(base + i))) == tc(base + i) && valid) {
          tc(base + i) = __float_as_int(-e);
        }
        float const se_i = s * e;
        se(base + i) += e;
        dt(base + i) = fmaf(li, se_i, dt(base + i));
        l[i] = se_i;
      }
      return l;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&&, SyncFn const&, int, int, bool is_last_iteration, VTensor) {
      if (!is_last_iteration) return;
      // A CTA entirely outside the problem has nothing to write (uniform over the CTA: no lane skips a shuffle).
      if (!cute::elem_less(cute::make_coord(0, 0), residue_cD)) return;
      auto se = cute::filter_zeros(tCrSumExp);
      auto dt = cute::filter_zeros(tCrDot);
      auto crd = cute::filter_zeros(tCcD, tCrSumExp.stride());
      auto tc = cute::filter_zeros(tCrTargetCol);
      auto k2r = cute::filter_zeros(tCrK);

      // Merge the lanes that share a row (the quad along N); partners add in either order to the same bits.
      constexpr int kLanesN = decltype(cute::size<1>(lane_layout_MN))::value;
      static_assert((kLanesN & (kLanesN - 1)) == 0, "lanes along N must be a power of two");
      CUTLASS_PRAGMA_UNROLL
      for (int k = kLanesN / 2; k > 0; k /= 2) {
        int const lane_mask = static_cast<int>(lane_layout_MN(0, k));
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < cute::size(se); ++r) {
          se(r) = se(r) + __shfl_xor_sync(0xffffffffu, se(r), lane_mask);
          dt(r) = dt(r) + __shfl_xor_sync(0xffffffffu, dt(r), lane_mask);
        }
      }

      bool const writer = cute::get<1>(lane_mn) == 0;
      Params const& p = *params;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < cute::size(se); ++r) {
        int const m_rel = static_cast<int>(cute::get<0>(crd(r)));
        if (m_rel >= cute::get<0>(residue_tCcD)) continue;  // rows >= M are never written
        int const idx = part_offset + m_first + m_rel;
        if (writer) {
          p.ptr_sumexp[idx] = se(r);
          // kOff: sum l e = ln 2 (sum x e + k2 sum e); only rows the finish reads (valid targets: k2 finite).
          p.ptr_dot[idx] = kSoftcap == SoftcapMode::kOff ? (dt(r) + k2r(r) * se(r)) * kLn2 : dt(r);
        }
        if (tc(r) < -1) p.ptr_target[m_first + m_rel] = -__int_as_float(tc(r));  // the lane that saw the target
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;

    Tensor tCgRow = line_partition<ReferenceSrc, /*kPerRow=*/true>(args);
    Tensor tCrRstd = make_tensor_like<float>(tCgRow);
    Tensor tCrK = make_tensor_like<float>(tCgRow);
    Tensor tCrSumExp = make_tensor_like<float>(tCgRow);
    Tensor tCrDot = make_tensor_like<float>(tCgRow);
    Tensor tCrTargetCol = make_tensor_like<int>(tCgRow);

    auto lanes = lanes_of_warp<ReferenceSrc>(args.tiled_copy);
    auto lane_layout_MN = get<0>(lanes);
    auto lane_mn = get<1>(lanes);
    static_assert(decltype(lane_layout_MN(_0{}, _1{}))::value == 1, "lanes along N must have lane stride 1");

    int const m_first = static_cast<int>(M) - static_cast<int>(get<0>(args.residue_tCcD));
    int64_t const n_first = static_cast<int64_t>(N) - get<1>(args.residue_tCcD);
    int n_valid = 0;
    if constexpr (kMaskColumns) {
      int64_t const rel = params_ptr->vocab - n_first;  // negative past the vocabulary
      n_valid = rel < 0 ? 0 : (rel > kTileN ? kTileN : static_cast<int>(rel));
    }
    int const part_offset = static_cast<int>(params_ptr->m_pad * (params_ptr->tile_base + static_cast<int64_t>(n)));
    (void)l;

    return ConsumerStoreCallbacks<decltype(tCrK), decltype(tCrTargetCol), decltype(args.tCcD),
                                  decltype(args.residue_tCcD), decltype(args.residue_cD), decltype(lane_layout_MN),
                                  decltype(lane_mn)>(
        cute::move(tCrRstd), cute::move(tCrK), cute::move(tCrSumExp), cute::move(tCrDot), cute::move(tCrTargetCol),
        args.tCcD, args.residue_tCcD, args.residue_cD, lane_layout_MN, lane_mn, m_first,
        params_ptr->col_base + n_first, n_valid, part_offset, params_ptr);
  }
};

}  // namespace coda::epilogue
