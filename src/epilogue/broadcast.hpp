// The per-row and per-column vector operands of the fused epilogues, as CUTLASS's stock broadcast nodes with
// CODA's one layout (an fp32, int32 or 16-bit vector of unit stride); CUTLASS-heavy, include only from
// epilogue programs. One alias per kind so that every op reads its rstd, zdz, positions, gamma or inv_freq the same
// way (ARCHITECTURE.md, the "vector load" primitive kind).
#pragma once

#include <cute/tensor.hpp>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include <cstdint>

namespace coda::epilogue {

/// A value per row m of the problem (the vector is [M], stride 1 along M): rstd, zdz, the RoPE positions.
template <class TileShape, class Element = float>
using ColumnVector = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, Element, float,
                                                                 cute::Stride<cute::_1, cute::_0, int64_t>>;

/// A value per column n of the problem (the vector is [N], stride 1 along N): gamma, inv_freq.
template <class TileShape, class Element = float>
using RowVector = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Element, float,
                                                              cute::Stride<cute::_0, cute::_1, int64_t>>;

}  // namespace coda::epilogue
