// Autotuning support shared by every op that has more than one kernel for a problem: event timing of candidate
// launches on the caller's stream, and a thread-safe winner cache keyed by (op key, device), optionally persisted
// in a text file. The op decides what its candidates are and what the key contains (src/gemm/gemm.cu is the first
// user); this file knows nothing about GEMMs.
//
// Environment:
//   CODA_AUTOTUNE_CACHE=<file>  load winners from <file> on first use and append every new winner to it. Lines are
//                               "<key>\t<winner>\t<ms>" where <key> ends with the device signature (name, SM count,
//                               compute capability), so one file can serve several GPU models. Later lines win.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace coda::runtime {

/// A candidate kernel: a stable name (the op can parse it back) and a function that enqueues one run on a stream.
/// `launch` may throw coda::detail::Error (the candidate is then skipped).
struct TuneCandidate {
  std::string name;
  std::function<void(cudaStream_t)> launch;
};

struct TimingOptions {
  int min_reps = 5;         ///< timed runs per candidate and round, at least
  int max_reps = 20;        ///< and at most
  /// Round-robin rounds over all candidates (median over every timed run). 1 = each candidate timed once, in
  /// order. Measured on H200 (bench_gemm, 93 shapes): 3 rounds of few runs picked pingpong 128x128 far more often
  /// and lost (geomean 0.973 vs cuBLAS) against one sequential pass (0.989, 0.992): keep 1 until understood.
  int rounds = 1;
  float target_ms = 40.0f;  ///< aim for about this much timed work per candidate (all rounds together)
  /// Before any timing, this long of back-to-back runs of the candidates in turn (each after its L2 flush, except
  /// with back_to_back, which settles at the load its timing sees), so
  /// that the SM clock has settled where sustained load holds it (the H200 at 700 W: ~1300-1500 MHz instead of
  /// 1980 MHz cool). 0: no warm-up (a cool-card timing).
  float warm_ms = 0.0f;
  /// Time each candidate's runs of a round back to back between two events, after one L2 flush (one sample per
  /// round: the mean run), instead of each run alone after its own flush. That is how a training step and the
  /// sustained-load benchmarks run a kernel; on a cool card such bursts put the same llama3 gate/up candidate first
  /// as the settled clock (1B, 8B; the 8B order identical), bench/results/vs_quack/deep_store_ab/ run 5.
  bool back_to_back = false;

  /// What CODA_GEMM_AUTOTUNE=burst asks for: 3 rounds in rotating order of back-to-back bursts of ~20 ms.
  static TimingOptions burst() {
    TimingOptions o;
    o.min_reps = 3;
    o.max_reps = 200;
    o.rounds = 3;
    o.target_ms = 60.0f;
    o.back_to_back = true;
    return o;
  }

  /// What CODA_GEMM_AUTOTUNE=settled asks for: PROTOCOL.md's sustained-load method applied to tuning (warm-up, then
  /// rounds in rotating order). About 1.5 s + 60 ms per candidate for each new problem.
  static TimingOptions settled() {
    TimingOptions o;
    o.min_reps = 3;
    o.max_reps = 40;
    o.rounds = 3;
    o.target_ms = 60.0f;
    o.warm_ms = 1500.0f;
    return o;
  }

  /// The finals of CODA_GEMM_AUTOTUNE=sustained: settled() without its L2 flush per run (a memset per run lowers
  /// the board's average power, so the card never reaches its limit and a kernel's energy stays invisible) and with
  /// ~120 ms back-to-back windows per round: long enough that the power limiter has set the clock for the kernel
  /// being timed, as vs_quack.py's 150 ms windows.
  static TimingOptions sustained() {
    TimingOptions o = settled();
    o.max_reps = 1000;
    o.target_ms = 3 * 120.0f;  // over settled()'s 3 rounds
    o.back_to_back = true;
    return o;
  }
};

/// Times each candidate on `stream`: one warm-up run and one run to estimate the time, then (warm_ms > 0) the
/// settling runs, then `rounds` rounds, each starting one candidate later in the list, in which every candidate
/// gets `reps` event-timed runs (reps from TimingOptions and the estimate), each after an L2 flush (operands come
/// from HBM, as in training), or with back_to_back one burst of `reps` runs after one flush;
/// returns the median over all timed runs in ms per candidate, +infinity for a
/// candidate that threw or failed to launch. Blocks the calling thread until the timing runs finish. The stream
/// must not be capturing a CUDA graph (check with stream_is_capturing first).
std::vector<float> time_candidates(std::vector<TuneCandidate> const& candidates, cudaStream_t stream,
                                   TimingOptions const& options = {});

/// True if `stream` (or, for the legacy default stream, the device) is capturing a CUDA graph: no timing then.
bool stream_is_capturing(cudaStream_t stream);

/// "<device name>/sm<multiprocessors>/cc<major>.<minor>" of a CUDA device (cached per ordinal).
std::string const& device_signature(int device);

/// The cache of autotuning winners. One process-wide instance; every member is thread-safe.
class TuneCache {
 public:
  static TuneCache& global();

  /// The winner recorded for (key, device) in this process, or loaded from CODA_AUTOTUNE_CACHE for a device with
  /// the same signature; nullopt if none.
  std::optional<std::string> find(std::string const& key, int device);
  /// Records a winner in memory and, when CODA_AUTOTUNE_CACHE is set, appends it to that file.
  void store(std::string const& key, int device, std::string const& winner, float ms);
  /// Forgets every in-memory winner (the file is left alone and is read again on the next find).
  void clear();
  /// Held by an op while it tunes, so that two threads do not time the same problem at once (and timings do not
  /// overlap). Re-check `find` after taking it.
  std::mutex& tuning_mutex() { return tuning_mutex_; }

 private:
  TuneCache() = default;
  void load_file_locked(std::string const& path);

  std::mutex mutex_;
  std::mutex tuning_mutex_;
  std::unordered_map<std::string, std::string> memory_;  // "<key>|dev<ordinal>" -> winner
  std::unordered_map<std::string, std::string> file_;    // "<key>|<signature>" -> winner, from the cache file
  std::string loaded_path_;
  bool file_loaded_ = false;
};

/// Value of an environment variable ("" when unset).
std::string env_string(char const* name);
/// True when the variable is set to anything but "", "0", "false", "off" or "no".
bool env_flag(char const* name);

}  // namespace coda::runtime
