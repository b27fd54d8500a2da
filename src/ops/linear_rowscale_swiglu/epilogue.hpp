// linear_rowscale_swiglu's epilogue program (CUTLASS-heavy; included only by the instances generated from op.cmake):
//
//   PairStore<Swiglu, row scale>(acc): z = rstd[m] * acc (fp32), y[m,i] = silu(z[m,2i]) * z[m,2i+1], vector
//   stores; returns z -> D = R(z)
//
// The row scale sits in the node (read per subtile), not in a Sm90ColBroadcast operand, whose 4 row values per
// thread stay in registers through the epilogue: with them the pingpong 128x192 kernel spilled (pair_store.hpp).
// The gate/up weight is interleaved (rows g0,u0,g1,u1,...), so each (gate, up) pair sits in adjacent columns of
// one thread's fragment (MATH.md "Layouts"). y and z both come from the fp32 z (one rounding each).
#pragma once

#include "epilogue/pair_store.hpp"
#include "epilogue/tree_args.hpp"
#include "gemm/fused_linear.hpp"
#include "ops/linear_rowscale_swiglu/kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
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
    // 4 z store buffers instead of the builder's 2 (the mainloop keeps the stages the rest of shared memory holds).
    using EpilogueDispatchPolicy = gemm::DeepStorePolicy<Traits, void, 4>;

    using Node = epilogue::Sm90PairStore<SwigluPair, ElementD, true>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<Node, cutlass::epilogue::fusion::Sm90AccFetch>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, gemm::Operands const&) {
      auto& node = epilogue::node_args<Node, Fusion>(out);
      node.ptr_y = static_cast<ElementD*>(args.y);
      node.ldy = args.ldy;
      node.row_scale = args.rstd;
    }
  };
};

template <class Config, class Element = cutlass::bfloat16_t>
using SwigluKernel = gemm::FusedLinear<Config, SwigluEpilogue, Element, Element,
                                       cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;

}  // namespace coda::ops
