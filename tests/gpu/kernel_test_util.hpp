// Helpers shared by the GPU tests of the non-GEMM kernels (test_kernels_*.cpp) and the LM head's: strided device
// tensors, 16-bit row layouts with padding, fast deterministic random data for huge shapes, acceptance-rule
// reporting, and weights that make some rows' target logit dominant.
#pragma once

#include <coda/coda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_util.hpp"
#include "reference/reference.hpp"

namespace coda::test {

inline int current_device() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}

/// A row-major [rows, cols] tensor with row stride `ld` (elements) over `ptr` on the current device.
inline coda_tensor strided_tensor(void* ptr, coda_dtype dtype, int64_t rows, int64_t cols, int64_t ld) {
  coda_tensor t{};
  t.data = ptr;
  t.dtype = dtype;
  t.rank = 2;
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = ld;
  t.strides[1] = 1;
  t.device = current_device();
  return t;
}

/// A rank-0 (scalar) tensor over `ptr` on the current device.
inline coda_tensor scalar_tensor(void* ptr, coda_dtype dtype) {
  coda_tensor t{};
  t.data = ptr;
  t.dtype = dtype;
  t.rank = 0;
  t.device = current_device();
  return t;
}

/// The 16-bit pattern that DeviceBuffer::poison leaves (a NaN in bf16 and fp16).
constexpr uint16_t kPoison16 = 0xFFFF;

inline bool is_nan_bits(uint16_t bits, coda_dtype dtype) {
  return dtype == CODA_BF16 ? (bits & 0x7FFFu) > 0x7F80u : (bits & 0x7FFFu) > 0x7C00u;
}

/// Dense [rows, cols] -> [rows, ld] with `fill` in the padding.
inline std::vector<uint16_t> pad_rows(std::vector<uint16_t> const& dense, int64_t rows, int64_t cols, int64_t ld,
                                      uint16_t fill) {
  std::vector<uint16_t> out(static_cast<size_t>(rows * ld), fill);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(dense.begin() + r * cols, cols, out.begin() + r * ld);
  }
  return out;
}

/// [rows, ld] -> dense [rows, cols].
inline std::vector<uint16_t> unpad_rows(std::vector<uint16_t> const& padded, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(padded.begin() + r * ld, cols, out.begin() + r * cols);
  return out;
}

/// True when every padding element of a [rows, ld] download still holds `fill` (the kernel wrote only [rows, cols]).
inline bool padding_untouched(std::vector<uint16_t> const& padded, int64_t rows, int64_t cols, int64_t ld,
                              uint16_t fill) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = cols; c < ld; ++c) {
      if (padded[static_cast<size_t>(r * ld + c)] != fill) return false;
    }
  }
  return true;
}

/// Downloads a padded [M, ld] 16-bit output, checks that its padding still holds kPoison16, returns the dense [M, N]
/// bits.
inline std::vector<uint16_t> dense_output(DeviceBuffer const& buf, int64_t M, int64_t N, int64_t ld,
                                          char const* name) {
  std::vector<uint16_t> const p = buf.download<uint16_t>(static_cast<size_t>(M * ld));
  EXPECT_TRUE(padding_untouched(p, M, N, ld, kPoison16)) << name << " row padding was written";
  return unpad_rows(p, M, N, ld);
}

/// M fp32-exact row scales |N(0.25, 0.05)| + 0.05: an rstd for the rowscaled GEMMs' tests.
inline ref::Vector random_rstd(int64_t M, ref::Rng& rng) {
  ref::Vector r = ref::random_normal(1, M, 0.25, 0.05, rng).data;
  for (double& v : r) v = ref::round_to(std::fabs(v) + 0.05, CODA_FP32);
  return r;
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// n samples of N(mean, stddev^2) rounded to `dtype` (bf16/fp16), as 16-bit patterns. Counter-based (Box-Muller on
/// a hash of (seed, index)), computed on all host cores, and independent of the thread count: fast enough for the
/// 1e9-element logits of the huge shapes, where std::normal_distribution would take a minute.
inline std::vector<uint16_t> normal_bits(int64_t n, double mean, double stddev, coda_dtype dtype, uint64_t seed) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  int64_t const pairs = (n + 1) / 2;
  unsigned const hw = std::max(1u, std::thread::hardware_concurrency());
  int64_t const n_threads = std::min<int64_t>(hw, std::max<int64_t>(1, pairs / 65536));
  auto work = [&](int64_t begin, int64_t end) {
    double const two_pi = 6.283185307179586;
    for (int64_t p = begin; p < end; ++p) {
      uint64_t const h = splitmix64(seed * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(p));
      double const u1 = (static_cast<double>(h >> 32) + 0.5) / 4294967296.0;
      double const u2 = (static_cast<double>(h & 0xFFFFFFFFull) + 0.5) / 4294967296.0;
      double const r = std::sqrt(-2.0 * std::log(u1));
      int64_t const i = 2 * p;
      out[static_cast<size_t>(i)] = ref::to_bits(mean + stddev * r * std::cos(two_pi * u2), dtype);
      if (i + 1 < n) out[static_cast<size_t>(i + 1)] = ref::to_bits(mean + stddev * r * std::sin(two_pi * u2), dtype);
    }
  };
  std::vector<std::thread> threads;
  int64_t const chunk = (pairs + n_threads - 1) / n_threads;
  for (int64_t t = 0; t < n_threads; ++t) {
    int64_t const b = t * chunk, e = std::min(pairs, b + chunk);
    if (b < e) threads.emplace_back(work, b, e);
  }
  for (auto& th : threads) th.join();
  return out;
}

/// gtest assertion over an acceptance result; prints "[ INFO ] what: message" when `print` (so the log shows both
/// errors for a few cases).
inline ::testing::AssertionResult Accepted(std::string const& what, ref::Acceptance const& a, bool print) {
  if (print) std::printf("[ INFO     ] %s: %s\n", what.c_str(), a.message().c_str());
  if (a.pass) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << a.message();
}

inline char const* dtype_name(coda_dtype dt) { return dt == CODA_BF16 ? "bf16" : dt == CODA_FP16 ? "fp16" : "fp32"; }

/// Confident rows for the LM head's tests: for every `every`-th row m (from `first`) whose target t is a real
/// column not already taken, sets w[t] (dtype-rounded) so that the raw logit rstd_m h_m . w[t] is ~`logit` (~25:
/// p_t ~ 1 - V e^-25, where the bf16 spacing is 0.125, so any mismatch between the statistics and the stored
/// logits a softmax is computed from shows). Other rows see column t as rstd h . w[t], ~logit / sqrt(d) in size.
/// Returns the rows made confident. `w` is [V, d], `h` [M, d] (what the GEMM multiplies), `rstd` [M].
inline std::vector<int64_t> make_confident_rows(ref::Matrix& w, ref::Matrix const& h, ref::Vector const& rstd,
                                                ref::Targets const& targets, int64_t first, int64_t every,
                                                double logit, coda_dtype dtype) {
  std::vector<int64_t> rows;
  std::vector<bool> taken(static_cast<size_t>(w.rows), false);
  for (int64_t m = first; m < h.rows; m += every) {
    int64_t const t = targets[static_cast<size_t>(m)];
    if (t < 0 || t >= w.rows || taken[static_cast<size_t>(t)]) continue;
    double const r = rstd[static_cast<size_t>(m)];
    double norm2 = 0;
    for (int64_t j = 0; j < h.cols; ++j) norm2 += (r * h(m, j)) * (r * h(m, j));
    if (norm2 == 0) continue;
    for (int64_t j = 0; j < h.cols; ++j) w(t, j) = ref::round_to(logit * r * h(m, j) / norm2, dtype);
    taken[static_cast<size_t>(t)] = true;
    rows.push_back(m);
  }
  return rows;
}

}  // namespace coda::test
