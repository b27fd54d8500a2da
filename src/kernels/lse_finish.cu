// linear_rowscale_lse's finishing kernel: per row, merge the T per-N-tile (max, sumexp) partials written by the
// OnlineLse epilogue node into lse[m], pick the target logit from the tile that owns the target column, optionally add
// up the per-tile logit sums. MATH.md and docs/OPS.md, linear_rowscale_lse.
#include <cuda_runtime.h>

#include <cmath>

#include "common/error.hpp"
#include "kernels/kernels.hpp"

namespace coda::kernels {

namespace {

// A block is 32 rows (x, consecutive m: coalesced loads of the m-major partials) by kPhases tile phases (y): phase
// y takes tiles t = y, y + kPhases, ... The per-thread results are combined over y in order 0..kPhases-1 through
// shared memory, so the summation order depends on T only: same inputs, same bits.
// Pass 1 finds the row max over tiles; pass 2 adds se_t * exp(mx_t - max) in double (up to ~1000 tiles for a
// 256k vocabulary: fp32 accumulation over that many terms would cost ~1e-6 relative, as much as the acceptance
// bound leaves on the LM-head shapes; double makes the merge exact to fp32 output rounding).
constexpr int kRows = 32;
constexpr int kPhases = 8;

__device__ __forceinline__ int64_t load_target(void const* targets, bool is64, int64_t m) {
  return is64 ? static_cast<int64_t const*>(targets)[m] : static_cast<int64_t>(static_cast<int32_t const*>(targets)[m]);
}

__global__ void __launch_bounds__(kRows * kPhases) lse_finish_kernel(LseFinishArgs a) {
  __shared__ float red_max[kPhases][kRows];
  __shared__ double red_se[kPhases][kRows];
  __shared__ double red_sum[kPhases][kRows];
  int const x = threadIdx.x, y = threadIdx.y;
  int64_t const m = static_cast<int64_t>(blockIdx.x) * kRows + x;
  bool const row = m < a.M;
  float const kNegInf = -INFINITY;

  float mx = kNegInf;
  if (row) {
#pragma unroll 4
    for (int64_t t = y; t < a.tiles; t += kPhases) mx = fmaxf(mx, a.part_max[m + t * a.ld]);
  }
  red_max[y][x] = mx;
  __syncthreads();
  float row_max = red_max[0][x];
#pragma unroll
  for (int k = 1; k < kPhases; ++k) row_max = fmaxf(row_max, red_max[k][x]);

  double se = 0.0, sum = 0.0;
  if (row) {
#pragma unroll 4
    for (int64_t t = y; t < a.tiles; t += kPhases) {
      float const tm = a.part_max[m + t * a.ld];
      double const ts = a.part_sumexp[m + t * a.ld];
      // A tile whose max is the row max contributes its sum unscaled (also covers max = -inf: no -inf - -inf).
      se += tm == row_max ? ts : ts * exp(static_cast<double>(tm) - static_cast<double>(row_max));
      if (a.part_sum != nullptr) sum += a.part_sum[m + t * a.ld];
    }
  }
  red_se[y][x] = se;
  red_sum[y][x] = sum;
  __syncthreads();
  if (y != 0 || !row) return;
  se = red_se[0][x];
  sum = red_sum[0][x];
#pragma unroll
  for (int k = 1; k < kPhases; ++k) {
    se += red_se[k][x];
    sum += red_sum[k][x];
  }

  float lse = static_cast<float>(static_cast<double>(row_max) + log(se));
  float target = 0.0f;
  int64_t const t = load_target(a.targets, a.targets_int64, m);
  if (t != a.ignore_index) {
    if (t >= 0 && t < a.V) {
      target = a.part_target[m + (t / a.tile_n) * a.ld];
    } else {
      // Reported without a host sync, as coda_cross_entropy does: the row's outputs are NaN.
      target = NAN;
      lse = NAN;
    }
  }
  a.lse[m] = lse;
  a.target_logit[m] = target;
  if (a.logit_sum != nullptr) a.logit_sum[m] = static_cast<float>(sum);
}

}  // namespace

void lse_finish(LseFinishArgs const& args, cudaStream_t stream) {
  if (args.M <= 0) return;
  dim3 const block(kRows, kPhases);
  dim3 const grid(static_cast<unsigned>((args.M + kRows - 1) / kRows));
  lse_finish_kernel<<<grid, block, 0, stream>>>(args);
  CODA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace coda::kernels
