// bench_gemm: CODA's plain GEMM against cuBLAS on the LLaMA linear shapes (docs/PROTOCOL.md method).
//
// For every shape: CUDA events around each launch, warm-up first (the first CODA call also autotunes; its host
// time is reported as tune_ms), an L2 flush (a memset of 2x the L2 size) before every timed launch, the median of
// --reps (>= 20) launches, and input sets rotated when A and B together would fit in twice the L2. cuBLAS
// (cublasGemmEx, fp32 compute, default math as PyTorch uses it) is measured in the same run, interleaved launch by
// launch with the tuned CODA variants (cuBLAS, CODA, cuBLAS, CODA, ...) so both see the same clock state, and every
// CODA number is reported with its ratio to it. Output: a table on stdout and, with --out, one JSON line per measurement.
//
// Variants: coda (autotuned over CODA's kernels only: cuBLAS excluded, the done-criterion measurement), cublas,
// coda_cublas (autotuned with cuBLAS among the candidates: what coda_gemm gives users), configs (each compiled
// config with default knobs, variant "coda:<config>").
#include <coda/coda.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_common.hpp"
#include "gemm/gemm_hooks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
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

// ---- shapes ------------------------------------------------------------------------------------------------------

/// One benchmarked GEMM. kind: fwd (A K-major, B K-major), dgrad (B N-major), wgrad (A M-major, B N-major).
struct Shape {
  std::string config;  // model, or "square" / "custom"
  std::string op;      // linear name (+ _dgrad / _wgrad)
  std::string pass;    // fwd | bwd
  std::string kind;    // fwd | dgrad | wgrad
  int64_t M = 0, N = 0, K = 0;
  coda_dtype dtype_d = CODA_BF16;
  bool accumulate = false;
};

struct Linear {
  char const* name;
  int64_t n_out, k_in;
};

std::vector<Linear> linears_of(Model const& m) {
  return {{"qkv", (m.hq + 2 * m.hkv) * m.hd, m.d},
          {"out", m.d, m.hq * m.hd},
          {"gate_up", 2 * m.F, m.d},
          {"down", m.d, m.F},
          {"lm_head", m.V, m.d}};
}

/// fwd y = x W^T: [M,K] x [N,K]; dgrad dx = dz W: M x K_in x N_out; wgrad dW = dz^T a: N_out x K_in x M.
Shape make_shape(std::string config, std::string const& op, std::string const& kind, int64_t tokens, int64_t n_out,
                 int64_t k_in, bool wgrad_fp32) {
  Shape s;
  s.config = std::move(config);
  s.kind = kind;
  if (kind == "fwd") {
    s.op = op;
    s.pass = "fwd";
    s.M = tokens, s.N = n_out, s.K = k_in;
  } else if (kind == "dgrad") {
    s.op = op + "_dgrad";
    s.pass = "bwd";
    s.M = tokens, s.N = k_in, s.K = n_out;
  } else {
    s.op = op + "_wgrad";
    s.pass = "bwd";
    s.M = n_out, s.N = k_in, s.K = tokens;
    if (wgrad_fp32) {
      s.dtype_d = CODA_FP32;
      s.accumulate = true;
      s.op += "_fp32acc";
    }
  }
  return s;
}

// ---- options -----------------------------------------------------------------------------------------------------

struct Options : coda_bench::CommonOptions {
  std::set<std::string> models{"1B", "8B", "70B"};
  std::vector<int64_t> tokens{8192, 16384};
  std::set<std::string> ops{"qkv", "out", "gate_up", "down", "lm_head", "square"};
  std::set<std::string> passes{"fwd", "dgrad", "wgrad"};
  std::vector<int64_t> squares{2048, 4096, 8192};
  std::vector<Shape> custom;
  std::set<std::string> variants{"coda", "cublas"};
  bool wgrad_fp32 = false;
};

void usage() {
  std::printf(
      "usage: bench_gemm [options]\n"
      "  --quick                 llama3-8B linears at 8192 tokens (all passes) + 4096^3 square\n"
      "  --models 1B,8B,70B      models of the LLaMA shape set\n"
      "  --tokens 8192,16384     token counts M\n"
      "  --ops qkv,out,gate_up,down,lm_head,square\n"
      "  --passes fwd,dgrad,wgrad\n"
      "  --squares 2048,4096,8192  M=N=K sizes of the square op\n"
      "  --shapes MxNxK[:fwd|dgrad|wgrad],...   explicit shapes instead of the set above\n"
      "  --variants coda,cublas,coda_cublas,configs   (default coda,cublas)\n"
      "  --wgrad-fp32            wgrad with fp32 output accumulated into D (op *_wgrad_fp32acc)\n"
      "  --reps N (>=20 per PROTOCOL.md, default 20)  --warmup N (default 3)  --no-flush\n"
      "  --out FILE.jsonl [--append]  --commit SHA  --device N  --list (print the shapes and exit)\n"
      "Environment: CODA_AUTOTUNE_CACHE=<file> reuses/persists tuning winners across runs.\n");
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
  auto ints = [](std::string const& s) {
    std::vector<int64_t> v;
    for (auto const& x : split(s, ',')) v.push_back(std::atoll(x.c_str()));
    return v;
  };
  auto set_of = [](std::string const& s) {
    auto v = split(s, ',');
    return std::set<std::string>(v.begin(), v.end());
  };
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--quick") {
      o.models = {"8B"};
      o.tokens = {8192};
      o.squares = {4096};
    } else if (a == "--models") {
      o.models = set_of(need(i));
    } else if (a == "--tokens") {
      o.tokens = ints(need(i));
    } else if (a == "--ops") {
      o.ops = set_of(need(i));
    } else if (a == "--passes") {
      o.passes = set_of(need(i));
    } else if (a == "--squares") {
      o.squares = ints(need(i));
    } else if (a == "--shapes") {
      for (auto const& item : split(need(i), ',')) {
        auto const colon = item.find(':');
        std::string const kind = colon == std::string::npos ? "fwd" : item.substr(colon + 1);
        auto const xs = split(item.substr(0, colon), 'x');
        if (xs.size() != 3 || (kind != "fwd" && kind != "dgrad" && kind != "wgrad")) {
          std::fprintf(stderr, "bad --shapes item '%s' (MxNxK[:fwd|dgrad|wgrad])\n", item.c_str());
          std::exit(2);
        }
        Shape s;
        s.config = "custom";
        s.op = "custom_" + kind;
        s.pass = kind == "fwd" ? "fwd" : "bwd";
        s.kind = kind;
        s.M = std::atoll(xs[0].c_str());
        s.N = std::atoll(xs[1].c_str());
        s.K = std::atoll(xs[2].c_str());
        o.custom.push_back(s);
      }
    } else if (a == "--variants") {
      o.variants = set_of(need(i));
    } else if (a == "--wgrad-fp32") {
      o.wgrad_fp32 = true;
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
  if (o.reps < 20) std::fprintf(stderr, "note: --reps %d is below PROTOCOL.md's minimum of 20\n", o.reps);
  for (auto const& v : o.variants) {
    if (v != "coda" && v != "cublas" && v != "coda_cublas" && v != "configs") {
      std::fprintf(stderr, "unknown variant %s\n", v.c_str());
      std::exit(2);
    }
  }
  return o;
}

std::vector<Shape> shape_set(Options const& o) {
  if (!o.custom.empty()) {
    std::vector<Shape> out = o.custom;
    for (Shape& s : out) {
      if (s.kind == "wgrad" && o.wgrad_fp32) {
        s.dtype_d = CODA_FP32;
        s.accumulate = true;
        s.op += "_fp32acc";
      }
    }
    return out;
  }
  std::vector<Shape> out;
  for (Model const& m : kModels) {
    if (o.models.count(m.short_name) == 0 && o.models.count(m.name) == 0) continue;
    for (int64_t t : o.tokens) {
      for (Linear const& l : linears_of(m)) {
        if (o.ops.count(l.name) == 0) continue;
        for (char const* kind : {"fwd", "dgrad", "wgrad"}) {
          if (o.passes.count(kind) == 0) continue;
          out.push_back(make_shape(m.name, l.name, kind, t, l.n_out, l.k_in, o.wgrad_fp32));
        }
      }
    }
  }
  if (o.ops.count("square") != 0 && o.passes.count("fwd") != 0) {
    for (int64_t n : o.squares) out.push_back(make_shape("square", "square", "fwd", n, n, n, false));
  }
  return out;
}

// ---- reporting ---------------------------------------------------------------------------------------------------

struct Record {
  Shape const* shape;
  std::string variant, winner;
  Timing t;
  double tflops = 0.0, peak_gib = 0.0, ratio = 0.0, tune_ms = -1.0;
};

char const* dtype_name(coda_dtype t) { return t == CODA_FP32 ? "fp32" : t == CODA_FP16 ? "fp16" : "bf16"; }

}  // namespace

int main(int argc, char** argv) {
  Options const opt = parse(argc, argv);
  std::vector<Shape> const shapes = shape_set(opt);
  if (opt.list_only) {
    for (Shape const& s : shapes) {
      std::printf("%-11s %-20s %-4s M=%-7lld N=%-7lld K=%-7lld %s\n", s.config.c_str(), s.op.c_str(), s.pass.c_str(),
                  static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                  dtype_name(s.dtype_d));
    }
    return 0;
  }

  CHECK_CUDA(cudaSetDevice(opt.device));
  int supported = 0, major = 0, minor = 0;
  if (coda_device_supported(opt.device, &supported, &major, &minor) != CODA_SUCCESS || supported == 0) {
    std::fprintf(stderr, "bench_gemm needs an sm_90 GPU (device %d: %d.%d): %s\n", opt.device, major, minor,
                 coda_last_error());
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, opt.device));
  std::string const gpu = prop.name, commit = opt.commit.empty() ? git_commit() : opt.commit, date = now_utc();
  size_t const l2 = static_cast<size_t>(std::max(prop.l2CacheSize, 1 << 20));

  cublasHandle_t const cublas = coda_bench::make_cublas_handle();

  FILE* jsonl = nullptr;
  if (!opt.out.empty()) {
    jsonl = std::fopen(opt.out.c_str(), opt.append ? "a" : "w");
    if (jsonl == nullptr) {
      std::fprintf(stderr, "cannot open %s\n", opt.out.c_str());
      return 1;
    }
  }
  std::vector<std::string> configs;
  for (int i = 0; i < coda_gemm_config_count(); ++i) {
    std::string const n = coda_gemm_config_name(i);
    if (n != "cublas") configs.push_back(n);
  }

  std::printf("bench_gemm on %s (%d SMs, L2 %zu MiB), commit %s, %d reps, L2 flush %s\n", gpu.c_str(),
              prop.multiProcessorCount, l2 >> 20, commit.c_str(), opt.reps, opt.flush ? "on" : "off");
  std::printf("%-11s %-22s %-4s %7s %7s %7s | %9s %9s %6s | %-40s\n", "config", "op", "pass", "M", "N", "K",
              "cuBLAS TF", "CODA TF", "ratio", "CODA winner");

  Timer timer(opt.reps, opt.flush, 2 * l2);
  std::vector<double> ratios;
  std::vector<Record> records;
  auto const wall0 = std::chrono::steady_clock::now();

  for (Shape const& s : shapes) {
    bool const a_col = s.kind == "wgrad", b_col = s.kind != "fwd";
    size_t const elem_d = s.dtype_d == CODA_FP32 ? 4 : 2;
    size_t const a_elems = static_cast<size_t>(s.M * s.K), b_elems = static_cast<size_t>(s.N * s.K);
    size_t const ab_bytes = 2 * (a_elems + b_elems);
    int const sets = static_cast<int>(std::clamp<size_t>((2 * l2 + ab_bytes - 1) / ab_bytes, 1, 4));
    std::vector<std::unique_ptr<Buffer>> as, bs;
    for (int i = 0; i < sets; ++i) {
      as.push_back(std::make_unique<Buffer>(2 * a_elems));
      bs.push_back(std::make_unique<Buffer>(2 * b_elems));
      fill_random(as.back()->ptr, a_elems, 1000 + static_cast<uint64_t>(i), 1.0f);
      fill_random(bs.back()->ptr, b_elems, 2000 + static_cast<uint64_t>(i), 0.05f);
    }
    Buffer d(static_cast<size_t>(s.M * s.N) * elem_d);
    CHECK_CUDA(cudaMemset(d.ptr, 0, d.bytes));
    // Leading dimensions of packed operands: A K-major [M,K] or M-major (stored [K,M]); B K-major [N,K] or N-major.
    int64_t const lda = a_col ? s.M : s.K, ldb = b_col ? s.N : s.K, ldd = s.N;
    auto problem = [&](int set) {
      coda_gemm_problem p{};
      p.M = s.M, p.N = s.N, p.K = s.K;
      p.dtype_ab = CODA_BF16;
      p.dtype_d = s.dtype_d;
      p.A = as[static_cast<size_t>(set)]->ptr, p.lda = lda, p.a_col_major = a_col ? 1 : 0;
      p.B = bs[static_cast<size_t>(set)]->ptr, p.ldb = ldb, p.b_col_major = b_col ? 1 : 0;
      p.D = d.ptr, p.ldd = ldd;
      p.alpha = 1.0f;
      p.accumulate = s.accumulate ? 1 : 0;
      return p;
    };
    coda_gemm_problem const p0 = problem(0);
    size_t ws_bytes = coda_gemm_candidate_workspace_size(nullptr, &p0);
    for (std::string const& c : configs) {
      ws_bytes = std::max(ws_bytes, coda_gemm_candidate_workspace_size(c.c_str(), &p0));
    }
    Buffer ws(ws_bytes);
    double const flop = 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
    double const peak_gib = static_cast<double>(ab_bytes + d.bytes + ws_bytes) / (1024.0 * 1024.0 * 1024.0);
    CHECK_CUDA(cudaDeviceSynchronize());

    auto run_coda = [&](char const* candidate, int set) {
      coda_gemm_problem const p = problem(set);
      coda_status const st = coda_gemm_run_candidate(candidate, &p, ws.ptr, ws_bytes, nullptr);
      if (st != CODA_SUCCESS) {
        std::fprintf(stderr, "%s %s: %s\n", s.op.c_str(), candidate ? candidate : "coda", coda_gemm_hook_error());
        std::exit(1);
      }
    };
    auto record = [&](std::string const& variant, std::string const& winner, Timing const& t, double tune_ms) {
      Record r{&s, variant, winner, t, flop / (t.median_ms * 1e9), peak_gib, 0.0, tune_ms};
      records.push_back(r);
      return records.size() - 1;
    };

    std::map<std::string, double> tf;
    std::map<std::string, std::string> winners;
    size_t const first_record = records.size();
    // Autotune first (its time is reported as tune_ms), then time cuBLAS and the tuned CODA variants interleaved.
    std::vector<std::string> timed;  // variant names in the order of `launches`
    std::vector<std::function<void(int)>> launches;
    if (opt.variants.count("cublas") != 0) {
      cublasOperation_t const op_b = b_col ? CUBLAS_OP_N : CUBLAS_OP_T, op_a = a_col ? CUBLAS_OP_T : CUBLAS_OP_N;
      float const beta = s.accumulate ? 1.0f : 0.0f;
      cudaDataType_t const td = s.dtype_d == CODA_FP32 ? CUDA_R_32F : CUDA_R_16BF;
      timed.push_back("cublas");
      launches.push_back([&, op_a, op_b, beta, td](int set) {
        float const alpha = 1.0f;
        CHECK_CUBLAS(cublasGemmEx(cublas, op_b, op_a, static_cast<int>(s.N), static_cast<int>(s.M),
                                  static_cast<int>(s.K), &alpha, bs[static_cast<size_t>(set)]->ptr, CUDA_R_16BF,
                                  static_cast<int>(ldb), as[static_cast<size_t>(set)]->ptr, CUDA_R_16BF,
                                  static_cast<int>(lda), &beta, d.ptr, td, static_cast<int>(ldd), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      });
      winners["cublas"] = "cublas";
    }
    std::map<std::string, double> tune_ms;
    for (std::string const variant : {"coda", "coda_cublas"}) {
      if (opt.variants.count(variant) == 0) continue;
      bool const no_cublas = variant == "coda";
      auto set_env = [no_cublas] {
        if (no_cublas) {
          setenv("CODA_GEMM_NO_CUBLAS", "1", 1);
        } else {
          unsetenv("CODA_GEMM_NO_CUBLAS");
        }
      };
      set_env();
      auto const t0 = std::chrono::steady_clock::now();
      run_coda(nullptr, 0);  // first call: autotunes (or finds the winner in CODA_AUTOTUNE_CACHE)
      CHECK_CUDA(cudaDeviceSynchronize());
      tune_ms[variant] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      winners[variant] = coda_gemm_last_choice();
      timed.push_back(variant);
      // The tuned winner is cached per (problem, CODA_GEMM_NO_CUBLAS): set the variable before each run.
      launches.push_back([&, set_env](int set) {
        set_env();
        run_coda(nullptr, set);
      });
    }
    std::vector<Timing> const times = timer.measure_interleaved(opt.warmup, sets, launches);
    for (size_t v = 0; v < timed.size(); ++v) {
      double const tm = tune_ms.count(timed[v]) != 0 ? tune_ms[timed[v]] : -1.0;
      tf[timed[v]] = records[record(timed[v], winners[timed[v]], times[v], tm)].tflops;
    }
    unsetenv("CODA_GEMM_NO_CUBLAS");
    if (opt.variants.count("configs") != 0) {
      for (std::string const& c : configs) {
        if (coda_gemm_candidate_check(c.c_str(), &p0) == 0) continue;
        Timing const t = timer.measure(opt.warmup, sets, [&](int set) { run_coda(c.c_str(), set); });
        record("coda:" + c, c, t, -1.0);
      }
    }
    double const base = tf.count("cublas") != 0 ? tf["cublas"] : 0.0;
    for (size_t i = first_record; i < records.size(); ++i) {
      Record& r = records[i];
      if (base > 0.0 && r.variant != "cublas") r.ratio = r.tflops / base;
      if (jsonl != nullptr) {
        std::fprintf(jsonl,
                     "{\"suite\":\"gemm\",\"op\":\"%s\",\"config\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,"
                     "\"pass\":\"%s\",\"variant\":\"%s\",\"ms\":%.6f,\"ms_min\":%.6f,\"tflops\":%.3f,"
                     "\"peak_gib\":%.4f,\"commit\":\"%s\",\"gpu\":\"%s\",\"date\":\"%s\",\"winner\":\"%s\","
                     "\"layout\":\"%s\",\"dtype_ab\":\"bf16\",\"dtype_d\":\"%s\",\"accumulate\":%s,"
                     "\"ratio_vs_cublas\":%s,\"tune_ms\":%s,\"reps\":%d,\"l2_flush\":%s}\n",
                     json_escape(s.op).c_str(), json_escape(s.config).c_str(), static_cast<long long>(s.M),
                     static_cast<long long>(s.N), static_cast<long long>(s.K), s.pass.c_str(),
                     json_escape(r.variant).c_str(), r.t.median_ms, r.t.min_ms, r.tflops, r.peak_gib,
                     json_escape(commit).c_str(), json_escape(gpu).c_str(), date.c_str(),
                     json_escape(r.winner).c_str(), s.kind.c_str(), dtype_name(s.dtype_d),
                     s.accumulate ? "true" : "false",
                     r.ratio > 0.0 ? std::to_string(r.ratio).c_str() : "null",
                     r.tune_ms >= 0.0 ? std::to_string(r.tune_ms).c_str() : "null", opt.reps,
                     opt.flush ? "true" : "false");
        std::fflush(jsonl);
      }
    }
    double const coda_tf =
        tf.count("coda") != 0 ? tf["coda"] : (tf.count("coda_cublas") != 0 ? tf["coda_cublas"] : 0.0);
    std::string const winner = winners.count("coda") != 0 ? winners["coda"] : winners["coda_cublas"];
    double const ratio = base > 0.0 && coda_tf > 0.0 ? coda_tf / base : 0.0;
    if (ratio > 0.0) ratios.push_back(ratio);
    std::printf("%-11s %-22s %-4s %7lld %7lld %7lld | %9.1f %9.1f %6.3f | %-40s\n", s.config.c_str(), s.op.c_str(),
                s.pass.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.N),
                static_cast<long long>(s.K), base, coda_tf, ratio, winner.c_str());
    for (size_t i = first_record; i < records.size(); ++i) {
      Record const& r = records[i];
      if (r.variant.rfind("coda:", 0) == 0 || r.variant == "coda_cublas") {
        std::printf("%-11s   %-38s %9s %9.1f %6.3f | %s\n", "", r.variant.c_str(), "", r.tflops, r.ratio,
                    r.winner.c_str());
      }
    }
    std::fflush(stdout);
  }

  if (!ratios.empty()) {
    double log_sum = 0.0;
    double worst = ratios.front();
    int below = 0;
    for (double r : ratios) {
      log_sum += std::log(r);
      worst = std::min(worst, r);
      below += r < 0.92 ? 1 : 0;
    }
    std::printf("\nCODA (%s) vs cuBLAS over %zu shapes: geometric mean %.3f, min %.3f, %d below 0.92 "
                "(target: >= 0.97, none below 0.92)\n",
                opt.variants.count("coda") != 0 ? "CODA kernels only" : "cuBLAS among candidates", ratios.size(),
                std::exp(log_sum / static_cast<double>(ratios.size())), worst, below);
  }
  std::printf("wall time %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count());
  if (jsonl != nullptr) std::fclose(jsonl);
  cublasDestroy(cublas);
  return 0;
}
