// qk_norm_rope_bwd_zdz: the backward of linear_rowscale_qk_norm_rope's per-head norm and RoPE (MATH.md;
// coda_qk_norm_rope_bwd_zdz). From the pre-norm z (u on the q/k heads) and dqkv, per q/k head of row m with
// r = 1/sqrt(mean u^2 + eps), nh = u r, g the head's gamma:
//   dn = R^T dqkv (rotation by -theta of each pair),  s = <dn, nh g>,  du = r (g dn - nh s / hd)
// v heads pass through (dz = dqkv, bit for bit). zdz[m] = (1/hidden_size) (sum over q/k heads of <u, du> + <v, dv>),
// with du in fp32 before its rounding. dq_gamma / dk_gamma = sum over rows and heads of the kind of dn nh: per-block
// partials (fixed order), then column_sum (fixed order): deterministic.
//
// One block per row (grid-stride over rows, at most kMaxBlocks blocks: the partials buffer does not grow with M), one
// warp per head: a lane holds head_dim / 32 contiguous columns (a pair or two), so the head's sums are one warp
// reduction each. The angles as rope_bwd_zdz's (rope_bwd.cu): theta and its cos/sin in double, once per (row, pair
// index), shared by the row's heads through shared memory. In place (dz == dqkv) is safe: a lane reads its elements,
// the warp reduces, then the lane writes the same elements.
#include <cuda_runtime.h>

#include "kernels/device_utils.cuh"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 1024;

template <typename T>
struct QkParams {
  T const* z;
  int64_t ld_z;
  T const* dqkv;  // may equal dz
  int64_t ld_dqkv;
  T* dz;
  int64_t ld_dz;
  float const* q_gamma;
  float const* k_gamma;
  int32_t const* positions;
  float const* inv_freq;
  float* zdz;
  float* partials;  // [gridDim.x, 2 head_dim]: q columns, then k columns
  int64_t M;
  int n_q_heads, n_rot, n_heads;
  float eps, hidden_size;
};

/// The 32-bit words of kPer consecutive 16-bit elements: one 4-byte (kPer = 2) or 8-byte (kPer = 4) global access
/// (aligned: rows are 16-byte aligned and a lane's first column is a multiple of kPer).
template <int kPer>
struct Words {
  uint32_t w[kPer / 2];
};

template <typename T, int kPer>
__device__ __forceinline__ Words<kPer> load_words(T const* p) {
  Words<kPer> out;
  if constexpr (kPer == 2) {
    out.w[0] = *reinterpret_cast<uint32_t const*>(p);
  } else {
    uint2 const v = *reinterpret_cast<uint2 const*>(p);
    out.w[0] = v.x;
    out.w[1] = v.y;
  }
  return out;
}

template <typename T, int kPer>
__device__ __forceinline__ void store_words(T* p, Words<kPer> const& in) {
  if constexpr (kPer == 2) {
    *reinterpret_cast<uint32_t*>(p) = in.w[0];
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(in.w[0], in.w[1]);
  }
}

template <typename T, int kPer>
__device__ __forceinline__ void load_elems(T const* p, float (&f)[kPer]) {
  Words<kPer> const in = load_words<T, kPer>(p);
#pragma unroll
  for (int i = 0; i < kPer / 2; ++i) {
    typename detail::Elem<T>::T2 h;
    __builtin_memcpy(&h, &in.w[i], 4);
    float2 const v = detail::Elem<T>::to_float2(h);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

template <typename T, int kPer>
__device__ __forceinline__ void store_elems(T* p, float const (&f)[kPer]) {
  Words<kPer> out;
#pragma unroll
  for (int i = 0; i < kPer / 2; ++i) {
    typename detail::Elem<T>::T2 const h = detail::Elem<T>::from_float2(f[2 * i], f[2 * i + 1]);
    __builtin_memcpy(&out.w[i], &h, 4);
  }
  store_words<T, kPer>(p, out);
}

template <typename T, int kPer>
__device__ __forceinline__ void copy_elems(T const* src, T* dst) {
  store_words<T, kPer>(dst, load_words<T, kPer>(src));
}

// kPer = head_dim / 32: 2 (head_dim 64) or 4 (head_dim 128).
template <typename T, int kPer>
__global__ void __launch_bounds__(kThreads) qk_norm_rope_bwd_kernel(QkParams<T> p) {
  constexpr int kHeadDim = 32 * kPer;
  __shared__ float cos_s[kHeadDim / 2], sin_s[kHeadDim / 2];
  __shared__ float red[32];
  __shared__ float gsum[kWarps][2 * kHeadDim];
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int const c0 = kPer * lane;  // the lane's first column within a head (even)
  float gq[kPer], gk[kPer], dgq[kPer], dgk[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    gq[e] = p.q_gamma[c0 + e];
    gk[e] = p.k_gamma[c0 + e];
    dgq[e] = 0.0f;
    dgk[e] = 0.0f;
  }

  for (int64_t m = blockIdx.x; m < p.M; m += gridDim.x) {
    double const pos = static_cast<double>(p.positions[m]);
    for (int i = threadIdx.x; i < kHeadDim / 2; i += blockDim.x) {
      double s, c;
      sincos(pos * static_cast<double>(p.inv_freq[i]), &s, &c);
      cos_s[i] = static_cast<float>(c);
      sin_s[i] = static_cast<float>(s);
    }
    __syncthreads();

    T const* zr = p.z + m * p.ld_z;
    T const* dr = p.dqkv + m * p.ld_dqkv;
    T* outr = p.dz + m * p.ld_dz;
    float acc = 0.0f;  // this thread's share of <z, dz> over the row
    for (int h = warp; h < p.n_heads; h += kWarps) {
      int64_t const col = static_cast<int64_t>(h) * kHeadDim + c0;
      float u[kPer], dy[kPer];
      load_elems<T, kPer>(zr + col, u);
      load_elems<T, kPer>(dr + col, dy);
      if (h >= p.n_rot) {  // v (warp-uniform)
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc = fmaf(u[e], dy[e], acc);
        copy_elems<T, kPer>(dr + col, outr + col);
        continue;
      }
      bool const is_q = h < p.n_q_heads;
      float ss = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) ss = fmaf(u[e], u[e], ss);
      ss = detail::warp_sum(ss);
      float const r = 1.0f / sqrtf(ss * (1.0f / kHeadDim) + p.eps);
      float dn[kPer], nh[kPer], g[kPer];
      float sdot = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer / 2; ++j) {
        int const i = c0 / 2 + j;
        float const c = cos_s[i], s = sin_s[i];
        float const d0 = dy[2 * j], d1 = dy[2 * j + 1];
        dn[2 * j] = fmaf(d0, c, d1 * s);
        dn[2 * j + 1] = fmaf(d1, c, -(d0 * s));
      }
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        g[e] = is_q ? gq[e] : gk[e];
        nh[e] = u[e] * r;
        sdot = fmaf(dn[e], nh[e] * g[e], sdot);
      }
      sdot = detail::warp_sum(sdot);
      float const k = sdot * (1.0f / kHeadDim);
      float du[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        du[e] = r * fmaf(g[e], dn[e], -(nh[e] * k));
        acc = fmaf(u[e], du[e], acc);
        if (is_q) {
          dgq[e] = fmaf(dn[e], nh[e], dgq[e]);
        } else {
          dgk[e] = fmaf(dn[e], nh[e], dgk[e]);
        }
      }
      store_elems<T, kPer>(outr + col, du);
    }
    // The barriers inside block_sum also order this row's reads of cos_s/sin_s before the next row's writes.
    float const total = detail::block_sum(acc, red);
    if (threadIdx.x == 0) p.zdz[m] = total / p.hidden_size;
  }

  // The block's gamma partials: each warp's lanes, then the warps summed in order.
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    gsum[warp][c0 + e] = dgq[e];
    gsum[warp][kHeadDim + c0 + e] = dgk[e];
  }
  __syncthreads();
  for (int j = threadIdx.x; j < 2 * kHeadDim; j += blockDim.x) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += gsum[w][j];
    p.partials[static_cast<int64_t>(blockIdx.x) * 2 * kHeadDim + j] = s;
  }
}

unsigned blocks_for(int64_t M) { return detail::grid_for(M, kMaxBlocks); }

template <typename T, int kPer>
void launch(QkNormRopeBwdArgs const& a, cudaStream_t stream) {
  int64_t const hd = a.head_dim;
  int64_t const W = (static_cast<int64_t>(a.n_q_heads) + 2 * static_cast<int64_t>(a.n_kv_heads)) * hd;
  QkParams<T> p{};
  p.z = static_cast<T const*>(a.z);
  p.ld_z = a.M > 1 ? a.ld_z : W;
  p.dqkv = static_cast<T const*>(a.dqkv);
  p.ld_dqkv = a.M > 1 ? a.ld_dqkv : W;
  p.dz = static_cast<T*>(a.dz);
  p.ld_dz = a.M > 1 ? a.ld_dz : W;
  p.q_gamma = a.q_gamma;
  p.k_gamma = a.k_gamma;
  p.positions = a.positions;
  p.inv_freq = a.inv_freq;
  p.zdz = a.zdz;
  p.partials = static_cast<float*>(a.workspace);
  p.M = a.M;
  p.n_q_heads = a.n_q_heads;
  p.n_rot = a.n_q_heads + a.n_kv_heads;
  p.n_heads = a.n_q_heads + 2 * a.n_kv_heads;
  p.eps = a.eps;
  p.hidden_size = static_cast<float>(a.hidden_size);
  // The API guarantees this (TMA rule on z, dqkv and dz_out).
  bool const aligned = detail::rows_vectorizable(p.z, a.M, W, p.ld_z) &&
                       detail::rows_vectorizable(p.dqkv, a.M, W, p.ld_dqkv) &&
                       detail::rows_vectorizable(p.dz, a.M, W, p.ld_dz);
  if (!aligned) ::coda::detail::fail(CODA_ERROR_INTERNAL, "qk_norm_rope_bwd_zdz: rows must be 16-byte aligned");
  unsigned const grid = blocks_for(a.M);
  qk_norm_rope_bwd_kernel<T, kPer><<<grid, kThreads, 0, stream>>>(p);
  CODA_CHECK_LAUNCH();
  float const* partials = p.partials;
  column_sum(partials, grid, 2 * hd, hd, a.dq_gamma, stream);
  column_sum(partials + hd, grid, 2 * hd, hd, a.dk_gamma, stream);
}

template <typename T>
void dispatch_head_dim(QkNormRopeBwdArgs const& a, cudaStream_t stream) {
  if (a.head_dim == 64) return launch<T, 2>(a, stream);
  return launch<T, 4>(a, stream);
}

}  // namespace

size_t qk_norm_rope_bwd_workspace_bytes(int64_t M, int64_t head_dim) {
  if (M <= 0 || head_dim <= 0) return 0;
  return (static_cast<size_t>(blocks_for(M)) * 2 * static_cast<size_t>(head_dim) * sizeof(float) + 255) / 256 * 256;
}

void qk_norm_rope_bwd_zdz(QkNormRopeBwdArgs const& args, cudaStream_t stream) {
  if (args.M <= 0) return;
  if (args.head_dim != 64 && args.head_dim != 128) {
    ::coda::detail::fail(CODA_ERROR_INTERNAL, "qk_norm_rope_bwd_zdz: head_dim must be 64 or 128, got ", args.head_dim);
  }
  switch (args.dtype) {
    case CODA_BF16: return dispatch_head_dim<__nv_bfloat16>(args, stream);
    case CODA_FP16: return dispatch_head_dim<__half>(args, stream);
    default: ::coda::detail::fail(CODA_ERROR_INTERNAL, "qk_norm_rope_bwd_zdz: dtype must be bf16 or fp16");
  }
}

}  // namespace coda::kernels
