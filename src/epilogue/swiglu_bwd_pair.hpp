// SwigluBwdPair: a custom sm90 EVT node for linear_swiglu_bwd_zdz (MATH.md): the SwiGLU backward on the dgrad
// accumulator.
//
// Its input fragment is dy = dx w_down [M, F] (fp32). For every element (m, i) it reads the saved interleaved
// pre-activation pair (g, u) = (z[m, 2i], z[m, 2i+1]) and, with s = sigmoid(g):
//   dz[m, 2i]   = dy u s (1 + g (1 - s))        dz[m, 2i+1] = dy silu(g)        (written by the node, [M, 2F])
//   y[m, i]     = silu(g) u                      (returned: the collective stores it as D, [M, F])
//   partial[t][m] = sum over the tile's columns i of (g dz[m,2i] + u dz[m,2i+1])   (fp32, per CTA N-tile t)
// dz and the row terms use the fp32 dy (never rounded); y and dz are rounded once to the z element type.
//
// Why a custom node: z and dz are twice the accumulator's width, which stock Sm90AuxLoad/AuxStore cannot map
// (CUTLASS_EVT.md section 6), and a pair needs both of its z values. The wgmma/STSM fragment holds accumulator
// columns (c, c+1) of one row at positions (4j, 4j+1) (row r) and (4j+2, 4j+3) (row r+8), c = 2*(lane%4) + 8j
// (CUTLASS_EVT.md section 4), so their dz columns 2c .. 2c+3 are 8 contiguous bytes: one 64-bit store per (row, j),
// a quad covering 32 contiguous bytes (a full sector); no shuffles for the math.
//
// z reaches the node through the collective's TMA C load, viewed as 32-bit words: z [M, 2F] 16-bit is read as C [M, F]
// with ElementC = float, ldc = ldz / 2, one word per accumulator element (its (g, u) pair, g in the low half); the node
// takes it as its second child (Sm90SrcFetch<float>: the float-to-float copy keeps the bits). The producer warp then
// loads z during the mainloop, ahead of the epilogue, where a consumer-side cp.async ring (the previous design, stop
// 12-15) started only when the epilogue did and left the first subtile's DRAM latency exposed (ncu: the largest single
// stall inside linear_swiglu_bwd_zdz's epilogue at llama3-1B).
//
// Row partials: per-row fp32 sums kept in thread-private smem words (registers held across subtiles made the kernel
// spill) and merged over the quad at the tile's end (smem_row_sums.hpp, shared with linear_residual_rmsnorm's node),
// written to partials[t, m] at m + Mpad * t, Mpad = round_up(M, CTA_M), t = the CTA's N-tile (batch L = 1). No atomics:
// deterministic. Rows >= M and columns >= F are neither loaded nor written.
//
// Registers: the 128 (128x128 tile) or 192 (128x192) accumulators stay live through the epilogue (docs/OPS.md
// "linear_swiglu_bwd_zdz" has what spilled and why).
//
// In place: dz may be z itself (same pointer and row stride): each z word is loaded (TMA, into this tile's C stage)
// before the consumer that owns it passes the stage's full barrier, and only then overwritten by that consumer;
// no other tile reads it.
//
// Requirements (checked by the op's validation): F % 8 == 0; z 16-byte aligned with a row stride % 8 == 0 (TMA on
// 32-bit words); dz 8-byte aligned with a row stride % 4 == 0.
//
// Host reference of the node's semantics: swiglu_bwd_pair_reference() below (plain C++, used by the unit test).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#include "epilogue/smem_row_sums.hpp"
#endif

namespace coda::epilogue {

/// Host reference of one element: from dy and the pair (g, u), the outputs (dg, du, y) and the row term
/// g dg + u du, in double.
struct SwigluBwdPairValue {
  double dg, du, y, row_term;
};
inline SwigluBwdPairValue swiglu_bwd_pair_reference(double dy, double g, double u) {
  double const s = 1.0 / (1.0 + std::exp(-g));
  double const silu = g * s;
  SwigluBwdPairValue v;
  v.dg = dy * u * s * (1.0 + g * (1.0 - s));
  v.du = dy * silu;
  v.y = silu * u;
  v.row_term = g * v.dg + u * v.du;
  return v;
}

#if defined(__CUDACC__)

/// Arguments of Sm90SwigluBwdPair. z itself is the kernel's C (see above): the op passes it as Operands::C with
/// ldc = ldz / 2.
template <class ElementZ>
struct SwigluBwdPairArguments {
  ElementZ* ptr_dz = nullptr;       ///< [M, 2F] out; may equal z (with the same row stride)
  int64_t lddz = 0;
  float* ptr_partials = nullptr;    ///< [T, Mpad] out: per-(N-tile, row) sums of g dg + u du
};

/// The node. `CtaTileShapeMNK` is the kernel's CTA tile; `ElementZ` the 16-bit element of z, dz (and y);
/// `kThreads` the threads running one epilogue at a time (128: a pingpong consumer warpgroup); `kNarrowChunk` the
/// dz words computed per store block at 64x16 subtiles (2, the shipped build; 4 keeps the two row pointers as well:
/// more registers, fewer address computations).
template <class CtaTileShapeMNK, class ElementZ, int kThreads = 128, int kNarrowChunk = 2>
struct Sm90SwigluBwdPair
    : SmemRowSumsNode<Sm90SwigluBwdPair<CtaTileShapeMNK, ElementZ, kThreads, kNarrowChunk>,
                      SwigluBwdPairArguments<ElementZ>, cute::size<0>(CtaTileShapeMNK{}), kThreads> {
  static_assert(cutlass::sizeof_bits<ElementZ>::value == 16, "z pairs are read and written as 32-bit words");
  static_assert(kNarrowChunk == 2 || kNarrowChunk == 4, "64x16 subtiles: chunks of 2 or 4 dz words");
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  using Base = SmemRowSumsNode<Sm90SwigluBwdPair, SwigluBwdPairArguments<ElementZ>, kTileM, kThreads>;
  using typename Base::Arguments;
  using typename Base::Params;  // Params::N is F
  using Base::Base;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto const n = cute::get<1>(problem_shape);
    return cute::get<3>(problem_shape) == 1 && args.ptr_dz != nullptr && args.ptr_partials != nullptr && n % 8 == 0 &&
           args.lddz % 4 == 0 && (reinterpret_cast<uintptr_t>(args.ptr_dz) & 7u) == 0;
  }

  /// CoordTensor: absolute (m, n, l) of every fragment element, per (epi_m, epi_n).
  template <class CoordTensor>
  struct ConsumerStoreCallbacks : RowSumsCallbacks<kTileM, kTileN, kThreads, Params, CoordTensor> {
    using Base = RowSumsCallbacks<kTileM, kTileN, kThreads, Params, CoordTensor>;
    using Base::Base;
    // Register budget: the pingpong consumer keeps its 128 or 192 accumulators live through the epilogue, so the
    // callbacks hold only the coordinates, the Params pointer and one smem address (the base's); M, F and the
    // partials' offset come from Params (constant bank) or are recomputed at the end, row sums live in smem.
    using Base::params;
    using Base::tC_cD;

    /// dy: the accumulator fragment; zw: the same elements' z words (g | u << 16) as the C child delivers them
    /// (floats carrying the bits; zero for rows >= M or columns >= F, which TMA fills).
    template <class ElementAccumulator, class ElementInput, class ElementWord, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& dy,
                              cutlass::Array<ElementWord, FragmentSize> const& zw) {
      static_assert(FragmentSize == 16 || FragmentSize == 8,
                    "expects a wgmma fragment of 4 (64x32 subtile) or 2 (64x16) column groups x 2 rows x 2 cols");
      static_assert(sizeof(ElementWord) == 4, "z arrives as one 32-bit word per accumulator element");
      cutlass::NumericConverter<ElementZ, float, cutlass::FloatRoundStyle::round_to_nearest> to_z{};
      cutlass::NumericConverter<float, ElementZ> from_z{};
      auto bits = [](ElementZ v) { return static_cast<uint32_t>(v.raw()); };
      auto value = [&](uint32_t b) { return from_z(ElementZ::bitcast(static_cast<uint16_t>(b))); };

      // Fragment element 4j + 2h + e is at (r + 8h, c + 8j + e) (CUTLASS_EVT.md section 4): one coordinate per
      // subtile addresses all of them.
      auto const origin = fragment_origin(tC_cD, epi_m, epi_n);
      int const r = cute::get<0>(origin), c = cute::get<1>(origin);
      cutlass::Array<float, FragmentSize> y;
      float part[2] = {0.0f, 0.0f};  // this subtile's row terms of rows r, r + 8
      // dz leaves in chunks, each computed in one branch-free block and then stored. 64x32 subtiles: two chunks of 8
      // (column groups j = 0, 1 then 2, 3): a bounds check after every pair split the block and kept the scheduler from
      // overlapping one pair's latency chain with the next; all 16 at once spilled. 64x16 subtiles (the 128x192 tile,
      // 192 accumulators): one pair per chunk, the smallest live set (ptxas: 12 bytes of spill stores against 24 with
      // chunks of 4 and 8). There the store addresses are recomputed from Params (kernel parameter space) per store
      // rather than kept as two 64-bit row pointers (60 -> 24 bytes); 64x32 subtiles keep the pointers (no register
      // shortage at 128 accumulators, and two integer ops fewer per store). kNarrowChunk = 4 (chunks of two pairs, the
      // pointers kept: 60 bytes of spill) measured faster under sustained load and is linear_swiglu_bwd_zdz's pick at
      // 128x192 (pp_128x192x64_c2x1_e16h, its op.cmake); kNarrowChunk = 2 is the pin pp_128x192x64_c2x1_e16. Streaming
      // stores (.cs: evict-first): dz is not read again by this kernel. F % 8 == 0, so columns n and n + 1 are both
      // inside or both outside; a subtile wholly inside (all but the last row/column tiles) takes one branch per chunk.
      bool const inside = r + 8 < params->M && c + 8 * (FragmentSize / 4 - 1) < params->N;
      constexpr int kChunk = FragmentSize == 16 ? 8 : kNarrowChunk;
      constexpr bool kHeldRows = FragmentSize == 16 || kNarrowChunk > 2;  // the row pointers kept in registers
      ElementZ* const dz_r = params->ptr_dz + static_cast<int64_t>(r) * params->lddz + 2 * c;  // kHeldRows only
      int64_t const dz_r8 = 8 * params->lddz;                                                  // row r + 8
      CUTLASS_PRAGMA_UNROLL
      for (int chunk = 0; chunk < FragmentSize / kChunk; ++chunk) {
        uint32_t dz[kChunk];  // packed (dg, du) words of elements kChunk chunk .. kChunk chunk + kChunk - 1
        CUTLASS_PRAGMA_UNROLL
        // k = 4j + 2h: row r + 8h, columns c + 8j, c + 8j + 1
        for (int k = kChunk * chunk; k < kChunk * chunk + kChunk; k += 2) {
          CUTLASS_PRAGMA_UNROLL
          for (int e = 0; e < 2; ++e) {
            uint32_t const word = cutlass::platform::bit_cast<uint32_t>(zw[k + e]);
            float const g = value(word & 0xffffu), u = value(word >> 16);
            float const d = static_cast<float>(dy[k + e]);
            // s = 1 / (1 + 2^(-g log2 e)) with the approximate (ftz) ex2 and rcp, what __expf and __fdividef lower
            // to, minus their denormal handling (s and the products below are O(1) or underflow to 0 anyway).
            // g -> -inf: rcp(inf) = 0; g -> +inf: rcp(1) = 1; NaN propagates.
            float ex, s;
            asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(ex) : "f"(g * -1.4426950408889634f));
            asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.0f + ex));
            // Factored so each output is one or two dependent operations on shared products (linear_swiglu_bwd_zdz is
            // bound by the epilogue's instruction latency): with su = s u and dyy = d y,
            //   dg = d s u (1 + g (1 - s)) = d su + dyy (1 - s),  du = d g s,  g dg + u du = dyy (2 + g (1 - s)).
            float const su = s * u, yv = g * su, dyy = d * yv, oms = 1.0f - s;
            float const dg = fmaf(dyy, oms, d * su);
            float const du = d * (g * s);
            y[k + e] = yv;
            part[(k >> 1) & 1] = fmaf(dyy, fmaf(g, oms, 2.0f), part[(k >> 1) & 1]);
            dz[k - kChunk * chunk + e] = bits(to_z(dg)) | (bits(to_z(du)) << 16);
          }
        }
        auto store = [&](int k) {
          ElementZ* p;
          if constexpr (kHeldRows) {
            p = dz_r + (((k >> 1) & 1) ? dz_r8 : 0) + 16 * (k >> 2);
          } else {
            p = params->ptr_dz + static_cast<int64_t>(r + 8 * ((k >> 1) & 1)) * params->lddz + 2 * c + 16 * (k >> 2);
          }
          asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p),
                       "r"(dz[k - kChunk * chunk]), "r"(dz[k - kChunk * chunk + 1]));
        };
        if (inside) {
          CUTLASS_PRAGMA_UNROLL
          for (int k = kChunk * chunk; k < kChunk * chunk + kChunk; k += 2) store(k);
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int k = kChunk * chunk; k < kChunk * chunk + kChunk; k += 2) {
            if (r + 8 * ((k >> 1) & 1) < params->M && c + 8 * (k >> 2) < params->N) store(k);
          }
        }
      }
      this->add(epi_m, epi_n, part[0], part[1]);
      return y;
    }
  };

};

#endif  // __CUDACC__

}  // namespace coda::epilogue
