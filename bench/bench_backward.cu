// bench_backward: CODA's fused backward ops against the bare cuBLAS dgrad GEMM and an unfused pipeline, and the
// memory of the LM head + cross-entropy forward with and without stored logits (docs/PROTOCOL.md).
//
// Ops (bf16), each at its own GEMM shape of llama3-1B/8B/70B (kModels), M = --tokens rows (16384 by default); the
// --ops names are the op names (and lm_head), a shape's `op` label adds `@gemm` where one op runs at several GEMMs:
//   linear_residual_rmsnorm_bwd (coda_linear_residual_rmsnorm_bwd, docs/MATH.md): the dgrad D = alpha dz w of a
//           linear whose input was a = rstd * x * gamma, with the RMSNorm backward in its epilogue; dx accumulated in
//           place into the residual gradient (dx_out aliases dx_in, as the block backward runs it). At the three
//           places of a LLaMA block:
//             linear_residual_rmsnorm_bwd@qkv     dz [M,(hq+2hkv)hd], w [(hq+2hkv)hd, d]
//             linear_residual_rmsnorm_bwd@gate_up dz [M,2F],          w [2F, d]
//             linear_residual_rmsnorm_bwd@lm_head dz [M,V],           w [V, d], alpha = 1/M   (V = 128256)
//           Other inputs: x [M,d], gamma [d], rstd [M] fp32 in [0.5,1.5], zdz [M] fp32 in [-0.01,0.01]. JSON M,N,K
//           = M, d, N' (the GEMM D[M,d] = dz[M,N'] w[N',d]).
//   linear_swiglu_bwd_zdz (coda_linear_swiglu_bwd_zdz, docs/MATH.md) at the down projection: dy = dx w_down fused
//           with the SwiGLU backward: dx [M,d], w_down [d,F], z [M,2F] (interleaved gate/up) -> dz [M,2F], y [M,F],
//           zdz [M] fp32. JSON M,N,K = M, F, d. Any failed CODA status exits.
//   lm_head the LM head + cross-entropy FORWARD (M = 8192 tokens unless --tokens is given, V = 128256, K = d, mean
//           loss, coda_ce_options_default()): peak device memory and time. JSON pass "fwd", M,N,K = M, V, d.
//
// Method of the timings, as bench_fused: CUDA events around each launch, --warmup launches of every variant first,
// an L2 flush (a memset of 2x the L2 size) before every timed launch, the median of --reps (>= 20), input sets
// rotated when one set of inputs would fit in twice the L2 (never for lm_head: w alone is >= 500 MB), and all
// variants of a shape timed interleaved launch by launch (cublas, coda, unfused, cublas, ...). The first CODA call
// of a shape (it may select or tune a kernel) runs alone before, its host time reported as tune_ms.
//
// Variants of linear_residual_rmsnorm_bwd and linear_swiglu_bwd_zdz (all write to preallocated outputs; nothing is
// allocated inside a timed launch):
//   cublas  : cublasGemmEx of the dgrad alone (bf16 in/out, fp32 compute, default algo), D[M,N] = alpha dz[M,K]
//             w[K,N] with both operands row-major as stored (cublas_dgrad). The speed-of-light bar.
//   coda    : the public C ABI call, with workspace from its *_workspace_size function; host validation included.
//   unfused : cuBLAS + simple vectorized kernels of this file, as an unfused framework runs it:
//             linear_residual_rmsnorm_bwd: cublas_dgrad -> bf16 temp D[M,N] (alpha in the GEMM);
//                 rmsnorm_bwd_kernel (16-byte accesses, every row handled by a whole block, kRowsPerBlock
//                 consecutive rows per block): c = x rstd, dx = dx_in + rstd (D gamma - alpha zdz c) in place,
//                 a = bf16(c gamma), and the block's column sums of D c into fp32 partials [ceil(M/kRowsPerBlock), N];
//                 then colsum_kernel adds the partials over the row blocks in a fixed order into dgamma [N] fp32
//                 (deterministic). Form "gemm+rmsnorm_bwd+colsum".
//             linear_swiglu_bwd_zdz: cublas_dgrad -> bf16 temp dy[M,F]; swiglu_bwd_kernel, one block per row,
//                 16-byte accesses, fp32 math: dz, y and zdz[m] = (1/d) sum_i (g dz[2i] + u dz[2i+1]) (from the
//                 fp32 dz, before rounding). Form "gemm+swiglu_bwd_zdz".
// TFLOP/s of every variant is 2MNK / time (the GEMM's flops only); peak_gib is the sum of the variant's buffers
// (one input set).
//
// Variants of lm_head (each with its own buffers):
//   cublas       : cublasGemmEx logits[M,V] bf16 = h w^T alone (the speed-of-light bar).
//   coda         : coda_linear_cross_entropy(h, w, rstd, targets int32, default options, chunk_rows 0 = default)
//                  -> loss [] fp32, lse [M] fp32, workspace from coda_linear_cross_entropy_workspace_size. Logits
//                  never stored.
//   materialized : cublasGemmEx logits[M,V] bf16 = hs w^T (hs: an input already row-scaled, so no rstd), then
//                  coda_cross_entropy(logits, targets) -> loss [] fp32 (no gradient), workspace from
//                  coda_cross_entropy_workspace_size.
//   Peak memory, measured per variant with cudaMemGetInfo: first one untimed run of the variant with its buffers
//   allocated and freed again (lazy module loads, cuBLAS's workspace, CODA's first-call selection stay out of the
//   figure); then used = total - free read, every buffer of the variant allocated, the variant run once,
//   synchronized, used read again: peak_measured_mib = the difference (cudaMalloc rounds to pages), alloc_mib = the
//   sum of the buffer sizes. The buffers are freed before the next variant, so the measurements never overlap; the
//   timing then allocates all three variants' buffers together.
// Output: a table, a summary per op (geometric means of coda/cublas time and of unfused/coda speedup; for lm_head
// also of the materialized/coda memory ratio) and, with --out, one JSON line per variant and shape.
#include <coda/coda.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_coda.hpp"
#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
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
using coda_bench::cublas_dgrad;
using coda_bench::device_used;
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
using coda_bench::SweepPoint;
using coda_bench::Timer;
using coda_bench::Timing;
using coda_bench::vec1d;

constexpr int64_t kLmHeadTokens = 8192;  // lm_head rows unless --tokens is given

// ---- shapes ------------------------------------------------------------------------------------------------------

enum class Kind { kResidualRmsnormBwd, kSwigluBwd, kLmHead };

struct Shape {
  std::string config;  // model name (PROTOCOL.md)
  std::string op;      // linear_residual_rmsnorm_bwd@qkv, @gate_up, @lm_head, linear_swiglu_bwd_zdz, lm_head
  std::string key;     // linear_residual_rmsnorm_bwd, linear_swiglu_bwd_zdz, lm_head (the --ops name)
  std::string fused;   // C ABI function name
  Kind kind = Kind::kResidualRmsnormBwd;
  int64_t M = 0, N = 0, K = 0;  // linear_residual_rmsnorm_bwd: M, d, N'; swiglu: M, F, d; lm_head: M, V, d
  float alpha = 1.0f;           // linear_residual_rmsnorm_bwd only
};

// The --ops names: the backward fused ops timed here and the LM head's forward memory.
std::set<std::string> const kOps{"linear_residual_rmsnorm_bwd", "linear_swiglu_bwd_zdz", "lm_head"};

struct Options : coda_bench::CommonOptions {
  std::set<std::string> models{"1B", "8B", "70B"};
  std::vector<int64_t> tokens{16384};
  bool tokens_given = false;  // lm_head runs at kLmHeadTokens unless --tokens is given
  std::set<std::string> ops = kOps;
  bool sweep = false;  // the fused ops: also time the compiled config x raster/swizzle knobs (CODA_OP_CONFIG pins)
};

void usage() {
  std::printf(
      "usage: bench_backward [options]\n"
      "  --quick                 llama3-1B shapes only\n"
      "  --models 1B,8B,70B      models of the LLaMA shape set (default all)\n"
      "  --tokens 16384[,...]    token counts M (default 16384 for the fused ops, 8192 for lm_head)\n"
      "  --ops OP[,OP...]        (default all) linear_residual_rmsnorm_bwd (qkv, gate_up, lm_head),\n"
      "                          linear_swiglu_bwd_zdz (down), lm_head linear_cross_entropy vs materialized logits\n"
      "                          (forward memory)\n"
      "  --sweep                 the fused ops: also time the config x raster/swizzle knobs (CODA_OP_CONFIG pins)\n"
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
      o.tokens_given = true;
      for (auto const& x : split(need(i), ',')) o.tokens.push_back(std::atoll(x.c_str()));
    } else if (a == "--ops") {
      o.ops.clear();
      for (std::string x : split(need(i), ',')) {
        if (x == "head" || x == "linear_cross_entropy") x = "lm_head";
        if (kOps.count(x) == 0) {
          std::fprintf(stderr, "unknown op %s (linear_residual_rmsnorm_bwd, linear_swiglu_bwd_zdz, lm_head)\n",
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
  if (o.warmup < 1) o.warmup = 1;
  if (o.reps < 20) std::fprintf(stderr, "note: --reps %d is below PROTOCOL.md's minimum of 20\n", o.reps);
  if (o.tokens.empty()) {
    std::fprintf(stderr, "--tokens: no row count given\n");
    std::exit(2);
  }
  for (int64_t t : o.tokens) {
    if (t < 1) {
      std::fprintf(stderr, "--tokens: %lld is not a positive row count\n", static_cast<long long>(t));
      std::exit(2);
    }
  }
  return o;
}

/// The fused ops' shapes of every selected model first, then the lm_head shapes (their own table).
std::vector<Shape> shape_set(Options const& o) {
  std::vector<Shape> bwd, head;
  std::vector<int64_t> const head_tokens = o.tokens_given ? o.tokens : std::vector<int64_t>{kLmHeadTokens};
  for (Model const& m : kModels) {
    if (o.models.count(m.short_name) == 0 && o.models.count(m.name) == 0) continue;
    for (int64_t t : o.tokens) {
      if (o.ops.count("linear_residual_rmsnorm_bwd") != 0) {
        char const* f = "linear_residual_rmsnorm_bwd";
        Kind const k = Kind::kResidualRmsnormBwd;
        bwd.push_back({m.name, "linear_residual_rmsnorm_bwd@qkv", f, f, k, t, m.d, (m.hq + 2 * m.hkv) * m.hd});
        bwd.push_back({m.name, "linear_residual_rmsnorm_bwd@gate_up", f, f, k, t, m.d, 2 * m.F});
        bwd.push_back({m.name, "linear_residual_rmsnorm_bwd@lm_head", f, f, k, t, m.d, m.V,
                       1.0f / static_cast<float>(t)});
      }
      if (o.ops.count("linear_swiglu_bwd_zdz") != 0) {
        char const* f = "linear_swiglu_bwd_zdz";
        bwd.push_back({m.name, f, f, f, Kind::kSwigluBwd, t, m.F, m.d});
      }
    }
    if (o.ops.count("lm_head") != 0) {
      for (int64_t t : head_tokens) {
        head.push_back({m.name, "lm_head", "lm_head", "linear_cross_entropy", Kind::kLmHead, t, m.V, m.d});
      }
    }
  }
  bwd.insert(bwd.end(), head.begin(), head.end());
  return bwd;
}

// ---- unfused epilogue kernels ------------------------------------------------------------------------------------

constexpr int kRowThreads = 256;
constexpr int kRowsPerBlock = 32;  // rows of one rmsnorm_bwd_kernel block (one dgamma partial row per block)
constexpr int kColWarps = 8;       // warps of one colsum_kernel block

/// linear_residual_rmsnorm_bwd's unfused epilogue over packed [rows, n] bf16 matrices (n a multiple of 8, at most
/// 8 * kRowThreads * kVecs).
/// Block b handles rows [b kRowsPerBlock, (b+1) kRowsPerBlock) one after the other, the whole block on one row,
/// each thread on the same 8-column groups of every row (16-byte accesses); with c = x * rstd (fp32):
///   dx = dx + rstd * (D * gamma - alpha * zdz * c)   (in place: dx is dx_in and dx_out),  a = bf16(c * gamma),
/// and partials[b, col] = sum over the block's rows of D * c (fp32, kept in registers, then one store per column).
template <int kVecs>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_bwd_kernel(
    __nv_bfloat16 const* __restrict__ d, __nv_bfloat16 const* __restrict__ x, __nv_bfloat16 const* __restrict__ gamma,
    float const* __restrict__ rstd, float const* __restrict__ zdz, float alpha, int64_t rows, int64_t n,
    __nv_bfloat16* dx, __nv_bfloat16* __restrict__ a, float* __restrict__ partials) {
  int64_t const nvec = n / 8;
  int64_t const row0 = int64_t{blockIdx.x} * kRowsPerBlock;
  int64_t const row_end = row0 + kRowsPerBlock < rows ? row0 + kRowsPerBlock : rows;
  float g[kVecs][8], acc[kVecs][8];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    int64_t const v = threadIdx.x + int64_t{k} * kRowThreads;
    uint4 const gv = v < nvec ? __ldg(reinterpret_cast<uint4 const*>(gamma) + v) : uint4{0, 0, 0, 0};
    auto const* g2 = reinterpret_cast<__nv_bfloat162 const*>(&gv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 const f = __bfloat1622float2(g2[j]);
      g[k][2 * j] = f.x, g[k][2 * j + 1] = f.y;
      acc[k][2 * j] = 0.0f, acc[k][2 * j + 1] = 0.0f;
    }
  }
  for (int64_t m = row0; m < row_end; ++m) {
    float const r = __ldg(rstd + m), zz = alpha * __ldg(zdz + m);
    uint4 const* dv = reinterpret_cast<uint4 const*>(d + m * n);
    uint4 const* xv = reinterpret_cast<uint4 const*>(x + m * n);
    uint4* dxv = reinterpret_cast<uint4*>(dx + m * n);
    uint4* av = reinterpret_cast<uint4*>(a + m * n);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      int64_t const v = threadIdx.x + int64_t{k} * kRowThreads;
      if (v < nvec) {
        uint4 const dd = dv[v], xx = xv[v], di = dxv[v];
        uint4 dxo, ao;
        auto const* d2 = reinterpret_cast<__nv_bfloat162 const*>(&dd);
        auto const* x2 = reinterpret_cast<__nv_bfloat162 const*>(&xx);
        auto const* i2 = reinterpret_cast<__nv_bfloat162 const*>(&di);
        auto* o2 = reinterpret_cast<__nv_bfloat162*>(&dxo);
        auto* a2 = reinterpret_cast<__nv_bfloat162*>(&ao);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float2 const fd = __bfloat1622float2(d2[j]), fx = __bfloat1622float2(x2[j]), fi = __bfloat1622float2(i2[j]);
          float const c0 = fx.x * r, c1 = fx.y * r;
          float const g0 = g[k][2 * j], g1 = g[k][2 * j + 1];
          o2[j] = __floats2bfloat162_rn(fi.x + r * (fd.x * g0 - zz * c0), fi.y + r * (fd.y * g1 - zz * c1));
          a2[j] = __floats2bfloat162_rn(c0 * g0, c1 * g1);
          acc[k][2 * j] += fd.x * c0;
          acc[k][2 * j + 1] += fd.y * c1;
        }
        dxv[v] = dxo;
        av[v] = ao;
      }
    }
  }
  float4* pv = reinterpret_cast<float4*>(partials + int64_t{blockIdx.x} * n);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    int64_t const v = threadIdx.x + int64_t{k} * kRowThreads;
    if (v < nvec) {
      pv[2 * v] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
      pv[2 * v + 1] = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
    }
  }
}

/// out[col] = sum_b partials[b, col] over b = 0 .. blocks-1 in a fixed order (deterministic): 32 columns per block
/// (coalesced), warp w adds the rows b = w, w + kColWarps, ... in order, then lane `col` of warp 0 adds the warp
/// sums in warp order.
__global__ void __launch_bounds__(32 * kColWarps) colsum_kernel(float const* __restrict__ partials, int64_t blocks,
                                                                int64_t n, float* __restrict__ out) {
  int const lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int64_t const col = int64_t{blockIdx.x} * 32 + lane;
  float s = 0.0f;
  if (col < n) {
#pragma unroll 4
    for (int64_t b = warp; b < blocks; b += kColWarps) s += partials[b * n + col];
  }
  __shared__ float sums[kColWarps][32];
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && col < n) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kColWarps; ++w) t += sums[w][lane];
    out[col] = t;
  }
}

/// linear_swiglu_bwd_zdz's unfused epilogue, one block per row of packed dy [rows, F], z and dz [rows, 2F]
/// (interleaved), y [rows, F] (F a multiple of 8): 8 dy and 16 z values in, 16 dz and 8 y values out per step
/// (16-byte accesses). Per pair (g, u) = (z[2i], z[2i+1]), s = sigmoid(g) in fp32: dz[2i] = dy u s (1 + g (1 - s)),
/// dz[2i+1] = dy silu(g), y = silu(g) u, and zdz[m] = inv_d * sum_i (g dz[2i] + u dz[2i+1]) from the fp32 dz (per
/// thread, then warp shuffles, then warps in order: fixed).
__global__ void __launch_bounds__(kRowThreads) swiglu_bwd_kernel(__nv_bfloat16 const* __restrict__ dy,
                                                                  __nv_bfloat16 const* __restrict__ z, int64_t F,
                                                                  float inv_d, __nv_bfloat16* __restrict__ dz,
                                                                  __nv_bfloat16* __restrict__ y,
                                                                  float* __restrict__ zdz) {
  int64_t const row = blockIdx.x;
  uint4 const* dyv = reinterpret_cast<uint4 const*>(dy + row * F);
  uint4 const* zv = reinterpret_cast<uint4 const*>(z + row * 2 * F);
  uint4* dzv = reinterpret_cast<uint4*>(dz + row * 2 * F);
  uint4* yv = reinterpret_cast<uint4*>(y + row * F);
  float dot = 0.0f;
  for (int64_t v = threadIdx.x; v < F / 8; v += blockDim.x) {
    uint4 const dd = dyv[v];
    uint4 const zin[2] = {zv[2 * v], zv[2 * v + 1]};
    uint4 zout[2], yo;
    auto const* d2 = reinterpret_cast<__nv_bfloat162 const*>(&dd);
    auto const* p2 = reinterpret_cast<__nv_bfloat162 const*>(zin);
    auto* q2 = reinterpret_cast<__nv_bfloat162*>(zout);
    auto* y2 = reinterpret_cast<__nv_bfloat162*>(&yo);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 const fd = __bfloat1622float2(d2[j]);
      float out_y[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float2 const gu = __bfloat1622float2(p2[2 * j + h]);
        float const dyj = h == 0 ? fd.x : fd.y;
        float const s = 1.0f / (1.0f + __expf(-gu.x)), silu = gu.x * s;
        float const dg = dyj * gu.y * s * (1.0f + gu.x * (1.0f - s)), du = dyj * silu;
        q2[2 * j + h] = __floats2bfloat162_rn(dg, du);
        out_y[h] = silu * gu.y;
        dot += gu.x * dg + gu.y * du;
      }
      y2[j] = __floats2bfloat162_rn(out_y[0], out_y[1]);
    }
    dzv[2 * v] = zout[0];
    dzv[2 * v + 1] = zout[1];
    yv[v] = yo;
  }
  __shared__ float warp_sums[kRowThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = dot;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kRowThreads / 32; ++w) total += warp_sums[w];
    zdz[row] = total * inv_d;
  }
}

int64_t rmsnorm_bwd_blocks(int64_t M) { return (M + kRowsPerBlock - 1) / kRowsPerBlock; }

void launch_rmsnorm_bwd(void const* d, void const* x, void const* gamma, float const* rstd, float const* zdz,
                        float alpha, int64_t M, int64_t N, void* dx, void* a, float* partials, float* dgamma) {
  auto const* dp = static_cast<__nv_bfloat16 const*>(d);
  auto const* xp = static_cast<__nv_bfloat16 const*>(x);
  auto const* gp = static_cast<__nv_bfloat16 const*>(gamma);
  auto* dxp = static_cast<__nv_bfloat16*>(dx);
  auto* ap = static_cast<__nv_bfloat16*>(a);
  int64_t const blocks = rmsnorm_bwd_blocks(M);
  int64_t const per_thread = (N / 8 + kRowThreads - 1) / kRowThreads;
  dim3 const grid(static_cast<unsigned>(blocks)), block(kRowThreads);
  if (per_thread <= 1) {
    rmsnorm_bwd_kernel<1><<<grid, block>>>(dp, xp, gp, rstd, zdz, alpha, M, N, dxp, ap, partials);
  } else if (per_thread <= 2) {
    rmsnorm_bwd_kernel<2><<<grid, block>>>(dp, xp, gp, rstd, zdz, alpha, M, N, dxp, ap, partials);
  } else if (per_thread <= 4) {
    rmsnorm_bwd_kernel<4><<<grid, block>>>(dp, xp, gp, rstd, zdz, alpha, M, N, dxp, ap, partials);
  } else if (per_thread <= 8) {
    rmsnorm_bwd_kernel<8><<<grid, block>>>(dp, xp, gp, rstd, zdz, alpha, M, N, dxp, ap, partials);
  } else {
    std::fprintf(stderr, "rmsnorm_bwd_kernel: N = %lld is above %d\n", static_cast<long long>(N),
                 8 * 8 * kRowThreads);
    std::exit(1);
  }
  CHECK_CUDA(cudaGetLastError());
  colsum_kernel<<<static_cast<unsigned>((N + 31) / 32), 32 * kColWarps>>>(partials, blocks, N, dgamma);
  CHECK_CUDA(cudaGetLastError());
}

void launch_swiglu_bwd(void const* dy, void const* z, int64_t M, int64_t F, int64_t d, void* dz, void* y,
                       float* zdz) {
  swiglu_bwd_kernel<<<static_cast<unsigned>(M), kRowThreads>>>(
      static_cast<__nv_bfloat16 const*>(dy), static_cast<__nv_bfloat16 const*>(z), F,
      1.0f / static_cast<float>(d), static_cast<__nv_bfloat16*>(dz), static_cast<__nv_bfloat16*>(y), zdz);
  CHECK_CUDA(cudaGetLastError());
}

// ---- cuBLAS, CODA and memory helpers -----------------------------------------------------------------------------

/// A rank-0 (scalar) tensor descriptor.
coda_tensor scalar(void* p, coda_dtype t, int device) {
  coda_tensor x{};
  x.data = p;
  x.dtype = t;
  x.rank = 0;
  x.device = device;
  return x;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string strf(char const* f, ...) __attribute__((format(printf, 1, 2)));
std::string strf(char const* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---- one benchmark run -------------------------------------------------------------------------------------------

struct Run {
  Options const* opt = nullptr;
  cublasHandle_t cublas = nullptr;
  Timer* timer = nullptr;
  FILE* jsonl = nullptr;
  std::string gpu, commit, date;
  size_t l2 = 0;
  int dev = 0;
  std::map<std::string, Geo> vs_cublas, vs_unfused, mem_ratio;  // per --ops name (Shape::key)
};

/// Input sets to rotate through: enough that they do not all fit in twice the L2 (at most 4).
int input_sets(Run const& r, size_t in_bytes) {
  return static_cast<int>(std::clamp<size_t>((2 * r.l2 + in_bytes - 1) / std::max<size_t>(in_bytes, 1), 1, 4));
}

/// The first CODA call of a shape, alone and host-timed (returns tune_ms); any failure exits.
double first_coda_call(Shape const& s, std::function<coda_status()> const& call) {
  CHECK_CUDA(cudaDeviceSynchronize());
  auto const t0 = std::chrono::steady_clock::now();
  check_coda(call(), "coda_" + s.fused + " " + s.op);
  CHECK_CUDA(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// One JSON line. time_vs_cublas, speedup and tune_ms are written as null when not positive, unfused_form when
/// empty; `extra` is appended inside the object (starts with a comma, or is empty).
void emit(Run const& r, Shape const& s, char const* pass, std::string const& variant, Timing const& t,
          double peak_gib, double time_vs_cublas, double speedup, std::string const& unfused_form, double tune_ms,
          int sets, std::string const& extra) {
  if (r.jsonl == nullptr) return;
  double const flop = 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
  std::string const form = unfused_form.empty() ? "null" : "\"" + json_escape(unfused_form) + "\"";
  std::fprintf(r.jsonl,
               "{\"suite\":\"backward\",\"op\":\"%s\",\"fused_op\":\"%s\",\"config\":\"%s\",\"M\":%lld,\"N\":%lld,"
               "\"K\":%lld,\"pass\":\"%s\",\"variant\":\"%s\",\"ms\":%.6f,\"ms_min\":%.6f,\"tflops\":%.3f,"
               "\"peak_gib\":%.4f,\"commit\":\"%s\",\"gpu\":\"%s\",\"date\":\"%s\",\"dtype\":\"bf16\","
               "\"ratio_vs_cublas\":%s,\"time_vs_cublas\":%s,\"speedup_vs_unfused\":%s,\"unfused_form\":%s,"
               "\"tune_ms\":%s,\"reps\":%d,\"l2_flush\":%s,\"input_sets\":%d%s}\n",
               json_escape(s.op).c_str(), json_escape(s.fused).c_str(), json_escape(s.config).c_str(),
               static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K), pass,
               variant.c_str(), t.median_ms, t.min_ms, flop / (t.median_ms * 1e9), peak_gib,
               json_escape(r.commit).c_str(), json_escape(r.gpu).c_str(), r.date.c_str(),
               num_or_null(time_vs_cublas > 0.0 ? 1.0 / time_vs_cublas : 0.0).c_str(),
               num_or_null(time_vs_cublas).c_str(), num_or_null(speedup).c_str(), form.c_str(),
               num_or_null(tune_ms).c_str(), r.opt->reps, r.opt->flush ? "true" : "false", sets, extra.c_str());
  std::fflush(r.jsonl);
}

/// --sweep: the op's compiled bf16 configs under each raster/swizzle pin, against cuBLAS in one measurement.
void sweep_bwd(Run& r, Shape const& s, int sets, std::vector<std::string> const& configs,
               std::function<void(int)> const& run_cublas, std::function<void(int)> const& run_coda) {
  if (!r.opt->sweep) return;
  std::vector<SweepPoint> const pts = coda_bench::sweep_knobs(*r.timer, r.opt->warmup, sets,
                                                              coda_bench::sweep_pins(configs), run_cublas, run_coda);
  coda_bench::report_sweep(r.jsonl, "backward_sweep", s.op, s.config, s.M, s.N, s.K, pts, r.commit, r.gpu, r.date);
}

/// Reports the three timed variants (cublas, coda, unfused) of a fused op's shape: JSON lines, table row, summary.
void report_bwd(Run& r, Shape const& s, std::vector<Timing> const& t, std::vector<size_t> const& peaks,
                std::string const& unfused_form, double tune_ms, int sets, std::string const& extra) {
  std::vector<std::string> const names{"cublas", "coda", "unfused"};
  double const ms_cublas = t[0].median_ms, ms_coda = t[1].median_ms, ms_unfused = t[2].median_ms;
  for (size_t v = 0; v < names.size(); ++v) {
    bool const cub = names[v] == "cublas", coda = names[v] == "coda", unf = names[v] == "unfused";
    emit(r, s, "bwd", names[v], t[v], gib(peaks[v]), cub ? 0.0 : t[v].median_ms / ms_cublas,
         coda ? ms_unfused / ms_coda : 0.0, unf ? unfused_form : "", coda ? tune_ms : 0.0, sets, extra);
  }
  r.vs_cublas[s.key].add(ms_coda / ms_cublas);
  r.vs_unfused[s.key].add(ms_unfused / ms_coda);
  std::printf("%-11s %-35s %7lld %7lld %7lld | %9.4f %9.4f %9.4f | %9.3f %9.3f | %s\n", s.config.c_str(),
              s.op.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
              ms_cublas, ms_coda, ms_unfused, ms_coda / ms_cublas, ms_unfused / ms_coda, unfused_form.c_str());
  std::fflush(stdout);
}

using BufferList = std::vector<std::unique_ptr<Buffer>>;

void* add_buffer(BufferList& list, size_t bytes) {
  list.push_back(std::make_unique<Buffer>(bytes));
  return list.back()->ptr;
}

void* at(BufferList const& v, int set) { return v[static_cast<size_t>(set)]->ptr; }

// ---- linear_residual_rmsnorm_bwd ---------------------------------------------------------------------------------

void bench_residual_rmsnorm_bwd(Run& r, Shape const& s) {
  int const dev = r.dev;
  size_t const Mr = static_cast<size_t>(s.M), Nr = static_cast<size_t>(s.N), Kr = static_cast<size_t>(s.K);
  size_t const MK = Mr * Kr, KN = Kr * Nr, MN = Mr * Nr;
  // Inputs of one set: dz, w, x, gamma, rstd, zdz, and dx (the residual gradient, updated in place).
  size_t const in_bytes = 2 * (MK + KN + MN + Nr + MN) + 4 * 2 * Mr;
  int const sets = input_sets(r, in_bytes);
  BufferList dzs, ws, xs, gs, rs, zs, dxs;
  for (int i = 0; i < sets; ++i) {
    uint64_t const seed = static_cast<uint64_t>(i);
    fill_random(add_buffer(dzs, 2 * MK), MK, 1000 + seed, 1.0f);
    fill_random(add_buffer(ws, 2 * KN), KN, 2000 + seed, 0.05f);
    fill_random(add_buffer(xs, 2 * MN), MN, 3000 + seed, 1.0f);
    fill_random(add_buffer(gs, 2 * Nr), Nr, 4000 + seed, 1.0f);
    fill_f32<<<256, 256>>>(static_cast<float*>(add_buffer(rs, 4 * Mr)), Mr, 5000 + seed, 0.5f, 1.5f);
    fill_f32<<<256, 256>>>(static_cast<float*>(add_buffer(zs, 4 * Mr)), Mr, 6000 + seed, -0.01f, 0.01f);
    CHECK_CUDA(cudaGetLastError());
    fill_random(add_buffer(dxs, 2 * MN), MN, 7000 + seed, 0.01f);
  }
  // Outputs and temporaries shared by the variants (every launch overwrites them completely).
  size_t const ws_bytes = coda_linear_residual_rmsnorm_bwd_workspace_size(s.M, s.N);
  int64_t const blocks = rmsnorm_bwd_blocks(s.M);
  Buffer workspace(ws_bytes), a_out(2 * MN), dgamma(4 * Nr), temp(2 * MN);
  Buffer partials(4 * static_cast<size_t>(blocks) * Nr);
  CHECK_CUDA(cudaDeviceSynchronize());

  auto coda_call = [&](int set) {
    coda_tensor const dz = matrix(at(dzs, set), CODA_BF16, s.M, s.K, dev);
    coda_tensor const w = matrix(at(ws, set), CODA_BF16, s.K, s.N, dev);
    coda_tensor const x = matrix(at(xs, set), CODA_BF16, s.M, s.N, dev);
    coda_tensor const g = vec1d(at(gs, set), CODA_BF16, s.N, dev);
    coda_tensor const rstd = vec1d(at(rs, set), CODA_FP32, s.M, dev);
    coda_tensor const zdz = vec1d(at(zs, set), CODA_FP32, s.M, dev);
    coda_tensor dx = matrix(at(dxs, set), CODA_BF16, s.M, s.N, dev);  // dx_in and dx_out: in place
    coda_tensor a = matrix(a_out.ptr, CODA_BF16, s.M, s.N, dev);
    coda_tensor dg = vec1d(dgamma.ptr, CODA_FP32, s.N, dev);
    return coda_linear_residual_rmsnorm_bwd(&dz, &w, &x, &g, &rstd, &zdz, &dx, s.alpha, &dx, &a, &dg,
                                            workspace.ptr, ws_bytes, nullptr);
  };
  double const tune_ms = first_coda_call(s, [&] { return coda_call(0); });

  auto run_cublas = [&](int set) {
    cublas_dgrad(r.cublas, at(dzs, set), at(ws, set), temp.ptr, s.M, s.N, s.K, s.alpha);
  };
  auto run_coda = [&](int set) { check_coda(coda_call(set), "coda_linear_residual_rmsnorm_bwd " + s.op); };
  auto run_unfused = [&](int set) {
    cublas_dgrad(r.cublas, at(dzs, set), at(ws, set), temp.ptr, s.M, s.N, s.K, s.alpha);
    launch_rmsnorm_bwd(temp.ptr, at(xs, set), at(gs, set), static_cast<float const*>(at(rs, set)),
                       static_cast<float const*>(at(zs, set)), s.alpha, s.M, s.N, at(dxs, set), a_out.ptr,
                       static_cast<float*>(partials.ptr), static_cast<float*>(dgamma.ptr));
  };
  std::vector<Timing> const t = r.timer->measure_interleaved(r.opt->warmup, sets, {run_cublas, run_coda, run_unfused});

  size_t const inputs = in_bytes, outputs = a_out.bytes + dgamma.bytes;
  std::vector<size_t> const peaks{2 * (MK + KN) + temp.bytes, inputs + outputs + ws_bytes,
                                  inputs + outputs + temp.bytes + partials.bytes};
  report_bwd(r, s, t, peaks, "gemm+rmsnorm_bwd+colsum", tune_ms, sets, strf(",\"alpha\":%.9g", s.alpha));
  sweep_bwd(r, s, sets, coda_bench::fused_configs("coda_linear_residual_rmsnorm_bwd"), run_cublas, run_coda);
}

// ---- linear_swiglu_bwd_zdz ---------------------------------------------------------------------------------------

void bench_swiglu_bwd(Run& r, Shape const& s) {
  int const dev = r.dev;
  int64_t const F = s.N, d = s.K;
  size_t const Mr = static_cast<size_t>(s.M), Fr = static_cast<size_t>(F), dr = static_cast<size_t>(d);
  size_t const Md = Mr * dr, dF = dr * Fr, MF = Mr * Fr;
  // Inputs of one set: dx, w_down, z.
  size_t const in_bytes = 2 * (Md + dF + 2 * MF);
  int const sets = input_sets(r, in_bytes);
  BufferList dxs, ws, zs;
  for (int i = 0; i < sets; ++i) {
    uint64_t const seed = static_cast<uint64_t>(i);
    fill_random(add_buffer(dxs, 2 * Md), Md, 1000 + seed, 1.0f);
    fill_random(add_buffer(ws, 2 * dF), dF, 2000 + seed, 0.05f);
    fill_random(add_buffer(zs, 4 * MF), 2 * MF, 3000 + seed, 3.0f);
  }
  size_t const ws_bytes = coda_linear_swiglu_bwd_zdz_workspace_size(s.M, F);
  Buffer workspace(ws_bytes), dz_out(4 * MF), y_out(2 * MF), zdz_out(4 * Mr), temp(2 * MF);
  CHECK_CUDA(cudaDeviceSynchronize());

  auto coda_call = [&](int set) {
    coda_tensor const dx = matrix(at(dxs, set), CODA_BF16, s.M, d, dev);
    coda_tensor const w = matrix(at(ws, set), CODA_BF16, d, F, dev);
    coda_tensor const z = matrix(at(zs, set), CODA_BF16, s.M, 2 * F, dev);
    coda_tensor dz = matrix(dz_out.ptr, CODA_BF16, s.M, 2 * F, dev);
    coda_tensor y = matrix(y_out.ptr, CODA_BF16, s.M, F, dev);
    coda_tensor zdz = vec1d(zdz_out.ptr, CODA_FP32, s.M, dev);
    return coda_linear_swiglu_bwd_zdz(&dx, &w, &z, &dz, &y, &zdz, workspace.ptr, ws_bytes, nullptr);
  };
  double const tune_ms = first_coda_call(s, [&] { return coda_call(0); });

  auto run_cublas = [&](int set) { cublas_dgrad(r.cublas, at(dxs, set), at(ws, set), temp.ptr, s.M, F, d, 1.0f); };
  auto run_coda = [&](int set) { check_coda(coda_call(set), "coda_linear_swiglu_bwd_zdz " + s.op); };
  auto run_unfused = [&](int set) {
    cublas_dgrad(r.cublas, at(dxs, set), at(ws, set), temp.ptr, s.M, F, d, 1.0f);
    launch_swiglu_bwd(temp.ptr, at(zs, set), s.M, F, d, dz_out.ptr, y_out.ptr, static_cast<float*>(zdz_out.ptr));
  };
  std::vector<Timing> const t = r.timer->measure_interleaved(r.opt->warmup, sets, {run_cublas, run_coda, run_unfused});

  size_t const outputs = dz_out.bytes + y_out.bytes + zdz_out.bytes;
  std::vector<size_t> const peaks{2 * (Md + dF) + temp.bytes, in_bytes + outputs + ws_bytes,
                                  in_bytes + outputs + temp.bytes};
  report_bwd(r, s, t, peaks, "gemm+swiglu_bwd_zdz", tune_ms, sets, "");
  sweep_bwd(r, s, sets, coda_bench::fused_configs("coda_linear_swiglu_bwd_zdz"), run_cublas, run_coda);
}

// ---- lm_head: linear_cross_entropy vs materialized logits (forward) ----------------------------------------------

enum class Head { kCublas, kCoda, kMaterialized };

/// Every device buffer of one lm_head variant, allocated (and filled) together, freed together.
struct HeadBuffers {
  BufferList owned;
  size_t bytes = 0;
  void* h = nullptr;        // [M,d] bf16: coda h = x * gamma (row-scaled in the GEMM); else already row-scaled
  void* w = nullptr;        // [V,d] bf16
  void* rstd = nullptr;     // coda: [M] fp32
  void* targets = nullptr;  // coda, materialized: [M] int32
  void* logits = nullptr;   // cublas, materialized: [M,V] bf16
  void* loss = nullptr;     // coda, materialized: [] fp32 (mean)
  void* lse = nullptr;      // coda: [M] fp32
  void* ws = nullptr;       // coda, materialized: the op's workspace
  size_t ws_bytes = 0;
  void* add(size_t n) {
    if (n == 0) return nullptr;
    bytes += n;
    return add_buffer(owned, n);
  }
};

std::unique_ptr<HeadBuffers> head_buffers(Head v, Shape const& s) {
  auto b = std::make_unique<HeadBuffers>();
  size_t const Mr = static_cast<size_t>(s.M), Vr = static_cast<size_t>(s.N), dr = static_cast<size_t>(s.K);
  b->h = b->add(2 * Mr * dr);
  b->w = b->add(2 * Vr * dr);
  fill_random(b->h, Mr * dr, 1000, 1.0f);
  fill_random(b->w, Vr * dr, 2000, 0.05f);
  if (v == Head::kCoda) {
    b->rstd = b->add(4 * Mr);
    fill_f32<<<256, 256>>>(static_cast<float*>(b->rstd), Mr, 5000, 0.5f, 1.5f);
    CHECK_CUDA(cudaGetLastError());
    b->lse = b->add(4 * Mr);
    b->ws_bytes = coda_linear_cross_entropy_workspace_size(s.M, s.N, 0);
  } else {
    b->logits = b->add(2 * Mr * Vr);
  }
  if (v != Head::kCublas) {
    b->targets = b->add(4 * Mr);
    fill_targets<<<256, 256>>>(static_cast<int32_t*>(b->targets), Mr, s.N);
    CHECK_CUDA(cudaGetLastError());
    b->loss = b->add(4);
  }
  if (v == Head::kMaterialized) b->ws_bytes = coda_cross_entropy_workspace_size(s.M, s.N);
  b->ws = b->add(b->ws_bytes);
  CHECK_CUDA(cudaDeviceSynchronize());
  return b;
}

/// Enqueues one run of variant v; returns the CODA status (CODA_SUCCESS for cuBLAS alone).
coda_status head_call(Run const& r, Head v, Shape const& s, HeadBuffers const& b) {
  int const dev = r.dev;
  coda_ce_options const ce = coda_ce_options_default();
  coda_tensor const tg = vec1d(b.targets, CODA_INT32, s.M, dev);
  coda_tensor loss = scalar(b.loss, CODA_FP32, dev);
  if (v == Head::kCoda) {
    coda_tensor const h = matrix(b.h, CODA_BF16, s.M, s.K, dev);
    coda_tensor const w = matrix(b.w, CODA_BF16, s.N, s.K, dev);
    coda_tensor const rstd = vec1d(b.rstd, CODA_FP32, s.M, dev);
    coda_tensor lse = vec1d(b.lse, CODA_FP32, s.M, dev);
    return coda_linear_cross_entropy(&h, &w, &rstd, &tg, &ce, 0, &loss, &lse, b.ws, b.ws_bytes, nullptr);
  }
  cublas_linear(r.cublas, b.h, b.w, b.logits, s.M, s.N, s.K);
  if (v == Head::kCublas) return CODA_SUCCESS;
  coda_tensor const logits = matrix(b.logits, CODA_BF16, s.M, s.N, dev);
  return coda_cross_entropy(&logits, &tg, &ce, nullptr, s.K, &loss, nullptr, nullptr, b.ws, b.ws_bytes, nullptr);
}

struct HeadMemory {
  size_t measured = 0, allocated = 0;
};

void bench_lm_head(Run& r, Shape const& s) {
  std::vector<Head> const variants{Head::kCublas, Head::kCoda, Head::kMaterialized};
  std::vector<std::string> const names{"cublas", "coda", "materialized"};
  std::string const fn[] = {"cublasGemmEx", "coda_linear_cross_entropy", "cublasGemmEx + coda_cross_entropy"};

  // Peak memory, one variant at a time: an untimed run with its buffers (freed again), then the measured one.
  std::vector<HeadMemory> mem(variants.size());
  double tune_ms = 0.0;
  for (size_t i = 0; i < variants.size(); ++i) {
    Head const v = variants[i];
    {
      std::unique_ptr<HeadBuffers> const b = head_buffers(v, s);
      if (v == Head::kCoda) {
        tune_ms = first_coda_call(s, [&] { return head_call(r, v, s, *b); });
      } else {
        check_coda(head_call(r, v, s, *b), fn[i] + " " + s.config);
      }
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    size_t const before = device_used();
    {
      std::unique_ptr<HeadBuffers> const b = head_buffers(v, s);
      check_coda(head_call(r, v, s, *b), fn[i] + " " + s.config);
      CHECK_CUDA(cudaDeviceSynchronize());
      size_t const after = device_used();
      mem[i].measured = after > before ? after - before : 0;
      mem[i].allocated = b->bytes;
    }
  }

  // Time: all variants' buffers at once, interleaved.
  std::vector<std::unique_ptr<HeadBuffers>> bufs;
  std::vector<std::function<void(int)>> launches;
  for (size_t i = 0; i < variants.size(); ++i) {
    bufs.push_back(head_buffers(variants[i], s));
    HeadBuffers const* b = bufs.back().get();
    Head const v = variants[i];
    std::string const what = fn[i] + " " + s.config;
    launches.push_back([&r, &s, b, v, what](int) { check_coda(head_call(r, v, s, *b), what); });
  }
  std::vector<Timing> const t = r.timer->measure_interleaved(r.opt->warmup, 1, launches);

  double const ms_cublas = t[0].median_ms, ms_coda = t[1].median_ms, ms_mat = t[2].median_ms;
  double const mem_ratio = mem[1].measured > 0 ? static_cast<double>(mem[2].measured) / mem[1].measured : 0.0;
  for (size_t i = 0; i < variants.size(); ++i) {
    bool const cub = i == 0, coda = i == 1, mat = i == 2;
    double const mem_vs_coda =
        mem[1].measured > 0 ? static_cast<double>(mem[i].measured) / static_cast<double>(mem[1].measured) : 0.0;
    std::string const extra =
        strf(",\"peak_measured_mib\":%.3f,\"alloc_mib\":%.3f,\"mem_vs_coda\":%s,\"time_vs_coda\":%s,"
             "\"chunk_rows\":0",
             mib(mem[i].measured), mib(mem[i].allocated), coda ? "null" : num_or_null(mem_vs_coda).c_str(),
             coda ? "null" : num_or_null(t[i].median_ms / ms_coda).c_str());
    emit(r, s, "fwd", names[i], t[i], gib(mem[i].measured), cub ? 0.0 : t[i].median_ms / ms_cublas,
         coda ? ms_mat / ms_coda : 0.0, mat ? "gemm+cross_entropy" : "", coda ? tune_ms : 0.0, 1, extra);
  }
  r.vs_cublas[s.key].add(ms_coda / ms_cublas);
  r.vs_unfused[s.key].add(ms_mat / ms_coda);
  r.mem_ratio[s.key].add(mem_ratio);
  std::printf("%-11s %7lld %7lld %6lld | %9.4f %9.4f %9.4f | %8.3f %8.3f | %9.1f (%9.1f) %9.1f (%9.1f) %9.1f (%9.1f) "
              "| %8.3f\n",
              s.config.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.N),
              static_cast<long long>(s.K), ms_cublas, ms_coda, ms_mat, ms_coda / ms_cublas, ms_mat / ms_coda,
              mib(mem[0].measured), mib(mem[0].allocated), mib(mem[1].measured), mib(mem[1].allocated),
              mib(mem[2].measured), mib(mem[2].allocated), mem_ratio);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options const opt = parse(argc, argv);
  std::vector<Shape> const shapes = shape_set(opt);
  if (opt.list_only) {
    for (Shape const& s : shapes) {
      std::printf("%-11s %-35s %-28s %s M=%-7lld N=%-7lld K=%-7lld bf16\n", s.config.c_str(), s.op.c_str(),
                  s.fused.c_str(), s.kind == Kind::kLmHead ? "fwd" : "bwd", static_cast<long long>(s.M),
                  static_cast<long long>(s.N), static_cast<long long>(s.K));
    }
    return 0;
  }

  int supported = 0, major = 0, minor = 0;
  coda_status const dev_st = coda_device_supported(opt.device, &supported, &major, &minor);
  if (dev_st != CODA_SUCCESS || supported == 0) {
    std::fprintf(stderr,
                 "bench_backward needs an sm_90 (Hopper) GPU; device %d: %s (compute capability %d.%d) %s\n",
                 opt.device, dev_st == CODA_SUCCESS ? "not supported" : coda_status_string(dev_st), major, minor,
                 coda_last_error());
    return 1;
  }
  CHECK_CUDA(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, opt.device));

  Run r;
  r.opt = &opt;
  r.gpu = prop.name;
  r.commit = opt.commit.empty() ? git_commit() : opt.commit;
  r.date = now_utc();
  r.l2 = static_cast<size_t>(std::max(prop.l2CacheSize, 1 << 20));
  r.dev = opt.device;
  r.cublas = coda_bench::make_cublas_handle();
  if (!opt.out.empty()) {
    r.jsonl = std::fopen(opt.out.c_str(), opt.append ? "a" : "w");
    if (r.jsonl == nullptr) {
      std::fprintf(stderr, "cannot open %s\n", opt.out.c_str());
      return 1;
    }
  }
  Timer timer(opt.reps, opt.flush, 2 * r.l2);
  r.timer = &timer;

  std::printf("bench_backward on %s (%d SMs, L2 %zu MiB), commit %s, %d reps, L2 flush %s, bf16\n", r.gpu.c_str(),
              prop.multiProcessorCount, r.l2 >> 20, r.commit.c_str(), opt.reps, opt.flush ? "on" : "off");
  auto const wall0 = std::chrono::steady_clock::now();
  bool bwd_header = false, head_header = false;
  for (Shape const& s : shapes) {
    if (s.kind != Kind::kLmHead && !bwd_header) {
      bwd_header = true;
      std::printf("%-11s %-35s %7s %7s %7s | %9s %9s %9s | %9s %9s | %s\n", "config", "op", "M", "N", "K",
                  "cuBLAS ms", "CODA ms", "unfus ms", "coda/cub", "unf/coda", "unfused form");
    }
    if (s.kind == Kind::kLmHead && !head_header) {
      head_header = true;
      std::printf("\nlm_head forward (loss), peak device memory measured (allocated) in MiB; mat = cuBLAS logits + "
                  "coda_cross_entropy\n");
      std::printf("%-11s %7s %7s %6s | %9s %9s %9s | %8s %8s | %21s %21s %21s | %8s\n", "config", "M", "V", "d",
                  "cuBLAS ms", "CODA ms", "mat ms", "coda/cub", "mat/coda", "cuBLAS MiB", "CODA MiB", "mat MiB",
                  "mem m/c");
    }
    switch (s.kind) {
      case Kind::kResidualRmsnormBwd: bench_residual_rmsnorm_bwd(r, s); break;
      case Kind::kSwigluBwd: bench_swiglu_bwd(r, s); break;
      case Kind::kLmHead: bench_lm_head(r, s); break;
    }
  }

  std::printf("\n");
  for (auto const& [key, g] : r.vs_cublas) {
    Geo const& u = r.vs_unfused[key];
    if (key == "lm_head") {
      Geo const& m = r.mem_ratio[key];
      std::printf("lm_head (linear_cross_entropy, forward) over %d shapes: CODA/cuBLAS-GEMM time geometric mean %.3f "
                  "(min %.3f, max %.3f); materialized/CODA time geometric mean %.3f (min %.3f, max %.3f); "
                  "materialized/CODA measured peak memory geometric mean %.3f (min %.3f, max %.3f)\n",
                  g.n, g.mean(), g.lo, g.hi, u.mean(), u.lo, u.hi, m.mean(), m.lo, m.hi);
    } else {
      std::printf("%s over %d shapes: CODA/cuBLAS-dgrad time geometric mean %.3f (min %.3f, max %.3f; 1.0 = "
                  "epilogue for free); unfused/CODA speedup geometric mean %.3f (min %.3f, max %.3f)\n",
                  key.c_str(), g.n, g.mean(), g.lo, g.hi, u.mean(), u.lo, u.hi);
    }
  }
  std::printf("wall time %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
  if (r.jsonl != nullptr) std::fclose(r.jsonl);
  cublasDestroy(r.cublas);
  return 0;
}
