// The per-row and per-column vector operands of the fused epilogues, as CUTLASS's stock broadcast nodes with
// CODA's one layout (an fp32, int32 or 16-bit vector of unit stride); CUTLASS-heavy, include only from
// epilogue programs. One alias per kind so that every op reads its rstd, zdz, positions, gamma or inv_freq the same
// way (ARCHITECTURE.md, the "vector load" primitive kind).
#pragma once

#include "epilogue/column_vector_ldg.hpp"
#include "epilogue/tree_args.hpp"

#include <cute/tensor.hpp>
// The visitor header uses NumericArrayConverter & co. unqualified: include it through the callbacks header.
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include <cstdint>
#include <type_traits>

namespace coda::epilogue {

/// A value per row m of the problem (the vector is [M], stride 1 along M): rstd, zdz, the RoPE positions.
template <class TileShape, class Element = float>
using ColumnVector = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, Element, float,
                                                                 cute::Stride<cute::_1, cute::_0, int64_t>>;

/// A value per column n of the problem (the vector is [N], stride 1 along N): gamma, inv_freq.
template <class TileShape, class Element = float>
using RowVector = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Element, float,
                                                              cute::Stride<cute::_0, cute::_1, int64_t>>;

/// A ColumnVector's arguments: the [M] vector at ptr (unit stride); 0 where ptr is null.
template <class ColumnArguments, class T>
void set_column_vector(ColumnArguments& a, T const* ptr, int64_t M) {
  a.ptr_col = ptr;
  a.null_default = decltype(a.null_default)(0);
  a.dCol = {cute::_1{}, cute::_0{}, M};
}

/// A RowVector's arguments: the [N] vector at ptr (unit stride); 0 where ptr is null.
template <class RowArguments, class T>
void set_row_vector(RowArguments& a, T const* ptr, int64_t N) {
  a.ptr_row = ptr;
  a.null_default = decltype(a.null_default)(0);
  a.dRow = {cute::_0{}, cute::_1{}, N};
}

// The vectors CODA's programs read, each under its own name (tree_args.hpp): a program sets them by name, and two of
// one kind in one tree stay apart (linear_residual_rmsnorm_bwd reads rstd, zdz and the row scale, all ColumnVector).
struct RstdName;
struct ZdzName;
struct RowScaleName;
struct PositionsName;
struct GammaName;
struct InvFreqName;

/// rstd [M] fp32: the input norm's 1 / rms per row (MATH.md).
template <class TileShape>
using Rstd = Named<ColumnVector<TileShape>, RstdName>;
/// zdz [M] fp32: (1/d) <z, dz> per row, linear_residual_rmsnorm_bwd's input.
template <class TileShape>
using Zdz = Named<ColumnVector<TileShape>, ZdzName>;
/// v [M] fp32: a per-row scale of the GEMM's result (the LM head's exponential form).
template <class TileShape>
using RowScale = Named<ColumnVector<TileShape>, RowScaleName>;
/// positions [M] int32: each token's RoPE position.
template <class TileShape>
using Positions = Named<ColumnVector<TileShape, int32_t>, PositionsName>;
/// gamma [N] in the GEMM's element type: a norm's weight along the output columns.
template <class TileShape, class Element>
using Gamma = Named<RowVector<TileShape, Element>, GammaName>;
/// inv_freq per output column [N] fp32 (RoPE's frequency of each column's pair).
template <class TileShape>
using InvFreq = Named<RowVector<TileShape>, InvFreqName>;

/// The rstd leaf of a program on EpilogueTraits: Rstd, or where a thread holds more than kAccumulatorsWithRoom
/// accumulators rstd read per visit (column_vector_ldg.hpp), whose registers Sm90ColBroadcast would keep through the
/// tile.
template <class Traits>
using RstdOf = std::conditional_t<(Traits::kAccumulatorsPerThread > kAccumulatorsWithRoom),
                                  Named<Sm90ColumnVectorLdg, RstdName>, Rstd<typename Traits::TileShape>>;

/// u = rstd[m] * acc in fp32 (the input norm's row scale on the GEMM's result, not rounded): the child of the nodes
/// that work on u (the QK-norm nodes, RopeHeads). Its rstd leaf (Rstd, or a node of the same arguments under
/// RstdName: column_vector_ldg.hpp's) is set by name as any other.
template <class TileShape, cutlass::FloatRoundStyle kRound, class RstdLeaf = Rstd<TileShape>>
using RowScaledAcc = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,
    cutlass::epilogue::fusion::Sm90AccFetch, RstdLeaf>;

}  // namespace coda::epilogue
