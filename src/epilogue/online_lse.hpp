// OnlineLse: a custom sm90 EVT node (linear_rowscale_lse, MATH.md) that turns its input fragment v (the capped logits)
// into per-(row, CTA N-tile) log-sum-exp partials and returns v unchanged (so the collective may still store D).
//
// Per output row m and CTA N-tile t, over the tile's columns n < N only (overhang columns never enter the state;
// their accumulators are 0, not -inf, so they are masked by coordinate):
//   max[t][m]    = max_n v[m,n]
//   sumexp[t][m] = sum_n exp(v[m,n] - max[t][m])           (online: rescaled whenever the running max grows)
//   sum[t][m]    = sum_n v[m,n]                             (for label smoothing; optional)
//   target[t][m] = v[m, targets[m]]  only by the tile that owns column targets[m] (< N); other tiles don't write
// Partials are fp32 buffers laid out [T, Mpad]: element (t, m) at m + Mpad * t, Mpad = round_up(M, CTA_M),
// T = ceil(N / CTA_N). Rows m >= M are never written. No atomics, no smem: deterministic.
//
// How (CUTLASS_EVT.md sections 4 and 5(d)): the per-row state lives in registers, one entry per row the thread
// owns, addressed through tensors whose N modes have stride 0 (the Sm90ColReduction trick), so fragment element i
// reads/writes the state of its own row. visit() takes the fragment-local max of each row first, rescales each
// row's sum once, then adds exp2(v*log2e - max*log2e) per element (ex2.approx.ftz). reduce() on the last subtile merges the lanes
// that share a row (the 4 lanes of a quad) with xor-shuffles, (m,s) + (m',s') = (M, s e^(m-M) + s' e^(m'-M)),
// where a side whose max equals M contributes its sum unscaled (so two empty states, max = -inf, give s = 0 and
// never -inf - -inf = NaN); the lane holding the target column writes it directly (no shuffle needed).
// Targets (int32 or int64, a run-time flag) are loaded once per tile in begin(), like Sm90ColBroadcast does.
//
// The host reference of these semantics is online_lse_ref.hpp (plain C++, used by the GPU unit test).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>  // before the visitor header, which uses it without including it
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"

namespace coda::epilogue {

/// 2^x with the bare MUFU instruction (ex2.approx.ftz: max rel. error ~2^-22, -inf -> +0, results below 2^-126
/// flushed to 0, which only drops terms 1e-38 below the row max's). exp2f adds denormal handling around the same
/// instruction, which is a measurable share of this per-element epilogue.
CUTLASS_DEVICE float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Run-time arguments of OnlineLse (all pointers device memory).
struct OnlineLseArguments {
  float* ptr_max = nullptr;       ///< [T, Mpad] required
  float* ptr_sumexp = nullptr;    ///< [T, Mpad] required
  float* ptr_sum = nullptr;       ///< [T, Mpad] or nullptr (not written)
  float* ptr_target = nullptr;    ///< [T, Mpad] or nullptr (no capture)
  void const* targets = nullptr;  ///< [M] int32 or int64, or nullptr (no capture)
  bool targets_int64 = false;
};

/// The node. `CtaTileShapeMNK` is the kernel's CTA tile; `ElementAux_` is what the collective uses as its D element
/// when D is void (the root of a void-D tree must name one; nothing of that type is stored).
template <class CtaTileShapeMNK, class ElementAux_>
struct OnlineLse : Sm90StoreOnlyNode {
  using ElementAux = ElementAux_;
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  // log2(e) rounded to float: exp(x) = exp2(x * log2e), one FMA + ex2 per element.
  static constexpr float kLog2e = 1.4426950408889634f;
  // Target slot states (besides a relative column >= 0): no target column in this thread's part of the tile, and
  // "already captured" (so a later subtile never matches again and reduce() knows who writes).
  static constexpr int kNoTarget = -1;
  static constexpr int kCaptured = -2;

  struct SharedStorage {};
  using Arguments = OnlineLseArguments;
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.ptr_max != nullptr && args.ptr_sumexp != nullptr;
  }

  CUTLASS_HOST_DEVICE OnlineLse() {}
  CUTLASS_HOST_DEVICE OnlineLse(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;


  /// FTensor: per-row float state (stride 0 along N); ITensor: per-row int; CTensor: the thread's fragment
  /// coordinates relative to its first element (static); Residue: (M, N) minus that first element's coordinate.
  template <class FTensor, class ITensor, class CTensor, class Residue, class TileResidue, class LaneLayout,
            class LaneCoord>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(FTensor&& mx, FTensor&& se, FTensor&& sv, FTensor&& tv, ITensor&& tc,
                                          CTensor crd, Residue residue, TileResidue tile_residue,
                                          LaneLayout lane_layout, LaneCoord lane_mn, int64_t m_first,
                                          int64_t n_first, int64_t n_limit, int64_t part_offset, int64_t m_pad,
                                          Params const* params)
        : tCrMax(cute::forward<FTensor>(mx)),
          tCrSumExp(cute::forward<FTensor>(se)),
          tCrSum(cute::forward<FTensor>(sv)),
          tCrTarget(cute::forward<FTensor>(tv)),
          tCrTargetCol(cute::forward<ITensor>(tc)),
          tCcD(crd),
          residue_tCcD(residue),
          residue_cD(tile_residue),
          lane_layout_MN(lane_layout),
          lane_mn(lane_mn),
          m_first(m_first),
          n_first(n_first),
          n_limit(n_limit),
          part_offset(part_offset),
          m_pad(m_pad),
          params(params) {}

    FTensor tCrMax, tCrSumExp, tCrSum, tCrTarget;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N), stride 0 along N
    ITensor tCrTargetCol;  // target column relative to the thread's first column, kNoTarget or kCaptured
    CTensor tCcD;
    Residue residue_tCcD;
    TileResidue residue_cD;
    LaneLayout lane_layout_MN;
    LaneCoord lane_mn;
    int64_t m_first;      // absolute row of the thread's first fragment element
    int64_t n_first;      // absolute column of the thread's first fragment element
    int64_t n_limit;      // N
    int64_t part_offset;  // Mpad * (t + T * l): start of this tile's partials
    int64_t m_pad;
    Params const* params;

    CUTLASS_DEVICE void begin() {
      cute::fill(tCrMax, -cutlass::platform::numeric_limits<float>::infinity());
      cute::fill(tCrSumExp, 0.0f);
      cute::fill(tCrSum, 0.0f);
      cute::fill(tCrTarget, 0.0f);
      cute::fill(tCrTargetCol, int{kNoTarget});  // (a prvalue: no ODR use in device code)
      if (params->targets == nullptr || params->ptr_target == nullptr) return;
      // One load per owned row (the filtered views drop the stride-0 N modes); rows >= M are not read.
      auto cols = cute::filter_zeros(tCrTargetCol);
      auto crd = cute::filter_zeros(tCcD, tCrTargetCol.stride());
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(cols); ++i) {
        int const m_rel = static_cast<int>(cute::get<0>(crd(i)));
        if (m_rel < cute::get<0>(residue_tCcD)) {
          int64_t const m = m_first + m_rel;
          int64_t const t = params->targets_int64
                                ? static_cast<int64_t const*>(params->targets)[m]
                                : static_cast<int64_t>(static_cast<int32_t const*>(params->targets)[m]);
          int64_t const rel = t - n_first;
          // Only a real column (< N) inside this CTA tile can match; anything else (ignore_index, bad targets,
          // other tiles) never does.
          cols(i) = (t < n_limit && rel >= 0 && rel < kTileN) ? static_cast<int>(rel) : kNoTarget;
        }
      }
    }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m,
                              int epi_n, cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      using cute::_;
      cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> convert{};
      cutlass::Array<float, FragmentSize> const v = convert(frg_input);

      auto mx = tCrMax(_, _, _, epi_m, epi_n);
      auto se = tCrSumExp(_, _, _, epi_m, epi_n);
      auto sv = tCrSum(_, _, _, epi_m, epi_n);
      auto tv = tCrTarget(_, _, _, epi_m, epi_n);
      auto tc = tCrTargetCol(_, _, _, epi_m, epi_n);
      auto crd = tCcD(_, _, _, epi_m, epi_n);
      int const base = epi_v * FragmentSize;

      bool valid[FragmentSize];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) valid[i] = cute::elem_less(crd(base + i), residue_tCcD);

      // 1. Fragment-local max per row (into a temporary with the same row aliasing as the state).
      auto new_max = cute::make_tensor_like(mx);
      auto new_max_rows = cute::filter_zeros(new_max);
      auto max_rows = cute::filter_zeros(mx);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < cute::size(max_rows); ++r) new_max_rows(r) = max_rows(r);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        if (valid[i]) new_max(base + i) = fmaxf(new_max(base + i), v[i]);
      }

      // 2. One rescale per row; keep max * log2e for the per-element exponent (0 for an empty row, so a masked
      //    element never computes -inf - -inf).
      auto max_log2 = cute::make_tensor_like(mx);
      auto max_log2_rows = cute::filter_zeros(max_log2);
      auto se_rows = cute::filter_zeros(se);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < cute::size(max_rows); ++r) {
        float const old_max = max_rows(r), cur_max = new_max_rows(r);
        if (old_max != cur_max) se_rows(r) *= ex2_approx((old_max - cur_max) * kLog2e);  // old = -inf gives 0
        max_rows(r) = cur_max;
        max_log2_rows(r) = cur_max == -cutlass::platform::numeric_limits<float>::infinity() ? 0.0f
                                                                                           : cur_max * kLog2e;
      }

      // 3. Accumulate exp, the plain sum and the target capture.
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        if (valid[i]) {
          se(base + i) += ex2_approx(fmaf(v[i], kLog2e, -max_log2(base + i)));
          sv(base + i) += v[i];
          if (static_cast<int>(cute::get<1>(crd(base + i))) == tc(base + i)) {
            tv(base + i) = v[i];
            tc(base + i) = kCaptured;
          }
        }
      }
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&&, SyncFn const&, int, int, bool is_last_iteration, VTensor) {
      if (!is_last_iteration) return;
      // A CTA entirely outside the problem (a partially out-of-bounds cluster) has nothing to write; the
      // condition is uniform over the CTA, so no lane skips a shuffle that another lane takes.
      if (!cute::elem_less(cute::make_coord(0, 0), residue_cD)) return;

      auto mx = cute::filter_zeros(tCrMax);
      auto se = cute::filter_zeros(tCrSumExp);
      auto sv = cute::filter_zeros(tCrSum);
      auto tv = cute::filter_zeros(tCrTarget);
      auto tc = cute::filter_zeros(tCrTargetCol);
      auto crd = cute::filter_zeros(tCcD, tCrMax.stride());

      // Merge the lanes that share a row: xor butterfly over the lane offsets along N (the 4 lanes of a quad).
      // Both partners compute the same commutative merge, so every lane ends with the same bits.
      constexpr int kLanesN = decltype(cute::size<1>(lane_layout_MN))::value;
      static_assert((kLanesN & (kLanesN - 1)) == 0, "lanes along N must be a power of two");
      CUTLASS_PRAGMA_UNROLL
      for (int k = kLanesN / 2; k > 0; k /= 2) {
        int const lane_mask = static_cast<int>(lane_layout_MN(0, k));
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < cute::size(mx); ++r) {
          float const m_a = mx(r), s_a = se(r);
          float const m_b = __shfl_xor_sync(0xffffffffu, m_a, lane_mask);
          float const s_b = __shfl_xor_sync(0xffffffffu, s_a, lane_mask);
          float const sum_b = __shfl_xor_sync(0xffffffffu, sv(r), lane_mask);
          float const m = fmaxf(m_a, m_b);
          float const fa = m_a == m ? s_a : s_a * ex2_approx((m_a - m) * kLog2e);
          float const fb = m_b == m ? s_b : s_b * ex2_approx((m_b - m) * kLog2e);
          mx(r) = m;
          se(r) = fa + fb;  // IEEE + is commutative: the partner computes fb + fa to the same bits
          sv(r) = sv(r) + sum_b;
        }
      }

      bool const writer = cute::get<1>(lane_mn) == 0;
      Params const& p = *params;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < cute::size(mx); ++r) {
        int const m_rel = static_cast<int>(cute::get<0>(crd(r)));
        if (m_rel >= cute::get<0>(residue_tCcD)) continue;  // rows >= M are never written
        int64_t const idx = part_offset + m_first + m_rel;
        if (writer) {
          p.ptr_max[idx] = mx(r);
          p.ptr_sumexp[idx] = se(r);
          if (p.ptr_sum != nullptr) p.ptr_sum[idx] = sv(r);
        }
        if (tc(r) == kCaptured) p.ptr_target[idx] = tv(r);  // the one lane that saw the target column
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;

    // Register state: one register per owned row (line_partition is stride 0 along N).
    Tensor tCgRow = line_partition<ReferenceSrc, /*kPerRow=*/true>(args);
    Tensor tCrMax = make_tensor_like<float>(tCgRow);
    Tensor tCrSumExp = make_tensor_like<float>(tCgRow);
    Tensor tCrSum = make_tensor_like<float>(tCgRow);
    Tensor tCrTarget = make_tensor_like<float>(tCgRow);
    Tensor tCrTargetCol = make_tensor_like<int>(tCgRow);

    // Lanes sharing a row (the quad along N); one warp along N (lanes_of_warp checks it): the quad merge covers
    // the whole row.
    auto lanes = lanes_of_warp<ReferenceSrc>(args.tiled_copy);
    auto lane_layout_MN = get<0>(lanes);
    auto lane_mn = get<1>(lanes);
    // The xor butterfly in reduce() needs the lanes of a row to be consecutive (lane offsets 1, 2, ...): the quad.
    static_assert(decltype(lane_layout_MN(_0{}, _1{}))::value == 1, "lanes along N must have lane stride 1");

    // Absolute coordinates of the thread's first element: the relative tCcD plus this offset.
    int64_t const m_first = static_cast<int64_t>(M) - get<0>(args.residue_tCcD);
    int64_t const n_first = static_cast<int64_t>(N) - get<1>(args.residue_tCcD);
    int64_t const m_pad = (static_cast<int64_t>(M) + kTileM - 1) / kTileM * kTileM;
    int64_t const tiles_n = (static_cast<int64_t>(N) + kTileN - 1) / kTileN;
    int64_t const part_offset = m_pad * (static_cast<int64_t>(n) + tiles_n * static_cast<int64_t>(l));

    return ConsumerStoreCallbacks<decltype(tCrMax), decltype(tCrTargetCol), decltype(args.tCcD),
                                  decltype(args.residue_tCcD), decltype(args.residue_cD), decltype(lane_layout_MN),
                                  decltype(lane_mn)>(
        cute::move(tCrMax), cute::move(tCrSumExp), cute::move(tCrSum), cute::move(tCrTarget),
        cute::move(tCrTargetCol), args.tCcD, args.residue_tCcD, args.residue_cD, lane_layout_MN, lane_mn, m_first,
        n_first, static_cast<int64_t>(N), part_offset, m_pad, params_ptr);
  }
};

}  // namespace coda::epilogue
