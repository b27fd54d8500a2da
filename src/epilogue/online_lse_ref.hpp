// Host reference of the OnlineLse EVT node's semantics (epilogue/online_lse.hpp), plain C++ in double: what the
// node should leave in its four [T, Mpad] partial buffers for a given matrix of node inputs (the capped logits).
// Used by the GPU unit test that reads the partials back from linear_rowscale_lse's workspace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace coda::epilogue {

struct OnlineLseReference {
  int64_t tiles = 0;  ///< T = ceil(N / tile_n)
  int64_t m_pad = 0;  ///< Mpad = round_up(M, tile_m); element (t, m) is at m + m_pad * t
  std::vector<double> max, sumexp, sum, target;  ///< [T * Mpad]; rows m >= M are never written by the node
  std::vector<uint8_t> target_written;           ///< [T * Mpad]: 1 exactly where the node writes `target`
};

/// v: [M, N] row-major node inputs with row stride ldv; targets: [M] (nullptr: no capture). For m < M and each
/// tile t: max / sumexp (= sum exp(v - max)) / sum over the columns n in [t*tile_n, (t+1)*tile_n) with n < N;
/// target[t][m] = v[m, targets[m]] for the one tile that holds column targets[m] when 0 <= targets[m] < N.
inline OnlineLseReference online_lse_reference(std::vector<double> const& v, int64_t M, int64_t N, int64_t ldv,
                                               int64_t tile_m, int64_t tile_n, std::vector<int64_t> const* targets) {
  OnlineLseReference r;
  r.tiles = (N + tile_n - 1) / tile_n;
  r.m_pad = (M + tile_m - 1) / tile_m * tile_m;
  size_t const size = static_cast<size_t>(r.tiles * r.m_pad);
  double const nan = std::numeric_limits<double>::quiet_NaN();
  r.max.assign(size, nan);
  r.sumexp.assign(size, nan);
  r.sum.assign(size, nan);
  r.target.assign(size, nan);
  r.target_written.assign(size, 0);
  for (int64_t m = 0; m < M; ++m) {
    double const* row = v.data() + m * ldv;
    for (int64_t t = 0; t < r.tiles; ++t) {
      int64_t const n0 = t * tile_n, n1 = std::min(N, n0 + tile_n);
      size_t const i = static_cast<size_t>(m + r.m_pad * t);
      double mx = -std::numeric_limits<double>::infinity(), s = 0.0;
      for (int64_t n = n0; n < n1; ++n) mx = std::max(mx, row[n]);
      double se = 0.0;
      for (int64_t n = n0; n < n1; ++n) {
        se += std::exp(row[n] - mx);
        s += row[n];
      }
      r.max[i] = mx;
      r.sumexp[i] = se;
      r.sum[i] = s;
    }
    if (targets != nullptr) {
      int64_t const tg = (*targets)[static_cast<size_t>(m)];
      if (tg >= 0 && tg < N) {
        size_t const i = static_cast<size_t>(m + r.m_pad * (tg / tile_n));
        r.target[i] = row[tg];
        r.target_written[i] = 1;
      }
    }
  }
  return r;
}

}  // namespace coda::epilogue
