// cross_entropy: cross-entropy over stored logits, with its gradient and the zdz row dot (MATH.md;
// coda_cross_entropy).
//
// Kernels, in stream order:
//   1. ce_count_valid (reduction mean only): one block counts the non-ignored rows (integers: order-free).
//   2. ce_rows: one block per row (grid-stride beyond 2^20 rows), up to 512 threads, 2 blocks per SM.
//      pass 1 reads the row once: per thread an online (max, sum-exp) state of the capped logits and their plain
//        sum; the states are merged warp by warp, then across warps (fixed order). Thread 0 reads the target logit,
//        computes lse, the row loss (in double) and the gradient coefficients, and shares them through shared memory.
//      pass 2 (only with dlogits) reads the row a second time (evict-first loads: its last use), writes the
//        gradient with streaming stores (in place over the logits is safe: each element is read, then written, by
//        the same thread, after pass 1 has finished for the whole row), and sums raw logit x fp32 gradient for zdz.
//   3. ce_reduce_loss (mean/sum): one block adds the per-row losses (workspace) in a fixed order, in double.
// No float atomics anywhere: same inputs, same bits.
//
// Rows: target == ignore_index -> loss 0, gradient 0, zdz 0 (the row is not read). A target outside [0, V) that is
// not ignore_index -> loss, gradient and zdz of the row are NaN (the row counts as valid, so a mean loss is NaN);
// no host sync is needed to report it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "epilogue/softcap.hpp"  // inverse_softcap
#include "kernels/device_utils.cuh"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

using detail::Elem;

constexpr int kRowMaxThreads = 512;
constexpr int kRowMinBlocks = 2;  // 2 blocks of 512 per SM (<= 64 registers): measured 1.2x faster than 1
constexpr int kRowUnroll = 4;     // 16-byte loads in flight per thread, pass 1
constexpr int kRowUnroll2 = 2;    // pass 2 (more live registers per vector; 4 would spill at 64 registers)

// log2(e) as a float pair (hi + lo = log2(e) to ~1e-15): exp(d) is evaluated as exp2(d log2e) with
// d log2e = fma(d, hi, d lo), so the only error left is exp2f's (2 ulp), cheaper than expf's range reduction.
constexpr float kLog2eHi = 1.44269502162933349609375f;
constexpr float kLog2eLo = 1.925963033500011079e-08f;
constexpr int kReduceThreads = 1024;

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

struct Params {
  void const* logits;
  int64_t ld_logits;
  void* dlogits;  // may equal logits
  int64_t ld_dlogits;
  void const* targets;
  bool targets_int64;
  int64_t M, V;
  double inv_V;  // 1 / V
  int64_t ignore_index;
  float label_smoothing, z_loss, softcap, inv_softcap;  // inv_softcap = 1 / softcap (0 when off)
  int reduction;
  float const* grad_loss;
  int grad_mode;  // 0: none (upstream 1), 1: scalar, 2: per row
  unsigned long long const* n_valid;  // reduction mean
  float* loss_rows;                   // reduction none: loss_out; mean/sum: the workspace
  float* zdz;
  float hidden_size;
};

__device__ __forceinline__ int64_t load_target(void const* targets, bool is64, int64_t m) {
  return is64 ? static_cast<int64_t const*>(targets)[m] : static_cast<int64_t>(static_cast<int32_t const*>(targets)[m]);
}

// ---- online log-sum-exp state ---------------------------------------------------------------------------------------

// The values seen so far: sum exp(v) = se * e^m (m: the running max); `sum` is their plain sum (for label
// smoothing). Empty: (-inf, 0, 0).
struct LseSum {
  float m, se, sum;
};

/// exp(d) for d = x - m <= 0. The difference is taken before any scaling: it is exact for the max itself (and for
/// any bf16/fp16 logit near it), so a logit of any finite size (1e20) gives exp(0) = 1 where x log2e - m log2e,
/// each rounded at 1e20's ulp (~1e13), would overflow exp2.
__device__ __forceinline__ float exp_of(float d) { return exp2f(fmaf(d, kLog2eHi, d * kLog2eLo)); }

// Symmetric in (a, b) bit for bit (products rounded separately, then one commutative add), so the xor butterfly
// leaves the same state in every lane.
__device__ __forceinline__ LseSum lse_merge(LseSum a, LseSum b) {
  float const m = fmaxf(a.m, b.m);
  float se = 0.0f;
  if (m != -INFINITY) se = __fadd_rn(__fmul_rn(a.se, exp_of(a.m - m)), __fmul_rn(b.se, exp_of(b.m - m)));
  return {m, se, __fadd_rn(a.sum, b.sum)};
}

__device__ __forceinline__ LseSum warp_lse(LseSum s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    LseSum const other{__shfl_xor_sync(detail::kFullMask, s.m, o), __shfl_xor_sync(detail::kFullMask, s.se, o),
                       __shfl_xor_sync(detail::kFullMask, s.sum, o)};
    s = lse_merge(s, other);
  }
  return s;
}

__device__ __forceinline__ LseSum block_lse(LseSum s, LseSum* scratch) {
  s = warp_lse(s);
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  LseSum const r = lane < n_warps ? scratch[lane] : LseSum{-INFINITY, 0.0f, 0.0f};
  return warp_lse(r);
}

// ---- row access: chunks of E = 8 elements (one 16-byte vector) or E = 1 ------------------------------------------

template <typename T, int E>
struct RowIO {
  using Raw = std::conditional_t<E == 8, uint4, T>;
  static __device__ __forceinline__ Raw load(T const* row, int64_t k) {
    if constexpr (E == 8) {
      return detail::load16(row + 8 * k);
    } else {
      return row[k];
    }
  }
  static __device__ __forceinline__ Raw load_last(T const* row, int64_t k) {
    if constexpr (E == 8) {
      return detail::load16_last(row + 8 * k);
    } else {
      return row[k];
    }
  }
  static __device__ __forceinline__ void unpack(Raw const& r, float (&f)[E]) {
    if constexpr (E == 8) {
      detail::unpack8<T>(r, f);
    } else {
      f[0] = Elem<T>::to_float(r);
    }
  }
  static __device__ __forceinline__ void store(T* row, int64_t k, float const (&f)[E]) {
    if constexpr (E == 8) {
      detail::store16_stream(row + 8 * k, detail::pack8<T>(f));
    } else {
      row[k] = Elem<T>::from_float(f[0]);
    }
  }
};

// c * tanh(l / c), with l / c as l * (1 / c): the two roundings are far below the bf16/fp16 rounding of l.
__device__ __forceinline__ float capped(float l, float cap, float inv_cap) {
  return cap > 0.0f ? cap * tanhf(l * inv_cap) : l;
}

// ---- per-row kernel -------------------------------------------------------------------------------------------------

template <typename T, bool kVec>
__global__ void __launch_bounds__(kRowMaxThreads, kRowMinBlocks) ce_rows_kernel(Params p) {
  constexpr int E = kVec ? 8 : 1;
  using IO = RowIO<T, E>;
  __shared__ LseSum lse_scratch[32];
  __shared__ float sum_scratch[32];
  __shared__ float coef[5];  // max, a = g (1 + 2 z lse), b = g ls / V, gt = g (1 - ls), lse - max

  int64_t const items = p.V / E;
  int64_t const step = static_cast<int64_t>(kRowUnroll) * blockDim.x;
  int64_t const step2 = static_cast<int64_t>(kRowUnroll2) * blockDim.x;
  float const cap = p.softcap, inv_cap = p.inv_softcap;

  for (int64_t m = blockIdx.x; m < p.M; m += gridDim.x) {
    int64_t const t = load_target(p.targets, p.targets_int64, m);
    T const* row = static_cast<T const*>(p.logits) + m * p.ld_logits;
    T* drow = p.dlogits != nullptr ? static_cast<T*>(p.dlogits) + m * p.ld_dlogits : nullptr;

    bool const ignored = t == p.ignore_index;
    if (ignored || t < 0 || t >= p.V) {
      // Ignored row: zeros. Out-of-range target: NaN (loss, gradient, zdz), so the error shows in the loss.
      float const fill = ignored ? 0.0f : __int_as_float(0x7fc00000);
      if (threadIdx.x == 0) {
        p.loss_rows[m] = fill;
        if (p.zdz != nullptr) p.zdz[m] = fill;
      }
      if (drow != nullptr) {
        float f[E];
#pragma unroll
        for (int i = 0; i < E; ++i) f[i] = fill;
        for (int64_t k = threadIdx.x; k < items; k += blockDim.x) IO::store(drow, k, f);
      }
      continue;  // uniform over the block
    }

    // ---- pass 1: statistics ----
    float target_value = 0.0f;
    // Read before any write of this row (in place).
    if (threadIdx.x == 0) target_value = capped(Elem<T>::to_float(row[t]), cap, inv_cap);
    LseSum st{-INFINITY, 0.0f, 0.0f};
    for (int64_t k0 = threadIdx.x; k0 < items; k0 += step) {
      typename IO::Raw raw[kRowUnroll];
#pragma unroll
      for (int r = 0; r < kRowUnroll; ++r) {
        int64_t const k = k0 + static_cast<int64_t>(r) * blockDim.x;
        if (k < items) raw[r] = IO::load(row, k);
      }
#pragma unroll
      for (int r = 0; r < kRowUnroll; ++r) {
        int64_t const k = k0 + static_cast<int64_t>(r) * blockDim.x;
        if (k < items) {
          float c[E];
          IO::unpack(raw[r], c);
          float cmax = -INFINITY, csum = 0.0f;
#pragma unroll
          for (int i = 0; i < E; ++i) {
            c[i] = capped(c[i], cap, inv_cap);
            cmax = fmaxf(cmax, c[i]);
            csum += c[i];
          }
          float const m = fmaxf(st.m, cmax);
          if (m != -INFINITY) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < E; ++i) acc += exp_of(c[i] - m);
            st.se = st.se * exp_of(st.m - m) + acc;  // exp(-inf) = 0 for the first chunk
            st.m = m;
          }
          st.sum += csum;
        }
      }
    }
    st = block_lse(st, lse_scratch);

    if (threadIdx.x == 0) {
      // Row scalars in double (lse - l_t, lse - mean_j l_j without fp32 cancellation).
      double const lse_rel = log(static_cast<double>(st.se)), lse = static_cast<double>(st.m) + lse_rel;
      double const ls = p.label_smoothing, z = p.z_loss;
      double loss = 0.0;
      double const mx = st.m;  // lse - x as lse_rel + (mx - x): mx + log 2 would round to mx at mx = 1e20
      if (ls < 1.0) loss += (1.0 - ls) * (lse_rel + (mx - static_cast<double>(target_value)));
      if (ls > 0.0) loss += ls * (lse_rel + (mx - static_cast<double>(st.sum) * p.inv_V));
      if (z > 0.0) loss += z * lse * lse;
      p.loss_rows[m] = static_cast<float>(loss);
      if (drow != nullptr) {
        float g = 1.0f;
        if (p.grad_mode == 1) g = p.grad_loss[0];
        if (p.grad_mode == 2) g = p.grad_loss[m];
        if (p.reduction == CODA_REDUCTION_MEAN) g = g / static_cast<float>(*p.n_valid);  // >= 1: this row counts
        double const gd = g;
        coef[0] = st.m;
        coef[4] = static_cast<float>(lse_rel);
        coef[1] = static_cast<float>(gd * (1.0 + 2.0 * z * lse));
        coef[2] = static_cast<float>(gd * ls * p.inv_V);
        coef[3] = static_cast<float>(gd * (1.0 - ls));
      }
    }
    if (drow == nullptr) continue;  // loss only (uniform over the block)
    __syncthreads();
    float const mx = coef[0], lse_rel = coef[4], a = coef[1], b = coef[2], gt = coef[3];

    // ---- pass 2: gradient, and zdz from the fp32 gradient ----
    float zacc = 0.0f;
    for (int64_t k0 = threadIdx.x; k0 < items; k0 += step2) {
      typename IO::Raw raw[kRowUnroll2];
#pragma unroll
      for (int r = 0; r < kRowUnroll2; ++r) {
        int64_t const k = k0 + static_cast<int64_t>(r) * blockDim.x;
        if (k < items) raw[r] = IO::load_last(row, k);
      }
#pragma unroll
      for (int r = 0; r < kRowUnroll2; ++r) {
        int64_t const k = k0 + static_cast<int64_t>(r) * blockDim.x;
        if (k < items) {
          float l[E], d[E];
          IO::unpack(raw[r], l);
#pragma unroll
          for (int i = 0; i < E; ++i) {
            float th = 0.0f, c = l[i];
            if (cap > 0.0f) {
              th = tanhf(l[i] * inv_cap);
              c = cap * th;
            }
            float v = fmaf(a, exp_of((c - mx) - lse_rel), -b);  // g (p (1 + 2 z lse) - ls / V), p = exp(c - lse)
            if (k * E + i == t) v -= gt;           // - g (1 - ls) at the target
            if (cap > 0.0f) v *= fmaf(-th, th, 1.0f);  // d capped / d raw = 1 - tanh^2
            d[i] = v;
            zacc = fmaf(l[i], v, zacc);
          }
          IO::store(drow, k, d);
        }
      }
    }
    if (p.zdz != nullptr) {  // uniform
      float const total = detail::block_sum(zacc, sum_scratch);
      if (threadIdx.x == 0) p.zdz[m] = total / p.hidden_size;
    }
  }
}

// ---- one-block helpers ----------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kReduceThreads) ce_count_valid_kernel(void const* targets, bool is64, int64_t M,
                                                                        int64_t ignore_index,
                                                                        unsigned long long* n_valid) {
  __shared__ unsigned long long scratch[32];
  unsigned long long c = 0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) c += load_target(targets, is64, m) != ignore_index ? 1 : 0;
  c = detail::block_sum(c, scratch);
  if (threadIdx.x == 0) *n_valid = c;
}

__global__ void __launch_bounds__(kReduceThreads) ce_reduce_loss_kernel(float const* loss_rows, int64_t M, bool mean,
                                                                        unsigned long long const* n_valid,
                                                                        float* loss) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) s += static_cast<double>(loss_rows[m]);
  s = detail::block_sum(s, scratch);
  if (threadIdx.x == 0) {
    if (mean) {
      unsigned long long const n = *n_valid;
      *loss = n > 0 ? static_cast<float>(s / static_cast<double>(n)) : 0.0f;
    } else {
      *loss = static_cast<float>(s);
    }
  }
}

/// Per-row loss from the LM head's row statistics (the fused linear_rowscale_lse path: no logits): the same formula as
/// ce_rows in double; 0 for ignored rows; NaN propagates from lse for an out-of-range target (lse_finish makes it NaN).
__global__ void ce_stats_rows_kernel(float const* __restrict__ lse, float const* __restrict__ target_logit,
                                     float const* __restrict__ logit_sum, void const* targets, bool is64, int64_t M,
                                     double inv_V, int64_t ignore_index, double label_smoothing, double z_loss,
                                     float* __restrict__ loss_rows) {
  for (int64_t m = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; m < M; m += int64_t{gridDim.x} * blockDim.x) {
    if (load_target(targets, is64, m) == ignore_index) {
      loss_rows[m] = 0.0f;
      continue;
    }
    double const l = lse[m];
    double loss = 0.0;
    if (label_smoothing < 1.0) loss += (1.0 - label_smoothing) * (l - static_cast<double>(target_logit[m]));
    if (label_smoothing > 0.0) loss += label_smoothing * (l - static_cast<double>(logit_sum[m]) * inv_V);
    if (z_loss > 0.0) loss += z_loss * l * l;
    loss_rows[m] = static_cast<float>(loss);
  }
}

template <typename T>
void launch_rows(Params const& p, bool vec, cudaStream_t stream) {
  int64_t const items = vec ? p.V / 8 : p.V;
  // About kRowUnroll items per thread, at most 512 threads: V = 128256 -> 512 threads (~31 vectors each), V = 8192
  // -> 256, V = 264 -> 32. Measured on an H200 (8192 x 128256 bf16, gradient and zdz): 512 threads with 2 blocks
  // per SM 1.81 ms (~2.3 TB/s counting one read and one write of the logits); 1 block per SM (96 registers) 2.45 ms,
  // 1024 threads 2.0 ms; expf instead of exp2f 1.99 ms. Loss only: 0.73 ms.
  int const threads = detail::threads_for(items, kRowUnroll, 32, kRowMaxThreads);
  unsigned const grid = detail::grid_for(p.M);
  if (vec) {
    ce_rows_kernel<T, true><<<grid, threads, 0, stream>>>(p);
  } else {
    ce_rows_kernel<T, false><<<grid, threads, 0, stream>>>(p);
  }
  CODA_CHECK_LAUNCH();
}

}  // namespace

size_t cross_entropy_workspace_size(int64_t M) {
  if (M <= 0) return 0;
  return round_up_256(static_cast<size_t>(M) * sizeof(float)) + 256;
}

void cross_entropy(CrossEntropyArgs const& a, cudaStream_t stream) {
  if (a.M <= 0) return;
  auto* ws = static_cast<char*>(a.workspace);
  float* const ws_loss_rows = reinterpret_cast<float*>(ws);
  auto* const n_valid =
      reinterpret_cast<unsigned long long*>(ws + round_up_256(static_cast<size_t>(a.M) * sizeof(float)));
  int const reduction = static_cast<int>(a.options.reduction);
  bool const per_row = a.options.reduction == CODA_REDUCTION_NONE;
  bool const mean = a.options.reduction == CODA_REDUCTION_MEAN;

  Params p{};
  p.logits = a.logits;
  p.ld_logits = a.M > 1 ? a.ld_logits : a.V;
  p.dlogits = a.dlogits;
  p.ld_dlogits = a.dlogits == nullptr ? 0 : (a.M > 1 ? a.ld_dlogits : a.V);
  p.targets = a.targets;
  p.targets_int64 = a.targets_int64;
  p.M = a.M;
  p.V = a.V;
  p.inv_V = 1.0 / static_cast<double>(a.V);
  p.ignore_index = a.options.ignore_index;
  p.label_smoothing = a.options.label_smoothing;
  p.z_loss = a.options.z_loss;
  p.softcap = a.options.softcap;
  p.inv_softcap = epilogue::inverse_softcap(a.options.softcap);
  p.reduction = reduction;
  p.grad_loss = a.grad_loss;
  p.grad_mode = a.grad_loss == nullptr ? 0 : (per_row && !a.grad_loss_scalar ? 2 : 1);
  p.n_valid = n_valid;
  p.loss_rows = per_row ? a.loss : ws_loss_rows;
  p.zdz = a.dlogits != nullptr ? a.zdz : nullptr;
  p.hidden_size = static_cast<float>(a.hidden_size);

  if (mean) {
    ce_count_valid_kernel<<<1, kReduceThreads, 0, stream>>>(a.targets, a.targets_int64, a.M, p.ignore_index,
                                                             n_valid);
    CODA_CHECK_LAUNCH();
  }
  bool const vec = detail::rows_vectorizable(a.logits, a.M, a.V, p.ld_logits) &&
                   (a.dlogits == nullptr || detail::rows_vectorizable(a.dlogits, a.M, a.V, p.ld_dlogits));
  switch (a.dtype) {
    case CODA_BF16: launch_rows<__nv_bfloat16>(p, vec, stream); break;
    case CODA_FP16: launch_rows<__half>(p, vec, stream); break;
    default: ::coda::detail::fail(CODA_ERROR_INTERNAL, "cross_entropy: dtype must be bf16 or fp16");
  }
  if (!per_row) {
    ce_reduce_loss_kernel<<<1, kReduceThreads, 0, stream>>>(ws_loss_rows, a.M, mean, n_valid, a.loss);
    CODA_CHECK_LAUNCH();
  }
}

namespace {
__global__ void __launch_bounds__(kReduceThreads) ce_mean_grad_scale_kernel(void const* targets, bool is64, int64_t M,
                                                                            int64_t ignore_index,
                                                                            float const* grad_loss, float* out) {
  __shared__ unsigned long long scratch[32];
  unsigned long long c = 0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) c += load_target(targets, is64, m) != ignore_index ? 1 : 0;
  c = detail::block_sum(c, scratch);
  if (threadIdx.x == 0) {
    float const g = grad_loss != nullptr ? grad_loss[0] : 1.0f;
    *out = c == 0 ? 0.0f : g / static_cast<float>(c);
  }
}
}  // namespace

void ce_mean_grad_scale(void const* targets, bool targets_int64, int64_t M, int64_t ignore_index,
                        float const* grad_loss, float* out, cudaStream_t stream) {
  ce_mean_grad_scale_kernel<<<1, kReduceThreads, 0, stream>>>(targets, targets_int64, M, ignore_index, grad_loss,
                                                               out);
  CODA_CHECK_LAUNCH();
}

void ce_reduce_rows(float const* loss_rows, int64_t M, void const* targets, bool targets_int64, int64_t ignore_index,
                    bool mean, unsigned long long* count, float* loss, cudaStream_t stream) {
  if (mean) {
    ce_count_valid_kernel<<<1, kReduceThreads, 0, stream>>>(targets, targets_int64, M, ignore_index, count);
    CODA_CHECK_LAUNCH();
  }
  ce_reduce_loss_kernel<<<1, kReduceThreads, 0, stream>>>(loss_rows, M, mean, count, loss);
  CODA_CHECK_LAUNCH();
}

void cross_entropy_from_stats(CrossEntropyStatsArgs const& a, cudaStream_t stream) {
  if (a.M <= 0) return;
  auto* ws = static_cast<char*>(a.workspace);
  float* const ws_loss_rows = reinterpret_cast<float*>(ws);
  auto* const n_valid =
      reinterpret_cast<unsigned long long*>(ws + round_up_256(static_cast<size_t>(a.M) * sizeof(float)));
  bool const per_row = a.options.reduction == CODA_REDUCTION_NONE;
  bool const mean = a.options.reduction == CODA_REDUCTION_MEAN;
  if (mean) {
    ce_count_valid_kernel<<<1, kReduceThreads, 0, stream>>>(a.targets, a.targets_int64, a.M, a.options.ignore_index,
                                                             n_valid);
    CODA_CHECK_LAUNCH();
  }
  int64_t const blocks = std::min<int64_t>((a.M + 255) / 256, int64_t{1} << 16);
  ce_stats_rows_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      a.lse, a.target_logit, a.logit_sum, a.targets, a.targets_int64, a.M, 1.0 / static_cast<double>(a.V),
      a.options.ignore_index, a.options.label_smoothing, a.options.z_loss, per_row ? a.loss : ws_loss_rows);
  CODA_CHECK_LAUNCH();
  if (!per_row) {
    ce_reduce_loss_kernel<<<1, kReduceThreads, 0, stream>>>(ws_loss_rows, a.M, mean, n_valid, a.loss);
    CODA_CHECK_LAUNCH();
  }
}

}  // namespace coda::kernels
