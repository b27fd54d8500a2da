// RopeRowscale: the elementwise functor of linear_rowscale_rope's epilogue (used as Sm90Compute<RopeRowscale, ...>;
// no custom node):
//
//   z = rstd[m] * acc;   for each adjacent column pair (2i, 2i+1) with angle theta = pos[m] * inv_freq[n]:
//   out[2i] = z[2i] cos(theta) - z[2i+1] sin(theta),   out[2i+1] = z[2i+1] cos(theta) + z[2i] sin(theta)
//
// inv_freq is per column (the op expands the caller's [head_dim/2] vector over the q and k heads and puts 0 on the
// v columns, which then pass through exactly). Pairs are adjacent in one thread's fragment (CUTLASS_EVT.md
// section 4), so the functor sees whole pairs at positions (2k, 2k+1).
//
// Angles are accurate at large positions (MATH.md, linear_rowscale_rope: pos * inv_freq reaches 1e5..1e6 rad, where a
// float product is off by up to ulp/2 ~ 4e-3..3e-2 rad): theta = hi + lo exactly (hi = fl(pos * f),
// lo = fma(pos, f, -hi); pos < 2^24 is exact in float), then a three-constant Cody-Waite reduction by 2 pi with fma
// (the first step is exact) and the hardware sin/cos on the reduced angle in [-pi, pi] (abs error ~4e-7). Total angle
// error < 1e-6 rad for pos * f < 2^24, against ~2^-9 relative for the bf16 rounding of the output.
//
// Host reference of the functor's semantics: rope_pair_reference() (double precision, plain C++).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#endif

namespace coda::epilogue {

/// Host reference of one rotated pair: (z0, z1) = rstd * (acc0, acc1), angle pos * inv_freq in double.
inline void rope_pair_reference(double acc0, double acc1, double rstd, int32_t pos, float inv_freq, double* out0,
                                double* out1) {
  double const z0 = rstd * acc0, z1 = rstd * acc1;
  double const theta = static_cast<double>(pos) * static_cast<double>(inv_freq);
  double const c = std::cos(theta), s = std::sin(theta);
  *out0 = z0 * c - z1 * s;
  *out1 = z1 * c + z0 * s;
}

#if defined(__CUDACC__)

namespace detail {

/// pos * f reduced to [-pi, pi] (plus rounding) for integer-valued pos in [0, 2^24) and finite f >= 0 (see the header
/// comment): the argument rope_sincos hands the hardware sin/cos.
CUTLASS_DEVICE float rope_reduce(float pos, float f) {
  float const hi = pos * f;
  float const lo = __fmaf_rn(pos, f, -hi);  // exact error of the product
  // k = round(theta / 2 pi), to nearest even, by the 1.5 * 2^23 bias: exact for theta / 2 pi < 2^22 (pos * f < 2.6e7,
  // past the 2^24 this header promises) and the same k as rintf. Two FADDs on the FMA pipe, where rintf's FRND takes
  // the quarter-rate XU pipe that the two MUFU (sin, cos) per pair already load: the epilogue's narrowest pipe.
  // The _rn intrinsics keep the compiler from contracting the product into the first add.
  float const k = __fadd_rn(__fadd_rn(__fmul_rn(hi, 0.15915494309189535f), 12582912.0f), -12582912.0f);
  // 2 pi = kC1 + kC2 + kC3; kC1 = 201/32 has 8 significant bits, so hi - k*kC1 is exact in one fma.
  constexpr float kC1 = 6.28125f;
  constexpr float kC2 = 1.9353071693331003e-3f;
  constexpr float kC3 = 1.0253376273028358e-11f;  // 2 pi - kC1 - kC2, rounded (residual 3e-19)
  float r = __fmaf_rn(-k, kC1, hi);
  r = __fmaf_rn(-k, kC2, r);
  r = __fmaf_rn(-k, kC3, r);
  return r + lo;
}

/// sin and cos of pos * f for integer-valued pos in [0, 2^24) and finite f >= 0 (see the header comment).
CUTLASS_DEVICE void rope_sincos(float pos, float f, float* s, float* c) { __sincosf(rope_reduce(pos, f), s, c); }

/// One pair turned by the angle whose sine and cosine are (s, c): (o0, o1) = (z0 c - z1 s, z1 c + z0 s), each an fma
/// of a rounded product (every RoPE node rotates through this, so their outputs agree bit for bit).
CUTLASS_DEVICE void rope_rotate(float z0, float z1, float s, float c, float& o0, float& o1) {
  o0 = __fmaf_rn(z0, c, -z1 * s);
  o1 = __fmaf_rn(z1, c, z0 * s);
}

}  // namespace detail

/// Sm90Compute functor: operator()(acc, rstd, pos, inv_freq) on whole fragments (float; pos as float).
template <class T>
struct RopeRowscale;

template <int N>
struct RopeRowscale<cutlass::Array<float, N>> {
  static_assert(N % 2 == 0, "RoPE pairs are adjacent fragment elements");
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& acc,
                                                     cutlass::Array<float, N> const& rstd,
                                                     cutlass::Array<float, N> const& pos,
                                                     cutlass::Array<float, N> const& inv_freq) const {
    cutlass::Array<float, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < N; k += 2) {
      float const z0 = rstd[k] * acc[k];
      float const z1 = rstd[k + 1] * acc[k + 1];
      float const f = inv_freq[k];
      if (f == 0.0f) {  // v columns (and zero frequencies): identity, bit-exact
        out[k] = z0;
        out[k + 1] = z1;
      } else {
        float s, c;
        detail::rope_sincos(pos[k], f, &s, &c);
        detail::rope_rotate(z0, z1, s, c, out[k], out[k + 1]);
      }
    }
    return out;
  }
};

#endif  // __CUDACC__

}  // namespace coda::epilogue
