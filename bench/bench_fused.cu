// bench_fused: CODA's forward fused ops against the bare cuBLAS GEMM and an unfused pipeline (docs/PROTOCOL.md).
//
// Ops (bf16), each at its own GEMM shape of llama3-1B/8B/70B, M = --tokens rows (16384 by default):
// coda_linear_residual_rmsnorm at the out- and down-projection, coda_linear_rowscale_swiglu at gate/up,
// coda_linear_rowscale_rope at q/k/v, coda_linear_rowscale_lse at the LM head (V = 128256, logits not stored, int32
// targets); and coda_linear_rowscale (the bare deferred row scale) at gate/up and q/k/v for comparison. A shape's
// `op` label is the op's name, with `@gemm` where one op runs at several GEMMs (linear_residual_rmsnorm@out).
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
//             linear_residual_rmsnorm: cublasGemmEx -> bf16 temp T[M,N]; then residual_rmsnorm_kernel, one block
//                 per row, one pass with 16-byte loads: x = bf16(T + residual), h = bf16(x * gamma),
//                 rstd = 1/sqrt(mean(x^2) + eps).
//             linear_rowscale: whichever row scale touches fewer bytes (rows x min(K, N)): K <= N (every LLaMA
//                 shape here): "prescale" = rowscale_kernel h -> bf16 temp hs = bf16(rstd * h) [M,K], then
//                 cublasGemmEx hs W^T (what RMSNorm-then-linear costs unfused); K > N: "postscale" = cublasGemmEx
//                 -> bf16 temp [M,N], then rowscale_kernel -> y.
//             linear_rowscale_swiglu: rowscale_kernel h -> hs, cublasGemmEx hs W^T -> z [M,2F], swiglu_kernel
//                 z -> y [M,F] (16-byte accesses, silu in fp32).
//             linear_rowscale_rope: rowscale_kernel h -> hs, cublasGemmEx hs W^T -> qkv, rope_kernel in place on the
//                 q/k columns (fp32 angles pos * inv_freq and sincosf, as HF computes its cos/sin tables, but
//                 without materializing the tables).
//             linear_rowscale_lse: rowscale_kernel h -> hs, cublasGemmEx hs W^T -> logits [M,V] bf16, lse_kernel
//                 (one block per row, one pass, 16-byte loads: online max / sum-exp in fp32, target logit).
// TFLOP/s of every variant is 2MNK / time (the GEMM's flops only). Output: a table, a summary per op (geometric
// means of coda/cublas time and of unfused/coda speedup) and, with --out, one JSON line per variant and shape.
#include <coda/coda.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_coda.hpp"
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
using coda_bench::check_coda;
using coda_bench::cublas_linear;
using coda_bench::fill_f32;
using coda_bench::fill_random;
using coda_bench::fill_targets;
using coda_bench::Geo;
using coda_bench::gib;
using coda_bench::git_commit;
using coda_bench::json_escape;
using coda_bench::kModels;
using coda_bench::matrix;
using coda_bench::Model;
using coda_bench::now_utc;
using coda_bench::num_or_null;
using coda_bench::split;
using coda_bench::Timer;
using coda_bench::Timing;
using coda_bench::vec1d;

constexpr float kEps = 1e-5f;

// ---- shapes ------------------------------------------------------------------------------------------------------

enum class Kind { kResidualRmsnorm, kRowscale, kSwiglu, kRope, kLse };

struct Shape {
  std::string config;  // model name (PROTOCOL.md)
  std::string op;      // linear_residual_rmsnorm@out, @down, linear_rowscale@gate_up, @qkv, linear_rowscale_swiglu, ...
  std::string fused;   // C ABI function name without coda_ (the --ops name)
  Kind kind = Kind::kResidualRmsnorm;
  int64_t M = 0, N = 0, K = 0;
  int32_t hq = 0, hkv = 0, hd = 0;  // linear_rowscale_rope heads
};

// The --ops names: the forward fused ops timed here.
std::set<std::string> const kOps{"linear_residual_rmsnorm", "linear_rowscale", "linear_rowscale_swiglu",
                                 "linear_rowscale_rope", "linear_rowscale_lse"};

struct Options : coda_bench::CommonOptions {
  std::set<std::string> models{"1B", "8B", "70B"};
  std::vector<int64_t> tokens{16384};
  std::set<std::string> ops = kOps;
  bool sweep = false;  // also time every compiled config x a few scheduler knobs (CODA_OP_CONFIG pins)
};

void usage() {
  std::printf(
      "usage: bench_fused [options]\n"
      "  --quick                 llama3-1B shapes only\n"
      "  --models 1B,8B,70B      models of the LLaMA shape set (default all)\n"
      "  --tokens 16384[,...]    token counts M (default 16384)\n"
      "  --ops OP[,OP...]        (default all) linear_residual_rmsnorm (out, down), linear_rowscale (gate_up, qkv),\n"
      "                          linear_rowscale_swiglu (gate_up), linear_rowscale_rope (qkv),\n"
      "                          linear_rowscale_lse (lm_head)\n"
      "  --sweep                 also time each compiled config x raster/swizzle knobs (CODA_OP_CONFIG pins)\n"
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
    } else if (a == "--sweep") {
      o.sweep = true;
    } else if (a == "--models") {
      o.models = set_of(need(i));
    } else if (a == "--tokens") {
      o.tokens.clear();
      for (auto const& x : split(need(i), ',')) o.tokens.push_back(std::atoll(x.c_str()));
    } else if (a == "--ops") {
      o.ops.clear();
      for (std::string const& x : split(need(i), ',')) {
        if (kOps.count(x) == 0) {
          std::fprintf(stderr,
                       "unknown op %s (linear_residual_rmsnorm, linear_rowscale, linear_rowscale_swiglu, "
                       "linear_rowscale_rope, linear_rowscale_lse)\n",
                       x.c_str());
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
      if (o.ops.count("linear_residual_rmsnorm") != 0) {
        char const* f = "linear_residual_rmsnorm";
        out.push_back({m.name, "linear_residual_rmsnorm@out", f, Kind::kResidualRmsnorm, t, m.d, m.hq * m.hd});
        out.push_back({m.name, "linear_residual_rmsnorm@down", f, Kind::kResidualRmsnorm, t, m.d, m.F});
      }
      if (o.ops.count("linear_rowscale") != 0) {
        char const* f = "linear_rowscale";
        out.push_back({m.name, "linear_rowscale@gate_up", f, Kind::kRowscale, t, 2 * m.F, m.d});
        out.push_back({m.name, "linear_rowscale@qkv", f, Kind::kRowscale, t, (m.hq + 2 * m.hkv) * m.hd, m.d});
      }
      if (o.ops.count("linear_rowscale_swiglu") != 0) {
        char const* f = "linear_rowscale_swiglu";
        out.push_back({m.name, f, f, Kind::kSwiglu, t, 2 * m.F, m.d});
      }
      if (o.ops.count("linear_rowscale_rope") != 0) {
        char const* f = "linear_rowscale_rope";
        Shape q{m.name, f, f, Kind::kRope, t, (m.hq + 2 * m.hkv) * m.hd, m.d};
        q.hq = static_cast<int32_t>(m.hq), q.hkv = static_cast<int32_t>(m.hkv), q.hd = static_cast<int32_t>(m.hd);
        out.push_back(q);
      }
      if (o.ops.count("linear_rowscale_lse") != 0) {
        char const* f = "linear_rowscale_lse";
        out.push_back({m.name, f, f, Kind::kLse, t, m.V, m.d});
      }
    }
  }
  return out;
}

// ---- unfused epilogue kernels ------------------------------------------------------------------------------------

constexpr int kRowThreads = 256;

/// linear_residual_rmsnorm's unfused epilogue, one block per row, one pass, 16-byte accesses (N a multiple of 8, rows
/// 16-byte aligned): x = bf16(t + residual); h = bf16(x * gamma); rstd = 1 / sqrt(mean(x^2) + eps) with x as stored
/// (bf16).
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

/// linear_rowscale_swiglu's unfused epilogue: y[m, i] = bf16(silu(z[m, 2i]) * z[m, 2i+1]) for packed z [rows, 2F],
/// y [rows, F] (F a multiple of 8): 16 z values in (two 16-byte loads), 8 y values out (one 16-byte store).
__global__ void swiglu_kernel(__nv_bfloat16 const* __restrict__ z, int64_t rows, int64_t F,
                              __nv_bfloat16* __restrict__ y) {
  int64_t const total = rows * (F / 8);
  uint4 const* zv = reinterpret_cast<uint4 const*>(z);
  uint4* yv = reinterpret_cast<uint4*>(y);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    uint4 const a = zv[2 * i], b = zv[2 * i + 1];
    __nv_bfloat162 pairs[8];
    *reinterpret_cast<uint4*>(&pairs[0]) = a;
    *reinterpret_cast<uint4*>(&pairs[4]) = b;
    uint4 o;
    auto* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 const p0 = __bfloat1622float2(pairs[2 * j]), p1 = __bfloat1622float2(pairs[2 * j + 1]);
      o2[j] = __floats2bfloat162_rn(p0.x / (1.0f + __expf(-p0.x)) * p0.y, p1.x / (1.0f + __expf(-p1.x)) * p1.y);
    }
    yv[i] = o;
  }
}

/// linear_rowscale_rope's unfused epilogue, in place on packed qkv [rows, width]: each q/k pair (2i, 2i+1) of a head
/// rotated by theta = pos[m] * inv_freq[i] (fp32 angle, sincosf), one thread per 8 elements (4 pairs, 16-byte
/// accesses).
__global__ void rope_kernel(__nv_bfloat16* __restrict__ qkv, int64_t rows, int64_t width, int64_t rotated, int hd,
                            int32_t const* __restrict__ pos, float const* __restrict__ inv_freq) {
  int64_t const per_row = rotated / 8, total = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t const m = i / per_row, c = (i % per_row) * 8;
    uint4* p = reinterpret_cast<uint4*>(qkv + m * width + c);
    uint4 v = *p;
    auto* v2 = reinterpret_cast<__nv_bfloat162*>(&v);
    float const fp = static_cast<float>(__ldg(pos + m));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int const pair = static_cast<int>(((c + 2 * j) % hd) / 2);
      float sn, cs;
      sincosf(fp * __ldg(inv_freq + pair), &sn, &cs);
      float2 const z = __bfloat1622float2(v2[j]);
      v2[j] = __floats2bfloat162_rn(z.x * cs - z.y * sn, z.y * cs + z.x * sn);
    }
    *p = v;
  }
}

constexpr int kLseThreads = 256;

/// linear_rowscale_lse's unfused epilogue: per row of packed bf16 logits [rows, V] (V a multiple of 8):
/// lse = log sum exp (fp32 online max / sum-exp per thread, then merged), target logit. One block per row, 16-byte
/// loads.
__global__ void __launch_bounds__(kLseThreads) lse_kernel(__nv_bfloat16 const* __restrict__ logits, int64_t V,
                                                           int32_t const* __restrict__ targets,
                                                           float* __restrict__ lse, float* __restrict__ target_logit) {
  int64_t const row = blockIdx.x;
  uint4 const* lv = reinterpret_cast<uint4 const*>(logits + row * V);
  float mx = -INFINITY, se = 0.0f;
  for (int64_t v = threadIdx.x; v < V / 8; v += blockDim.x) {
    uint4 const a = lv[v];
    auto const* a2 = reinterpret_cast<__nv_bfloat162 const*>(&a);
    float x[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 const f = __bfloat1622float2(a2[j]);
      x[2 * j] = f.x, x[2 * j + 1] = f.y;
    }
    float m8 = x[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) m8 = fmaxf(m8, x[j]);
    float const nm = fmaxf(mx, m8);
    float s = se * __expf(mx - nm);
#pragma unroll
    for (int j = 0; j < 8; ++j) s += __expf(x[j] - nm);
    mx = nm, se = s;
  }
  __shared__ float smx[kLseThreads / 32], sse[kLseThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float const om = __shfl_xor_sync(0xffffffffu, mx, o), os = __shfl_xor_sync(0xffffffffu, se, o);
    float const nm = fmaxf(mx, om);
    se = (nm == -INFINITY) ? 0.0f : se * __expf(mx - nm) + os * __expf(om - nm);
    mx = nm;
  }
  if ((threadIdx.x & 31) == 0) smx[threadIdx.x >> 5] = mx, sse[threadIdx.x >> 5] = se;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = smx[0], t = sse[0];
    for (int w = 1; w < kLseThreads / 32; ++w) {
      float const nm = fmaxf(m, smx[w]);
      t = t * __expf(m - nm) + sse[w] * __expf(smx[w] - nm);
      m = nm;
    }
    lse[row] = m + __logf(t);
    int32_t const tg = targets[row];
    target_logit[row] = (tg >= 0 && tg < V) ? __bfloat162float(logits[row * V + tg]) : 0.0f;
  }
}

/// int32 positions: packed sequences of 4096 tokens (pos = m % 4096), the linear_rowscale_rope input.
__global__ void fill_positions(int32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<int32_t>(i % 4096);
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

int grid_for(int64_t items) {
  return static_cast<int>(std::clamp<int64_t>((items + 255) / 256, 1, int64_t{1} << 20));
}

void launch_swiglu(void const* z, int64_t rows, int64_t F, void* y) {
  swiglu_kernel<<<grid_for(rows * (F / 8)), 256>>>(static_cast<__nv_bfloat16 const*>(z), rows, F,
                                                  static_cast<__nv_bfloat16*>(y));
  CHECK_CUDA(cudaGetLastError());
}

void launch_rope(void* qkv, int64_t rows, int64_t width, int64_t rotated, int hd, int32_t const* pos,
                 float const* inv_freq) {
  rope_kernel<<<grid_for(rows * (rotated / 8)), 256>>>(static_cast<__nv_bfloat16*>(qkv), rows, width, rotated, hd,
                                                      pos, inv_freq);
  CHECK_CUDA(cudaGetLastError());
}

}  // namespace

int main(int argc, char** argv) {
  Options const opt = parse(argc, argv);
  std::vector<Shape> const shapes = shape_set(opt);
  if (opt.list_only) {
    for (Shape const& s : shapes) {
      std::printf("%-11s %-28s %-24s fwd M=%-7lld N=%-7lld K=%-7lld bf16\n", s.config.c_str(), s.op.c_str(),
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

  cublasHandle_t const cublas = coda_bench::make_cublas_handle();

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
  std::printf("%-11s %-28s %7s %7s %7s | %9s %9s %9s | %9s %9s | %s\n", "config", "op", "M", "N", "K", "cuBLAS ms",
              "CODA ms", "unfus ms", "coda/cub", "unf/coda", "unfused form");

  Timer timer(opt.reps, opt.flush, 2 * l2);
  std::map<std::string, Geo> vs_cublas, vs_unfused;  // per op name (Shape::fused)
  auto const wall0 = std::chrono::steady_clock::now();

  for (Shape const& s : shapes) {
    size_t const MK = static_cast<size_t>(s.M * s.K), NK = static_cast<size_t>(s.N * s.K);
    size_t const MN = static_cast<size_t>(s.M * s.N), Mr = static_cast<size_t>(s.M), Nr = static_cast<size_t>(s.N);
    bool const is_norm = s.kind == Kind::kResidualRmsnorm;
    // Inputs of one set: linear_residual_rmsnorm a, w, residual, gamma; the row-scaled ops h, w, rstd.
    size_t const in_bytes = is_norm ? 2 * (MK + NK + MN + Nr) : 2 * (MK + NK) + 4 * Mr;
    int const sets = static_cast<int>(std::clamp<size_t>((2 * l2 + in_bytes - 1) / in_bytes, 1, 4));
    std::vector<std::unique_ptr<Buffer>> as, ws, rs, gs, ss;  // a|h, w, residual, gamma, rstd (row-scale input)
    for (int i = 0; i < sets; ++i) {
      uint64_t const seed = static_cast<uint64_t>(i);
      as.push_back(std::make_unique<Buffer>(2 * MK));
      ws.push_back(std::make_unique<Buffer>(2 * NK));
      fill_random(as.back()->ptr, MK, 1000 + seed, 1.0f);
      fill_random(ws.back()->ptr, NK, 2000 + seed, 0.05f);
      if (is_norm) {
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
    // linear_residual_rmsnorm: x, h [M,N], rstd [M], T [M,N] (cuBLAS output / unfused temp). linear_rowscale:
    // y [M,N], temp [M,min(K,N)]. linear_rowscale_swiglu: z [M,2F] (out0), y [M,F] (out1), temp = prescaled h.
    // linear_rowscale_rope: qkv (out0), temp = prescaled h, positions and inv_freq inputs (one set: tiny).
    bool const is_swiglu = s.kind == Kind::kSwiglu, is_rope = s.kind == Kind::kRope, is_lse = s.kind == Kind::kLse;
    bool const prescale = s.K <= s.N || is_swiglu || is_rope || is_lse;
    size_t const ws_bytes = is_norm     ? coda_linear_residual_rmsnorm_workspace_size(s.M, s.N)
                            : is_swiglu ? coda_linear_rowscale_swiglu_workspace_size(s.M, s.N)
                            : is_rope   ? coda_linear_rowscale_rope_workspace_size(s.M, s.N)
                            : is_lse    ? coda_linear_rowscale_lse_workspace_size(s.M, s.N)
                                        : coda_linear_rowscale_workspace_size(s.M, s.N);
    Buffer workspace(ws_bytes);
    Buffer out0(2 * MN);                                         // x / y / z / qkv
    Buffer out1(is_norm ? 2 * MN : is_swiglu ? MN : 0);          // linear_residual_rmsnorm's h / swiglu's y
    Buffer rstd_out(is_norm ? 4 * Mr : 0);                       // linear_residual_rmsnorm's rstd
    Buffer temp(is_norm ? 2 * MN : 2 * Mr * static_cast<size_t>(prescale ? s.K : s.N));
    Buffer positions(is_rope ? 4 * Mr : 0), inv_freq(is_rope ? 2 * static_cast<size_t>(s.hd) : 0);
    Buffer targets(is_lse ? 4 * Mr : 0), lse_out(is_lse ? 4 * Mr : 0), tl_out(is_lse ? 4 * Mr : 0);
    if (is_lse) {
      fill_targets<<<256, 256>>>(static_cast<int32_t*>(targets.ptr), Mr, s.N);
      CHECK_CUDA(cudaGetLastError());
    }
    if (is_rope) {
      fill_positions<<<256, 256>>>(static_cast<int32_t*>(positions.ptr), Mr);
      std::vector<float> freq(static_cast<size_t>(s.hd / 2));
      for (size_t i = 0; i < freq.size(); ++i) freq[i] = std::pow(500000.0f, -2.0f * i / s.hd);
      CHECK_CUDA(cudaMemcpy(inv_freq.ptr, freq.data(), freq.size() * 4, cudaMemcpyHostToDevice));
    }
    std::string const unfused_form = is_norm     ? "gemm+residual_rmsnorm"
                                     : is_swiglu ? "prescale+gemm+swiglu"
                                     : is_rope   ? "prescale+gemm+rope"
                                     : is_lse    ? "prescale+gemm+lse"
                                     : prescale  ? "prescale+gemm" : "gemm+postscale";

    std::function<void(int)> run_cublas, run_coda, run_unfused;
    size_t peak_cublas = 0, peak_coda = 0, peak_unfused = 0;
    if (is_norm) {
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
    } else if (is_lse) {
      run_cublas = [&](int set) { cublas_linear(cublas, at(as, set), at(ws, set), out0.ptr, s.M, s.N, s.K); };
      run_coda = [&](int set) {
        coda_tensor const h = matrix(at(as, set), CODA_BF16, s.M, s.K, dev);
        coda_tensor const w = matrix(at(ws, set), CODA_BF16, s.N, s.K, dev);
        coda_tensor const rstd = vec1d(at(ss, set), CODA_FP32, s.M, dev);
        coda_tensor const tg = vec1d(targets.ptr, CODA_INT32, s.M, dev);
        coda_tensor lse = vec1d(lse_out.ptr, CODA_FP32, s.M, dev), tl = vec1d(tl_out.ptr, CODA_FP32, s.M, dev);
        check_coda(coda_linear_rowscale_lse(&h, &w, &rstd, &tg, 0.0f, -100, &lse, &tl, nullptr, workspace.ptr,
                                            ws_bytes, nullptr),
                   "coda_linear_rowscale_lse " + s.op);
      };
      run_unfused = [&](int set) {
        launch_rowscale(at(as, set), static_cast<float const*>(at(ss, set)), s.M, s.K, temp.ptr);
        cublas_linear(cublas, temp.ptr, at(ws, set), out0.ptr, s.M, s.N, s.K);
        lse_kernel<<<static_cast<unsigned>(s.M), kLseThreads>>>(
            static_cast<__nv_bfloat16 const*>(out0.ptr), s.N, static_cast<int32_t const*>(targets.ptr),
            static_cast<float*>(lse_out.ptr), static_cast<float*>(tl_out.ptr));
        CHECK_CUDA(cudaGetLastError());
      };
      size_t const small = targets.bytes + lse_out.bytes + tl_out.bytes;
      peak_cublas = 2 * (MK + NK) + out0.bytes;
      peak_coda = in_bytes + small + ws_bytes;  // no logits
      peak_unfused = in_bytes + small + temp.bytes + out0.bytes;
    } else if (is_swiglu || is_rope) {
      run_cublas = [&](int set) { cublas_linear(cublas, at(as, set), at(ws, set), out0.ptr, s.M, s.N, s.K); };
      run_coda = [&](int set) {
        coda_tensor const h = matrix(at(as, set), CODA_BF16, s.M, s.K, dev);
        coda_tensor const w = matrix(at(ws, set), CODA_BF16, s.N, s.K, dev);
        coda_tensor const rstd = vec1d(at(ss, set), CODA_FP32, s.M, dev);
        coda_tensor o0 = matrix(out0.ptr, CODA_BF16, s.M, s.N, dev);
        if (is_swiglu) {
          coda_tensor y = matrix(out1.ptr, CODA_BF16, s.M, s.N / 2, dev);
          check_coda(coda_linear_rowscale_swiglu(&h, &w, &rstd, &o0, &y, workspace.ptr, ws_bytes, nullptr),
                     "coda_linear_rowscale_swiglu " + s.op);
        } else {
          coda_tensor const pos = vec1d(positions.ptr, CODA_INT32, s.M, dev);
          coda_tensor const freq = vec1d(inv_freq.ptr, CODA_FP32, s.hd / 2, dev);
          check_coda(coda_linear_rowscale_rope(&h, &w, &rstd, &pos, &freq, s.hq, s.hkv, s.hd, &o0, workspace.ptr,
                                               ws_bytes, nullptr),
                     "coda_linear_rowscale_rope " + s.op);
        }
      };
      run_unfused = [&](int set) {
        launch_rowscale(at(as, set), static_cast<float const*>(at(ss, set)), s.M, s.K, temp.ptr);
        cublas_linear(cublas, temp.ptr, at(ws, set), out0.ptr, s.M, s.N, s.K);
        if (is_swiglu) {
          launch_swiglu(out0.ptr, s.M, s.N / 2, out1.ptr);
        } else {
          launch_rope(out0.ptr, s.M, s.N, static_cast<int64_t>(s.hq + s.hkv) * s.hd, s.hd,
                      static_cast<int32_t const*>(positions.ptr), static_cast<float const*>(inv_freq.ptr));
        }
      };
      size_t const extra = positions.bytes + inv_freq.bytes;
      peak_cublas = 2 * (MK + NK) + out0.bytes;
      peak_coda = in_bytes + extra + out0.bytes + out1.bytes + ws_bytes;
      peak_unfused = in_bytes + extra + temp.bytes + out0.bytes + out1.bytes;
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
    if (opt.sweep) {
      // Every compiled config of the op (coda_fused_op_configs) x knob sets, each against cuBLAS in one interleaved
      // measurement.
      std::vector<std::string> const pins = coda_bench::sweep_pins(coda_bench::fused_configs(s.fused.c_str()));
      std::vector<coda_bench::SweepPoint> const pts =
          coda_bench::sweep_knobs(timer, opt.warmup, sets, pins, run_cublas, run_coda);
      coda_bench::report_sweep(jsonl, "fused_sweep", s.op, s.config, s.M, s.N, s.K, pts, commit, gpu, date);
    }
    vs_cublas[s.fused].add(ms_coda / ms_cublas);
    vs_unfused[s.fused].add(ms_unfused / ms_coda);
    std::printf("%-11s %-28s %7lld %7lld %7lld | %9.4f %9.4f %9.4f | %9.3f %9.3f | %s\n", s.config.c_str(),
                s.op.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                ms_cublas, ms_coda, ms_unfused, ms_coda / ms_cublas, ms_unfused / ms_coda, unfused_form.c_str());
    std::fflush(stdout);
  }

  std::printf("\n");
  Geo all_cublas, all_unfused;  // over the issue's set: each fused op at its own GEMM (not linear_rowscale)
  for (auto const& [key, g] : vs_cublas) {
    Geo const& u = vs_unfused[key];
    std::printf("%s over %d shapes: CODA/cuBLAS-GEMM time geometric mean %.3f (min %.3f, max %.3f; 1.0 = "
                "epilogue for free); unfused/CODA speedup geometric mean %.3f (min %.3f, max %.3f)\n",
                key.c_str(), g.n, g.mean(), g.lo, g.hi, u.mean(), u.lo, u.hi);
    if (key == "linear_rowscale") continue;
    all_cublas.log_sum += g.log_sum, all_cublas.n += g.n;
    all_unfused.log_sum += u.log_sum, all_unfused.n += u.n;
  }
  if (all_cublas.n > 0) {
    std::printf("fused ops at their own GEMMs (linear_residual_rmsnorm out/down, linear_rowscale_swiglu gate/up, "
                "linear_rowscale_rope qkv, linear_rowscale_lse lm_head) over %d shapes: CODA/cuBLAS time "
                "geometric mean %.3f; unfused/CODA speedup geometric mean %.3f\n",
                all_cublas.n, all_cublas.mean(), all_unfused.mean());
  }
  std::printf("wall time %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
  if (jsonl != nullptr) std::fclose(jsonl);
  cublasDestroy(cublas);
  return 0;
}
