// PairStore: a custom sm90 EVT node that writes a half-width output y[m, i] = PairFn(v[m, 2i], v[m, 2i+1]) from
// the (even, odd) column pairs of its input fragment and returns the input unchanged, so the collective still
// stores the full-width D (e.g. the SwiGLU pre-activation z next to y = silu(gate) * up).
//
// Why a custom node: stock Sm90AuxStore maps the accumulator 1:1 onto an (M, N) output; y is (M, N/2)
// (CUTLASS_EVT.md section 6). Why no shuffles for the math: the wgmma/STSM epilogue fragment holds columns
// (n, n+1) of one row at positions (2k, 2k+1) of the same thread (CUTLASS_EVT.md section 4).
//
// Stores are vectorized, never scalar: fragment position 4j+{0,1} is row r, columns c+8j+{0,1} and 4j+{2,3} is
// row r+8 with c = 2*(lane%4), so lane q of a quad owns y columns {q, 4+q, 8+q, 12+q} of the quad's 16. The quad
// transposes those 4x4 blocks with three xor-shuffles (two rows packed per 32-bit word), after which lane q owns
// y columns 4q..4q+3 of rows r and r+8: one 8-byte store per row, a warp writing 8 rows x 32 contiguous bytes.
// Requirements (checked by the op's validation): N % 16 == 0, y 8-byte aligned, ldy % 4 == 0. Rows >= M and
// columns >= N/2 (subtiles overhanging N) are not written; a 4-column y group is never partial (N/2 % 8 == 0).
//
// kRowScale: the node first multiplies its input by a per-row fp32 scale s[m] (linear_rowscale_swiglu's rstd), read
// from global memory for the two rows of each subtile as it is visited, and returns v * s (y is built from the scaled
// values). A Sm90ColBroadcast operand instead holds the tile's 4 row values in registers through the whole epilogue:
// with the 192 accumulators of a pingpong 128x192 tile that spilled (12 bytes); loaded per subtile, nothing spills.
//
// Host reference of the node's semantics: pair_store_reference() below (plain C++, used by the unit test).
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "epilogue/node_base.hpp"
#endif

namespace coda::epilogue {

/// Host reference: y[m*ldy + i] = fn(v[m*ldv + 2i], v[m*ldv + 2i+1]) for m < rows, i < cols/2, in the precision
/// the caller chooses (the node computes in fp32 and rounds y once to its element type).
template <class T, class Fn>
std::vector<T> pair_store_reference(std::vector<T> const& v, int64_t rows, int64_t cols, int64_t ldv, Fn fn) {
  std::vector<T> y(static_cast<size_t>(rows * (cols / 2)));
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t i = 0; i < cols / 2; ++i) {
      y[static_cast<size_t>(m * (cols / 2) + i)] = fn(v[static_cast<size_t>(m * ldv + 2 * i)],
                                                      v[static_cast<size_t>(m * ldv + 2 * i + 1)]);
    }
  }
  return y;
}

#if defined(__CUDACC__)

/// The node. `PairFn` is a default-constructible functor `float operator()(float even, float odd) const` (device).
/// `ElementY` is the y element (16-bit: bf16 or fp16). Arguments: y pointer and its row stride (elements); with
/// kRowScale, the [M] fp32 row scale (contiguous).
template <class PairFn, class ElementY, bool kRowScale = false>
struct Sm90PairStore : Sm90StoreOnlyNode {
  static_assert(cutlass::sizeof_bits<ElementY>::value == 16, "PairStore packs two 16-bit y values per shuffle");

  struct SharedStorage {};
  struct Arguments {
    ElementY* ptr_y = nullptr;
    int64_t ldy = 0;
    float const* row_scale = nullptr;  ///< kRowScale only: [M] fp32
  };
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto const n = cute::get<1>(problem_shape);
    return args.ptr_y != nullptr && n % 16 == 0 && args.ldy % 4 == 0 &&
           (reinterpret_cast<uintptr_t>(args.ptr_y) & 7u) == 0 && (!kRowScale || args.row_scale != nullptr);
  }

  CUTLASS_HOST_DEVICE Sm90PairStore() {}
  CUTLASS_HOST_DEVICE Sm90PairStore(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;


  template <class CoordTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CoordTensor&& coords, int M, int F, Params const* params)
        : tC_cY(cute::forward<CoordTensor>(coords)), M(M), F(F), params(params) {}

    CoordTensor tC_cY;  // absolute (m, n, l) of every fragment element, per (epi_m, epi_n)
    int M;
    int F;  // y columns (N / 2; N is an int in the problem shape): 32-bit, as it lives through the whole tile
    Params const* params;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m,
                              int epi_n, cutlass::Array<ElementInput, FragmentSize> const& input) {
      static_assert(FragmentSize == 16, "expects the EpilogueTileAuto wgmma fragment: 4 column groups x 2 rows x 2 cols");
      PairFn fn{};
      cutlass::NumericConverter<ElementY, float, cutlass::FloatRoundStyle::round_to_nearest> to_y{};
      int const q = static_cast<int>(threadIdx.x) & 3;
      auto coords = tC_cY(cute::_, cute::_, cute::_, epi_m, epi_n);
      cutlass::Array<ElementInput, FragmentSize> v = input;
      if constexpr (kRowScale) {
        // Positions 4j+{0,1} are row r, 4j+{2,3} row r+8 (header); one scale per row, fp32 multiply as
        // Sm90Compute<multiplies> would do it.
        int const m_r = static_cast<int>(cute::get<0>(coords(0)));
        int const m_r8 = static_cast<int>(cute::get<0>(coords(2)));
        // Rows >= M (never stored) read row M - 1: a clamped index, where a predicated load spilled at 128x192.
        float const s_r = __ldg(params->row_scale + min(m_r, M - 1));
        float const s_r8 = __ldg(params->row_scale + min(m_r8, M - 1));
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          v[i] = static_cast<ElementInput>(static_cast<float>(input[i]) * ((i & 2) == 0 ? s_r : s_r8));
        }
      }

      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < FragmentSize / 16; ++b) {
        int const base = b * 16;
        // Pack (row r, row r+8) of each column group j into one 32-bit word.
        uint32_t word[4];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) {
          ElementY const lo = to_y(fn(static_cast<float>(v[base + 4 * j + 0]), static_cast<float>(v[base + 4 * j + 1])));
          ElementY const hi = to_y(fn(static_cast<float>(v[base + 4 * j + 2]), static_cast<float>(v[base + 4 * j + 3])));
          word[j] = static_cast<uint32_t>(reinterpret_cast<uint16_t const&>(lo)) |
                    (static_cast<uint32_t>(reinterpret_cast<uint16_t const&>(hi)) << 16);
        }
        // 4x4 transpose within the quad: lane q sends word[q^x] to lane q^x and places what it receives at
        // out[q^x] (selects, not a dynamically indexed array, keep everything in registers).
        uint32_t out[4];
        CUTLASS_PRAGMA_UNROLL
        for (int x = 0; x < 4; ++x) {
          int const idx = q ^ x;
          uint32_t const send = idx == 0 ? word[0] : idx == 1 ? word[1] : idx == 2 ? word[2] : word[3];
          uint32_t const got = x == 0 ? send : __shfl_xor_sync(0xffffffffu, send, x);
          if (idx == 0) out[0] = got;
          if (idx == 1) out[1] = got;
          if (idx == 2) out[2] = got;
          if (idx == 3) out[3] = got;
        }
        // Lane q now owns y columns ybase + 4q .. +3 for rows r (low halves) and r+8 (high halves).
        auto const c0 = coords(base);      // (m, n, l) of fragment element base: row r, column 2q + 8*0
        auto const c8 = coords(base + 2);  // row r + 8
        int const m_r = static_cast<int>(cute::get<0>(c0));
        int const m_r8 = static_cast<int>(cute::get<0>(c8));
        int const ycol = (static_cast<int>(cute::get<1>(c0)) - 2 * q) / 2 + 4 * q;
        // One 64-bit value per row (a uint2 store was split into two 32-bit stores by the compiler).
        uint64_t const lo_row = static_cast<uint64_t>((out[0] & 0xffffu) | (out[1] << 16)) |
                                (static_cast<uint64_t>((out[2] & 0xffffu) | (out[3] << 16)) << 32);
        uint64_t const hi_row = static_cast<uint64_t>((out[0] >> 16) | (out[1] & 0xffff0000u)) |
                                (static_cast<uint64_t>((out[2] >> 16) | (out[3] & 0xffff0000u)) << 32);
        ElementY* const y = params->ptr_y;
        // Subtiles overhanging N (N % 32 != 0, or whole subtiles past N in the last CTA tile) hold zeros there:
        // a 4-column group is entirely inside y or entirely outside (y columns = N/2, a multiple of 8).
        if (ycol >= F) continue;
        if (m_r < M) {
          *reinterpret_cast<uint64_t*>(y + static_cast<int64_t>(m_r) * params->ldy + ycol) = lo_row;
        }
        if (m_r8 < M) {
          *reinterpret_cast<uint64_t*>(y + static_cast<int64_t>(m_r8) * params->ldy + ycol) = hi_row;
        }
      }
      return v;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    auto coords = fragment_coords<ReferenceSrc>(args);
    return ConsumerStoreCallbacks<decltype(coords)>(cute::move(coords),
                                                    static_cast<int>(cute::get<0>(args.problem_shape_mnkl)),
                                                    static_cast<int>(cute::get<1>(args.problem_shape_mnkl)) / 2,
                                                    params_ptr);
  }
};

#endif  // __CUDACC__

}  // namespace coda::epilogue
