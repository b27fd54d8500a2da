#include "runtime/autotune.hpp"

#include "common/error.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>

namespace coda::runtime {

namespace {

/// cudaEvent_t owner (timing events, destroyed on every exit path).
class Events {
 public:
  explicit Events(size_t n) : events_(n, nullptr) {
    for (auto& e : events_) CODA_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (auto e : events_) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
  }
  Events(Events const&) = delete;
  Events& operator=(Events const&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

float elapsed_ms(cudaEvent_t start, cudaEvent_t stop) {
  float ms = 0.0f;
  CODA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

/// Runs one launch; false if it threw a CODA error or left a CUDA launch error (the error is cleared).
bool try_launch(TuneCandidate const& c, cudaStream_t stream) {
  try {
    c.launch(stream);
  } catch (coda::detail::Error const&) {
    (void)cudaGetLastError();
    return false;
  }
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace

namespace {

/// A scratch buffer of twice the L2 size, written before every timed run so each candidate reads its operands from
/// HBM, as it will in training (measured on H200: without it, tuning on L2-resident operands picked pingpong
/// 128x128 on shapes where, with cold L2, it is 10-15% slower than cooperative 128x256). Freed after tuning.
class L2Flush {
 public:
  explicit L2Flush(cudaStream_t stream) : stream_(stream) {
    int device = 0, l2 = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) == cudaSuccess && l2 > 0) {
      bytes_ = 2 * static_cast<size_t>(l2);
      if (cudaMalloc(&ptr_, bytes_) != cudaSuccess) {  // no memory to spare: time without flushing
        (void)cudaGetLastError();
        ptr_ = nullptr;
      }
    }
  }
  ~L2Flush() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  L2Flush(L2Flush const&) = delete;
  L2Flush& operator=(L2Flush const&) = delete;
  void operator()(int value) const {
    if (ptr_ != nullptr) CODA_CUDA_CHECK(cudaMemsetAsync(ptr_, value & 0xff, bytes_, stream_));
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

std::vector<float> time_candidates(std::vector<TuneCandidate> const& candidates, cudaStream_t stream,
                                   TimingOptions const& options) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  int const max_reps = std::max(1, options.max_reps);
  int const min_reps = std::clamp(options.min_reps, 1, max_reps);
  int const rounds = std::max(1, options.rounds);
  // (start, stop) per timed run, the flush outside; back to back: one pair per round.
  Events events(options.back_to_back ? 2 : 2 * static_cast<size_t>(max_reps));
  L2Flush const flush(stream);
  std::vector<float> result(candidates.size(), kInf);
  std::vector<int> reps(candidates.size(), 0);  // 0: candidate failed
  std::vector<float> estimates(candidates.size(), 0.0f);
  std::vector<std::vector<float>> samples(candidates.size());

  // Warm-up (module load, descriptor setup) and one timed run for the estimate that sizes the repetitions.
  for (size_t i = 0; i < candidates.size(); ++i) {
    TuneCandidate const& c = candidates[i];
    if (!try_launch(c, stream)) continue;
    flush(0);
    CODA_CUDA_CHECK(cudaEventRecord(events[0], stream));
    if (!try_launch(c, stream)) continue;
    CODA_CUDA_CHECK(cudaEventRecord(events[1], stream));
    CODA_CUDA_CHECK(cudaEventSynchronize(events[1]));
    float const estimate = elapsed_ms(events[0], events[1]);
    estimates[i] = estimate;
    int const n = estimate > 0.0f ? static_cast<int>(std::ceil(options.target_ms / rounds / estimate)) : max_reps;
    reps[i] = std::clamp(n, min_reps, max_reps);
  }
  // Settling: whole turns over the candidates, enqueued at once (no host gaps), until about warm_ms of GPU work.
  if (options.warm_ms > 0.0f) {
    float turn_ms = 0.0f;
    for (size_t i = 0; i < candidates.size(); ++i) turn_ms += reps[i] == 0 ? 0.0f : estimates[i];
    if (turn_ms > 0.0f) {
      int const live = static_cast<int>(std::count_if(reps.begin(), reps.end(), [](int r) { return r > 0; }));
      int const max_turns = std::max(1, 20000 / std::max(1, live));  // bounds the host's enqueueing for tiny kernels
      int const turns = std::clamp(static_cast<int>(std::ceil(options.warm_ms / turn_ms)), 1, max_turns);
      for (int t = 0; t < turns; ++t) {
        for (size_t i = 0; i < candidates.size(); ++i) {
          if (reps[i] == 0) continue;
          if (!options.back_to_back) flush(t);  // back to back: settle at the load the timing will see
          if (!try_launch(candidates[i], stream)) reps[i] = 0;
        }
      }
      CODA_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  }
  // Rounds: every candidate is timed in every round, each round starting one later in the list, so with
  // rounds > 1 clock or thermal drift during tuning spreads over all of them (see TimingOptions::rounds).
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < candidates.size(); ++k) {
      size_t const i = (k + static_cast<size_t>(round)) % candidates.size();
      if (reps[i] == 0) continue;
      bool ok = true;
      size_t last = 1;  // the stop event of the round's last timing
      if (options.back_to_back) {
        flush(round + 1);
        CODA_CUDA_CHECK(cudaEventRecord(events[0], stream));
        for (int r = 0; r < reps[i] && ok; ++r) ok = try_launch(candidates[i], stream);
        CODA_CUDA_CHECK(cudaEventRecord(events[1], stream));
      } else {
        for (int r = 0; r < reps[i] && ok; ++r) {
          flush(r + 1);
          CODA_CUDA_CHECK(cudaEventRecord(events[2 * static_cast<size_t>(r)], stream));
          ok = try_launch(candidates[i], stream);
          CODA_CUDA_CHECK(cudaEventRecord(events[2 * static_cast<size_t>(r) + 1], stream));
        }
        last = 2 * static_cast<size_t>(reps[i]) - 1;
      }
      CODA_CUDA_CHECK(cudaEventSynchronize(events[last]));
      if (!ok) {
        reps[i] = 0;
        samples[i].clear();
        continue;
      }
      if (options.back_to_back) {
        samples[i].push_back(elapsed_ms(events[0], events[1]) / static_cast<float>(reps[i]));
      } else {
        for (int r = 0; r < reps[i]; ++r) {
          samples[i].push_back(
              elapsed_ms(events[2 * static_cast<size_t>(r)], events[2 * static_cast<size_t>(r) + 1]));
        }
      }
    }
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (reps[i] == 0 || samples[i].empty()) continue;
    std::sort(samples[i].begin(), samples[i].end());
    result[i] = samples[i][samples[i].size() / 2];
  }
  return result;
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t const err = cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) {
    // Querying the legacy stream while another stream captures in global mode fails: treat as capturing.
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

std::string const& device_signature(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, std::string> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  cudaDeviceProp prop{};
  CODA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::string name = prop.name;
  for (char& ch : name) {
    if (ch == '|' || ch == '\t' || ch == '\n') ch = '_';
  }
  return cache.emplace(device, coda::detail::concat(name, "/sm", prop.multiProcessorCount, "/cc", prop.major, ".",
                                                   prop.minor))
      .first->second;
}

TuneCache& TuneCache::global() {
  static TuneCache* const cache = new TuneCache();  // never destroyed: usable from exit handlers and other threads
  return *cache;
}

void TuneCache::load_file_locked(std::string const& path) {
  file_.clear();
  file_loaded_ = true;
  loaded_path_ = path;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    size_t const t1 = line.find('\t');
    if (t1 == std::string::npos || t1 == 0) continue;
    size_t const t2 = line.find('\t', t1 + 1);
    std::string winner = line.substr(t1 + 1, t2 == std::string::npos ? std::string::npos : t2 - t1 - 1);
    if (winner.empty()) continue;
    file_[line.substr(0, t1)] = std::move(winner);
  }
}

std::optional<std::string> TuneCache::find(std::string const& key, int device) {
  std::string const memory_key = coda::detail::concat(key, "|dev", device);
  std::string const path = env_string("CODA_AUTOTUNE_CACHE");
  std::string file_key;
  if (!path.empty()) file_key = coda::detail::concat(key, "|", device_signature(device));

  std::lock_guard<std::mutex> lock(mutex_);
  auto it = memory_.find(memory_key);
  if (it != memory_.end()) return it->second;
  if (path.empty()) return std::nullopt;
  if (!file_loaded_ || loaded_path_ != path) load_file_locked(path);
  auto f = file_.find(file_key);
  if (f == file_.end()) return std::nullopt;
  memory_[memory_key] = f->second;
  return f->second;
}

void TuneCache::store(std::string const& key, int device, std::string const& winner, float ms) {
  std::string const memory_key = coda::detail::concat(key, "|dev", device);
  std::string const path = env_string("CODA_AUTOTUNE_CACHE");
  std::string file_key;
  if (!path.empty()) file_key = coda::detail::concat(key, "|", device_signature(device));

  std::lock_guard<std::mutex> lock(mutex_);
  memory_[memory_key] = winner;
  if (path.empty()) return;
  if (!file_loaded_ || loaded_path_ != path) load_file_locked(path);
  file_[file_key] = winner;
  // Append one line; a cache file that cannot be written is not an error (tuning still worked).
  if (std::FILE* out = std::fopen(path.c_str(), "a")) {
    std::fprintf(out, "%s\t%s\t%.6f\n", file_key.c_str(), winner.c_str(), static_cast<double>(ms));
    std::fclose(out);
  }
}

void TuneCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.clear();
  file_.clear();
  file_loaded_ = false;
  loaded_path_.clear();
}

std::string env_string(char const* name) {
  char const* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

bool env_flag(char const* name) {
  std::string v = env_string(name);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return !(v.empty() || v == "0" || v == "false" || v == "off" || v == "no");
}

}  // namespace coda::runtime
