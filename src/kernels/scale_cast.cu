// scale_cast: out[i] = R(src[i] * scale[0]) for an fp32 src and a 16-bit out, the product in fp32 and rounded once
// to nearest even, which is what torch.mul(src, scale, out=<bf16 tensor>) computes. It scales the LM head's saved
// fp32 weight gradient ([V, d], 1 GiB at llama3-1B) by the upstream loss gradient in the backward. PyTorch runs that
// mixed-dtype product through its non-vectorised casting loop (1.3 ms for 1 GiB on the H200, about 1.2 TB/s:
// bench/results/block_variants_h200/); here each thread moves 8 elements as two 16-byte loads and one 16-byte
// store. The scale is read on the device (no host sync on the loss gradient).
#include <cuda_runtime.h>

#include "common/error.hpp"
#include "kernels/device_utils.cuh"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

using detail::Elem;

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_cast_vec8_kernel(float const* __restrict__ src,
                                                                   float const* __restrict__ scale,
                                                                   T* __restrict__ out, int64_t groups) {
  float const s = *scale;
  for (int64_t g = int64_t{blockIdx.x} * kThreads + threadIdx.x; g < groups; g += int64_t{gridDim.x} * kThreads) {
    float4 const a = __ldcs(reinterpret_cast<float4 const*>(src) + 2 * g);
    float4 const b = __ldcs(reinterpret_cast<float4 const*>(src) + 2 * g + 1);
    float const f[8] = {a.x * s, a.y * s, a.z * s, a.w * s, b.x * s, b.y * s, b.z * s, b.w * s};
    detail::store16_stream(out + 8 * g, detail::pack8<T>(f));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_cast_scalar_kernel(float const* __restrict__ src,
                                                                     float const* __restrict__ scale,
                                                                     T* __restrict__ out, int64_t n) {
  float const s = *scale;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
    out[i] = Elem<T>::from_float(src[i] * s);
  }
}

unsigned blocks_for(int64_t items) {
  int64_t const b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < (int64_t{1} << 20) ? b : (int64_t{1} << 20));  // grid-stride beyond that
}

template <typename T>
void launch(float const* src, float const* scale, void* out_v, int64_t n, cudaStream_t stream) {
  T* const out = static_cast<T*>(out_v);
  // The vector body needs 16-byte aligned src and out (its float4 loads and 16-byte stores); the tail (n % 8) and
  // any other view take the scalar kernel.
  bool const vec = detail::aligned16(src) && detail::aligned16(out);
  int64_t const groups = vec ? n / 8 : 0;
  if (groups > 0) {
    scale_cast_vec8_kernel<T><<<blocks_for(groups), kThreads, 0, stream>>>(src, scale, out, groups);
    CODA_CUDA_CHECK(cudaGetLastError());
  }
  int64_t const done = groups * 8;
  if (done < n) {
    scale_cast_scalar_kernel<T><<<blocks_for(n - done), kThreads, 0, stream>>>(src + done, scale, out + done, n - done);
    CODA_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void scale_cast(float const* src, float const* scale, coda_dtype out_dtype, void* out, int64_t n,
                cudaStream_t stream) {
  if (n == 0) return;
  if (out_dtype == CODA_FP16) {
    launch<__half>(src, scale, out, n, stream);
  } else {
    launch<__nv_bfloat16>(src, scale, out, n, stream);
  }
}

}  // namespace coda::kernels
