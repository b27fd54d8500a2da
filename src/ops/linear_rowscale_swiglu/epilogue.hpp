// F3's epilogue program (CUTLASS-heavy; include only from the per-config .cu files of this directory):
//
//   z = multiplies(ColBroadcast(rstd), acc)          fp32
//   PairStore<Swiglu>(z): y[m,i] = silu(z[m,2i]) * z[m,2i+1], vector stores; returns z -> D = R(z)
//
// The gate/up weight is interleaved (rows g0,u0,g1,u1,...), so each (gate, up) pair sits in adjacent columns of
// one thread's fragment (MATH.md "Layouts"). y and z both come from the fp32 z (one rounding each).
#pragma once

#include "epilogue/pair_store.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale_swiglu/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/functional.h>
#include <cutlass/numeric_types.h>

namespace coda::ops {

/// silu(g) * u in fp32. __expf and __fdividef (2 ulp): |rel err| ~ 1e-6, far below the bf16 rounding of y. The
/// IEEE division compiled to a range check and a slow-path call per element (64 per tile per thread in the SASS).
/// g -> -inf: the denominator passes 2^126 and __fdividef returns 0 (the true value is below 1e-36).
struct SwigluPair {
  CUTLASS_DEVICE float operator()(float g, float u) const { return __fdividef(g, 1.0f + __expf(-g)) * u; }
};

struct SwigluEpilogue {
  using Args = SwigluArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = void;
    static constexpr auto kRound = Traits::kRound;
    // 4 z store buffers instead of the builder's 2 (mainloop stages unchanged: 6 at 128x128, 4 at 128x256).
    using EpilogueDispatchPolicy = gemm::DeepStorePolicy<Traits, void, 4>;

    using Rstd = cutlass::epilogue::fusion::Sm90ColBroadcast<0, typename Traits::TileShape, float, float,
                                                             cute::Stride<cute::_1, cute::_0, int64_t>>;
    using Z = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Rstd,
        cutlass::epilogue::fusion::Sm90AccFetch>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<epilogue::Sm90PairStore<SwigluPair, ElementD>, Z>;

    /// {op_0 = z subtree {op_0 = rstd, op_1 = acc, op_2 = multiply}, op_1 = pair store}
    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const& op) {
      out.op_0.op_0.ptr_col = args.rstd;
      out.op_0.op_0.null_default = 0.0f;
      out.op_0.op_0.dCol = {cute::_1{}, cute::_0{}, op.M};
      out.op_1.ptr_y = static_cast<ElementD*>(args.y);
      out.op_1.ldy = args.ldy;
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t>
using SwigluKernel = gemm::FusedLinear<Config, SwigluEpilogue, Element, Element,
                                       cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
