// Device helpers shared by the non-GEMM kernels (included by src/kernels/*.cu only): 16-bit element traits,
// 8-element (16-byte) vector loads/stores, and deterministic warp/block reductions.
//
// Determinism: every reduction below combines values in an order fixed by the launch shape. The xor butterfly
// gives every lane the same bits, because IEEE addition (and the merge of log-sum-exp states) is commutative.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/error.hpp"

namespace coda::kernels::detail {

constexpr unsigned kFullMask = 0xffffffffu;

inline bool aligned16(void const* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Rows of `cols` 16-bit elements at `base` with row stride `ld` can use 16-byte vectors.
inline bool rows_vectorizable(void const* base, int64_t rows, int64_t cols, int64_t ld) {
  return cols % 8 == 0 && aligned16(base) && (rows <= 1 || ld % 8 == 0);
}

/// Threads for one row of `items` work items when each thread should take about `per_thread` of them:
/// a multiple of 32 in [lo, hi].
inline int threads_for(int64_t items, int64_t per_thread, int lo, int hi) {
  int64_t t = (items + per_thread - 1) / per_thread;
  t = (t + 31) / 32 * 32;
  if (t < lo) t = lo;
  if (t > hi) t = hi;
  return static_cast<int>(t);
}

/// Grid size for `rows` row blocks (each block loops over rows with a grid stride beyond the cap).
inline unsigned grid_for(int64_t rows, int64_t cap = int64_t{1} << 20) {
  return static_cast<unsigned>(rows < cap ? rows : cap);
}

// ---- 16-bit element traits ---------------------------------------------------------------------------------------

template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ float2 to_float2(T2 v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ T2 from_float2(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

template <>
struct Elem<__half> {
  using T2 = __half2;
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ float2 to_float2(T2 v) { return __half22float2(v); }
  static __device__ __forceinline__ T2 from_float2(float a, float b) { return __floats2half2_rn(a, b); }
};

// ---- 8-element vectors ---------------------------------------------------------------------------------------------

/// The 8 elements of a 16-byte vector as floats (exact: every bf16/fp16 value is a float).
template <typename T>
__device__ __forceinline__ void unpack8(uint4 const& u, float (&f)[8]) {
  uint32_t const w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    typename Elem<T>::T2 h;
    __builtin_memcpy(&h, &w[i], 4);
    float2 const v = Elem<T>::to_float2(h);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

/// 8 floats rounded to nearest even into a 16-byte vector of T.
template <typename T>
__device__ __forceinline__ uint4 pack8(float const (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    typename Elem<T>::T2 const h = Elem<T>::from_float2(f[2 * i], f[2 * i + 1]);
    __builtin_memcpy(&w[i], &h, 4);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T>
__device__ __forceinline__ uint4 load16(T const* p) {
  return *reinterpret_cast<uint4 const*>(p);
}
/// Last use of the data: evict-first (ld.global.cs). Coherent, so it is safe on memory that this kernel writes.
template <typename T>
__device__ __forceinline__ uint4 load16_last(T const* p) {
  return __ldcs(reinterpret_cast<uint4 const*>(p));
}
template <typename T>
__device__ __forceinline__ void store16(T* p, uint4 v) {
  *reinterpret_cast<uint4*>(p) = v;
}
/// Streaming store (st.global.cs): output that this kernel never reads back.
template <typename T>
__device__ __forceinline__ void store16_stream(T* p, uint4 v) {
  __stcs(reinterpret_cast<uint4*>(p), v);
}

// ---- reductions -----------------------------------------------------------------------------------------------------

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

/// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the same bits.
/// `scratch` holds 32 values; the leading barrier makes back-to-back calls on the same scratch safe.
template <typename V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
  v = warp_sum(v);
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V r = lane < n_warps ? scratch[lane] : V(0);
  return warp_sum(r);
}

}  // namespace coda::kernels::detail

/// Checks the launch just made (configuration errors and earlier asynchronous errors).
#define CODA_CHECK_LAUNCH() CODA_CUDA_CHECK(cudaGetLastError())
