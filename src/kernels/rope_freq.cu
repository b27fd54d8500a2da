// linear_rowscale_rope's per-column frequency vector: the epilogue broadcasts one inv_freq per output column
// (Sm90RowBroadcast), so the caller's [head_dim/2] vector is expanded once per call over the q and k heads, with 0 on
// the v columns (angle 0: the epilogue passes them through exactly). N = (Hq + 2 Hkv) * head_dim floats; one tiny
// launch.
#include <cuda_runtime.h>

#include "common/error.hpp"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

__global__ void expand_rope_inv_freq_kernel(float const* __restrict__ inv_freq, int64_t rotated_width,
                                            int64_t width, int head_dim, float* __restrict__ out) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < width;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[n] = n < rotated_width ? inv_freq[(n % head_dim) / 2] : 0.0f;
  }
}

}  // namespace

void expand_rope_inv_freq(float const* inv_freq, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                          float* out, cudaStream_t stream) {
  int64_t const rotated = (static_cast<int64_t>(n_q_heads) + n_kv_heads) * head_dim;
  int64_t const width = rotated + static_cast<int64_t>(n_kv_heads) * head_dim;
  int const threads = 256;
  int64_t const blocks = (width + threads - 1) / threads;
  expand_rope_inv_freq_kernel<<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), threads, 0, stream>>>(
      inv_freq, rotated, width, head_dim, out);
  CODA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace coda::kernels
