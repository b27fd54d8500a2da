// The plain GEMM's epilogue program: D = alpha * acc + beta * C, written as an explicit EVT so it doubles as the
// worked example of the Epilogue concept that FusedLinear takes (fused_linear.hpp). CUTLASS-heavy header.
//
//   root = homogeneous_multiply_add(beta, C, alpha * acc)      (fp32 math, one rounding to ElementD)
//
// This tree has the shape CUTLASS optimises (Sm90TreeVisitor specialisation for multiply_add with a scalar first
// operand and Sm90SrcFetch second): when beta == 0 the C tile is never loaded, so one instantiation serves both
// "overwrite" (beta = 0) and "accumulate into D" (C = D, beta = 1) without extra memory traffic for the former.
#pragma once

#include "epilogue/tree_args.hpp"
#include "gemm/fused_linear.hpp"
#include "gemm/kernel_api.hpp"
#include "gemm/one_lane_tma_store.hpp"
#include "gemm/plain_kernels.hpp"

#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/functional.h>

#include <type_traits>

namespace coda::gemm {

namespace lc {
struct AlphaName;
struct BetaName;
/// The two scalars, named apart (both are Sm90ScalarBroadcast<float>; the Named node keeps is_zero(), so beta = 0
/// still skips the C load).
using Alpha = epilogue::Named<cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>, AlphaName>;
using Beta = epilogue::Named<cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>, BetaName>;
}  // namespace lc

struct LinearCombinationEpilogue {
  using Args = LinearCombinationArgs;

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = ElementD;  // the accumulate source is D itself
    static constexpr auto kRound = Traits::kRound;

    using AlphaTimesAcc = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, lc::Alpha,
        cutlass::epilogue::fusion::Sm90AccFetch>;
    using Fusion = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float, kRound>, lc::Beta,
        cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>, AlphaTimesAcc>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, Operands const& /*operands*/) {
      epilogue::node_args<lc::Beta, Fusion>(out).scalars[0] = args.beta;
      epilogue::node_args<lc::Alpha, Fusion>(out).scalars[0] = args.alpha;
    }
  };
};

/// The overwrite-only plain epilogue: D = alpha * acc (beta must be 0; check_args refuses anything else, so the
/// tuner skips it for accumulating GEMMs). Without a C source the D buffers are not shared with C, so it keeps
/// kStagesD of them (DeepStorePolicy) and the stores of a tile overlap the next sub-tiles' math.
template <int kStagesD>
struct ScaleEpilogue {
  using Args = LinearCombinationArgs;

  static char const* check_args(Args const& args) {
    return args.beta == 0.0f ? nullptr : "this kernel overwrites D (beta = 0): accumulating needs one with a C source";
  }

  template <class Traits>
  struct Program {
    using ElementD = typename Traits::ElementD;
    using ElementC = void;
    static constexpr auto kRound = Traits::kRound;
    using EpilogueDispatchPolicy = DeepStorePolicy<Traits, void, kStagesD>;

    using Fusion = cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>, lc::Alpha,
        cutlass::epilogue::fusion::Sm90AccFetch>;

    template <class FusionArguments>
    static void make_args(FusionArguments& out, Args const& args, Operands const& /*operands*/) {
      epilogue::node_args<lc::Alpha, Fusion>(out).scalars[0] = args.alpha;
    }
  };
};

/// The add-into-D plain epilogue: D += alpha * acc with the tile written by TMA reduce-add (cp.reduce.async.bulk
/// .add, from one lane), so D is never loaded into the CTA: no C smem and no C loads in the epilogue, and the
/// mainloop keeps the stages C would take. L2 adds each fp32 element once (one CTA per output tile), so the result is
/// that of beta = 1 with C = D (alpha * acc rounded, then one rounded fp32 add; the same bits as the C-loading kernel
/// on the LM head's dW shape, wgrad_accumulate_ab.py; whether L2's add keeps subnormals is not checked), and
/// deterministic. beta must be 1; fp32 D only (a 16-bit D would round the sum in L2's add, not once in fp32).
template <int kStagesD>
struct ReduceAddEpilogue {
  using Args = LinearCombinationArgs;

  static char const* check_args(Args const& args) {
    return args.beta == 1.0f ? nullptr
                             : "this kernel adds into D (beta = 1, TMA reduce-add): overwriting needs one that stores";
  }

  /// ScaleEpilogue's program (D = alpha * acc, kStagesD D buffers, no C) with the reduction in the store's slot.
  template <class Traits>
  struct Program : ScaleEpilogue<kStagesD>::template Program<Traits> {
    static_assert(std::is_same_v<typename Traits::ElementD, float>, "ReduceAddEpilogue: fp32 D only");
    using StoreOp = OneLaneTmaReduceAdd;  // issued by one lane: warp 0's 32 would add the tile 32 times
  };
};

}  // namespace coda::gemm
