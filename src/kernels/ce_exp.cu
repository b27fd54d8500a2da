// The LM head's cross-entropy backward in exponential form (linear_cross_entropy_bwd; MATH.md, cross_entropy's
// "exponential form"): the three small kernels around the ExpCe logits GEMM (ops/linear_rowscale_exp,
// epilogue/exp_ce.hpp) of one chunk of rows.
//
//   ce_exp_offset  one warp per row: l_t = rstd <h_m, w_t> and K[m] = cap(l_t) (fp32), K = +inf for an ignored row,
//                  NaN for a target outside [0, V); resets the flag count. K is only an offset: any value near c_t
//                  works. This l_t serves s_t and zdz's target term only; p_t and the loss come from the GEMM's own
//                  e_t (this one differs by fp32 summation order).
//   ce_exp_finish  per row, from the GEMM's per-tile sums (double, order fixed by T): lse, the loss, the row scale v,
//                  the scaled row dot, and the target entry of E. A row whose lse - K exceeds kMaxGap (a per-token
//                  loss above ~40 nats) or whose z-loss factor a is not comfortably positive is put on a list.
//   ce_exp_target_fix after the chunk's wgrad: dW[t_m, :] += (E_t - R(E_t)) a[m, :], the target entry's bf16
//                  rounding undone (deterministic, no atomics).
//   ce_exp_rescue  always launched; exits at once when the list is empty. Per listed row, one block recomputes the
//                  row's logits three times (max, sums, store; one warp per logit) and rewrites the E row, loss, v and
//                  row dot with the row max as offset. Milliseconds per row (three passes over w), but only rows
//                  with a per-token loss above ~40 nats reach it: diverging training.
//
// Gradient (label smoothing 0): dl_j = g s_j (a p_j - [j = t]), a = 1 + 2 z lse, p_j = exp(c_j - lse). With
// E_j = s_j e_j, e_j = exp(c_j - K) for j != t, S = sum_j e_j = exp(lse - K) and the GEMM's own e_t, the finish sets
//   v   = g a / S,   E_t = s_t (e_t - S / a),   so that dl = v (.) E;
//   zdz_scaled = zdz / v = (1/d) (sum_j l_j s_j e_j - s_t l_t S / a),
// zdz being cross_entropy's (1/d) sum_j l_j dl_j. The rescue uses v = g exp(K' - lse) and E_j = a s_j exp(c_j - K'),
// which needs no division by a. Both are exact rewrites; the dgrad applies v per row (linear_residual_rmsnorm_bwd with
// a row scale).
// No float atomics (the list's order does not matter: each row's work is its own): same inputs, same bits.
#include <cuda_runtime.h>

#include <cmath>

#include "epilogue/softcap.hpp"  // inverse_softcap
#include "kernels/device_utils.cuh"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

using detail::kFullMask;

// Largest lse - K the exponential form accepts: E <= e^40 (~2.4e17, a normal bf16), the dgrad's row sums stay far
// below fp32's range for any vocabulary, and v >= g a e^-40 / V keeps v c gamma a normal bf16 for g >= ~1e-8.
constexpr double kMaxGap = 40.0;
constexpr double kMinA = 1.0 / 1024;  // a below this goes to the rescue (z-loss with lse < -1/(2z), never in practice)
constexpr float kLog2eF = 1.4426950408889634f;  // the ExpCe epilogue's float log2(e): k2 = fl(K * kLog2eF) there
constexpr double kLn2 = 0.69314718055994530942;

__device__ __forceinline__ int64_t load_target(void const* targets, bool is64, int64_t m) {
  return is64 ? static_cast<int64_t const*>(targets)[m] : static_cast<int64_t>(static_cast<int32_t const*>(targets)[m]);
}

__device__ __forceinline__ float grad_of(CeExpArgs const& a, int64_t m) {
  if (a.grad_loss == nullptr) return 1.0f;
  return a.grad_loss_scalar ? a.grad_loss[0] : a.grad_loss[m];
}

/// The fp32 dot of two bf16 rows of d elements (d % 8 == 0, 16-byte aligned), reduced over the warp (every lane
/// gets the same bits: fixed lane order of the partial sums, then an xor butterfly).
__device__ __forceinline__ float warp_dot(__nv_bfloat16 const* x, __nv_bfloat16 const* y, int64_t d, int lane) {
  float acc = 0.0f;
  for (int64_t k = static_cast<int64_t>(lane) * 8; k < d; k += 32 * 8) {
    float a[8], b[8];
    detail::unpack8<__nv_bfloat16>(*reinterpret_cast<uint4 const*>(x + k), a);
    detail::unpack8<__nv_bfloat16>(*reinterpret_cast<uint4 const*>(y + k), b);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(a[i], b[i], acc);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(kFullMask, acc, o);
  return acc;
}

/// Softcap in fp32 as the ExpCe epilogue applies it: c and s = dc/dl.
__device__ __forceinline__ void cap_f(float l, float cap, float inv_cap, float& c, float& s) {
  if (cap > 0.0f) {
    float const t = tanhf(l * inv_cap);
    c = cap * t;
    s = fmaf(-t, t, 1.0f);
  } else {
    c = l;
    s = 1.0f;
  }
}

__global__ void ce_exp_offset_kernel(CeExpArgs a) {
  int const lane = threadIdx.x % 32;
  int64_t const m = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.flag_count = 0u;
  if (m >= a.M) return;
  int64_t const t = load_target(a.targets, a.targets_int64, m);
  if (t == a.ignore_index || t < 0 || t >= a.V) {
    if (lane == 0) {
      a.offset[m] = t == a.ignore_index ? INFINITY : NAN;
      a.target_logit[m] = 0.0f;
      a.target_e[m] = 0.0f;
    }
    return;  // uniform over the warp
  }
  auto const* h = static_cast<__nv_bfloat16 const*>(a.h) + m * a.ldh;
  auto const* w = static_cast<__nv_bfloat16 const*>(a.w) + t * a.ldw;
  float const l = a.rstd[m] * warp_dot(h, w, a.d, lane);
  float c, s;
  cap_f(l, a.softcap, epilogue::inverse_softcap(a.softcap), c, s);
  if (lane == 0) {
    a.offset[m] = c;
    a.target_logit[m] = l;
    a.target_e[m] = NAN;  // the GEMM's epilogue overwrites it; a NaN loss if it ever did not
  }
}

/// E[m, t] = R(value), and the rounding's residual value - R(value) for ce_exp_target_fix: the target entry is the
/// one E value of a row whose bf16 rounding shows (dl_t = v E_t is a row's largest gradient entry; the logits
/// path's dl_t ~ -1 rounds finer, bench/python/lce_target_rounding.py).
__device__ __forceinline__ void store_target_entry(CeExpArgs const& a, int64_t m, int64_t t, double value) {
  __nv_bfloat16 const hi = __double2bfloat16(value);
  static_cast<__nv_bfloat16*>(a.e)[m * a.ld_e + t] = hi;
  a.target_lo[m] = static_cast<float>(value - static_cast<double>(__bfloat162float(hi)));
}

// Finish: 32 rows (x, coalesced over the m-major partials) by kPhases tile phases (y), combined over y in order.
constexpr int kRows = 32;
constexpr int kPhases = 8;

__global__ void __launch_bounds__(kRows * kPhases) ce_exp_finish_kernel(CeExpArgs a) {
  __shared__ double red_se[kPhases][kRows];
  __shared__ double red_dot[kPhases][kRows];
  int const x = threadIdx.x, y = threadIdx.y;
  int64_t const m = static_cast<int64_t>(blockIdx.x) * kRows + x;
  bool const row = m < a.M;
  double se = 0.0, dot = 0.0;
  if (row) {
#pragma unroll 4
    for (int64_t t = y; t < a.tiles; t += kPhases) {
      se += a.part_sumexp[m + t * a.ld];
      dot += a.part_dot[m + t * a.ld];
    }
  }
  red_se[y][x] = se;
  red_dot[y][x] = dot;
  __syncthreads();
  if (y != 0 || !row) return;
  se = red_se[0][x];
  dot = red_dot[0][x];
#pragma unroll
  for (int k = 1; k < kPhases; ++k) {
    se += red_se[k][x];
    dot += red_dot[k][x];
  }

  int64_t const t = load_target(a.targets, a.targets_int64, m);
  if (t == a.ignore_index || t < 0 || t >= a.V) {  // E's row is 0 (K = +inf) or NaN (K = NaN) already
    float const fill = t == a.ignore_index ? 0.0f : NAN;
    a.loss[m] = fill;
    a.v[m] = fill;
    a.zdz[m] = fill;
    a.target_lo[m] = 0.0f;
    return;
  }
  // Everything in the GEMM's own terms: its e_j = 2^(c_j log2e - k2) with k2 = fl(K log2e), so its offset is
  // exactly k2 ln 2, the sum S = exp(lse - offset), and p_t = e_t / S from the same fp32 values (a recomputed c_t
  // would leave ~1e-5 of e_t in p_t - 1, all of a confident row's gradient).
  double const k2 = static_cast<double>(a.offset[m] * kLog2eF);
  double const log_s = log(se);
  double const lse = k2 * kLn2 + log_s;
  double const z = a.z_loss;
  double const A = 1.0 + 2.0 * z * lse;
  if (!(log_s <= kMaxGap) || !(log_s >= -kMaxGap) || !(A >= kMinA)) {  // also NaN
    a.flagged[atomicAdd(a.flag_count, 1u)] = static_cast<int>(m);
    return;
  }
  double const et = a.target_e[m];
  double const lt = a.target_logit[m];
  double st = 1.0;
  if (a.softcap > 0.0f) {
    double const th = tanh(lt / a.softcap);
    st = 1.0 - th * th;
  }
  double const g = grad_of(a, m);
  a.loss[m] = static_cast<float>(log_s - log(et) + z * lse * lse);  // lse - c_t = -log p_t
  a.v[m] = static_cast<float>(g * A / se);
  a.zdz[m] = static_cast<float>((dot - st * lt * se / A) / static_cast<double>(a.d));
  store_target_entry(a, m, t, st * (et - se / A));
}

constexpr int kRescueThreads = 1024;
constexpr int kRescueWarps = kRescueThreads / 32;

/// Block-wide reduction of one double per warp (lane 0's), in warp order: every thread gets the same bits.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // scratch free
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double s = 0.0;
  for (int k = 0; k < kRescueWarps; ++k) s += scratch[k];
  return s;
}

__global__ void __launch_bounds__(kRescueThreads) ce_exp_rescue_kernel(CeExpArgs a) {
  __shared__ double scratch[kRescueWarps];
  __shared__ double scratch2[kRescueWarps];
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned const count = *a.flag_count;
  float const cap = a.softcap, inv_cap = epilogue::inverse_softcap(cap);
  for (unsigned i = blockIdx.x; i < count; i += gridDim.x) {
    int64_t const m = a.flagged[i];
    int64_t const t = load_target(a.targets, a.targets_int64, m);  // valid: the finish checked it
    auto const* h = static_cast<__nv_bfloat16 const*>(a.h) + m * a.ldh;
    float const rstd = a.rstd[m];
    auto logit = [&](int64_t j) {
      return rstd * warp_dot(h, static_cast<__nv_bfloat16 const*>(a.w) + j * a.ldw, a.d, lane);
    };
    // Pass 1: the row max of the capped logits (fmaxf drops NaN; a NaN row shows in the sums below).
    float mx = -INFINITY;
    for (int64_t j = warp; j < a.V; j += kRescueWarps) {
      float c, s;
      cap_f(logit(j), cap, inv_cap, c, s);
      mx = fmaxf(mx, c);
    }
    __syncthreads();
    if (lane == 0) scratch[warp] = mx;
    __syncthreads();
    float K = scratch[0];
    for (int k = 1; k < kRescueWarps; ++k) K = fmaxf(K, scratch[k]);
    // Pass 2: sum e and sum l s e (double, each warp in column order, then warps in order), and l_t.
    double se = 0.0, dot = 0.0;
    float lt = 0.0f;
    for (int64_t j = warp; j < a.V; j += kRescueWarps) {
      float const l = logit(j);
      float c, s;
      cap_f(l, cap, inv_cap, c, s);
      double const e = exp(static_cast<double>(c) - K);
      se += e;
      dot += static_cast<double>(l) * s * e;
      if (j == t) lt = l;
    }
    __syncthreads();
    if (lane == 0) scratch2[warp] = (t % kRescueWarps == warp) ? static_cast<double>(lt) : 0.0;
    se = block_sum(se, scratch);
    dot = block_sum(dot, scratch);
    double const l_t = scratch2[t % kRescueWarps];
    double const lse = static_cast<double>(K) + log(se);
    double const z = a.z_loss;
    double const A = 1.0 + 2.0 * z * lse;
    double ct = l_t, st = 1.0;
    if (cap > 0.0f) {
      double const th = tanh(l_t / cap);
      ct = cap * th;
      st = 1.0 - th * th;
    }
    double const r = exp(lse - K);  // in [1, V]
    // Pass 3: E_j = a s_j e_j, the target's entry s_t (a e_t - e^(lse - K)).
    auto* e_row = static_cast<__nv_bfloat16*>(a.e) + m * a.ld_e;
    for (int64_t j = warp; j < a.V; j += kRescueWarps) {
      float const l = logit(j);
      float c, s;
      cap_f(l, cap, inv_cap, c, s);
      double const e = exp(static_cast<double>(c) - K);
      if (lane == 0 && j != t) e_row[j] = __double2bfloat16(A * s * e);
    }
    if (threadIdx.x == 0) {
      store_target_entry(a, m, t, st * (A * exp(ct - K) - r));
      double const g = grad_of(a, m);
      a.loss[m] = static_cast<float>(lse - ct + z * lse * lse);
      a.v[m] = static_cast<float>(g / r);
      a.zdz[m] = static_cast<float>((A * dot - st * l_t * r) / static_cast<double>(a.d));
    }
  }
}

// Target fix: dW[t_m, :] += lo_m a[m, :] for every row with lo_m != 0. Block b owns the vocabulary rows
// [b V / G, (b + 1) V / G) and walks the chunk's rows in index order (a ballot compaction per 256 rows keeps the
// order), its threads over the hidden dimension: each dW element is updated by one thread, rows in a fixed order,
// no atomics.
constexpr int kFixThreads = 256;
constexpr int kFixBlocks = 264;

__global__ void __launch_bounds__(kFixThreads) ce_exp_target_fix_kernel(CeTargetFixArgs f) {
  __shared__ int list[kFixThreads];
  __shared__ int warp_base[kFixThreads / 32 + 1];
  int64_t const v0 = f.V * blockIdx.x / gridDim.x, v1 = f.V * (blockIdx.x + 1) / gridDim.x;
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t m0 = 0; m0 < f.M; m0 += kFixThreads) {
    int64_t const m = m0 + threadIdx.x;
    bool match = false;
    if (m < f.M) {
      int64_t const t = load_target(f.targets, f.targets_int64, m);
      match = t >= v0 && t < v1 && f.lo[m] != 0.0f;
    }
    unsigned const ballot = __ballot_sync(kFullMask, match);
    if (lane == 0) warp_base[warp + 1] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
      warp_base[0] = 0;
      for (int w = 1; w <= kFixThreads / 32; ++w) warp_base[w] += warp_base[w - 1];
    }
    __syncthreads();
    if (match) list[warp_base[warp] + __popc(ballot & ((1u << lane) - 1u))] = static_cast<int>(m);
    __syncthreads();
    int const count = warp_base[kFixThreads / 32];
    for (int i = 0; i < count; ++i) {
      int64_t const r = list[i];
      int64_t const t = load_target(f.targets, f.targets_int64, r);
      float* row = t < f.V8 ? f.dw + t * f.ld_dw : f.dw_tail + (t - f.V8) * f.d;
      auto const* a_row = static_cast<__nv_bfloat16 const*>(f.a) + r * f.ld_a;
      float const lo = f.lo[r];
      for (int64_t n = threadIdx.x; n < f.d; n += kFixThreads) row[n] = fmaf(lo, __bfloat162float(a_row[n]), row[n]);
    }
    __syncthreads();  // list and warp_base reused
  }
}

}  // namespace

void ce_exp_target_fix(CeTargetFixArgs const& args, cudaStream_t stream) {
  if (args.M <= 0) return;
  unsigned const blocks = static_cast<unsigned>(args.V < kFixBlocks ? args.V : kFixBlocks);
  ce_exp_target_fix_kernel<<<blocks, kFixThreads, 0, stream>>>(args);
  CODA_CUDA_CHECK(cudaGetLastError());
}

void ce_exp_offset(CeExpArgs const& args, cudaStream_t stream) {
  if (args.M <= 0) return;
  constexpr int kThreads = 256;
  int64_t const blocks = (args.M * 32 + kThreads - 1) / kThreads;
  ce_exp_offset_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  CODA_CUDA_CHECK(cudaGetLastError());
}

void ce_exp_finish(CeExpArgs const& args, cudaStream_t stream) {
  if (args.M <= 0) return;
  dim3 const block(kRows, kPhases);
  ce_exp_finish_kernel<<<static_cast<unsigned>((args.M + kRows - 1) / kRows), block, 0, stream>>>(args);
  CODA_CUDA_CHECK(cudaGetLastError());
}

void ce_exp_rescue(CeExpArgs const& args, int sm_count, cudaStream_t stream) {
  if (args.M <= 0) return;
  int64_t const blocks = args.M < sm_count ? args.M : sm_count;
  ce_exp_rescue_kernel<<<static_cast<unsigned>(blocks), kRescueThreads, 0, stream>>>(args);
  CODA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace coda::kernels
