// The tile grid CUTLASS's sm90 persistent schedulers run for a problem, and the swizzle that keeps it tight.
// CUTLASS-free (the fused ops' generated policies and the plain GEMM's tuner both use it).
#pragma once

#include "gemm/kernel_api.hpp"

#include <algorithm>
#include <cstdint>

namespace coda::gemm {

/// CTA counts along M and N that the scheduler walks for kernel `info` at max swizzle `swizzle`
/// (tile_scheduler_params.h): the tile counts rounded up to the cluster, then padded to (1 << log swizzle) x cluster,
/// with log swizzle 3 / 2 / 1 for a swizzle of 8 / 4 / 2 when the smaller rounded count is >= 6 / 3 / 2, else 0.
/// The padded tiles are real work: their mainloop runs on TMA's zero fill and their epilogue computes, only the
/// stores are dropped (so e.g. N = 7168 on a 256-wide tile, 28 tiles, runs 32 at swizzle 8: 14 % more MMA).
struct TileGrid {
  int64_t m = 0, n = 0;  ///< CTAs scheduled along M and N, padding included
  int64_t tiles_m = 0, tiles_n = 0;  ///< the tiles that cover the problem (rounded up to the cluster only)
  int64_t scheduled() const { return m * n; }
  int64_t needed() const { return tiles_m * tiles_n; }
};

inline TileGrid tile_grid(KernelInfo const& info, int64_t M, int64_t N, int swizzle) {
  auto ctas = [](int64_t extent, int tile, int cluster) {
    int64_t const t = (std::max<int64_t>(extent, 0) + tile - 1) / tile;
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

/// `knobs` with the swizzle halved until the scheduled grid is at most 1/8 larger than the tiles the problem needs
/// (never below 1). Why: a fused op's tile policy names one swizzle for a range of shapes, and the padding is
/// wasted MMA time: Qwen3-14B's q/k/v GEMM (N = 7168: 28 tiles of 256, 32 at swizzle 8) on the cooperative 128x256
/// tile ran 1.18 ms where pingpong 128x128 (no padding) ran 1.05 (H100, bench/results/vs_quack/h100_bc3ad2e/). Why
/// 1/8: a lower swizzle costs L2 reuse, 0-4 % for the same kernel at swizzle 4 against 8 in the tuner's logs
/// (bench/results/vs_quack/radd_tuner/), so only padding well above that is traded without a measurement. Every
/// llama3 shape the policies were measured on pads <= 6.7 % (dgrad N = 14336 on 192-wide tiles) and keeps its swizzle.
inline Knobs fit_swizzle(KernelInfo const& info, int64_t M, int64_t N, Knobs knobs) {
  while (knobs.swizzle > 1) {
    TileGrid const g = tile_grid(info, M, N, knobs.swizzle);
    if (g.scheduled() * 8 <= g.needed() * 9) break;
    knobs.swizzle /= 2;
  }
  return knobs;
}

}  // namespace coda::gemm
