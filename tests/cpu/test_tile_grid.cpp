// The scheduler's tile grid and the swizzle the fused ops' policies fit to it (src/gemm/tile_grid.hpp). Its own file:
// the internal coda::gemm namespace and the public coda::gemm() of <coda/ops.hpp> do not share a translation unit.
#include <gtest/gtest.h>

#include "gemm/tile_grid.hpp"

namespace {

using coda::gemm::fit_swizzle;
using coda::gemm::KernelInfo;
using coda::gemm::Knobs;
using coda::gemm::Raster;
using coda::gemm::tile_grid;

}  // namespace

// The scheduler's grid (CUTLASS's tile_scheduler_params.h: counts rounded to the cluster, then padded to swizzle x
// cluster once the smaller count reaches 6 / 3 / 2) and the swizzle the fused policies fit to it.
TEST(TileGrid, PaddingAndFittedSwizzle) {
  KernelInfo coop;  // 128x256, cluster 2x1
  coop.tile_m = 128, coop.tile_n = 256, coop.tile_k = 64, coop.cluster_m = 2;
  auto g = tile_grid(coop, 8192, 7168, 8);  // Qwen3-14B q/k/v: 64 x 28 tiles
  EXPECT_EQ(g.tiles_m, 64);
  EXPECT_EQ(g.tiles_n, 28);
  EXPECT_EQ(g.m, 64);
  EXPECT_EQ(g.n, 32);
  g = tile_grid(coop, 1000, 4096, 8);  // 8 M tiles (cluster-rounded), padded to 8 x 2
  EXPECT_EQ(g.tiles_m, 8);
  EXPECT_EQ(g.m, 16);
  EXPECT_EQ(g.n, 16);
  g = tile_grid(coop, 1, 512, 8);  // smaller count 2: log swizzle 1 whatever the max
  EXPECT_EQ(g.m, 4);
  EXPECT_EQ(g.n, 2);
  g = tile_grid(coop, 0, 512, 8);  // empty M: nothing scheduled, nothing needed
  EXPECT_EQ(g.scheduled(), 0);
  EXPECT_EQ(g.needed(), 0);

  Knobs k;
  k.raster = Raster::kAlongM;
  k.swizzle = 8;
  EXPECT_EQ(fit_swizzle(coop, 8192, 7168, k).swizzle, 4);   // 32 / 28 > 9 / 8
  EXPECT_EQ(fit_swizzle(coop, 8192, 6144, k).swizzle, 8);   // 24 tiles: no padding
  EXPECT_EQ(fit_swizzle(coop, 8192, 3072, k).swizzle, 4);   // 12 -> 16 at 8
  EXPECT_EQ(fit_swizzle(coop, 1, 512, k).swizzle, 1);
  EXPECT_EQ(fit_swizzle(coop, 0, 512, k).swizzle, 8);       // nothing to pad
  EXPECT_EQ(fit_swizzle(coop, 8192, 7168, k).raster, Raster::kAlongM);  // only the swizzle
  KernelInfo pp192;  // 128x192: dgrad N = 14336 is 75 tiles, 80 at swizzle 8 (6.7 %: kept)
  pp192.tile_m = 128, pp192.tile_n = 192, pp192.tile_k = 64, pp192.cluster_m = 2, pp192.pingpong = true;
  EXPECT_EQ(tile_grid(pp192, 8192, 14336, 8).n, 80);
  EXPECT_EQ(fit_swizzle(pp192, 8192, 14336, k).swizzle, 8);
  EXPECT_EQ(fit_swizzle(pp192, 8192, 8192, k).swizzle, 8);  // 43 -> 48 (11.6 %: kept)
  EXPECT_EQ(fit_swizzle(pp192, 8192, 1728, k).swizzle, 2);  // 9 tiles: 16 at 8, 12 at 4, 10 at 2 (11 %)
}
