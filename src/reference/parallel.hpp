// Row-parallel loops for the float64 reference (internal). Each row is computed by exactly one thread with the same
// loop order as the serial code, so results do not depend on the thread count (bit-identical to serial).
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace coda::ref::detail {

/// fn(row) for row in [0, rows), on up to hardware_concurrency() threads (at most 32) when the total work
/// (rows x work_per_row inner iterations) is large enough to pay for them; serially otherwise.
template <class Fn>
void for_rows(int64_t rows, int64_t work_per_row, Fn const& fn) {
  constexpr int64_t kMinParallelWork = int64_t{1} << 22;
  int64_t const hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  int64_t const threads = std::min<int64_t>({hw, int64_t{32}, rows});
  if (threads <= 1 || rows * work_per_row < kMinParallelWork) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  int64_t const chunk = (rows + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t) {
    int64_t const begin = t * chunk, end = std::min(rows, begin + chunk);
    if (begin >= end) break;
    pool.emplace_back([&fn, begin, end] {
      for (int64_t r = begin; r < end; ++r) fn(r);
    });
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace coda::ref::detail
