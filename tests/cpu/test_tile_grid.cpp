// The scheduler's tile grid and the swizzle the fused ops' policies fit to it (src/gemm/tile_grid.hpp). Its own file:
// the internal coda::gemm namespace and the public coda::gemm() of <coda/ops.hpp> do not share a translation unit.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

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
  g = tile_grid(coop, 1000, 4096, 8);  // 8 M tiles, padded to 16 (swizzle 8 x cluster 2)
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
  coop.ragged = true;  // the ragged scheduler pads nothing: the swizzle stays
  EXPECT_EQ(fit_swizzle(coop, 8192, 7168, k).swizzle, 8);
  EXPECT_EQ(fit_swizzle(coop, 1, 512, k).swizzle, 8);
  coop.ragged = false;

  // A heuristic raster keeps the order it takes at the policy's swizzle: 24 x 28 tiles pad to 32 x 32 at swizzle 8
  // (along N: n is not > m); at swizzle 4 (24 x 28, unpadded) the heuristic would go along M.
  k.raster = Raster::kHeuristic;
  Knobs const fitted = fit_swizzle(coop, 3000, 7168, k);
  EXPECT_EQ(fitted.swizzle, 4);
  EXPECT_EQ(fitted.raster, Raster::kAlongN);
  EXPECT_EQ(fit_swizzle(coop, 8192, 6144, k).raster, Raster::kHeuristic);  // nothing to fit: knobs as given

  // Extents beyond INT_MAX count as INT_MAX: no overflow in the products.
  g = tile_grid(coop, int64_t{1} << 40, int64_t{1} << 40, 8);
  EXPECT_GT(g.scheduled(), 0);
  EXPECT_EQ(g.tiles_n, (int64_t{INT_MAX} + 255) / 256);
}
