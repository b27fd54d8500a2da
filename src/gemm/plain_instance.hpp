// Shared by the plain-GEMM instance files (generated from src/gemm/plain.cmake): one FusedLinear instantiation per .cu
// (see plain_kernels.hpp). Every alias there takes <Config, Layout, ElementD>.
#pragma once

#include "gemm/fused_linear.hpp"
#include "gemm/linear_combination.hpp"
#include "gemm/plain_kernels.hpp"

#include <cutlass/numeric_types.h>

#include <type_traits>

namespace coda::gemm::plain {

/// Operand layouts in CUTLASS tags (A is M x K, B is K x N).
struct FwdLayout {  // A K-major, B K-major
  using A = cutlass::layout::RowMajor;
  using B = cutlass::layout::ColumnMajor;
};
struct DgradLayout {  // A K-major, B N-major
  using A = cutlass::layout::RowMajor;
  using B = cutlass::layout::RowMajor;
};
struct WgradLayout {  // A M-major, B N-major
  using A = cutlass::layout::ColumnMajor;
  using B = cutlass::layout::RowMajor;
};

template <class Config, class Layout, class ElementD>
using PlainGemm = FusedLinear<Config, LinearCombinationEpilogue, cutlass::bfloat16_t, ElementD, typename Layout::A,
                              typename Layout::B>;

/// Overwrite-only (beta = 0) with kStagesD D store buffers.
template <class Config, class Layout, class ElementD, int kStagesD>
using PlainStoreGemm = FusedLinear<Config, ScaleEpilogue<kStagesD>, cutlass::bfloat16_t, ElementD, typename Layout::A,
                                   typename Layout::B>;

/// Add-into-D (beta = 1, C = D) through TMA reduce-add, fp32 D, with kStagesD D store buffers.
template <class Config, class Layout, int kStagesD>
using PlainReduceAddGemm = FusedLinear<Config, ReduceAddEpilogue<kStagesD>, cutlass::bfloat16_t, float,
                                       typename Layout::A, typename Layout::B>;

/// The registry's fixed-parameter forms: 6 D store buffers; reduce-add into fp32 D with 4.
template <class Config, class Layout, class ElementD>
using PlainStore6Gemm = PlainStoreGemm<Config, Layout, ElementD, 6>;
template <class Config, class Layout, class ElementD,
          class = std::enable_if_t<std::is_same_v<ElementD, float>>>  // fp32 D only
using PlainReduceAdd4Gemm = PlainReduceAddGemm<Config, Layout, 4>;

}  // namespace coda::gemm::plain
