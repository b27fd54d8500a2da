// RoundThrough<Element>::Fn: an elementwise functor for cutlass::epilogue::fusion::Sm90Compute that, when its
// run-time flag is set, rounds each fp32 value to Element (round to nearest even, the conversion the collective
// applies to D) and back to fp32; otherwise the identity. A node after it then sees exactly the values the kernel
// stores (F5 with stored logits: statistics of what a later read of the logits sees). The flag is uniform over the
// kernel, so one compiled kernel serves both.
//
// Sm90Compute instantiates Fn<float> only to find `Arguments` and calls Fn<Array<float, N>>.
#pragma once

#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>

namespace coda::epilogue {

struct RoundThroughArguments {
  bool enabled = false;  ///< round to Element and back; false: pass through
};

template <class Element>
struct RoundThrough {
  template <class T>
  struct Fn {
    using Arguments = RoundThroughArguments;
  };

  template <int N>
  struct Fn<cutlass::Array<float, N>> {
    using Arguments = RoundThroughArguments;
    CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v, Arguments const& a) const {
      if (!a.enabled) return v;  // uniform over the kernel: no divergence
      cutlass::NumericArrayConverter<Element, float, N, cutlass::FloatRoundStyle::round_to_nearest> to{};
      cutlass::NumericArrayConverter<float, Element, N> back{};
      return back(to(v));
    }
  };
};

}  // namespace coda::epilogue
