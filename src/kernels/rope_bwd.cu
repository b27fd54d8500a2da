// rope_bwd_zdz: RoPE backward with the zdz row dot (MATH.md; coda_rope_bwd_zdz).
//   dz[2i] = d0 cos + d1 sin,  dz[2i+1] = d1 cos - d0 sin  (rotation by -theta of each q/k pair, pairs adjacent),
//   v columns pass through unchanged, zdz[m] = (1/hidden_size) sum_j qkv[m,j] dqkv[m,j] (R is orthogonal).
//
// One block per row (grid-stride beyond 2^20 rows). The angles theta = pos[m] * inv_freq[i] and their cos/sin are
// computed once per (row, pair index i) in double and shared by all q/k heads through shared memory: pos * inv_freq
// is exact in double for |pos| < 2^29 and double sincos reduces any argument accurately, so cos/sin carry only
// their final rounding to fp32 (~6e-8), also at positions of millions (theta up to ~1e7 rad), where an fp32 angle
// would already be off by ulp(theta)/2 = 0.03..0.5 rad. The rotation and the row dot are fp32; each output element
// is rounded once. In place (dz == dqkv) is safe: each element is read, then written, by the same thread.
#include <cuda_runtime.h>

#include "kernels/device_utils.cuh"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

constexpr int kMaxThreads = 256;
constexpr int kUnroll = 4;
constexpr int kMaxHalfHeadDim = 64;  // head_dim <= 128

template <typename T>
struct RopeParams {
  T const* qkv;
  int64_t ld_qkv;
  T const* dqkv;  // may equal dz
  int64_t ld_dqkv;
  T* dz;
  int64_t ld_dz;
  int32_t const* positions;
  float const* inv_freq;
  int64_t M, W, rotated_width;
  int head_dim;
  float* zdz;
  float hidden_size;
};

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) rope_bwd_zdz_kernel(RopeParams<T> p) {
  __shared__ float cos_s[kMaxHalfHeadDim], sin_s[kMaxHalfHeadDim];
  __shared__ float red[32];
  int const half = p.head_dim / 2;
  // Work items: 16-byte vectors (4 pairs); head_dim is a multiple of 8, so a vector never straddles two heads or the
  // q/k | v boundary.
  int64_t const items = p.W / 8;
  int64_t const step = static_cast<int64_t>(kUnroll) * blockDim.x;

  for (int64_t m = blockIdx.x; m < p.M; m += gridDim.x) {
    double const pos = static_cast<double>(p.positions[m]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      double s, c;
      sincos(pos * static_cast<double>(p.inv_freq[i]), &s, &c);
      cos_s[i] = static_cast<float>(c);
      sin_s[i] = static_cast<float>(s);
    }
    __syncthreads();

    T const* qr = p.qkv + m * p.ld_qkv;
    T const* dr = p.dqkv + m * p.ld_dqkv;
    T* zr = p.dz + m * p.ld_dz;
    float acc = 0.0f;
    for (int64_t k0 = threadIdx.x; k0 < items; k0 += step) {
      uint4 qv[kUnroll], dv[kUnroll];
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        int64_t const k = k0 + static_cast<int64_t>(r) * blockDim.x;
        if (k < items) {
          qv[r] = detail::load16(qr + 8 * k);
          dv[r] = detail::load16(dr + 8 * k);
        }
      }
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        int64_t const k = k0 + static_cast<int64_t>(r) * blockDim.x;
        if (k < items) {
          float q[8], d[8];
          detail::unpack8<T>(qv[r], q);
          detail::unpack8<T>(dv[r], d);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc = fmaf(q[i], d[i], acc);  // q * d is exact in fp32
          int64_t const col = 8 * k;
          if (col < p.rotated_width) {
            int const i0 = static_cast<int>(col % p.head_dim) / 2;
            float o[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              float const c = cos_s[i0 + j], s = sin_s[i0 + j];
              float const d0 = d[2 * j], d1 = d[2 * j + 1];
              o[2 * j] = fmaf(d0, c, d1 * s);
              o[2 * j + 1] = fmaf(d1, c, -(d0 * s));
            }
            detail::store16(zr + 8 * k, detail::pack8<T>(o));
          } else {
            detail::store16(zr + 8 * k, dv[r]);  // v: bit-exact copy
          }
        }
      }
    }
    // The barriers inside block_sum also order this row's reads of cos_s/sin_s before the next row's writes.
    float const total = detail::block_sum(acc, red);
    if (threadIdx.x == 0) p.zdz[m] = total / p.hidden_size;
  }
}

template <typename T>
void launch(RopeBwdArgs const& a, cudaStream_t stream) {
  int64_t const hd = a.head_dim;
  int64_t const W = (static_cast<int64_t>(a.n_q_heads) + 2 * static_cast<int64_t>(a.n_kv_heads)) * hd;
  RopeParams<T> p{};
  p.qkv = static_cast<T const*>(a.qkv);
  p.ld_qkv = a.M > 1 ? a.ld_qkv : W;
  p.dqkv = static_cast<T const*>(a.dqkv);
  p.ld_dqkv = a.M > 1 ? a.ld_dqkv : W;
  p.dz = static_cast<T*>(a.dz);
  p.ld_dz = a.M > 1 ? a.ld_dz : W;
  p.positions = a.positions;
  p.inv_freq = a.inv_freq;
  p.M = a.M;
  p.W = W;
  p.rotated_width = (static_cast<int64_t>(a.n_q_heads) + a.n_kv_heads) * hd;
  p.head_dim = a.head_dim;
  p.zdz = a.zdz;
  p.hidden_size = static_cast<float>(a.hidden_size);
  // The API guarantees this (TMA rule on qkv, dqkv and dz_out; head_dim 64 or 128).
  bool const vec = hd % 8 == 0 && detail::rows_vectorizable(p.qkv, a.M, W, p.ld_qkv) &&
                   detail::rows_vectorizable(p.dqkv, a.M, W, p.ld_dqkv) &&
                   detail::rows_vectorizable(p.dz, a.M, W, p.ld_dz);
  if (!vec) {
    ::coda::detail::fail(CODA_ERROR_INTERNAL,
                         "rope_bwd_zdz: rows must be 16-byte aligned with head_dim a multiple of 8");
  }
  int64_t const items = W / 8;
  // About kUnroll items per thread, 64..256 threads: W = 6144 (8B: 32 q + 2x8 kv heads of 128) -> 192 threads.
  // Measured on an H200: 16384 x 6144 bf16 in 0.156 ms (~3.9 TB/s counting 2 reads and 1 write; copy: 4.3 TB/s).
  int const threads = detail::threads_for(items, kUnroll, 64, kMaxThreads);
  unsigned const grid = detail::grid_for(a.M);
  rope_bwd_zdz_kernel<T><<<grid, threads, 0, stream>>>(p);
  CODA_CHECK_LAUNCH();
}

}  // namespace

void rope_bwd_zdz(RopeBwdArgs const& args, cudaStream_t stream) {
  if (args.M <= 0) return;
  if (args.head_dim <= 0 || args.head_dim % 2 != 0 || args.head_dim / 2 > kMaxHalfHeadDim) {
    ::coda::detail::fail(CODA_ERROR_INTERNAL, "rope_bwd_zdz: head_dim must be even and <= 128, got ", args.head_dim);
  }
  switch (args.dtype) {
    case CODA_BF16: return launch<__nv_bfloat16>(args, stream);
    case CODA_FP16: return launch<__half>(args, stream);
    default: ::coda::detail::fail(CODA_ERROR_INTERNAL, "rope_bwd_zdz: dtype must be bf16 or fp16");
  }
}

}  // namespace coda::kernels
