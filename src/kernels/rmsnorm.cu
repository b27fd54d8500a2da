// RMSNorm kernels outside the GEMMs: the final reduce of linear_residual_rmsnorm's per-tile partial sums of squares
// (coda_rmsnorm_rstd) and the first-layer preparation h = x * gamma with rstd from the rows of x
// (coda_rmsnorm_prepare). MATH.md, "Deferred row scale".
#include <cuda_runtime.h>

#include "kernels/device_utils.cuh"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

using detail::Elem;

// ---- rstd from partials -------------------------------------------------------------------------------------------

// One thread per row m; the T partials of a row are summed in tile order (t = 0, 1, ...), so the result does not
// depend on the launch. Loads are coalesced across m (partials are [T, M] with unit stride along M).
constexpr int kRstdThreads = 256;

__global__ void __launch_bounds__(kRstdThreads) rmsnorm_rstd_kernel(float const* __restrict__ partials, int64_t T,
                                                                    int64_t M, int64_t ld, float n_features,
                                                                    float eps, float* __restrict__ rstd) {
  int64_t const stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t m = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; m < M; m += stride) {
    float const* p = partials + m;
    float s = 0.0f;
#pragma unroll 4
    for (int64_t t = 0; t < T; ++t) s += p[t * ld];
    // IEEE division and square root (no fast-math): the same formula as 1.0f / std::sqrt(mean + eps) on the host.
    rstd[m] = 1.0f / sqrtf(s / n_features + eps);
  }
}

// ---- first-layer preparation --------------------------------------------------------------------------------------

template <typename T>
struct PrepareParams {
  T const* x;
  int64_t ldx;
  T const* gamma;
  T* h;
  int64_t ldh;
  float* rstd;
  int64_t M, N;
  float eps;
};

// A group of `tpr` threads (a multiple of 32) handles one row; a block holds blockDim.x / tpr groups (blockDim.x is
// a multiple of tpr). Each thread
// walks its items (16-byte vectors of 8 elements, or single elements on the scalar path) with a stride of tpr,
// four loads in flight at a time; h needs no statistic, so it is written in the same pass. The row's sum of squares
// is reduced warp by warp, then across the row's warps in warp order.
constexpr int kPrepareMaxThreads = 512;
constexpr int kPrepareUnroll = 4;

template <typename T, bool kVec>
__global__ void __launch_bounds__(kPrepareMaxThreads) rmsnorm_prepare_kernel(PrepareParams<T> p, int tpr) {
  __shared__ float red[32];
  int const rows_per_block = blockDim.x / tpr;
  int const warps_per_row = tpr / 32;
  int const group = threadIdx.x / tpr;
  int const gl = threadIdx.x % tpr;  // thread index inside the row group
  int64_t const items = kVec ? p.N / 8 : p.N;
  float const n_f = static_cast<float>(p.N);

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < p.M;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    int64_t const m = base + group;
    float ss = 0.0f;
    if (m < p.M) {
      T const* xr = p.x + m * p.ldx;
      T* hr = p.h + m * p.ldh;
      if constexpr (kVec) {
        for (int64_t k0 = gl; k0 < items; k0 += static_cast<int64_t>(kPrepareUnroll) * tpr) {
          uint4 xv[kPrepareUnroll], gv[kPrepareUnroll];
#pragma unroll
          for (int r = 0; r < kPrepareUnroll; ++r) {
            int64_t const k = k0 + static_cast<int64_t>(r) * tpr;
            if (k < items) {
              xv[r] = detail::load16(xr + 8 * k);
              gv[r] = detail::load16(p.gamma + 8 * k);
            }
          }
#pragma unroll
          for (int r = 0; r < kPrepareUnroll; ++r) {
            int64_t const k = k0 + static_cast<int64_t>(r) * tpr;
            if (k < items) {
              float xf[8], gf[8], hf[8];
              detail::unpack8<T>(xv[r], xf);
              detail::unpack8<T>(gv[r], gf);
#pragma unroll
              for (int i = 0; i < 8; ++i) {
                ss = fmaf(xf[i], xf[i], ss);  // x^2 is exact in fp32 for 16-bit x: same as s += x * x
                hf[i] = xf[i] * gf[i];        // exact in fp32; rounded once below
              }
              detail::store16(hr + 8 * k, detail::pack8<T>(hf));
            }
          }
        }
      } else {
        for (int64_t k = gl; k < items; k += tpr) {
          float const xf = Elem<T>::to_float(xr[k]);
          ss = fmaf(xf, xf, ss);
          hr[k] = Elem<T>::from_float(xf * Elem<T>::to_float(p.gamma[k]));
        }
      }
    }
    ss = detail::warp_sum(ss);
    if (warps_per_row > 1) {  // uniform over the block: every thread reaches the barriers
      int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      __syncthreads();
      if (lane == 0) red[warp] = ss;
      __syncthreads();
      float t = 0.0f;
      for (int w = 0; w < warps_per_row; ++w) t += red[group * warps_per_row + w];
      ss = t;
    }
    if (m < p.M && gl == 0) p.rstd[m] = 1.0f / sqrtf(ss / n_f + p.eps);
  }
}

template <typename T>
void launch_prepare(RmsnormPrepareArgs const& a, cudaStream_t stream) {
  PrepareParams<T> p{static_cast<T const*>(a.x), a.ldx, static_cast<T const*>(a.gamma), static_cast<T*>(a.h),
                     a.ldh, a.rstd, a.M, a.N, a.eps};
  bool const vec = detail::rows_vectorizable(a.x, a.M, a.N, a.ldx) && detail::rows_vectorizable(a.h, a.M, a.N, a.ldh) &&
                   detail::rows_vectorizable(a.gamma, 1, a.N, a.N);
  int64_t const items = vec ? a.N / 8 : a.N;
  // About kPrepareUnroll items per thread: N = 2048 -> 64 threads a row, 8192 -> 256, >= 16384 -> 512. Measured on
  // an H200 (bf16, M = 16384): N = 2048 in 0.041 ms, N = 8192 in 0.134 ms (~4.0 TB/s; copy: 4.3 TB/s).
  int const tpr = detail::threads_for(items, kPrepareUnroll, 32, kPrepareMaxThreads);
  // Small rows: as many whole row groups as fit in 256 threads (the block must be a multiple of tpr).
  int const rows_per_block = tpr < 256 ? 256 / tpr : 1;
  int const threads = rows_per_block * tpr;
  unsigned const grid = detail::grid_for((a.M + rows_per_block - 1) / rows_per_block);
  if (vec) {
    rmsnorm_prepare_kernel<T, true><<<grid, threads, 0, stream>>>(p, tpr);
  } else {
    rmsnorm_prepare_kernel<T, false><<<grid, threads, 0, stream>>>(p, tpr);
  }
  CODA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_rstd(float const* partials, int64_t T, int64_t M, int64_t ld, int64_t n_features, float eps,
                  float* rstd, cudaStream_t stream) {
  if (M <= 0) return;
  unsigned const grid = detail::grid_for((M + kRstdThreads - 1) / kRstdThreads, int64_t{1} << 16);
  rmsnorm_rstd_kernel<<<grid, kRstdThreads, 0, stream>>>(partials, T, M, ld, static_cast<float>(n_features), eps,
                                                         rstd);
  CODA_CHECK_LAUNCH();
}

void rmsnorm_prepare(RmsnormPrepareArgs const& args, cudaStream_t stream) {
  if (args.M <= 0) return;
  switch (args.dtype) {
    case CODA_BF16: return launch_prepare<__nv_bfloat16>(args, stream);
    case CODA_FP16: return launch_prepare<__half>(args, stream);
    default: ::coda::detail::fail(CODA_ERROR_INTERNAL, "rmsnorm_prepare: dtype must be bf16 or fp16");
  }
}

}  // namespace coda::kernels
