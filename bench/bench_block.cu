// bench_block: the whole CODA block (include/coda/block.h), forward and forward+backward, against its GEMMs alone
// through cuBLAS (docs/PROTOCOL.md method; issue 5's block target: CODA <= 1.05x the GEMMs).
//
// Shapes: llama3-1B/8B/70B (bench_common.hpp), M = --tokens rows (16384 by default), bf16, positions 0..M-1.
// Variants (interleaved launch by launch, L2 flushed before each, median of --reps):
//   cublas fwd   : the block's 4 forward GEMMs (out-proj, gate/up, down, q/k/v; bf16 out).
//   coda fwd     : coda_block_forward (4 fused GEMMs + 2 rstd reduces + the RoPE frequency expansion).
//   cublas f+b   : the 4 forward GEMMs, then the backward's 4 dgrad GEMMs (q/k/v, down, gate/up, out-proj; bf16
//                  out) and 4 wgrad GEMMs (fp32 out, as CODA's grads here).
//   coda f+b     : coda_block_forward then coda_block_backward (rope_bwd_zdz, 3 fused dgrads, 5 plain GEMMs, 2 tiny
//                  reduces).
// Backward = (f+b) - fwd, reported as such (the backward overwrites z1 and dqkv, so it is timed after a forward).
// Also reported: the activations CODA does not keep (h1, h2, y1, pre-RoPE q/k/v: M (2d + F + W) x 2 bytes).
#include <coda/block.h>
#include <coda/coda.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_coda.hpp"
#include "bench_common.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {

using coda_bench::Buffer;
using coda_bench::check_coda;
using coda_bench::cublas_dgrad;
using coda_bench::cublas_linear;
using coda_bench::cublas_wgrad;
using coda_bench::fill_f32;
using coda_bench::fill_random;
using coda_bench::Geo;
using coda_bench::json_escape;
using coda_bench::kModels;
using coda_bench::matrix;
using coda_bench::Model;
using coda_bench::vec1d;

struct Options : coda_bench::CommonOptions {
  std::set<std::string> models{"1B", "8B", "70B"};
  std::vector<int64_t> tokens{16384};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto need = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--models") {
      o.models.clear();
      for (auto const& m : coda_bench::split(need(), ',')) o.models.insert(m);
    } else if (a == "--tokens") {
      o.tokens.clear();
      for (auto const& t : coda_bench::split(need(), ',')) o.tokens.push_back(std::atoll(t.c_str()));
    } else if (coda_bench::parse_common_option(a, o, need)) {
    } else if (a == "--help" || a == "-h") {
      std::printf("bench_block [--models 1B,8B,70B] [--tokens 16384] [--reps N] [--warmup N] [--no-flush] "
                  "[--out FILE.jsonl] [--append] [--commit SHA] [--device N] [--list]\n");
      std::exit(0);
    } else {
      std::fprintf(stderr, "bench_block: unknown option %s (--help)\n", a.c_str());
      std::exit(2);
    }
  }
  for (int64_t t : o.tokens) {
    if (t < 1) {
      std::fprintf(stderr, "--tokens: %lld is not a positive row count\n", static_cast<long long>(t));
      std::exit(2);
    }
  }
  if (o.reps < 1) o.reps = 1;
  if (o.warmup < 1) o.warmup = 1;
  return o;
}

__global__ void iota_i32(int32_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<int32_t>(i);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options const opt = parse(argc, argv);
  std::vector<std::pair<Model, int64_t>> shapes;
  for (Model const& m : kModels) {
    if (opt.models.count(m.short_name) == 0 && opt.models.count(m.name) == 0) continue;
    for (int64_t t : opt.tokens) shapes.push_back({m, t});
  }
  if (opt.list_only) {
    for (auto const& [m, t] : shapes) {
      std::printf("%-11s block M=%-7lld d=%-6lld F=%-6lld heads %lld/%lld x %lld bf16\n", m.name,
                  static_cast<long long>(t), static_cast<long long>(m.d), static_cast<long long>(m.F),
                  static_cast<long long>(m.hq), static_cast<long long>(m.hkv), static_cast<long long>(m.hd));
    }
    return 0;
  }
  int supported = 0, major = 0, minor = 0;
  if (coda_device_supported(opt.device, &supported, &major, &minor) != CODA_SUCCESS || supported == 0) {
    std::fprintf(stderr, "bench_block needs an sm_90 (Hopper) GPU; device %d is %d.%d\n", opt.device, major, minor);
    return 1;
  }
  CHECK_CUDA(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, opt.device));
  std::string const gpu = prop.name;
  std::string const commit = opt.commit.empty() ? coda_bench::git_commit() : opt.commit;
  std::string const date = coda_bench::now_utc();
  size_t const l2 = static_cast<size_t>(std::max(prop.l2CacheSize, 1 << 20));
  int const dev = opt.device;
  cublasHandle_t const cublas = coda_bench::make_cublas_handle();
  FILE* jsonl = opt.out.empty() ? nullptr : std::fopen(opt.out.c_str(), opt.append ? "a" : "w");
  if (!opt.out.empty() && jsonl == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", opt.out.c_str());
    return 1;
  }
  std::printf("bench_block on %s, commit %s, %d reps, L2 flush %s, bf16\n", gpu.c_str(), commit.c_str(), opt.reps,
              opt.flush ? "on" : "off");
  std::printf("%-11s %6s | %9s %9s %6s | %9s %9s %6s | %9s %9s %6s | %s\n", "config", "M", "cuBLAS fwd", "CODA fwd",
              "ratio", "cuBLAS bwd", "CODA bwd", "ratio", "cuBLAS f+b", "CODA f+b", "ratio", "not stored by CODA");
  coda_bench::Timer timer(opt.reps, opt.flush, 2 * l2);
  Geo geo_f, geo_b, geo_fb;

  for (auto const& shape : shapes) {
    Model const& m = shape.first;
    int64_t const M = shape.second;
    int64_t const d = m.d, F = m.F, qo = m.hq * m.hd, W = (m.hq + 2 * m.hkv) * m.hd;
    size_t const Mr = static_cast<size_t>(M);
    auto bf = [](size_t elems) { return std::make_unique<Buffer>(2 * elems); };
    // Weights, inputs.
    auto wo = bf(d * qo), g1 = bf(d), wgu = bf(2 * F * d), wd = bf(d * F), g2 = bf(d), wqkv = bf(W * d);
    auto y0 = bf(Mr * qo), x0 = bf(Mr * d);
    Buffer pos(4 * Mr), freq(4 * static_cast<size_t>(m.hd / 2));
    fill_random(wo->ptr, d * qo, 1, 0.02f);
    fill_random(wgu->ptr, 2 * F * d, 2, 0.02f);
    fill_random(wd->ptr, d * F, 3, 0.02f);
    fill_random(wqkv->ptr, W * d, 4, 0.02f);
    fill_random(g1->ptr, d, 5, 1.0f);
    fill_random(g2->ptr, d, 6, 1.0f);
    fill_random(y0->ptr, Mr * qo, 7, 1.0f);
    fill_random(x0->ptr, Mr * d, 8, 4.0f);
    iota_i32<<<256, 256>>>(static_cast<int32_t*>(pos.ptr), M);
    std::vector<float> fr(static_cast<size_t>(m.hd / 2));
    for (size_t i = 0; i < fr.size(); ++i) fr[i] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / m.hd);
    CHECK_CUDA(cudaMemcpy(freq.ptr, fr.data(), fr.size() * 4, cudaMemcpyHostToDevice));
    // Saved, gradients, outputs.
    auto x1 = bf(Mr * d), z1 = bf(Mr * 2 * F), x2 = bf(Mr * d), qkv = bf(Mr * W);
    Buffer rstd1(4 * Mr), rstd2(4 * Mr);
    auto dqkv = bf(Mr * W), dx2 = bf(Mr * d), dy0 = bf(Mr * qo), dx0 = bf(Mr * d);
    fill_random(dqkv->ptr, Mr * W, 9, 0.01f);
    fill_random(dx2->ptr, Mr * d, 10, 0.01f);
    Buffer gwo(4 * d * qo), gg1(4 * d), gwgu(4 * 2 * F * d), gwd(4 * d * F), gg2(4 * d), gwqkv(4 * W * d);
    // cuBLAS scratch: activations of the GEMM-only pipeline.
    auto t_md = bf(Mr * d), t_mf2 = bf(Mr * 2 * F), t_mf = bf(Mr * F), t_mw = bf(Mr * W), t_mqo = bf(Mr * qo);

    coda_block_config const cfg{sizeof(coda_block_config), d, F, static_cast<int32_t>(m.hq),
                                static_cast<int32_t>(m.hkv), static_cast<int32_t>(m.hd), 1e-5f};
    coda_block_weights const w{sizeof(coda_block_weights),
                               matrix(wo->ptr, CODA_BF16, d, qo, dev),      vec1d(g1->ptr, CODA_BF16, d, dev),
                               matrix(wgu->ptr, CODA_BF16, 2 * F, d, dev),  matrix(wd->ptr, CODA_BF16, d, F, dev),
                               vec1d(g2->ptr, CODA_BF16, d, dev),          matrix(wqkv->ptr, CODA_BF16, W, d, dev)};
    coda_block_saved saved{sizeof(coda_block_saved),
                           matrix(x1->ptr, CODA_BF16, M, d, dev),      vec1d(rstd1.ptr, CODA_FP32, M, dev),
                           matrix(z1->ptr, CODA_BF16, M, 2 * F, dev),  matrix(x2->ptr, CODA_BF16, M, d, dev),
                           vec1d(rstd2.ptr, CODA_FP32, M, dev),        matrix(qkv->ptr, CODA_BF16, M, W, dev)};
    coda_block_grads grads{sizeof(coda_block_grads),
                           matrix(gwo.ptr, CODA_FP32, d, qo, dev),     vec1d(gg1.ptr, CODA_FP32, d, dev),
                           matrix(gwgu.ptr, CODA_FP32, 2 * F, d, dev), matrix(gwd.ptr, CODA_FP32, d, F, dev),
                           vec1d(gg2.ptr, CODA_FP32, d, dev),          matrix(gwqkv.ptr, CODA_FP32, W, d, dev)};
    coda_tensor const ty0 = matrix(y0->ptr, CODA_BF16, M, qo, dev), tx0 = matrix(x0->ptr, CODA_BF16, M, d, dev);
    coda_tensor const tpos = vec1d(pos.ptr, CODA_INT32, M, dev), tfreq = vec1d(freq.ptr, CODA_FP32, m.hd / 2, dev);
    coda_tensor tdqkv = matrix(dqkv->ptr, CODA_BF16, M, W, dev), tdx2 = matrix(dx2->ptr, CODA_BF16, M, d, dev);
    coda_tensor tdy0 = matrix(dy0->ptr, CODA_BF16, M, qo, dev), tdx0 = matrix(dx0->ptr, CODA_BF16, M, d, dev);
    size_t const fwd_bytes = coda_block_forward_workspace_size(&cfg, M);
    size_t const bwd_bytes = coda_block_backward_workspace_size(&cfg, M);
    Buffer fws(fwd_bytes), bws(bwd_bytes);

    auto coda_fwd = [&](int) {
      check_coda(coda_block_forward(&cfg, &w, &ty0, &tx0, &tpos, &tfreq, &saved, fws.ptr, fwd_bytes, nullptr),
                 "coda_block_forward");
    };
    auto coda_fb = [&](int set) {
      coda_fwd(set);
      check_coda(coda_block_backward(&cfg, &w, &ty0, &tpos, &tfreq, &saved, &tdqkv, &tdx2, &tdy0, &tdx0, &grads,
                                     bws.ptr, bwd_bytes, nullptr),
                 "coda_block_backward");
    };
    auto cublas_fwd = [&](int) {
      cublas_linear(cublas, y0->ptr, wo->ptr, t_md->ptr, M, d, qo);
      cublas_linear(cublas, t_md->ptr, wgu->ptr, t_mf2->ptr, M, 2 * F, d);
      cublas_linear(cublas, t_mf->ptr, wd->ptr, t_md->ptr, M, d, F);
      cublas_linear(cublas, t_md->ptr, wqkv->ptr, t_mw->ptr, M, W, d);
    };
    auto cublas_fb = [&](int set) {
      cublas_fwd(set);
      cublas_dgrad(cublas, dqkv->ptr, wqkv->ptr, t_md->ptr, M, d, W);
      cublas_wgrad(cublas, dqkv->ptr, t_md->ptr, static_cast<float*>(gwqkv.ptr), M, W, d);
      cublas_dgrad(cublas, dx2->ptr, wd->ptr, t_mf->ptr, M, F, d);
      cublas_wgrad(cublas, dx2->ptr, t_mf->ptr, static_cast<float*>(gwd.ptr), M, d, F);
      cublas_dgrad(cublas, t_mf2->ptr, wgu->ptr, t_md->ptr, M, d, 2 * F);
      cublas_wgrad(cublas, t_mf2->ptr, t_md->ptr, static_cast<float*>(gwgu.ptr), M, 2 * F, d);
      cublas_dgrad(cublas, t_md->ptr, wo->ptr, t_mqo->ptr, M, qo, d);
      cublas_wgrad(cublas, t_md->ptr, y0->ptr, static_cast<float*>(gwo.ptr), M, d, qo);
    };
    CHECK_CUDA(cudaDeviceSynchronize());
    coda_fb(0);  // first calls may select kernels: keep them out of the timing
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<coda_bench::Timing> const t =
        timer.measure_interleaved(opt.warmup, 1, {cublas_fwd, coda_fwd, cublas_fb, coda_fb});
    // Host time per call (enqueue only: 10 calls back to back, the clock stopped before the synchronize). It is the
    // time the GPU waits before a call's first kernel whenever the host is not ahead of it (a synchronize per step,
    // or short GEMMs); the Python layer adds its own on top (bench/python/bench_block.py --profile).
    auto host_us = [&](auto&& fn) {
      CHECK_CUDA(cudaDeviceSynchronize());
      auto const t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 10; ++i) fn(0);
      auto const t1 = std::chrono::steady_clock::now();
      CHECK_CUDA(cudaDeviceSynchronize());
      return std::chrono::duration<double, std::micro>(t1 - t0).count() / 10;
    };
    double const host[4] = {host_us(cublas_fwd), host_us(coda_fwd), host_us(cublas_fb), host_us(coda_fb)};
    double const cf = t[0].median_ms, kf = t[1].median_ms, cfb = t[2].median_ms, kfb = t[3].median_ms;
    double const cb = cfb - cf, kb = kfb - kf;
    double const not_stored_gib = coda_bench::gib(Mr * static_cast<size_t>(2 * d + F + W) * 2);
    geo_f.add(kf / cf);
    geo_b.add(kb / cb);
    geo_fb.add(kfb / cfb);
    std::printf("%-11s %6lld | %9.3f %9.3f %6.3f | %9.3f %9.3f %6.3f | %9.3f %9.3f %6.3f | %.2f GiB\n", m.name,
                static_cast<long long>(M), cf, kf, kf / cf, cb, kb, kb / cb, cfb, kfb, kfb / cfb, not_stored_gib);
    std::printf("%-11s host time per call (enqueue): cuBLAS fwd %.0f us, CODA fwd %.0f us, cuBLAS f+b %.0f us, "
                "CODA f+b %.0f us\n", "", host[0], host[1], host[2], host[3]);
    std::fflush(stdout);
    if (jsonl != nullptr) {
      char const* names[] = {"cublas_gemms", "coda", "cublas_gemms", "coda"};
      char const* passes[] = {"fwd", "fwd", "fwd+bwd", "fwd+bwd"};
      for (int v = 0; v < 4; ++v) {
        double const base = v < 2 ? cf : cfb;
        std::fprintf(jsonl,
                     "{\"suite\":\"block\",\"op\":\"block\",\"config\":\"%s\",\"M\":%lld,\"pass\":\"%s\","
                     "\"variant\":\"%s\",\"ms\":%.6f,\"ms_min\":%.6f,\"time_vs_cublas\":%.4f,\"bwd_ms\":%.6f,"
                     "\"not_stored_gib\":%.4f,\"host_us\":%.1f,\"commit\":\"%s\",\"gpu\":\"%s\",\"date\":\"%s\",\"dtype\":\"bf16\","
                     "\"reps\":%d,\"l2_flush\":%s}\n",
                     m.name, static_cast<long long>(M), passes[v], names[v], t[static_cast<size_t>(v)].median_ms,
                     t[static_cast<size_t>(v)].min_ms, t[static_cast<size_t>(v)].median_ms / base,
                     v == 1 ? kb : v == 0 ? cb : v == 3 ? kb : cb, not_stored_gib, host[v], json_escape(commit).c_str(),
                     json_escape(gpu).c_str(), date.c_str(), opt.reps, opt.flush ? "true" : "false");
      }
      std::fflush(jsonl);
    }
  }
  std::printf("\nCODA/cuBLAS-GEMMs time, geometric mean over %d shapes: forward %.3f, backward %.3f, "
              "forward+backward %.3f\n", geo_fb.n, geo_f.mean(), geo_b.mean(), geo_fb.mean());
  if (jsonl != nullptr) std::fclose(jsonl);
  cublasDestroy(cublas);
  return 0;
}
