// The dgrad epilogues' small kernels. column_sum: the final reduce of per-tile partials (B2's dgamma, B3's zdz):
// out[n] = scale * sum over tiles t in order 0..T-1 of partials[t * ld + n], accumulated in double, rounded once.
// One thread per column (coalesced across n); deterministic: the order depends on T only. scale_vector: alpha * zdz
// for B2's epilogue.
#include <cuda_runtime.h>

#include "common/error.hpp"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

__global__ void column_sum_kernel(float const* __restrict__ partials, int64_t tiles, int64_t ld, int64_t N,
                                  double scale, float* __restrict__ out) {
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < N; n += int64_t{gridDim.x} * blockDim.x) {
    double s = 0.0;
    for (int64_t t = 0; t < tiles; ++t) s += partials[t * ld + n];
    out[n] = static_cast<float>(s * scale);
  }
}

__global__ void scale_vector_kernel(float const* __restrict__ in, float alpha, int64_t n, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = alpha * in[i];
  }
}

}  // namespace

void scale_vector(float const* in, float alpha, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  int64_t const blocks = (n + 255) / 256;
  scale_vector_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(in, alpha, n, out);
  CODA_CUDA_CHECK(cudaGetLastError());
}

void column_sum(float const* partials, int64_t tiles, int64_t ld, int64_t N, float* out, cudaStream_t stream,
                double scale) {
  if (N <= 0) return;
  int64_t const blocks = (N + 255) / 256;
  column_sum_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(partials, tiles, ld,
                                                                                            N, scale, out);
  CODA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace coda::kernels
