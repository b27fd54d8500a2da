// The plain GEMM's dispatcher: kernel registry, candidate names, autotuning and the run() entry point.
// Host-only translation unit: no CUTLASS headers and no kernels (those are generated from src/gemm/plain.cmake).
#include "gemm/gemm.hpp"
#include "gemm/knobs.hpp"

#include "common/error.hpp"
#include "gemm/cublas_backend.hpp"
#include "gemm/plain_instances.hpp"
#include "gemm/tile_grid.hpp"
#include "runtime/autotune.hpp"
#include "runtime/device.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>


namespace coda::gemm {

int device_sm_count(int device) { return runtime::device_info(device).sm_count; }

namespace {

// ---- problem classes and the kernel registry ---------------------------------------------------------------------

enum class Layout : uint8_t { kFwd, kDgrad, kWgrad, kOther };

Layout layout_of(GemmArgs const& a) {
  if (!a.a_col_major && !a.b_col_major) return Layout::kFwd;
  if (!a.a_col_major && a.b_col_major) return Layout::kDgrad;
  if (a.a_col_major && a.b_col_major) return Layout::kWgrad;
  return Layout::kOther;  // A M-major with B K-major: no CODA kernel (cuBLAS)
}

char const* layout_name(Layout l) {
  switch (l) {
    case Layout::kFwd: return "fwd (A K-major, B K-major)";
    case Layout::kDgrad: return "dgrad (A K-major, B N-major)";
    case Layout::kWgrad: return "wgrad (A M-major, B N-major)";
    default: return "A M-major, B K-major";
  }
}

char const* dtype_name(coda_dtype t) {
  switch (t) {
    case CODA_BF16: return "bf16";
    case CODA_FP16: return "fp16";
    case CODA_FP32: return "fp32";
    case CODA_INT32: return "int32";
    case CODA_INT64: return "int64";
    default: return "?";
  }
}

size_t dtype_bytes(coda_dtype t) { return t == CODA_FP32 ? 4 : 2; }

/// One compiled kernel: which problems it serves (all take bf16 A and B) and its function table.
struct Entry {
  Layout layout;
  coda_dtype dtype_d;
  plain::Ops const& (*ops)();
};

// Order matters: within a layout, the first entry is the untuned default and stage 1 of tuning lists them in order
// (src/gemm/plain.cmake, the one list of the compiled kernels).
constexpr Entry kEntries[] = {
#include "gemm/plain_entries.inc"
};

std::vector<plain::Ops const*> kernels_for(GemmArgs const& a) {
  std::vector<plain::Ops const*> out;
  if (a.dtype_ab != CODA_BF16) return out;
  Layout const l = layout_of(a);
  for (Entry const& e : kEntries) {
    if (e.layout == l && e.dtype_d == a.dtype_d) out.push_back(&e.ops());
  }
  return out;
}

std::string describe(GemmArgs const& a) {
  return coda::detail::concat("M=", a.M, " N=", a.N, " K=", a.K, " ", dtype_name(a.dtype_ab), " -> ",
                              dtype_name(a.dtype_d), ", ", layout_name(layout_of(a)),
                              a.accumulate ? ", accumulate" : "");
}

// ---- candidates --------------------------------------------------------------------------------------------------

constexpr char kCublas[] = "cublas";

struct Candidate {
  plain::Ops const* ops = nullptr;  // nullptr: cuBLAS
  Knobs knobs;
};

std::string name_of(Candidate const& c) {
  if (c.ops == nullptr) return kCublas;
  std::string const knobs = knobs_string(c.knobs);
  return std::string(c.ops->info.config) + (knobs.empty() ? "" : ":" + knobs);
}

/// Parses "<config>[:k=v,...]" or "cublas" for problem `a`; nullopt with *why set when the name is malformed or no
/// kernel of that config is compiled for this problem's layout and dtypes.
std::optional<Candidate> parse_candidate(std::string const& text, GemmArgs const& a, std::string* why) {
  if (text == kCublas) return Candidate{};
  size_t const colon = text.find(':');
  std::string const config = text.substr(0, colon);
  Candidate c;
  for (plain::Ops const* ops : kernels_for(a)) {
    if (config == ops->info.config) c.ops = ops;
  }
  if (c.ops == nullptr) {
    bool known = false;
    std::string compiled;
    for (Entry const& e : kEntries) {
      plain::Ops const& ops = e.ops();
      if (config != ops.info.config) continue;
      known = true;
      compiled += coda::detail::concat(compiled.empty() ? "" : "; ", layout_name(e.layout), " bf16 -> ",
                                       dtype_name(e.dtype_d));
    }
    if (!known) {
      std::string names;
      for (std::string const& n : candidate_configs()) names += (names.empty() ? "" : ", ") + n;
      *why = coda::detail::concat("unknown GEMM config '", config, "' (known: ", names, ")");
    } else {
      *why = coda::detail::concat("config '", config, "' is not compiled for ", describe(a), " (compiled for: ",
                                  compiled, "; other problems run on cublas)");
    }
    return std::nullopt;
  }
  if (colon == std::string::npos) return c;
  std::string bad;
  if (!parse_knobs(text.substr(colon + 1), c.knobs, &bad)) {
    *why = coda::detail::concat(bad, " in '", text, "'");
    return std::nullopt;
  }
  return c;
}

Operands operands_of(GemmArgs const& a) {
  Operands op;
  op.M = a.M;
  op.N = a.N;
  op.K = a.K;
  op.A = a.A;
  op.lda = a.lda;
  op.B = a.B;
  op.ldb = a.ldb;
  op.C = a.accumulate ? a.D : nullptr;  // accumulate: C = D, beta = 1 (the epilogue reads C only when beta != 0)
  op.ldc = a.ldd;
  op.D = a.D;
  op.ldd = a.ldd;
  return op;
}

LinearCombinationArgs epilogue_of(GemmArgs const& a) { return {a.alpha, a.accumulate ? 1.0f : 0.0f}; }

std::string check(Candidate const& c, GemmArgs const& a) {
  if (c.ops == nullptr) return cublas_check(a);
  return c.ops->check(operands_of(a), epilogue_of(a), c.knobs);
}

size_t workspace_of(Candidate const& c, GemmArgs const& a) {
  if (c.ops == nullptr) return 0;  // cuBLAS uses the workspace its handle owns
  return c.ops->workspace_size(operands_of(a), epilogue_of(a), c.knobs);
}

void launch(Candidate const& c, GemmArgs const& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (c.ops == nullptr) {
    cublas_run(a, stream);
  } else {
    c.ops->run(operands_of(a), epilogue_of(a), c.knobs, workspace, workspace_bytes, stream);
  }
}

thread_local std::string t_last_choice;

// ---- tuning ------------------------------------------------------------------------------------------------------

/// Whether CUTLASS's heuristic raster order resolves to along M for kernel `info` on `a` at max swizzle `swizzle`:
/// along M when N's scheduled CTA count (gemm::tile_grid, padding included) is the larger. The ragged scheduler
/// resolves it through the same code.
bool heuristic_along_m(KernelInfo const& info, GemmArgs const& a, int swizzle) {
  TileGrid const g = tile_grid(info, a.M, a.N, swizzle);
  return g.n > g.m;
}

/// c with a heuristic raster replaced by the order it resolves to: two names, one schedule, compare equal.
Candidate resolved(Candidate c, GemmArgs const& a) {
  if (c.ops != nullptr && c.knobs.raster == Raster::kHeuristic) {
    c.knobs.raster = heuristic_along_m(c.ops->info, a, c.knobs.swizzle) ? Raster::kAlongM : Raster::kAlongN;
  }
  return c;
}

/// Stage 1's swizzles (at the heuristic raster): 1, the default knobs, and 8, the L2-friendly order. At swizzle 1
/// pp_128x192x64_c2x1_d6 read 6.0 GB of DRAM for llama3-8B gate/up (8192 x 28672 x 4096) against 2.4 GB at raster n,
/// swizzle 8 (ncu), so a kernel timed only at swizzle 1 could lose stage 1 on an order stage 2 would have fixed;
/// swizzle 8 alone would pad small problems' tile counts (CUTLASS's scheduler rounds them to the swizzle).
constexpr int kStage1Swizzles[] = {1, 8};

/// Stage 1: every compiled kernel for the problem at the default knobs and at swizzle 8. A stream-K kernel runs
/// stream-K, plus data-parallel when no persistent kernel of the same tile exists for this layout (then it stands
/// in for it).
std::vector<Candidate> stage1_candidates(GemmArgs const& a) {
  std::vector<plain::Ops const*> const kernels = kernels_for(a);
  std::vector<Candidate> out;
  auto push = [&](plain::Ops const* k, Knobs knobs) {
    for (int swizzle : kStage1Swizzles) {
      knobs.swizzle = swizzle;
      out.push_back(Candidate{k, knobs});
    }
  };
  for (plain::Ops const* k : kernels) {
    if (!k->info.stream_k) {
      push(k, Knobs{});
      continue;
    }
    bool persistent_twin = false;
    for (plain::Ops const* o : kernels) {
      persistent_twin |= !o->info.stream_k && o->info.tile_m == k->info.tile_m && o->info.tile_n == k->info.tile_n &&
                         o->info.cluster_m == k->info.cluster_m && o->info.cluster_n == k->info.cluster_n;
    }
    Knobs knobs;
    if (!persistent_twin) {
      knobs.decomposition = Decomposition::kDataParallel;
      push(k, knobs);
    }
    knobs.decomposition = Decomposition::kStreamK;
    push(k, knobs);
  }
  return out;
}

/// The stage-1 candidates that can run `a` (check() passes); *reasons (when given) collects why the others cannot.
std::vector<Candidate> runnable_stage1(GemmArgs const& a, std::string* reasons = nullptr) {
  std::vector<Candidate> out;
  for (Candidate const& c : stage1_candidates(a)) {
    std::string const why = check(c, a);
    if (why.empty()) {
      out.push_back(c);
    } else if (reasons != nullptr && c.knobs.swizzle == kStage1Swizzles[0]) {  // once per kernel
      *reasons += coda::detail::concat("; ", name_of(c), ": ", why);
    }
  }
  return out;
}

/// Stage 2: the stage-1 seed's raster orders x swizzles 1, 2, 4, 8, except the settings stage 1 already timed.
std::vector<Candidate> stage2_candidates(Candidate const& best, GemmArgs const& a) {
  std::vector<Candidate> out;
  if (best.ops == nullptr) return out;
  KernelInfo const& info = best.ops->info;
  for (Raster r : {Raster::kAlongM, Raster::kAlongN}) {
    for (int swizzle : {1, 2, 4, 8}) {
      bool const same_as_stage1 =
          std::find(std::begin(kStage1Swizzles), std::end(kStage1Swizzles), swizzle) != std::end(kStage1Swizzles) &&
          best.knobs.raster == Raster::kHeuristic && (r == Raster::kAlongM) == heuristic_along_m(info, a, swizzle);
      if (same_as_stage1) continue;
      Candidate c = best;
      c.knobs.raster = r;
      c.knobs.swizzle = swizzle;
      out.push_back(c);
    }
  }
  return out;
}

/// A stream-ordered device buffer freed (stream-ordered) on scope exit.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (cudaMallocAsync(&ptr_, bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      ptr_ = nullptr;
    }
  }
  ~StreamBuffer() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }
  StreamBuffer(StreamBuffer const&) = delete;
  StreamBuffer& operator=(StreamBuffer const&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

/// The indices of the candidates that ran, fastest first (ties in timing order).
std::vector<size_t> by_time(std::vector<float> const& times) {
  std::vector<size_t> ranked;
  for (size_t i = 0; i < times.size(); ++i) {
    if (times[i] < std::numeric_limits<float>::infinity()) ranked.push_back(i);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t x, size_t y) { return times[x] < times[y]; });
  return ranked;
}

/// One kernel for the tuner's stages: the same compiled kernel and decomposition, whatever the knobs.
bool same_kernel(Candidate const& x, Candidate const& y) {
  return x.ops == y.ops && x.knobs.decomposition == y.knobs.decomposition;
}

/// The sustained-load finals (the default tuning's for problems of kDefaultFinalsFromMs or more;
/// CODA_GEMM_AUTOTUNE=sustained's at every size), from the stage-1/2 timings: the three fastest distinct CODA kernels
/// (kernel and decomposition), each at its fastest knobs and at swizzle 8 along M and along N, and cuBLAS when it
/// was timed. Why the swizzle-8 orders: the cool timing undervalues them (llama3-8B gate/up: pp_128x192x64_c2x1 at
/// swizzle 1 timed 2.75 ms on the cool card and ran 3.0 ms under sustained load, where d6 at raster n, swizzle 8 ran
/// 2.85 ms; swizzle 1 read 6.0 GB of DRAM, n/8 2.4 GB; bench/results/vs_quack/radd_tuner/).
std::vector<Candidate> finalists(std::vector<Candidate> const& all, std::vector<float> const& times,
                                 GemmArgs const& a) {
  std::vector<Candidate> out;
  std::vector<std::string> schedules;  // the resolved names: a heuristic raster and its explicit twin are one run
  auto add = [&](Candidate const& c) {
    std::string const schedule = name_of(resolved(c, a));
    if (std::find(schedules.begin(), schedules.end(), schedule) != schedules.end()) return;
    schedules.push_back(schedule);
    out.push_back(c);
  };
  int kernels = 0;
  for (size_t i : by_time(times)) {
    Candidate const& c = all[i];
    if (c.ops == nullptr) {
      add(c);  // cuBLAS
      continue;
    }
    bool const seen = std::any_of(out.begin(), out.end(), [&](Candidate const& o) { return same_kernel(o, c); });
    if (seen || kernels == 3) continue;
    ++kernels;
    add(c);
    for (Raster r : {Raster::kAlongM, Raster::kAlongN}) {
      Candidate o = c;
      o.knobs.raster = r;
      o.knobs.swizzle = 8;
      add(o);
    }
  }
  return out;
}

/// Times the candidates on the caller's stream and buffers; returns the winner (and its time). Without
/// accumulate the timing runs write the caller's D (the real run overwrites it next). With accumulate they write a
/// zeroed scratch copy of D (C = D = scratch), so the caller's D is never read-modified twice; nullopt when the
/// scratch cannot be allocated.
/// *best_coda / *best_coda_ms: the fastest CODA kernel among them (what a CUDA graph capture runs instead of a cuBLAS
/// winner, see choose()); unset when none ran. When the fastest stage-1/2 time is at least `finals_from_ms`, the
/// winner comes from finalists(), re-timed under sustained load (infinity: never).
std::optional<Candidate> tune(GemmArgs const& a, std::vector<Candidate> const& stage1, bool cublas_allowed,
                              runtime::TimingOptions const& timing, float finals_from_ms, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream, float* best_ms,
                              std::optional<Candidate>* best_coda_out, float* best_coda_ms) {
  GemmArgs t = a;
  std::optional<StreamBuffer> scratch;
  if (a.accumulate) {
    size_t const bytes = static_cast<size_t>(a.M) * static_cast<size_t>(a.N) * dtype_bytes(a.dtype_d);
    scratch.emplace(bytes, stream);
    if (scratch->get() == nullptr) return std::nullopt;
    CODA_CUDA_CHECK(cudaMemsetAsync(scratch->get(), 0, bytes, stream));
    t.D = scratch->get();
    t.ldd = a.N;
  }
  auto run_all = [&](std::vector<Candidate> const& cands, runtime::TimingOptions const& options) {
    std::vector<runtime::TuneCandidate> list;
    for (Candidate const& c : cands) {
      list.push_back({name_of(c), [c, &t, workspace, workspace_bytes](cudaStream_t s) {
                        launch(c, t, workspace, workspace_bytes, s);
                      }});
    }
    return runtime::time_candidates(list, stream, options);
  };

  std::vector<Candidate> all = stage1;
  bool finals_ran = false;
  if (cublas_allowed) all.push_back(Candidate{});
  std::vector<float> times = run_all(all, timing);
  // The fastest CODA kernel that ran (index into all), or all.size().
  auto fastest_coda = [&]() {
    size_t i_best = all.size();
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].ops != nullptr && times[i] < std::numeric_limits<float>::infinity() &&
          (i_best == all.size() || times[i] < times[i_best])) {
        i_best = i;
      }
    }
    return i_best;
  };
  // Stage 2 refines the two fastest CODA kernels (even when cuBLAS won stage 1: a knob may beat it), two distinct
  // ones (kernel and decomposition; stage 1 timed each at two swizzles): the order that suits a kernel's L2 reuse
  // is one stage 1 may not have timed (llama3-1B gate/up: pp_128x192x64_c2x1_d6 at raster m, swizzle 8 ran 0.94x
  // cuBLAS under sustained load, the one-seed tuner's pick 1.07x).
  std::vector<size_t> seeds;
  for (size_t i : by_time(times)) {
    if (all[i].ops == nullptr || seeds.size() == 2) continue;
    bool const seen = std::any_of(seeds.begin(), seeds.end(), [&](size_t j) { return same_kernel(all[j], all[i]); });
    if (!seen) seeds.push_back(i);
  }
  std::vector<Candidate> refine;
  for (size_t seed : seeds) {
    std::vector<Candidate> const more = stage2_candidates(all[seed], a);
    refine.insert(refine.end(), more.begin(), more.end());
  }
  if (!refine.empty()) {
    runtime::TimingOptions refine_timing = timing;
    refine_timing.warm_ms /= 5;  // the clock has settled during stage 1: a short re-warm
    std::vector<float> const refine_times = run_all(refine, refine_timing);
    all.insert(all.end(), refine.begin(), refine.end());
    times.insert(times.end(), refine_times.begin(), refine_times.end());
  }
  float const fastest = *std::min_element(times.begin(), times.end());
  bool const finals = fastest < std::numeric_limits<float>::infinity() && fastest >= finals_from_ms;
  if (std::vector<Candidate> list = finals ? finalists(all, times, a) : std::vector<Candidate>{}; !list.empty()) {
    // Only the finalists compete, with their sustained-load times (a cool-card time ranks a kernel that draws more
    // power, e.g. through more DRAM traffic, higher than the power limit will let it run). Should none of them run
    // again, stages 1-2 decide.
    std::vector<float> const final_times = run_all(list, runtime::TimingOptions::sustained());
    if (std::any_of(final_times.begin(), final_times.end(),
                    [](float ms) { return ms < std::numeric_limits<float>::infinity(); })) {
      all = std::move(list);
      times = final_times;
      finals_ran = true;
    }
  }
  size_t const best = static_cast<size_t>(std::min_element(times.begin(), times.end()) - times.begin());
  if (!(times[best] < std::numeric_limits<float>::infinity())) {
    coda::detail::fail(CODA_ERROR_INTERNAL, "GEMM autotuning: no candidate could run ", describe(a));
  }
  if (size_t const coda_i = fastest_coda(); coda_i < all.size()) {  // over stage 2's refinements too (or the finals)
    *best_coda_out = all[coda_i], *best_coda_ms = times[coda_i];
  }
  if (runtime::env_flag("CODA_AUTOTUNE_LOG")) {  // every candidate's time, in timing order, then the pick
    std::string line =
        coda::detail::concat("[coda] GEMM tuning of ", describe(a), finals_ran ? ", sustained finals" : "", ":");
    for (size_t i = 0; i < all.size(); ++i) line += coda::detail::concat(" ", name_of(all[i]), "=", times[i]);
    std::fprintf(stderr, "%s -> %s\n", line.c_str(), name_of(all[best]).c_str());
  }
  *best_ms = times[best];
  return all[best];
}

/// The timing method CODA_GEMM_AUTOTUNE names besides on/off: "settled" (TimingOptions::settled, the
/// sustained-load method), "burst" (TimingOptions::burst, back-to-back bursts on the cool card) or "sustained" (the
/// default timing, then finalists() re-timed by TimingOptions::sustained, at every size); "" for the default (each
/// run alone after an L2 flush, then the sustained finals for problems of kDefaultFinalsFromMs or more).
std::string tuning_mode() {
  std::string v = runtime::env_string("CODA_GEMM_AUTOTUNE");
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return v == "settled" || v == "burst" || v == "sustained" ? v : std::string();
}

/// The default tuning re-times its finalists under sustained load when the fastest candidate took at least this
/// long: from about a llama3-1B q-projection (8192 x 2048 x 2048: 69 GFLOP, ~0.12 ms at ~600 TFLOP/s; computed)
/// up. Smaller problems are a small share of a step, and the finals' ~1.5-5 s per shape would dominate their first
/// call (the GPU test suite's GEMM and block tests took 171 s with finals at every size against 40 s without).
constexpr float kDefaultFinalsFromMs = 0.1f;

/// When tune() runs its sustained finals for `mode`.
float finals_from_ms(std::string const& mode) {
  if (mode == "sustained") return 0.0f;
  if (mode.empty()) return kDefaultFinalsFromMs;
  return std::numeric_limits<float>::infinity();
}

runtime::TimingOptions timing_for(std::string const& mode) {
  if (mode == "settled") return runtime::TimingOptions::settled();
  if (mode == "burst") return runtime::TimingOptions::burst();
  return runtime::TimingOptions{};
}

/// The winner cache key. Each timing method has its own keys ("|tune=settled", "|tune=burst", "|tune=sustained"): the
/// methods can pick differently, and a cache file says which one picked.
std::string tune_key(GemmArgs const& a, bool cublas_allowed) {
  std::string const mode = tuning_mode();
  return coda::detail::concat("gemm|M=", a.M, "|N=", a.N, "|K=", a.K, "|ab=", dtype_name(a.dtype_ab),
                              "|d=", dtype_name(a.dtype_d), "|a=", a.a_col_major ? "m" : "k",
                              "|b=", a.b_col_major ? "n" : "k", "|acc=", a.accumulate ? 1 : 0,
                              "|cublas=", cublas_allowed ? 1 : 0, mode.empty() ? "" : "|tune=", mode);
}

/// The kernel run() uses for `a` (pinned, cached, tuned now, or the default), never cuBLAS when excluded.
Candidate choose(GemmArgs const& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  std::string const pinned = runtime::env_string("CODA_GEMM_CONFIG");
  if (!pinned.empty()) {
    std::string why;
    std::optional<Candidate> c = parse_candidate(pinned, a, &why);
    if (c) why = check(*c, a);
    if (!why.empty()) coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "CODA_GEMM_CONFIG=", pinned, ": ", why);
    return *c;
  }

  bool const cublas_allowed = !runtime::env_flag("CODA_GEMM_NO_CUBLAS") && cublas_check(a).empty();
  int device = 0;
  CODA_CUDA_CHECK(cudaGetDevice(&device));
  std::string const key = tune_key(a, cublas_allowed);
  runtime::TuneCache& cache = runtime::TuneCache::global();
  auto cached = [&]() -> std::optional<Candidate> {
    std::optional<std::string> hit = cache.find(key, device);
    if (!hit) return std::nullopt;
    std::string why;
    std::optional<Candidate> c = parse_candidate(*hit, a, &why);
    if (!c || !check(*c, a).empty() || (c->ops == nullptr && !cublas_allowed)) return std::nullopt;
    return c;
  };
  // While a CUDA graph is captured, cuBLAS is not called: a captured cublasGemmEx failed on the H200 (CUDA 13.0,
  // CUBLAS_STATUS_EXECUTION_FAILED, invalidating the capture) even after a warm-up on the same thread, while CODA's
  // own kernels capture like any launch. The capture runs the fastest CODA kernel instead, which eager tuning
  // recorded under the key without cuBLAS (else the default CODA kernel): a replay then matches eager within one
  // GEMM's rounding, not bit for bit, where eager picked cuBLAS. Checked only when cuBLAS would run (the query
  // costs a driver call).
  auto coda_for_capture = [&](Candidate const& choice) -> Candidate {
    if (choice.ops != nullptr || !runtime::stream_is_capturing(stream)) return choice;
    if (std::optional<std::string> hit = cache.find(tune_key(a, false), device)) {
      std::string why;
      std::optional<Candidate> c = parse_candidate(*hit, a, &why);
      if (c && c->ops != nullptr && check(*c, a).empty()) return *c;
    }
    std::vector<Candidate> const runnable = runnable_stage1(a);
    return runnable.empty() ? choice : runnable.front();  // no CODA kernel for this problem: cuBLAS it is
  };
  if (std::optional<Candidate> c = cached()) return coda_for_capture(*c);  // the common case: one lookup per call

  std::string reasons;
  std::vector<Candidate> const stage1 = runnable_stage1(a, &reasons);
  if (stage1.empty()) {
    if (cublas_allowed) return Candidate{};  // no CODA kernel: even in a capture
    std::string const cublas_why = cublas_check(a);
    coda::detail::fail(cublas_why.empty() ? CODA_ERROR_NOT_IMPLEMENTED : CODA_ERROR_DTYPE, "no CODA GEMM kernel for ",
                       describe(a), reasons.empty() ? " (none compiled for this layout/dtype)" : reasons,
                       cublas_why.empty() ? " and cuBLAS is excluded by CODA_GEMM_NO_CUBLAS" : "; " + cublas_why);
  }

  Candidate fallback = cublas_allowed ? Candidate{} : stage1.front();
  std::string const autotune = runtime::env_string("CODA_GEMM_AUTOTUNE");
  // No timing in a capture (and no cuBLAS: above); not cached, so a later eager call still tunes.
  if (runtime::stream_is_capturing(stream)) return stage1.front();
  if (!autotune.empty() && !runtime::env_flag("CODA_GEMM_AUTOTUNE")) return fallback;  // timing not wanted
  std::lock_guard<std::mutex> lock(cache.tuning_mutex());
  if (std::optional<Candidate> c = cached()) return *c;  // another thread tuned it meanwhile
  float ms = 0.0f, coda_ms = 0.0f;
  std::optional<Candidate> best_coda;
  std::string const mode = tuning_mode();
  std::optional<Candidate> winner = tune(a, stage1, cublas_allowed, timing_for(mode), finals_from_ms(mode), workspace,
                                         workspace_bytes, stream, &ms, &best_coda, &coda_ms);
  if (!winner) return fallback;
  cache.store(key, device, name_of(*winner), ms);
  // The same timings give the answer without cuBLAS (CODA_GEMM_NO_CUBLAS, and what a capture runs).
  if (cublas_allowed && best_coda) cache.store(tune_key(a, false), device, name_of(*best_coda), coda_ms);
  return *winner;
}

/// Problems with nothing to multiply: M or N = 0 (nothing to write) and K = 0 (D = 0, or D unchanged).
bool run_trivial(GemmArgs const& a, cudaStream_t stream) {
  if (a.M == 0 || a.N == 0) return true;
  if (a.K != 0) return false;
  if (!a.accumulate) {
    size_t const elem = dtype_bytes(a.dtype_d);
    CODA_CUDA_CHECK(cudaMemset2DAsync(a.D, static_cast<size_t>(std::max(a.ldd, a.N)) * elem, 0,
                                      static_cast<size_t>(a.N) * elem, static_cast<size_t>(a.M), stream));
  }
  return true;
}

/// Aligned stand-in operands with minimal leading dimensions: workspace sizes must not depend on pointer values.
GemmArgs synthetic(GemmArgs a) {
  auto round8 = [](int64_t x) { return (x + 7) / 8 * 8; };
  void* const p = reinterpret_cast<void*>(uintptr_t{1} << 20);
  a.A = p;
  a.B = p;
  a.D = p;
  a.lda = round8(a.a_col_major ? a.M : a.K);
  a.ldb = round8(a.b_col_major ? a.N : a.K);
  a.ldd = round8(a.N);
  return a;
}

}  // namespace

// ---- public entry points -----------------------------------------------------------------------------------------

namespace {

/// workspace_size(), or nothing when sizing failed (a CUDA error while querying a kernel): not a size to memoise.
std::optional<size_t> try_workspace_size(GemmArgs const& args) {
  if (args.M <= 0 || args.N <= 0 || args.K <= 0) return size_t{0};
  GemmArgs const a = synthetic(args);
  try {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;  // no device: nothing can run, nothing to size
    }
    static std::mutex mutex;
    static std::unordered_map<std::string, size_t> memo;
    std::string const key = coda::detail::concat(tune_key(a, true), "|dev", device);
    size_t bytes = 0;
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = memo.find(key);
      if (it != memo.end()) {
        bytes = it->second;
        known = true;
      }
    }
    if (!known) {
      for (Candidate const& c : stage1_candidates(a)) {
        if (!check(c, a).empty()) continue;
        bytes = std::max(bytes, workspace_of(c, a));
        for (Candidate const& r : stage2_candidates(c, a)) bytes = std::max(bytes, workspace_of(r, a));
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (memo.size() > (1u << 16)) memo.clear();
      memo.emplace(key, bytes);
    }
    // A pinned candidate (read on every call: the variable may change) may need more, e.g. mode=splitk.
    std::string const pinned = runtime::env_string("CODA_GEMM_CONFIG");
    if (!pinned.empty()) {
      std::string why;
      if (std::optional<Candidate> c = parse_candidate(pinned, a, &why)) bytes = std::max(bytes, workspace_of(*c, a));
    }
    return bytes;
  } catch (coda::detail::Error const&) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
}

}  // namespace

size_t workspace_size(GemmArgs const& args) { return try_workspace_size(args).value_or(0); }

size_t workspace_size_for_shape(int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;  // no device: nothing can run, nothing to size
  }
  bool failed = false;  // some entry could not be sized: its 0 is not memoised
  auto over_entries = [&] {
    size_t bytes = 0;
    for (Entry const& e : kEntries) {
      GemmArgs a;
      a.M = M;
      a.N = N;
      a.K = K;
      a.dtype_ab = CODA_BF16;
      a.dtype_d = e.dtype_d;
      a.a_col_major = e.layout == Layout::kWgrad;
      a.b_col_major = e.layout != Layout::kFwd;
      std::optional<size_t> const b = try_workspace_size(a);
      failed = failed || !b;
      bytes = std::max(bytes, b.value_or(0));
    }
    return bytes;
  };
  // A pinned candidate (read on every call: the variable may change) may need more: not memoized.
  if (!runtime::env_string("CODA_GEMM_CONFIG").empty()) return over_entries();
  // Memoized per (M, N, K, device): the block and LM-head backward size their workspace from several shapes on
  // every call (twice: the caller's query and the call itself), and each shape's loop builds one string key per
  // compiled entry.
  struct Key {
    int64_t M, N, K;
    int device;
    bool operator==(Key const& o) const { return M == o.M && N == o.N && K == o.K && device == o.device; }
  };
  struct Hash {
    size_t operator()(Key const& k) const {
      size_t h = std::hash<int64_t>{}(k.M);
      for (int64_t v : {k.N, k.K, static_cast<int64_t>(k.device)}) h = h * 1000003u ^ std::hash<int64_t>{}(v);
      return h;
    }
  };
  static std::mutex mutex;
  static std::unordered_map<Key, size_t, Hash> memo;
  Key const key{M, N, K, device};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
  }
  size_t const bytes = over_entries();
  if (failed) return bytes;
  std::lock_guard<std::mutex> lock(mutex);
  if (memo.size() > (1u << 16)) memo.clear();
  memo.emplace(key, bytes);
  return bytes;
}

void run(GemmArgs const& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (run_trivial(args, stream)) {
    t_last_choice = "none";
    return;
  }
  Candidate const c = choose(args, workspace, workspace_bytes, stream);
  t_last_choice = name_of(c);
  launch(c, args, workspace, workspace_bytes, stream);
}

std::vector<std::string> const& candidate_configs() {
  static std::vector<std::string> const names = [] {
    std::vector<std::string> out;
    for (Entry const& e : kEntries) {
      std::string const n = e.ops().info.config;
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    }
    out.push_back(kCublas);
    return out;
  }();
  return names;
}

std::string check_candidate(std::string const& candidate, GemmArgs const& args) {
  std::string why;
  std::optional<Candidate> c = parse_candidate(candidate, args, &why);
  if (!c) return why;
  return check(*c, args);
}

size_t candidate_workspace_size(std::string const& candidate, GemmArgs const& args) {
  std::string why;
  std::optional<Candidate> c = parse_candidate(candidate, args, &why);
  if (!c || !check(*c, args).empty()) return 0;
  return workspace_of(*c, args);
}

void run_candidate(std::string const& candidate, GemmArgs const& args, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) {
  std::string why;
  std::optional<Candidate> c = parse_candidate(candidate, args, &why);
  if (c && args.M > 0 && args.N > 0 && args.K > 0) why = check(*c, args);
  if (!why.empty()) coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "GEMM candidate '", candidate, "': ", why);
  if (run_trivial(args, stream)) {
    t_last_choice = "none";
    return;
  }
  t_last_choice = name_of(*c);
  launch(*c, args, workspace, workspace_bytes, stream);
}

std::string const& last_choice() { return t_last_choice; }

void clear_tuning() { runtime::TuneCache::global().clear(); }

}  // namespace coda::gemm
