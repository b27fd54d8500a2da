// bench_fused: CODA's forward fused ops against the bare cuBLAS GEMM and an unfused pipeline (docs/PROTOCOL.md).
//
// Ops (bf16): F1 coda_linear_residual_rmsnorm at the out- and down-projection shapes, F2 coda_linear_rowscale at
// the gate/up and q/k/v shapes of llama3-1B/8B/70B, M = --tokens rows (16384 by default).
//
// Method, as bench_gemm: CUDA events around each launch, --warmup launches of every variant first, an L2 flush (a
// memset of 2x the L2 size) before every timed launch, the median of --reps (>= 20), input sets rotated when one
// set of inputs would fit in twice the L2, and all variants of a shape timed interleaved launch by launch
// (cublas, coda, unfused, cublas, ...) so that they see the same clock state.
//
// Variants (all write to preallocated outputs; nothing is allocated inside a timed launch):
//   cublas  : cublasGemmEx of the same M,N,K (bf16 in/out, fp32 compute, default algo): D[M,N] = A W^T. The
//             speed-of-light bar: the GEMM alone, no epilogue work.
//   coda    : the public C ABI call (coda_linear_residual_rmsnorm incl. its coda_rmsnorm_rstd finishing reduce, or
//             coda_linear_rowscale), with workspace from the *_workspace_size function; host validation included.
//   unfused : cuBLAS + simple vectorized kernels of this file, as an unfused framework runs it:
//             F1: cublasGemmEx -> bf16 temp T[M,N]; then residual_rmsnorm_kernel, one block per row, one pass with
//                 16-byte loads: x = bf16(T + residual), h = bf16(x * gamma), rstd = 1/sqrt(mean(x^2) + eps).
//             F2: whichever row scale touches fewer bytes (rows x min(K, N)): K <= N (every LLaMA shape here):
//                 "prescale" = rowscale_kernel h -> bf16 temp hs = bf16(rstd * h) [M,K], then cublasGemmEx hs W^T
//                 (what RMSNorm-then-linear costs unfused); K > N: "postscale" = cublasGemmEx -> bf16 temp [M,N],
//                 then rowscale_kernel -> y.
// TFLOP/s of every variant is 2MNK / time (the GEMM's flops only). Output: a table, a summary per op (geometric
// means of coda/cublas time and of unfused/coda speedup) and, with --out, one JSON line per variant and shape.
#include <coda/coda.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {

using coda_bench::Buffer;
using coda_bench::fill_random;
using coda_bench::git_commit;
using coda_bench::json_escape;
using coda_bench::kModels;
using coda_bench::Model;
using coda_bench::now_utc;
using coda_bench::split;
using coda_bench::Timer;
using coda_bench::Timing;

constexpr float kEps = 1e-5f;

// ---- shapes ------------------------------------------------------------------------------------------------------

struct Shape {
  std::string config;  // model name (PROTOCOL.md)
  std::string op;      // f1_out, f1_down, f2_gate_up, f2_qkv
  std::string fused;   // C ABI function name
  int which = 1;       // 1 = F1, 2 = F2
  int64_t M = 0, N = 0, K = 0;
};

struct Options : coda_bench::CommonOptions {
  std::set<std::string> models{"1B", "8B", "70B"};
  std::vector<int64_t> tokens{16384};
  std::set<std::string> ops{"f1", "f2"};
};

void usage() {
  std::printf(
      "usage: bench_fused [options]\n"
      "  --quick                 llama3-1B shapes only\n"
      "  --models 1B,8B,70B      models of the LLaMA shape set (default all)\n"
      "  --tokens 16384[,...]    token counts M (default 16384)\n"
      "  --ops f1,f2             F1 linear_residual_rmsnorm (out, down), F2 linear_rowscale (gate_up, qkv)\n"
      "  --reps N (>=20 per PROTOCOL.md, default 20)  --warmup N (default 3)  --no-flush\n"
      "  --out FILE.jsonl [--append]  --commit SHA  --device N  --list (print the shapes and exit)\n");
}

Options parse(int argc, char** argv) {
  Options o;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", argv[i]);
      std::exit(2);
    }
    return argv[++i];
  };
  auto set_of = [](std::string const& s) {
    auto v = split(s, ',');
    return std::set<std::string>(v.begin(), v.end());
  };
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--quick") {
      o.models = {"1B"};
    } else if (a == "--models") {
      o.models = set_of(need(i));
    } else if (a == "--tokens") {
      o.tokens.clear();
      for (auto const& x : split(need(i), ',')) o.tokens.push_back(std::atoll(x.c_str()));
    } else if (a == "--ops") {
      o.ops.clear();
      for (std::string x : split(need(i), ',')) {
        if (x == "F1" || x == "linear_residual_rmsnorm") x = "f1";
        if (x == "F2" || x == "linear_rowscale") x = "f2";
        if (x != "f1" && x != "f2") {
          std::fprintf(stderr, "unknown op %s (f1, f2)\n", x.c_str());
          std::exit(2);
        }
        o.ops.insert(x);
      }
    } else if (coda_bench::parse_common_option(a, o, [&] { return need(i); })) {
      // --reps --warmup --no-flush --out --append --commit --device --list
    } else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      usage();
      std::exit(2);
    }
  }
  if (o.reps < 1) o.reps = 1;
  if (o.warmup < 1) o.warmup = 1;  // the first coda call may tune; keep it out of the timed runs
  if (o.reps < 20) std::fprintf(stderr, "note: --reps %d is below PROTOCOL.md's minimum of 20\n", o.reps);
  for (int64_t t : o.tokens) {
    if (t < 1) {
      std::fprintf(stderr, "--tokens: %lld is not a positive row count\n", static_cast<long long>(t));
      std::exit(2);
    }
  }
  return o;
}

std::vector<Shape> shape_set(Options const& o) {
  std::vector<Shape> out;
  for (Model const& m : kModels) {
    if (o.models.count(m.short_name) == 0 && o.models.count(m.name) == 0) continue;
    for (int64_t t : o.tokens) {
      if (o.ops.count("f1") != 0) {
        out.push_back({m.name, "f1_out", "linear_residual_rmsnorm", 1, t, m.d, m.hq * m.hd});
        out.push_back({m.name, "f1_down", "linear_residual_rmsnorm", 1, t, m.d, m.F});
      }
      if (o.ops.count("f2") != 0) {
        out.push_back({m.name, "f2_gate_up", "linear_rowscale", 2, t, 2 * m.F, m.d});
        out.push_back({m.name, "f2_qkv", "linear_rowscale", 2, t, (m.hq + 2 * m.hkv) * m.hd, m.d});
      }
    }
  }
  return out;
}

// ---- unfused epilogue kernels ------------------------------------------------------------------------------------

constexpr int kRowThreads = 256;

/// F1 unfused epilogue, one block per row, one pass, 16-byte accesses (N a multiple of 8, rows 16-byte aligned):
/// x = bf16(t + residual); h = bf16(x * gamma); rstd = 1 / sqrt(mean(x^2) + eps) with x as stored (bf16).
__global__ void __launch_bounds__(kRowThreads) residual_rmsnorm_kernel(
    __nv_bfloat16 const* __restrict__ t, __nv_bfloat16 const* __restrict__ residual,
    __nv_bfloat16 const* __restrict__ gamma, int64_t n, float eps, __nv_bfloat16* __restrict__ x,
    __nv_bfloat16* __restrict__ h, float* __restrict__ rstd) {
  int64_t const row = blockIdx.x;
  int64_t const nvec = n / 8;
  uint4 const* tv = reinterpret_cast<uint4 const*>(t + row * n);
  uint4 const* rv = reinterpret_cast<uint4 const*>(residual + row * n);
  uint4 const* gv = reinterpret_cast<uint4 const*>(gamma);
  uint4* xv = reinterpret_cast<uint4*>(x + row * n);
  uint4* hv = reinterpret_cast<uint4*>(h + row * n);
  float ss = 0.0f;
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    uint4 const a = tv[v], b = rv[v], g = __ldg(gv + v);
    uint4 xo, ho;
    auto const* a2 = reinterpret_cast<__nv_bfloat162 const*>(&a);
    auto const* b2 = reinterpret_cast<__nv_bfloat162 const*>(&b);
    auto const* g2 = reinterpret_cast<__nv_bfloat162 const*>(&g);
    auto* x2 = reinterpret_cast<__nv_bfloat162*>(&xo);
    auto* h2 = reinterpret_cast<__nv_bfloat162*>(&ho);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 const fa = __bfloat1622float2(a2[j]), fb = __bfloat1622float2(b2[j]);
      __nv_bfloat162 const xb = __floats2bfloat162_rn(fa.x + fb.x, fa.y + fb.y);
      float2 const fx = __bfloat1622float2(xb), fg = __bfloat1622float2(g2[j]);
      ss += fx.x * fx.x + fx.y * fx.y;
      x2[j] = xb;
      h2[j] = __floats2bfloat162_rn(fx.x * fg.x, fx.y * fg.y);
    }
    xv[v] = xo;
    hv[v] = ho;
  }
  __shared__ float warp_sums[kRowThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kRowThreads / 32; ++w) total += warp_sums[w];
    rstd[row] = 1.0f / sqrtf(total / static_cast<float>(n) + eps);
  }
}

/// out[m, :] = bf16(rstd[m] * in[m, :]) for a packed [rows, cols] bf16 matrix (cols a multiple of 8), 16-byte
/// accesses, grid-stride over the 8-element vectors.
__global__ void rowscale_kernel(__nv_bfloat16 const* __restrict__ in, float const* __restrict__ rstd, int64_t rows,
                                int64_t cols, __nv_bfloat16* __restrict__ out) {
  int64_t const per_row = cols / 8, total = rows * per_row;
  uint4 const* iv = reinterpret_cast<uint4 const*>(in);
  uint4* ov = reinterpret_cast<uint4*>(out);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    float const s = __ldg(rstd + i / per_row);
    uint4 const a = iv[i];
    uint4 o;
    auto const* a2 = reinterpret_cast<__nv_bfloat162 const*>(&a);
    auto* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 const f = __bfloat1622float2(a2[j]);
      o2[j] = __floats2bfloat162_rn(s * f.x, s * f.y);
    }
    ov[i] = o;
  }
}

/// fp32 values uniform in [lo, hi) (the rstd input of F2).
__global__ void fill_f32(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
}

void launch_residual_rmsnorm(void const* t, void const* residual, void const* gamma, int64_t M, int64_t N,
                             void* x, void* h, float* rstd) {
  residual_rmsnorm_kernel<<<static_cast<unsigned>(M), kRowThreads>>>(
      static_cast<__nv_bfloat16 const*>(t), static_cast<__nv_bfloat16 const*>(residual),
      static_cast<__nv_bfloat16 const*>(gamma), N, kEps, static_cast<__nv_bfloat16*>(x),
      static_cast<__nv_bfloat16*>(h), rstd);
  CHECK_CUDA(cudaGetLastError());
}

void launch_rowscale(void const* in, float const* rstd, int64_t rows, int64_t cols, void* out) {
  int64_t const vecs = rows * (cols / 8);
  int64_t const blocks = std::clamp<int64_t>((vecs + 255) / 256, 1, int64_t{1} << 20);
  rowscale_kernel<<<static_cast<unsigned>(blocks), 256>>>(static_cast<__nv_bfloat16 const*>(in), rstd, rows, cols,
                                                          static_cast<__nv_bfloat16*>(out));
  CHECK_CUDA(cudaGetLastError());
}

// ---- CODA / cuBLAS calls -----------------------------------------------------------------------------------------

coda_tensor matrix(void* p, coda_dtype t, int64_t rows, int64_t cols, int device) {
  coda_tensor x{};
  x.data = p;
  x.dtype = t;
  x.rank = 2;
  x.sizes[0] = rows, x.sizes[1] = cols;
  x.strides[0] = cols, x.strides[1] = 1;
  x.device = device;
  return x;
}

coda_tensor vec1d(void* p, coda_dtype t, int64_t n, int device) {
  coda_tensor x{};
  x.data = p;
  x.dtype = t;
  x.rank = 1;
  x.sizes[0] = n;
  x.strides[0] = 1;
  x.device = device;
  return x;
}

void check_coda(coda_status st, std::string const& what) {
  if (st != CODA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %s: %s\n", what.c_str(), coda_status_string(st), coda_last_error());
    std::exit(1);
  }
}

/// D[M,N] = A[M,K] W[N,K]^T, all bf16 row-major, fp32 compute (cuBLAS is column-major: D^T = W A^T).
void cublas_linear(cublasHandle_t handle, void const* a, void const* w, void* d, int64_t M, int64_t N, int64_t K) {
  float const alpha = 1.0f, beta = 0.0f;
  CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                            static_cast<int>(K), &alpha, w, CUDA_R_16BF, static_cast<int>(K), a, CUDA_R_16BF,
                            static_cast<int>(K), &beta, d, CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

// ---- reporting ---------------------------------------------------------------------------------------------------

double gib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

std::string num_or_null(double v) { return v > 0.0 ? std::to_string(v) : "null"; }

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

}  // namespace

int main(int argc, char** argv) {
  Options const opt = parse(argc, argv);
  std::vector<Shape> const shapes = shape_set(opt);
  if (opt.list_only) {
    for (Shape const& s : shapes) {
      std::printf("%-11s %-11s %-24s fwd M=%-7lld N=%-7lld K=%-7lld bf16\n", s.config.c_str(), s.op.c_str(),
                  s.fused.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.N),
                  static_cast<long long>(s.K));
    }
    return 0;
  }

  int supported = 0, major = 0, minor = 0;
  coda_status const dev_st = coda_device_supported(opt.device, &supported, &major, &minor);
  if (dev_st != CODA_SUCCESS || supported == 0) {
    std::fprintf(stderr,
                 "bench_fused needs an sm_90 (Hopper) GPU; device %d: %s (compute capability %d.%d) %s\n",
                 opt.device, dev_st == CODA_SUCCESS ? "not supported" : coda_status_string(dev_st), major, minor,
                 coda_last_error());
    return 1;
  }
  CHECK_CUDA(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, opt.device));
  std::string const gpu = prop.name, commit = opt.commit.empty() ? git_commit() : opt.commit, date = now_utc();
  size_t const l2 = static_cast<size_t>(std::max(prop.l2CacheSize, 1 << 20));
  int const dev = opt.device;

  cublasHandle_t cublas = nullptr;
  CHECK_CUBLAS(cublasCreate(&cublas));
  CHECK_CUBLAS(cublasSetStream(cublas, nullptr));

  FILE* jsonl = nullptr;
  if (!opt.out.empty()) {
    jsonl = std::fopen(opt.out.c_str(), opt.append ? "a" : "w");
    if (jsonl == nullptr) {
      std::fprintf(stderr, "cannot open %s\n", opt.out.c_str());
      return 1;
    }
  }

  std::printf("bench_fused on %s (%d SMs, L2 %zu MiB), commit %s, %d reps, L2 flush %s, bf16\n", gpu.c_str(),
              prop.multiProcessorCount, l2 >> 20, commit.c_str(), opt.reps, opt.flush ? "on" : "off");
  std::printf("%-11s %-11s %7s %7s %7s | %9s %9s %9s | %9s %9s | %s\n", "config", "op", "M", "N", "K", "cuBLAS ms",
              "CODA ms", "unfus ms", "coda/cub", "unf/coda", "unfused form");

  Timer timer(opt.reps, opt.flush, 2 * l2);
  std::map<std::string, Geo> vs_cublas, vs_unfused;  // per op (f1 / f2)
  auto const wall0 = std::chrono::steady_clock::now();

  for (Shape const& s : shapes) {
    size_t const MK = static_cast<size_t>(s.M * s.K), NK = static_cast<size_t>(s.N * s.K);
    size_t const MN = static_cast<size_t>(s.M * s.N), Mr = static_cast<size_t>(s.M), Nr = static_cast<size_t>(s.N);
    bool const f1 = s.which == 1;
    // Inputs of one set: F1 a, w, residual, gamma; F2 h, w, rstd.
    size_t const in_bytes = f1 ? 2 * (MK + NK + MN + Nr) : 2 * (MK + NK) + 4 * Mr;
    int const sets = static_cast<int>(std::clamp<size_t>((2 * l2 + in_bytes - 1) / in_bytes, 1, 4));
    std::vector<std::unique_ptr<Buffer>> as, ws, rs, gs, ss;  // a|h, w, residual, gamma, rstd (F2 input)
    for (int i = 0; i < sets; ++i) {
      uint64_t const seed = static_cast<uint64_t>(i);
      as.push_back(std::make_unique<Buffer>(2 * MK));
      ws.push_back(std::make_unique<Buffer>(2 * NK));
      fill_random(as.back()->ptr, MK, 1000 + seed, 1.0f);
      fill_random(ws.back()->ptr, NK, 2000 + seed, 0.05f);
      if (f1) {
        rs.push_back(std::make_unique<Buffer>(2 * MN));
        gs.push_back(std::make_unique<Buffer>(2 * Nr));
        fill_random(rs.back()->ptr, MN, 3000 + seed, 4.0f);
        fill_random(gs.back()->ptr, Nr, 4000 + seed, 1.0f);
      } else {
        ss.push_back(std::make_unique<Buffer>(4 * Mr));
        fill_f32<<<256, 256>>>(static_cast<float*>(ss.back()->ptr), Mr, 5000 + seed, 0.5f, 1.5f);
        CHECK_CUDA(cudaGetLastError());
      }
    }
    auto at = [](std::vector<std::unique_ptr<Buffer>> const& v, int set) { return v[static_cast<size_t>(set)]->ptr; };

    // Outputs and temporaries (shared by the variants; every launch overwrites them completely).
    // F1: x, h [M,N], rstd [M], T [M,N] (cuBLAS output / unfused temp). F2: y [M,N], temp [M,min(K,N)].
    bool const prescale = s.K <= s.N;
    size_t const ws_bytes = f1 ? coda_linear_residual_rmsnorm_workspace_size(s.M, s.N)
                               : coda_linear_rowscale_workspace_size(s.M, s.N);
    Buffer workspace(ws_bytes);
    Buffer out0(2 * MN);                                         // F1 x / F2 y
    Buffer out1(f1 ? 2 * MN : 0);                                // F1 h
    Buffer rstd_out(f1 ? 4 * Mr : 0);                            // F1 rstd
    Buffer temp(f1 ? 2 * MN : 2 * Mr * static_cast<size_t>(std::min(s.K, s.N)));
    std::string const unfused_form = f1 ? "gemm+residual_rmsnorm" : prescale ? "prescale+gemm" : "gemm+postscale";

    std::function<void(int)> run_cublas, run_coda, run_unfused;
    size_t peak_cublas = 0, peak_coda = 0, peak_unfused = 0;
    if (f1) {
      run_cublas = [&](int set) { cublas_linear(cublas, at(as, set), at(ws, set), temp.ptr, s.M, s.N, s.K); };
      run_coda = [&](int set) {
        coda_tensor const a = matrix(at(as, set), CODA_BF16, s.M, s.K, dev);
        coda_tensor const w = matrix(at(ws, set), CODA_BF16, s.N, s.K, dev);
        coda_tensor const r = matrix(at(rs, set), CODA_BF16, s.M, s.N, dev);
        coda_tensor const g = vec1d(at(gs, set), CODA_BF16, s.N, dev);
        coda_tensor x = matrix(out0.ptr, CODA_BF16, s.M, s.N, dev);
        coda_tensor h = matrix(out1.ptr, CODA_BF16, s.M, s.N, dev);
        coda_tensor rstd = vec1d(rstd_out.ptr, CODA_FP32, s.M, dev);
        check_coda(coda_linear_residual_rmsnorm(&a, &w, &r, &g, kEps, &x, &h, &rstd, workspace.ptr, ws_bytes,
                                                nullptr),
                   "coda_linear_residual_rmsnorm " + s.op);
      };
      run_unfused = [&](int set) {
        cublas_linear(cublas, at(as, set), at(ws, set), temp.ptr, s.M, s.N, s.K);
        launch_residual_rmsnorm(temp.ptr, at(rs, set), at(gs, set), s.M, s.N, out0.ptr, out1.ptr,
                                static_cast<float*>(rstd_out.ptr));
      };
      size_t const inputs = in_bytes;
      peak_cublas = 2 * (MK + NK) + temp.bytes;
      peak_coda = inputs + out0.bytes + out1.bytes + rstd_out.bytes + ws_bytes;
      peak_unfused = inputs + temp.bytes + out0.bytes + out1.bytes + rstd_out.bytes;
    } else {
      run_cublas = [&](int set) { cublas_linear(cublas, at(as, set), at(ws, set), out0.ptr, s.M, s.N, s.K); };
      run_coda = [&](int set) {
        coda_tensor const h = matrix(at(as, set), CODA_BF16, s.M, s.K, dev);
        coda_tensor const w = matrix(at(ws, set), CODA_BF16, s.N, s.K, dev);
        coda_tensor const rstd = vec1d(at(ss, set), CODA_FP32, s.M, dev);
        coda_tensor y = matrix(out0.ptr, CODA_BF16, s.M, s.N, dev);
        check_coda(coda_linear_rowscale(&h, &w, &rstd, &y, workspace.ptr, ws_bytes, nullptr),
                   "coda_linear_rowscale " + s.op);
      };
      run_unfused = [&, prescale](int set) {
        float const* rstd = static_cast<float const*>(at(ss, set));
        if (prescale) {
          launch_rowscale(at(as, set), rstd, s.M, s.K, temp.ptr);
          cublas_linear(cublas, temp.ptr, at(ws, set), out0.ptr, s.M, s.N, s.K);
        } else {
          cublas_linear(cublas, at(as, set), at(ws, set), temp.ptr, s.M, s.N, s.K);
          launch_rowscale(temp.ptr, rstd, s.M, s.N, out0.ptr);
        }
      };
      peak_cublas = 2 * (MK + NK) + out0.bytes;
      peak_coda = in_bytes + out0.bytes + ws_bytes;
      peak_unfused = in_bytes + temp.bytes + out0.bytes;
    }
    CHECK_CUDA(cudaDeviceSynchronize());

    // First CODA call on its own (it may select/tune a kernel): host time reported as tune_ms, never timed.
    auto const t0 = std::chrono::steady_clock::now();
    run_coda(0);
    CHECK_CUDA(cudaDeviceSynchronize());
    double const tune_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    std::vector<std::string> const names{"cublas", "coda", "unfused"};
    std::vector<Timing> const times = timer.measure_interleaved(opt.warmup, sets, {run_cublas, run_coda, run_unfused});
    std::vector<size_t> const peaks{peak_cublas, peak_coda, peak_unfused};
    double const flop = 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
    double const ms_cublas = times[0].median_ms, ms_coda = times[1].median_ms, ms_unfused = times[2].median_ms;

    for (size_t v = 0; v < names.size(); ++v) {
      double const ms = times[v].median_ms;
      double const tflops = flop / (ms * 1e9);
      if (jsonl == nullptr) continue;
      std::string const form = names[v] == "unfused" ? "\"" + unfused_form + "\"" : "null";
      std::fprintf(jsonl,
                   "{\"suite\":\"fused\",\"op\":\"%s\",\"fused_op\":\"%s\",\"config\":\"%s\",\"M\":%lld,\"N\":%lld,"
                   "\"K\":%lld,\"pass\":\"fwd\",\"variant\":\"%s\",\"ms\":%.6f,\"ms_min\":%.6f,\"tflops\":%.3f,"
                   "\"peak_gib\":%.4f,\"commit\":\"%s\",\"gpu\":\"%s\",\"date\":\"%s\",\"dtype\":\"bf16\","
                   "\"ratio_vs_cublas\":%s,\"time_vs_cublas\":%s,\"speedup_vs_unfused\":%s,\"unfused_form\":%s,"
                   "\"tune_ms\":%s,\"reps\":%d,\"l2_flush\":%s,\"input_sets\":%d}\n",
                   json_escape(s.op).c_str(), json_escape(s.fused).c_str(), json_escape(s.config).c_str(),
                   static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                   names[v].c_str(), ms, times[v].min_ms, tflops, gib(peaks[v]), json_escape(commit).c_str(),
                   json_escape(gpu).c_str(), date.c_str(),
                   names[v] == "cublas" ? "null" : num_or_null(ms_cublas / ms).c_str(),
                   names[v] == "cublas" ? "null" : num_or_null(ms / ms_cublas).c_str(),
                   names[v] == "coda" ? num_or_null(ms_unfused / ms).c_str() : "null", form.c_str(),
                   names[v] == "coda" ? num_or_null(tune_ms).c_str() : "null", opt.reps,
                   opt.flush ? "true" : "false", sets);
      std::fflush(jsonl);
    }
    std::string const key = f1 ? "f1" : "f2";
    vs_cublas[key].add(ms_coda / ms_cublas);
    vs_unfused[key].add(ms_unfused / ms_coda);
    std::printf("%-11s %-11s %7lld %7lld %7lld | %9.4f %9.4f %9.4f | %9.3f %9.3f | %s\n", s.config.c_str(),
                s.op.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                ms_cublas, ms_coda, ms_unfused, ms_coda / ms_cublas, ms_unfused / ms_coda, unfused_form.c_str());
    std::fflush(stdout);
  }

  std::printf("\n");
  for (auto const& [key, g] : vs_cublas) {
    Geo const& u = vs_unfused[key];
    std::printf("%s (%s) over %d shapes: CODA/cuBLAS-GEMM time geometric mean %.3f (min %.3f, max %.3f; 1.0 = "
                "epilogue for free); unfused/CODA speedup geometric mean %.3f (min %.3f, max %.3f)\n",
                key == "f1" ? "F1" : "F2", key == "f1" ? "linear_residual_rmsnorm" : "linear_rowscale", g.n,
                g.mean(), g.lo, g.hi, u.mean(), u.lo, u.hi);
  }
  std::printf("wall time %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
  if (jsonl != nullptr) std::fclose(jsonl);
  cublasDestroy(cublas);
  return 0;
}
