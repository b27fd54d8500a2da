// Softcap: an elementwise functor for cutlass::epilogue::fusion::Sm90Compute, v <- c * tanh(v / c) in fp32
// (accurate tanhf), the identity when c == 0 (a run-time argument, so one kernel serves both).
//
// Sm90Compute instantiates the functor template twice: Softcap<ElementCompute> only to find `Arguments` (which then
// become the node's run-time arguments), and Softcap<Array<float, N>> to compute, called as fn(x, arguments).
// Both therefore share one Arguments type.
#pragma once

#include <cutlass/array.h>
#include <cutlass/cutlass.h>

namespace coda::epilogue {

/// 1 / c, or 0 when the cap is off (c == 0): SoftcapArguments::inv_cap and the cross-entropy kernels' inverse, one
/// IEEE division wherever it is taken (host or device), so every kernel of a step caps with the same value.
CUTLASS_HOST_DEVICE float inverse_softcap(float cap) { return cap > 0.0f ? 1.0f / cap : 0.0f; }

struct SoftcapArguments {
  float cap = 0.0f;      ///< c >= 0; 0 = off
  float inv_cap = 0.0f;  ///< inverse_softcap(c): a multiply instead of a division per element
};

template <class T>
struct Softcap;

template <>
struct Softcap<float> {
  using Arguments = SoftcapArguments;
  CUTLASS_DEVICE float operator()(float v, Arguments const& a) const {
    return a.cap == 0.0f ? v : a.cap * tanhf(v * a.inv_cap);
  }
};

template <int N>
struct Softcap<cutlass::Array<float, N>> {
  using Arguments = SoftcapArguments;
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v, Arguments const& a) const {
    if (a.cap == 0.0f) return v;  // uniform over the kernel: no divergence
    cutlass::Array<float, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = a.cap * tanhf(v[i] * a.inv_cap);
    return out;
  }
};

}  // namespace coda::epilogue
