// The tile grid CUTLASS's sm90 persistent and stream-K schedulers lay out for a problem, and the swizzle that keeps a
// fused op's grid free of padding. CUTLASS-free (the fused ops' generated policies and the plain GEMM's tuner use it).
#pragma once

#include "gemm/kernel_api.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace coda::gemm {

/// CTA counts along M and N of CUTLASS's scheduler grid for kernel `info` at max swizzle `swizzle`
/// (tile_scheduler_params.h): the tile counts rounded up to the cluster, then padded to (1 << log swizzle) x cluster,
/// log swizzle 3 / 2 / 1 for a swizzle of 8 / 4 / 2 when the smaller rounded count is >= 6 / 3 / 2, else 0. The
/// heuristic raster order is read from these counts (along M when n > m), by the ragged scheduler too. Tiles past
/// the problem are real work for CUTLASS's persistent scheduler: the scheduler hands them out, their mainloop runs
/// on TMA's zero fill and their epilogue computes, only the stores are dropped. The ragged scheduler
/// (`info.ragged`) enumerates only the needed tiles. Extents beyond INT_MAX (which no kernel accepts) count as INT_MAX.
struct TileGrid {
  int64_t m = 0, n = 0;              ///< CTAs along M and N, padding included
  int64_t tiles_m = 0, tiles_n = 0;  ///< the CTAs that cover the problem (rounded up to the cluster only)
  int64_t scheduled() const { return m * n; }
  int64_t needed() const { return tiles_m * tiles_n; }
};

inline TileGrid tile_grid(KernelInfo const& info, int64_t M, int64_t N, int swizzle) {
  auto ctas = [](int64_t extent, int tile, int cluster) {
    int64_t const t = (std::clamp<int64_t>(extent, 0, INT_MAX) + tile - 1) / tile;
    return (t + cluster - 1) / cluster * cluster;
  };
  TileGrid g;
  g.tiles_m = ctas(M, info.tile_m, info.cluster_m);
  g.tiles_n = ctas(N, info.tile_n, info.cluster_n);
  int64_t const least = std::min(g.tiles_m, g.tiles_n);
  int const log = swizzle >= 8 && least >= 6 ? 3 : swizzle >= 4 && least >= 3 ? 2 : swizzle >= 2 && least >= 2 ? 1 : 0;
  auto pad = [&](int64_t count, int cluster) {
    int64_t const q = (int64_t{1} << log) * cluster;
    return (count + q - 1) / q * q;
  };
  g.m = pad(g.tiles_m, info.cluster_m);
  g.n = pad(g.tiles_n, info.cluster_n);
  return g;
}

/// `knobs` with the swizzle halved until CUTLASS's scheduler would run at most 1/8 more tiles than the problem needs
/// (never below 1); unchanged for a ragged-scheduler kernel, which pads nothing. A heuristic raster is first fixed
/// to the order it takes at the given swizzle, so that only the swizzle changes. Why: a fused op's tile policy names
/// one swizzle for a range of shapes, and the padding is wasted MMA time. Qwen3-14B's q/k/v GEMM (N = 7168 is 28
/// tiles of 256, 32 at swizzle 8): `linear_rowscale_qk_norm_rope` on the cooperative 128x256 tile ran 1.18 ms
/// against 1.05 for its unpadded 128x128 kernel, and the plain `linear_rowscale` 1.14 against 1.02 (H100,
/// bench/results/vs_quack/h100_bc3ad2e/). Why 1/8: a lower swizzle costs L2 reuse, 0-4 % for the same kernel at
/// swizzle 4 against 8 in the tuner's logs (bench/results/vs_quack/radd_tuner/), so only padding well above that is
/// traded without a measurement. On the llama3 shapes the fused policies' CUTLASS-scheduled kernels pad at most
/// 0.6 % (the LM head's 128256 columns), so none of them changes.
inline Knobs fit_swizzle(KernelInfo const& info, int64_t M, int64_t N, Knobs knobs) {
  if (info.ragged) return knobs;
  auto padded = [&](int swizzle) {
    TileGrid const g = tile_grid(info, M, N, swizzle);
    return g.scheduled() * 8 > g.needed() * 9;
  };
  if (knobs.swizzle <= 1 || !padded(knobs.swizzle)) return knobs;
  if (knobs.raster == Raster::kHeuristic) {
    TileGrid const g = tile_grid(info, M, N, knobs.swizzle);
    knobs.raster = g.n > g.m ? Raster::kAlongM : Raster::kAlongN;
  }
  do {
    knobs.swizzle /= 2;
  } while (knobs.swizzle > 1 && padded(knobs.swizzle));
  return knobs;
}

}  // namespace coda::gemm
