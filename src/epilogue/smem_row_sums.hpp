// SmemRowSums: per-(row, N-tile) sums of an sm90 epilogue's wgmma fragment, kept as running sums in thread-private
// shared-memory words across the tile's subtiles, then merged over the quad and written as fp32 partials
// partials[t * Mpad + m] (t = the CTA's N-tile, Mpad = round_up(M, CTA_M), batch L = 1). Shared by
// linear_residual_rmsnorm's row-partials node (row_partials.hpp) and linear_swiglu_bwd_zdz's node
// (swiglu_bwd_pair.hpp); CUTLASS-heavy, include only from node headers.
//
// Why shared memory: registers held across subtiles made the pingpong kernels spill (linear_swiglu_bwd_zdz at 128x128,
// linear_residual_rmsnorm at 128x192 with Sm90ColReduction). Each visit adds its subtile's two row sums (rows r and
// r + 8 of the fragment) to the thread's pair of words for that epi_m: the first subtile along N writes them, the
// later ones read-add-write (the collective loops epi_n outer, epi_m inner). end() merges the 4 lanes sharing a row
// (one warp along N) with two xor-shuffles; lane 0 of the quad writes rows < M. Pingpong's two consumer warpgroups
// share the words; their epilogues are serialized by the kernel's order barrier (end() runs inside the collective's
// store()).
//
// Requirements: the wgmma fragment of a 64x32 (EpilogueTileAuto) or 64x16 subtile per 128 threads, 16 or 8 elements
// per thread (element 4j + 2h + e at (r + 8h, c + 8j + e), CUTLASS_EVT.md section 4), whose subtile is
// 64 * kThreads / 128 rows tall; kThreads the epilogue's thread count (128 pingpong, 256 cooperative); not stream-K
// (its separate-reduction subtiles visit one subtile per call).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include <cstdint>

#include "epilogue/node_base.hpp"

namespace coda::epilogue {

template <int kTileM, int kThreads>
struct SmemRowSums {
  /// Subtiles along M of a kTileM-row tile: the sm90 epilogue tile is 64 rows per 128 threads.
  static constexpr int kEpiMMax = kTileM * 128 / (64 * kThreads) > 0 ? kTileM * 128 / (64 * kThreads) : 1;

  struct SharedStorage {
    alignas(128) float rows[2 * kEpiMMax * kThreads];  // [epi_m][thread][h]
  };

  /// This thread's words: a pair (rows r, r + 8) per epi_m, epi_m e at e * kThreads * 8 bytes further.
  CUTLASS_DEVICE static uint32_t thread_words(SharedStorage const* storage, int thread_idx) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(storage->rows)) +
           static_cast<uint32_t>(thread_idx % kThreads) * 8u;
  }
  CUTLASS_DEVICE static uint32_t pair_addr(uint32_t words, int e) {
    return words + static_cast<uint32_t>(e * kThreads * 8);
  }
};

/// The consumer-store callbacks' common half for a node that keeps SmemRowSums: the thread's coordinates, the
/// node's Params (with ptr_partials, M, N and m_pad; read through the pointer, so no register copies) and its words.
/// A node derives its callbacks from it and adds visit(), which ends with add(); end() writes the partials.
template <int kTileM, int kTileN, int kThreads, class Params, class CoordTensor>
struct RowSumsCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
  using RowSums = SmemRowSums<kTileM, kThreads>;
  static constexpr int kEpiM = decltype(cute::size<3>(cute::declval<CoordTensor>()))::value;
  static_assert(kEpiM <= RowSums::kEpiMMax, "SmemRowSums: sized for subtiles of 64 rows per 128 threads");

  CUTLASS_DEVICE RowSumsCallbacks(CoordTensor&& coords, Params const* params, uint32_t words)
      : tC_cD(cute::forward<CoordTensor>(coords)), params(params), words(words) {}

  CoordTensor tC_cD;
  Params const* params;
  uint32_t words;  // this thread's running sums (SmemRowSums::thread_words: one 32-bit register)

  /// Adds (r0, r8), subtile (epi_m, epi_n)'s sums of rows r and r + 8, to the thread's running pair for epi_m; the
  /// first subtile along N (epi_n = 0) writes it. Static smem indices only (a dynamic epi_m index would move the pair
  /// into local memory).
  CUTLASS_DEVICE void add(int epi_m, int epi_n, float r0, float r8) const {
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kEpiM; ++e) {
      if (e == epi_m) {
        uint32_t const addr = RowSums::pair_addr(words, e);
        float s0 = 0.0f, s8 = 0.0f;
        if (epi_n != 0) asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(s0), "=f"(s8) : "r"(addr));
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(s0 + r0), "f"(s8 + r8) : "memory");
      }
    }
  }

  /// At the tile's end: partials[tile_n * m_pad + m] = the quad's sum of row m, for the tile's rows m < M. A CTA
  /// entirely outside the problem (a partially out-of-bounds cluster) writes nothing: the condition is uniform over
  /// the CTA, so no lane skips a shuffle that another takes.
  CUTLASS_DEVICE void end() {
    int const M = params->M;
    auto const [r0, c0] = fragment_origin(tC_cD, 0, 0);
    int const tile_m0 = r0 / kTileM * kTileM, tile_n = c0 / kTileN;
    if (tile_m0 >= M || tile_n * kTileN >= params->N) return;
    float* const partials = params->ptr_partials + params->m_pad * tile_n;
    bool const writer = (threadIdx.x & 3) == 0;
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kEpiM; ++e) {
      int const r = cute::get<0>(fragment_origin(tC_cD, e, 0));
      float rows[2];
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                   : "=f"(rows[0]), "=f"(rows[1])
                   : "r"(RowSums::pair_addr(words, e)));
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        float v = rows[h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        int const m = r + 8 * h;
        if (writer && m < M) partials[m] = v;
      }
    }
  }
};

/// The base of a node that keeps SmemRowSums: Params = the node's Arguments (with ptr_partials) plus the extents,
/// so its callbacks keep no copies of them in registers; the shared storage; and get_consumer_store_callbacks,
/// which builds the derived node's ConsumerStoreCallbacks<CoordTensor> (a RowSumsCallbacks derivative).
template <class Derived, class Arguments_, int kTileM, int kThreads>
struct SmemRowSumsNode : Sm90StoreOnlyNode {
  using Arguments = Arguments_;
  struct Params : Arguments {
    int M = 0;
    int N = 0;
    int64_t m_pad = 0;  // round_up(M, CTA_M): the partials' row stride
  };
  using SharedStorage = typename SmemRowSums<kTileM, kThreads>::SharedStorage;

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    Params p;
    static_cast<Arguments&>(p) = args;
    p.M = static_cast<int>(cute::get<0>(problem_shape));
    p.N = static_cast<int>(cute::get<1>(problem_shape));
    p.m_pad = (static_cast<int64_t>(p.M) + kTileM - 1) / kTileM * kTileM;
    return p;
  }

  CUTLASS_HOST_DEVICE SmemRowSumsNode() {}
  CUTLASS_HOST_DEVICE SmemRowSumsNode(Params const& params, SharedStorage const& shared)
      : params_ptr(&params), smem(&shared) {}

  Params const* params_ptr = nullptr;
  SharedStorage const* smem = nullptr;

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    static_assert(decltype(cute::size(args.tiled_copy))::value == kThreads,
                  "SmemRowSums: kThreads must be the epilogue's thread count (one smem word pair per thread)");
    auto coords = fragment_coords<ReferenceSrc>(args);
    return typename Derived::template ConsumerStoreCallbacks<decltype(coords)>(
        cute::move(coords), params_ptr, SmemRowSums<kTileM, kThreads>::thread_words(smem, args.thread_idx));
  }
};

}  // namespace coda::epilogue
