// bench_common.hpp: pieces shared by the bench_* programs (one executable per bench/*.cu, so shared code lives in
// this header): error checks, the LLaMA model table, device buffers and random fill, the interleaved L2-flushed
// timer of docs/PROTOCOL.md, and the JSON/report helpers.
#ifndef CODA_BENCH_BENCH_COMMON_HPP_
#define CODA_BENCH_BENCH_COMMON_HPP_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#define CHECK_CUDA(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(err_), __FILE__, __LINE__); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

#define CHECK_CUBLAS(call)                                                                        \
  do {                                                                                            \
    cublasStatus_t st_ = (call);                                                                  \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cublasGetStatusString(st_), __FILE__, \
                   __LINE__);                                                                     \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace coda_bench {

/// The cuBLAS baseline's handle, set up as PyTorch sets up its own (what a user's torch.matmul runs): default
/// stream, and the 32 MiB workspace cuBLAS recommends for Hopper. Without the workspace cuBLAS keeps a smaller
/// default pool and its heuristic skips kernels that need more. Never freed (one per bench process).
inline cublasHandle_t make_cublas_handle() {
  cublasHandle_t h = nullptr;
  CHECK_CUBLAS(cublasCreate(&h));
  CHECK_CUBLAS(cublasSetStream(h, nullptr));  // before the workspace: cublasSetStream resets it
  size_t const bytes = size_t{32} << 20;
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, bytes));
  CHECK_CUBLAS(cublasSetWorkspace(h, ws, bytes));
  return h;
}


// ---- shapes ------------------------------------------------------------------------------------------------------

struct Model {
  char const* name;  // PROTOCOL.md config name
  char const* short_name;
  int64_t d, F, hq, hkv, hd, V;
};

inline constexpr Model kModels[] = {
    {"llama3-1B", "1B", 2048, 8192, 32, 8, 64, 128256},
    {"llama3-8B", "8B", 4096, 14336, 32, 8, 128, 128256},
    {"llama3-70B", "70B", 8192, 28672, 64, 8, 128, 128256},
    // The CODA paper's configs (PROTOCOL.md): MHA, head_dim 128; selected only by name ("--models p1B,p7B,p70B").
    {"paper-1B", "p1B", 2048, 5632, 16, 16, 128, 32768},
    {"paper-7B", "p7B", 4096, 11008, 32, 32, 128, 32768},
    {"paper-70B", "p70B", 8192, 22016, 64, 64, 128, 32768},
};

inline std::vector<std::string> split(std::string const& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ---- device data -------------------------------------------------------------------------------------------------

static __global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    float const u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * scale);
  }
}

struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n) {
    if (n != 0) CHECK_CUDA(cudaMalloc(&ptr, n));
  }
  ~Buffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  Buffer(Buffer const&) = delete;
  Buffer& operator=(Buffer const&) = delete;
};

/// bf16 values uniform in [-scale, scale), a fixed function of (index, seed).
inline void fill_random(void* p, size_t elems, uint64_t seed, float scale) {
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), elems, seed, scale);
  CHECK_CUDA(cudaGetLastError());
}

// ---- timing ------------------------------------------------------------------------------------------------------

struct Timing {
  double median_ms = 0.0, min_ms = 0.0;
};

class Timer {
 public:
  Timer(int reps, bool flush, size_t flush_bytes) : reps_(reps), flush_(flush), scratch_(flush ? flush_bytes : 0) {
    events_.resize(2 * static_cast<size_t>(reps));
    for (auto& e : events_) CHECK_CUDA(cudaEventCreate(&e));
  }
  ~Timer() {
    for (auto e : events_) cudaEventDestroy(e);
  }
  Timer(Timer const&) = delete;
  Timer& operator=(Timer const&) = delete;

  /// launch(set) enqueues one run on the default stream using input set `set`.
  Timing measure(int warmup, int sets, std::function<void(int)> const& launch) {
    return measure_interleaved(warmup, sets, {launch}).front();
  }

  /// Times several variants rep by rep in turn (A B A B ...), each run after an L2 flush, so that all of them see
  /// the same clock and thermal state: on H200 the same cuBLAS shape varied by a median 6% (up to 19%) between
  /// sequential runs minutes apart, more than the differences being measured.
  std::vector<Timing> measure_interleaved(int warmup, int sets,
                                          std::vector<std::function<void(int)>> const& launches) {
    size_t const n = launches.size();
    if (events_.size() < 2 * static_cast<size_t>(reps_) * n) {
      size_t const old = events_.size();
      events_.resize(2 * static_cast<size_t>(reps_) * n);
      for (size_t i = old; i < events_.size(); ++i) CHECK_CUDA(cudaEventCreate(&events_[i]));
    }
    for (auto const& launch : launches) {
      for (int w = 0; w < warmup; ++w) launch(w % sets);
    }
    for (int r = 0; r < reps_; ++r) {
      for (size_t v = 0; v < n; ++v) {
        size_t const i = 2 * (static_cast<size_t>(r) * n + v);
        if (flush_) CHECK_CUDA(cudaMemsetAsync(scratch_.ptr, (r + static_cast<int>(v)) & 0xff, scratch_.bytes, nullptr));
        CHECK_CUDA(cudaEventRecord(events_[i], nullptr));
        launches[v](r % sets);
        CHECK_CUDA(cudaEventRecord(events_[i + 1], nullptr));
      }
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<Timing> out(n);
    for (size_t v = 0; v < n; ++v) {
      std::vector<double> ms(static_cast<size_t>(reps_));
      for (int r = 0; r < reps_; ++r) {
        float t = 0.0f;
        size_t const i = 2 * (static_cast<size_t>(r) * n + v);
        CHECK_CUDA(cudaEventElapsedTime(&t, events_[i], events_[i + 1]));
        ms[static_cast<size_t>(r)] = t;
      }
      std::sort(ms.begin(), ms.end());
      out[v] = {ms[ms.size() / 2], ms.front()};
    }
    return out;
  }

 private:
  int reps_;
  bool flush_;
  Buffer scratch_;
  std::vector<cudaEvent_t> events_;
};

// ---- reporting ---------------------------------------------------------------------------------------------------

inline std::string now_utc() {
  std::time_t const t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

inline std::string git_commit() {
  if (char const* env = std::getenv("CODA_COMMIT")) return env;
  std::string out;
  if (FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, p) != nullptr) out = buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

inline std::string json_escape(std::string const& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

/// Options every benchmark program takes (a program's Options derives from this).
struct CommonOptions {
  int reps = 20;
  int warmup = 3;
  bool flush = true;
  bool list_only = false;
  bool append = false;
  std::string out;
  std::string commit;
  int device = 0;
};

/// Parses one of the shared options (--reps --warmup --no-flush --out --append --commit --device --list); `need`
/// returns the option's value (advancing the index). Returns false for an option it does not know.
template <class Need>
bool parse_common_option(std::string const& a, CommonOptions& o, Need&& need) {
  if (a == "--reps") {
    o.reps = std::atoi(need().c_str());
  } else if (a == "--warmup") {
    o.warmup = std::atoi(need().c_str());
  } else if (a == "--no-flush") {
    o.flush = false;
  } else if (a == "--out") {
    o.out = need();
  } else if (a == "--append") {
    o.append = true;
  } else if (a == "--commit") {
    o.commit = need();
  } else if (a == "--device") {
    o.device = std::atoi(need().c_str());
  } else if (a == "--list") {
    o.list_only = true;
  } else {
    return false;
  }
  return true;
}

}  // namespace coda_bench

#endif  // CODA_BENCH_BENCH_COMMON_HPP_
