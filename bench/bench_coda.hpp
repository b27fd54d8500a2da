// bench_coda.hpp: helpers of the bench programs that call CODA ops (bench_fused, bench_backward): contiguous
// coda_tensor descriptors, the status check, the cuBLAS linear D = A W^T, fp32 and int32-target fills, and the
// report helpers (GiB, a JSON number or null, a geometric mean). Needs bench_common.hpp (CHECK_* macros).
#ifndef CODA_BENCH_BENCH_CODA_HPP_
#define CODA_BENCH_BENCH_CODA_HPP_

#include <coda/coda.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace coda_bench {

// ---- CODA / cuBLAS calls -----------------------------------------------------------------------------------------

/// A packed row-major [rows, cols] tensor descriptor.
inline coda_tensor matrix(void* p, coda_dtype t, int64_t rows, int64_t cols, int device) {
  coda_tensor x{};
  x.data = p;
  x.dtype = t;
  x.rank = 2;
  x.sizes[0] = rows, x.sizes[1] = cols;
  x.strides[0] = cols, x.strides[1] = 1;
  x.device = device;
  return x;
}

/// A contiguous [n] tensor descriptor.
inline coda_tensor vec1d(void* p, coda_dtype t, int64_t n, int device) {
  coda_tensor x{};
  x.data = p;
  x.dtype = t;
  x.rank = 1;
  x.sizes[0] = n;
  x.strides[0] = 1;
  x.device = device;
  return x;
}

/// Exits with the status name and coda_last_error() unless `st` is CODA_SUCCESS.
inline void check_coda(coda_status st, std::string const& what) {
  if (st != CODA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %s: %s\n", what.c_str(), coda_status_string(st), coda_last_error());
    std::exit(1);
  }
}

/// D[M,N] = A[M,K] W[N,K]^T, all bf16 row-major, fp32 compute (cuBLAS is column-major: D^T = W A^T).
inline void cublas_linear(cublasHandle_t handle, void const* a, void const* w, void* d, int64_t M, int64_t N,
                          int64_t K) {
  float const alpha = 1.0f, beta = 0.0f;
  CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                            static_cast<int>(K), &alpha, w, CUDA_R_16BF, static_cast<int>(K), a, CUDA_R_16BF,
                            static_cast<int>(K), &beta, d, CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

// ---- device data -------------------------------------------------------------------------------------------------

/// int32 targets spread over [0, V) (a multiplicative hash of the row index).
static __global__ void fill_targets(int32_t* p, size_t n, int64_t V) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<int32_t>((i * 2654435761ull) % static_cast<uint64_t>(V));
  }
}

/// fp32 values uniform in [lo, hi), a fixed function of (index, seed) (e.g. rstd inputs).
static __global__ void fill_f32(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
}

// ---- reporting ---------------------------------------------------------------------------------------------------

/// D[M,N] = alpha dz[M,K] w[K,N], both row-major as stored, bf16 out (the dgrad). cuBLAS is column-major: it
/// computes D^T[N,M] = w^T dz^T with both operands untransposed (A = w, lda = N; B = dz, ldb = K; ldc = N).
inline void cublas_dgrad(cublasHandle_t handle, void const* dz, void const* w, void* d, int64_t M, int64_t N, int64_t K,
                         float alpha = 1.0f) {
  float const beta = 0.0f;
  CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                            static_cast<int>(K), &alpha, w, CUDA_R_16BF, static_cast<int>(N), dz, CUDA_R_16BF,
                            static_cast<int>(K), &beta, d, CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

/// dW[N',N] = dz[M,N']^T a[M,N], both row-major, fp32 out (the wgrad).
inline void cublas_wgrad(cublasHandle_t handle, void const* dz, void const* a, float* dw, int64_t M, int64_t Nd,
                         int64_t N) {
  float const one = 1.0f, zero = 0.0f;
  CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(N), static_cast<int>(Nd),
                            static_cast<int>(M), &one, a, CUDA_R_16BF, static_cast<int>(N), dz, CUDA_R_16BF,
                            static_cast<int>(Nd), &zero, dw, CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

/// Device memory in use (total - free), bytes.
inline size_t device_used() {
  size_t free_bytes = 0, total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

inline double gib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

/// A positive number as JSON, anything else (0, negative, NaN) as null.
inline std::string num_or_null(double v) { return v > 0.0 ? std::to_string(v) : "null"; }

/// Geometric mean (and range) of positive ratios; non-positive values are ignored.
struct Geo {
  double log_sum = 0.0;
  double lo = 0.0, hi = 0.0;
  int n = 0;
  void add(double v) {
    if (!(v > 0.0)) return;
    log_sum += std::log(v);
    lo = n == 0 ? v : std::min(lo, v);
    hi = n == 0 ? v : std::max(hi, v);
    ++n;
  }
  double mean() const { return n > 0 ? std::exp(log_sum / n) : 0.0; }
};


// ---- scheduler-knob sweep ----------------------------------------------------------------------------------------

/// The bf16 configs a fused op (C ABI name) compiles, as libcoda lists them (coda_fused_op_configs); empty for a
/// name it does not know.
inline std::vector<std::string> fused_configs(char const* op) {
  char const* const listed = coda_fused_op_configs(op, CODA_BF16);
  return listed != nullptr ? split(listed, ',') : std::vector<std::string>{};
}

/// The CODA_OP_CONFIG pins of a sweep: each config x {default, raster m|n x swizzle 1|2|4|8}.
inline std::vector<std::string> sweep_pins(std::vector<std::string> const& configs) {
  std::vector<std::string> pins;
  for (std::string const& c : configs) {
    pins.push_back(c);
    for (char const* r : {"m", "n"}) {
      for (int sw : {1, 2, 4, 8}) pins.push_back(c + ":raster=" + r + ",swizzle=" + std::to_string(sw));
    }
  }
  return pins;
}

struct SweepPoint {
  std::string pin;
  double ms = 0.0, cublas_ms = 0.0;
  double ratio() const { return cublas_ms > 0.0 ? ms / cublas_ms : 0.0; }
};

/// Times `run_coda` under each pin (set through CODA_OP_CONFIG, which the fused ops read on every call),
/// interleaved with `run_cublas` in one measurement, so every ratio shares the cuBLAS time of the same reps.
inline std::vector<SweepPoint> sweep_knobs(Timer& timer, int warmup, int sets, std::vector<std::string> const& pins,
                                           std::function<void(int)> const& run_cublas,
                                           std::function<void(int)> const& run_coda) {
  std::vector<std::function<void(int)>> launches{run_cublas};
  for (std::string const& pin : pins) {
    launches.push_back([&run_coda, pin](int set) {
      setenv("CODA_OP_CONFIG", pin.c_str(), 1);
      run_coda(set);
    });
  }
  std::vector<Timing> const t = timer.measure_interleaved(warmup, sets, launches);
  unsetenv("CODA_OP_CONFIG");
  std::vector<SweepPoint> out;
  for (size_t i = 0; i < pins.size(); ++i) out.push_back({pins[i], t[i + 1].median_ms, t[0].median_ms});
  return out;
}

/// One JSON line per sweep point (suite `suite`) and a one-line summary on stdout (best pin first).
inline void report_sweep(FILE* jsonl, char const* suite, std::string const& op, std::string const& config, int64_t M,
                         int64_t N, int64_t K, std::vector<SweepPoint> const& pts, std::string const& commit,
                         std::string const& gpu, std::string const& date) {
  size_t best = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    if (pts[i].ratio() < pts[best].ratio()) best = i;
    if (jsonl == nullptr) continue;
    std::fprintf(jsonl,
                 "{\"suite\":\"%s\",\"op\":\"%s\",\"config\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,"
                 "\"pin\":\"%s\",\"ms\":%.6f,\"cublas_ms\":%.6f,\"time_vs_cublas\":%.4f,\"commit\":\"%s\","
                 "\"gpu\":\"%s\",\"date\":\"%s\"}\n",
                 suite, json_escape(op).c_str(), json_escape(config).c_str(), static_cast<long long>(M),
                 static_cast<long long>(N), static_cast<long long>(K), pts[i].pin.c_str(), pts[i].ms,
                 pts[i].cublas_ms, pts[i].ratio(), json_escape(commit).c_str(), json_escape(gpu).c_str(),
                 date.c_str());
  }
  if (jsonl != nullptr) std::fflush(jsonl);
  if (pts.empty()) return;
  std::printf("  sweep %s %s: best %s %.3f x cuBLAS;", config.c_str(), op.c_str(), pts[best].pin.c_str(),
              pts[best].ratio());
  for (SweepPoint const& p : pts) std::printf(" %s=%.3f", p.pin.c_str(), p.ratio());
  std::printf("\n");
}

}  // namespace coda_bench

#endif  // CODA_BENCH_BENCH_CODA_HPP_
