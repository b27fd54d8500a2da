// bench_lm_head: the last layer's exit, forward + backward (LM head + cross-entropy + the final RMSNorm backward),
// CODA's chunked ops against the same math with materialized logits; time and measured peak device memory.
//
// Shapes: llama3-1B/8B/70B hidden sizes, V = 128256, M = --tokens (8192 by default), bf16, mean loss, random targets.
// Variants (each computes the loss, dx [M,d] bf16, dW [V,d] fp32 and dgamma [d] fp32 from h = x * gamma, rstd, x):
//   coda         : coda_linear_cross_entropy (loss; logits never stored) + coda_linear_cross_entropy_bwd (chunks of
//                  2048 rows: logits recomputed, dlogits of one chunk at a time).
//   coda_onepass : coda_linear_cross_entropy_bwd alone with loss_out (the training step: loss and gradients in one
//                  chunked pass, no separate forward).
//   materialized : cuBLAS logits [M,V] bf16 (row-scaled input) -> coda_cross_entropy (loss, dlogits in place, zdz)
//                  -> coda_linear_residual_rmsnorm_bwd on the whole dlogits (dx, a, dgamma) -> cuBLAS wgrad dW =
//                  dlogits^T a (fp32). The [M,V] logits/dlogits buffer is the memory CODA avoids.
// Memory: per variant, its buffers allocated, one run, synchronize; peak = used after - used before (cudaMemGetInfo;
// an untimed run first keeps lazy loading and first-call selection out). Time: interleaved, L2 flushed, median.
#include <coda/coda.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_coda.hpp"
#include "bench_common.hpp"

#include <algorithm>
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
using coda_bench::cublas_linear;
using coda_bench::cublas_wgrad;
using coda_bench::device_used;
using coda_bench::fill_f32;
using coda_bench::fill_random;
using coda_bench::fill_targets;
using coda_bench::kModels;
using coda_bench::matrix;
using coda_bench::vec1d;

constexpr int64_t kV = 128256;

coda_tensor scalar(void* p, int dev) {
  coda_tensor t{};
  t.data = p;
  t.dtype = CODA_FP32;
  t.rank = 0;
  t.device = dev;
  return t;
}

/// Every buffer of one variant (inputs included: both variants hold the same inputs).
struct Bufs {
  std::vector<std::unique_ptr<Buffer>> owned;
  size_t bytes = 0;
  void* add(size_t n) {
    owned.push_back(std::make_unique<Buffer>(n));
    bytes += n;
    return owned.back()->ptr;
  }
  void *h, *w, *rstd, *x, *gamma, *targets, *loss, *dx, *dw, *dgamma, *ws, *logits = nullptr, *a = nullptr,
      *zdz = nullptr, *ws2 = nullptr;
  size_t ws_bytes = 0, ws2_bytes = 0;
};

std::unique_ptr<Bufs> make_bufs(bool coda, int64_t M, int64_t d) {
  auto b = std::make_unique<Bufs>();
  size_t const Mr = static_cast<size_t>(M), dr = static_cast<size_t>(d), Vr = static_cast<size_t>(kV);
  b->h = b->add(2 * Mr * dr);
  b->w = b->add(2 * Vr * dr);
  b->rstd = b->add(4 * Mr);
  b->x = b->add(2 * Mr * dr);
  b->gamma = b->add(2 * dr);
  b->targets = b->add(4 * Mr);
  b->loss = b->add(4);
  b->dx = b->add(2 * Mr * dr);
  b->dw = b->add(4 * Vr * dr);
  b->dgamma = b->add(4 * dr);
  fill_random(b->h, Mr * dr, 1, 1.0f);
  fill_random(b->w, Vr * dr, 2, 0.05f);
  fill_random(b->x, Mr * dr, 3, 1.0f);
  fill_random(b->gamma, dr, 4, 1.0f);
  fill_f32<<<256, 256>>>(static_cast<float*>(b->rstd), Mr, 5, 0.5f, 1.5f);
  fill_targets<<<256, 256>>>(static_cast<int32_t*>(b->targets), Mr, kV);
  CHECK_CUDA(cudaGetLastError());
  if (coda) {
    b->ws_bytes = std::max(coda_linear_cross_entropy_workspace_size(M, kV, 0),
                           coda_linear_cross_entropy_bwd_workspace_size(M, kV, d, 0));
  } else {
    b->logits = b->add(2 * Mr * Vr);
    b->a = b->add(2 * Mr * dr);
    b->zdz = b->add(4 * Mr);
    b->ws_bytes = coda_cross_entropy_workspace_size(M, kV);
    b->ws2_bytes = coda_linear_residual_rmsnorm_bwd_workspace_size(M, d);
    b->ws2 = b->add(b->ws2_bytes);
  }
  b->ws = b->add(b->ws_bytes);
  CHECK_CUDA(cudaDeviceSynchronize());
  return b;
}

enum Variant { kCoda = 0, kCodaOnePass = 1, kMaterialized = 2 };

void run(Variant v, cublasHandle_t cublas, Bufs const& b, int64_t M, int64_t d, int dev) {
  bool const coda = v != kMaterialized;
  coda_ce_options const o = coda_ce_options_default();
  coda_tensor const h = matrix(b.h, CODA_BF16, M, d, dev), w = matrix(b.w, CODA_BF16, kV, d, dev);
  coda_tensor const rstd = vec1d(b.rstd, CODA_FP32, M, dev), x = matrix(b.x, CODA_BF16, M, d, dev);
  coda_tensor const gamma = vec1d(b.gamma, CODA_BF16, d, dev), t = vec1d(b.targets, CODA_INT32, M, dev);
  coda_tensor loss = scalar(b.loss, dev), dx = matrix(b.dx, CODA_BF16, M, d, dev);
  coda_tensor dw = matrix(b.dw, CODA_FP32, kV, d, dev), dgamma = vec1d(b.dgamma, CODA_FP32, d, dev);
  if (coda) {
    if (v == kCoda) {
      check_coda(coda_linear_cross_entropy(&h, &w, &rstd, &t, &o, 0, &loss, nullptr, b.ws, b.ws_bytes, nullptr),
                 "coda_linear_cross_entropy");
    }
    check_coda(coda_linear_cross_entropy_bwd(&h, &w, &rstd, &x, &gamma, &t, &o, nullptr, 0, nullptr, &dx, &dw,
                                             &dgamma, v == kCodaOnePass ? &loss : nullptr, b.ws, b.ws_bytes,
                                             nullptr),
               "coda_linear_cross_entropy_bwd");
    return;
  }
  cublas_linear(cublas, b.h, b.w, b.logits, M, kV, d);
  coda_tensor logits = matrix(b.logits, CODA_BF16, M, kV, dev), zdz = vec1d(b.zdz, CODA_FP32, M, dev);
  check_coda(coda_cross_entropy(&logits, &t, &o, nullptr, d, &loss, &logits, &zdz, b.ws, b.ws_bytes, nullptr),
             "coda_cross_entropy");
  coda_tensor a = matrix(b.a, CODA_BF16, M, d, dev);
  check_coda(coda_linear_residual_rmsnorm_bwd(&logits, &w, &x, &gamma, &rstd, &zdz, nullptr, 1.0f, &dx, &a,
                                              &dgamma, b.ws2, b.ws2_bytes, nullptr),
             "coda_linear_residual_rmsnorm_bwd");
  cublas_wgrad(cublas, b.logits, b.a, static_cast<float*>(b.dw), M, kV, d);
}

}  // namespace

int main(int argc, char** argv) {
  coda_bench::CommonOptions opt;
  std::set<std::string> models{"1B", "8B", "70B"};
  int64_t M = 8192;
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
      models.clear();
      for (auto const& m : coda_bench::split(need(), ',')) models.insert(m);
    } else if (a == "--tokens") {
      M = std::atoll(need().c_str());
    } else if (!coda_bench::parse_common_option(a, opt, need)) {
      std::fprintf(stderr, "bench_lm_head [--models 1B,8B,70B] [--tokens 8192] [common options]\n");
      return 2;
    }
  }
  if (M < 1) {
    std::fprintf(stderr, "--tokens must be >= 1\n");
    return 2;
  }
  if (opt.list_only) {
    for (auto const& m : kModels) {
      if (models.count(m.short_name) != 0) std::printf("%s lm_head f+b M=%lld V=%lld d=%lld\n", m.name,
                                                       static_cast<long long>(M), static_cast<long long>(kV),
                                                       static_cast<long long>(m.d));
    }
    return 0;
  }
  int supported = 0;
  if (coda_device_supported(opt.device, &supported, nullptr, nullptr) != CODA_SUCCESS || supported == 0) {
    std::fprintf(stderr, "bench_lm_head needs an sm_90 GPU\n");
    return 1;
  }
  CHECK_CUDA(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, opt.device));
  std::string const commit = opt.commit.empty() ? coda_bench::git_commit() : opt.commit;
  cublasHandle_t const cublas = coda_bench::make_cublas_handle();
  FILE* jsonl = opt.out.empty() ? nullptr : std::fopen(opt.out.c_str(), opt.append ? "a" : "w");
  coda_bench::Timer timer(opt.reps, opt.flush, 2 * static_cast<size_t>(prop.l2CacheSize));
  std::printf("bench_lm_head on %s, commit %s: LM head + CE + final-norm forward+backward, V = %lld, bf16\n",
              prop.name, commit.c_str(), static_cast<long long>(kV));
  std::printf("%-11s %6s %6s | %10s %10s %10s | %10s %10s %10s | %s\n", "config", "M", "d", "CODA ms", "1-pass ms",
              "mat. ms", "CODA MiB", "1-pass MiB", "mat. MiB", "mat/1-pass time, memory");
  for (auto const& m : kModels) {
    if (models.count(m.short_name) == 0) continue;
    int64_t const d = m.d;
    size_t measured[3] = {0, 0, 0}, allocated[3] = {0, 0, 0};
    for (int vi = 0; vi < 3; ++vi) {
      Variant const v = static_cast<Variant>(vi);
      {
        auto const b = make_bufs(v != kMaterialized, M, d);
        run(v, cublas, *b, M, d, opt.device);
        CHECK_CUDA(cudaDeviceSynchronize());
      }
      size_t const before = device_used();
      auto const b = make_bufs(v != kMaterialized, M, d);
      run(v, cublas, *b, M, d, opt.device);
      CHECK_CUDA(cudaDeviceSynchronize());
      size_t const after = device_used();
      measured[vi] = after > before ? after - before : 0;
      allocated[vi] = b->bytes;
    }
    auto const bc = make_bufs(true, M, d);
    auto const bm = make_bufs(false, M, d);
    std::vector<coda_bench::Timing> const t = timer.measure_interleaved(
        opt.warmup, 1,
        {[&](int) { run(kCoda, cublas, *bc, M, d, opt.device); },
         [&](int) { run(kCodaOnePass, cublas, *bc, M, d, opt.device); },
         [&](int) { run(kMaterialized, cublas, *bm, M, d, opt.device); }});
    auto mib = [](size_t b) { return static_cast<double>(b) / (1 << 20); };
    std::printf("%-11s %6lld %6lld | %10.3f %10.3f %10.3f | %10.1f %10.1f %10.1f | %.3f, %.2f\n", m.name,
                static_cast<long long>(M), static_cast<long long>(d), t[0].median_ms, t[1].median_ms, t[2].median_ms,
                mib(measured[0]), mib(measured[1]), mib(measured[2]), t[2].median_ms / t[1].median_ms,
                mib(measured[2]) / mib(measured[1]));
    std::fflush(stdout);
    if (jsonl != nullptr) {
      char const* names[] = {"coda", "coda_onepass", "materialized"};
      for (int v = 0; v < 3; ++v) {
        std::fprintf(jsonl,
                     "{\"suite\":\"lm_head\",\"op\":\"lm_head_fwd_bwd\",\"config\":\"%s\",\"M\":%lld,\"N\":%lld,"
                     "\"K\":%lld,\"pass\":\"fwd+bwd\",\"variant\":\"%s\",\"ms\":%.6f,\"ms_min\":%.6f,"
                     "\"peak_measured_mib\":%.3f,\"alloc_mib\":%.3f,\"commit\":\"%s\",\"gpu\":\"%s\","
                     "\"date\":\"%s\",\"dtype\":\"bf16\",\"reps\":%d}\n",
                     m.name, static_cast<long long>(M), static_cast<long long>(kV), static_cast<long long>(d), names[v],
                     t[static_cast<size_t>(v)].median_ms, t[static_cast<size_t>(v)].min_ms, mib(measured[v]),
                     mib(allocated[v]), coda_bench::json_escape(commit).c_str(),
                     coda_bench::json_escape(prop.name).c_str(), coda_bench::now_utc().c_str(), opt.reps);
      }
      std::fflush(jsonl);
    }
  }
  if (jsonl != nullptr) std::fclose(jsonl);
  cublasDestroy(cublas);
  return 0;
}
