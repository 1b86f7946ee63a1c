// The cuBLASLt plan tuner (cublaslt_autotune.h): the switch, the candidates' timing and the
// counters.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "base/logging.h"
#include "kernels/common/cublaslt_autotune.h"

namespace tandem {
namespace {

// Timing: kWarmups untimed launches (module loading, clocks), one timed launch to size the
// samples, then kSamples samples of `reps` back-to-back launches each, reps chosen so a sample
// lasts about kSampleUs (one launch's time is near the events' resolution for small GEMMs);
// candidates slower than kSlowUs get kSlowSamples samples, which bounds a plan's tuning at
// about 16 x 6 launches of its slowest candidates. Each timed run waits behind a delay kernel
// of kDelayBaseNs + kDelayPerLaunchNs per launch, longer than the host takes to enqueue them
// (a cublasLtMatmul call costs the host a few µs, as long as a small GEMM runs).
constexpr int kWarmups = 1;
constexpr int kSamples = 5;
constexpr int kSlowSamples = 3;
constexpr float kSlowUs = 1000.0f;
constexpr float kSampleUs = 50.0f;
constexpr int kMaxReps = 16;
constexpr int64_t kDelayBaseNs = 10'000;
constexpr int64_t kDelayPerLaunchNs = 10'000;

std::atomic<int> g_override{-1};        // -1: TANDEM_LT_AUTOTUNE decides; else 0 / 1
std::atomic<int> g_extra_override{-1};  // -1: TANDEM_LT_AUTOTUNE_EXTRA decides; else 0 / 1
std::atomic<int> g_forced{-1};
std::atomic<int> g_max_checked{0}, g_max_timed{0};  // 0: the defaults
std::atomic<int64_t> g_plans_timed{0}, g_candidates_timed{0}, g_plans_untimed{0},
    g_bucket_reuses{0}, g_plans_single{0}, g_extra_checked{0}, g_extra_accepted{0},
    g_extra_timed{0}, g_plans_extra_won{0}, g_forced_applied{0}, g_forced_missing{0};

bool FromEnv() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_LT_AUTOTUNE");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

bool ExtraFromEnv() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_LT_AUTOTUNE_EXTRA");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return on;
}

// The scratch D and the timing events of one tuning, released on every path.
class TuneResources {
 public:
  TuneResources() = default;
  ~TuneResources() {
    if (d_ != nullptr) cudaFree(d_);
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }
  TuneResources(const TuneResources&) = delete;
  TuneResources& operator=(const TuneResources&) = delete;

  // False (the error cleared, so it reaches no later check) when an allocation fails.
  bool Init(size_t d_bytes, cudaStream_t stream) {
    if (cudaMalloc(&d_, std::max<size_t>(d_bytes, 1)) != cudaSuccess ||
        cudaEventCreate(&start_) != cudaSuccess || cudaEventCreate(&stop_) != cudaSuccess ||
        cudaMemsetAsync(d_, 0, d_bytes, stream) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return true;
  }
  void* d() const { return d_; }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }

 private:
  void* d_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Microseconds of `launches` launches of `algo` into the scratch, or a negative value when a
// launch or the timing failed.
float TimeLaunches(const LtTuneProblem& p, const cublasLtMatmulAlgo_t& algo, const TuneResources& r,
                   int launches) {
  const float alpha = 1.0f;
  if (LaunchLtTuneDelay(kDelayBaseNs + kDelayPerLaunchNs * launches, p.stream) != cudaSuccess ||
      cudaEventRecord(r.start(), p.stream) != cudaSuccess) {
    return -1;
  }
  for (int i = 0; i < launches; ++i) {
    const cublasStatus_t st = cublasLtMatmul(
        p.handle, p.op, &alpha, p.a, p.a_layout, p.b, p.b_layout, &p.beta, r.d(), p.d_layout, r.d(),
        p.d_layout, &algo, p.workspace, p.workspace_bytes, p.stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
      cudaStreamSynchronize(p.stream);  // drain the launches made before the failure
      return -1;
    }
  }
  float ms = 0;
  if (cudaEventRecord(r.stop(), p.stream) != cudaSuccess ||
      cudaEventSynchronize(r.stop()) != cudaSuccess ||
      cudaEventElapsedTime(&ms, r.start(), r.stop()) != cudaSuccess) {
    return -1;
  }
  return ms * 1000.0f;
}

// The median microseconds of one launch of `algo`, or a negative value when it failed.
float TimeCandidate(const LtTuneProblem& p, const cublasLtMatmulAlgo_t& algo,
                    const TuneResources& r) {
  if (TimeLaunches(p, algo, r, kWarmups) < 0) return -1;
  const float once = TimeLaunches(p, algo, r, 1);
  if (once < 0) return -1;
  const int reps =
      std::clamp(static_cast<int>(std::ceil(kSampleUs / std::max(once, 0.1f))), 1, kMaxReps);
  std::vector<float> samples(once > kSlowUs ? kSlowSamples : kSamples);
  for (float& s : samples) {
    s = TimeLaunches(p, algo, r, reps);
    if (s < 0) return -1;
    s /= static_cast<float>(reps);
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

LtTuneChoice Untimed(const LtTuneProblem& p, const char* why) {
  g_plans_untimed.fetch_add(1);
  LOG(INFO) << "cuBLASLt " << p.label << ": the heuristic's first algorithm, untimed (" << why
            << ")";
  LtTuneChoice c;
  c.why = why;
  return c;
}

}  // namespace

bool LtAutotuneEnabled() {
  const int o = g_override.load();
  return o < 0 ? FromEnv() : o != 0;
}

void SetLtAutotune(bool on) { g_override.store(on ? 1 : 0); }

bool LtExtraCandidatesEnabled() {
  const int o = g_extra_override.load();
  return o < 0 ? ExtraFromEnv() : o != 0;
}

void SetLtExtraCandidates(bool on) { g_extra_override.store(on ? 1 : 0); }

void SetLtForcedCandidate(int index) { g_forced.store(index < 0 ? -1 : index); }
int LtForcedCandidate() { return g_forced.load(); }

int LtTuneMode() {
  if (const int f = g_forced.load(); f >= 0) return 3 + f;
  if (!LtAutotuneEnabled()) return 0;
  return LtExtraCandidatesEnabled() ? 2 : 1;
}

void SetLtExtraLimits(int max_checked, int max_timed) {
  g_max_checked.store(std::max(max_checked, 0));
  g_max_timed.store(std::max(max_timed, 0));
}

int LtExtraMaxChecked() {
  const int v = g_max_checked.load();
  return v > 0 ? v : kLtExtraMaxChecked;
}

int LtExtraMaxTimed() {
  const int v = g_max_timed.load();
  return v > 0 ? v : kLtExtraMaxTimed;
}

int64_t LtTuneBucket(int64_t rows) {
  if (rows <= 8) return rows;
  if (rows <= 512) return (rows + 7) / 8 * 8;
  int64_t b = 1024;
  while (b < rows) b *= 2;
  return b;
}

cublasStatus_t LtHeuristic(const LtTuneProblem& p, int max,
                           std::vector<cublasLtMatmulHeuristicResult_t>& out) {
  out.assign(static_cast<size_t>(std::max(max, 1)), cublasLtMatmulHeuristicResult_t{});
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t st = cublasLtMatmulPreferenceCreate(&pref);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  size_t ws = p.workspace_bytes;
  st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof(ws));
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(p.handle, p.op, p.a_layout, p.b_layout, p.d_layout,
                                        p.d_layout, pref, static_cast<int>(out.size()), out.data(),
                                        &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  out.resize(st == CUBLAS_STATUS_SUCCESS ? static_cast<size_t>(found) : 0);
  return st;
}

bool LtAlgoFits(const LtTuneProblem& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result{};
  const cublasStatus_t st = cublasLtMatmulAlgoCheck(p.handle, p.op, p.a_layout, p.b_layout,
                                                    p.d_layout, p.d_layout, &algo, &result);
  return st == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= p.workspace_bytes;
}

LtTuneChoice TuneLtAlgo(const LtTuneProblem& p, const cublasLtMatmulHeuristicResult_t* candidates,
                        int count, int heuristic_count) {
  if (count <= 1) return LtTuneChoice{.why = "one candidate"};
  if (heuristic_count < 0 || heuristic_count > count) heuristic_count = count;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(p.stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    return Untimed(p, "the stream's capture status is unknown");
  }
  if (capture != cudaStreamCaptureStatusNone) return Untimed(p, "the stream is capturing");
  TuneResources r;
  if (!r.Init(p.d_bytes, p.stream)) return Untimed(p, "no memory for the scratch output");
  LtTuneChoice c;
  int extra_timed = 0;
  for (int i = 0; i < count; ++i) {
    if (candidates[i].workspaceSize > p.workspace_bytes) continue;
    const float us = TimeCandidate(p, candidates[i].algo, r);
    if (us < 0) {
      cudaGetLastError();  // a refused launch is skipped; it must not fail a later check
      continue;
    }
    if (i == 0) c.first_us = us;
    if (i < heuristic_count && (c.best_heuristic_us == 0 || us < c.best_heuristic_us)) {
      c.best_heuristic_us = us;
    }
    if (i >= heuristic_count) ++extra_timed;
    if (c.timed == 0 || us < c.chosen_us) {
      c.index = i;
      c.chosen_us = us;
    }
    ++c.timed;
  }
  if (c.timed == 0) return Untimed(p, "every candidate failed");
  g_plans_timed.fetch_add(1);
  g_candidates_timed.fetch_add(c.timed);
  g_extra_timed.fetch_add(extra_timed);
  const bool extra_won = c.index >= heuristic_count;
  if (extra_won) g_plans_extra_won.fetch_add(1);
  LOG(INFO) << "cuBLASLt " << p.label << ": candidate " << c.index << " of " << count << " ("
            << heuristic_count << " heuristic + " << count - heuristic_count << " extra, "
            << c.timed << " timed), " << (extra_won ? "extra " : "heuristic's ")
            << LtAlgoName(candidates[c.index].algo) << ", " << c.chosen_us
            << " us against the heuristic's first " << c.first_us << " us (best heuristic "
            << c.best_heuristic_us << " us)";
  return c;
}

int ApplyLtForcedCandidate(const LtTuneProblem& p, const cublasLtMatmulHeuristicResult_t* found,
                           int count, int index) {
  if (index < 0 || index >= count) {
    g_forced_missing.fetch_add(1);
    return -1;
  }
  g_forced_applied.fetch_add(1);
  LOG(INFO) << "cuBLASLt " << p.label << ": forced candidate " << index << " of " << count << ", "
            << LtAlgoName(found[index].algo);
  return index;
}

void CountLtExtras(int64_t checked, int64_t accepted) {
  g_extra_checked.fetch_add(checked);
  g_extra_accepted.fetch_add(accepted);
}

LtTuneStats GetLtTuneStats() {
  return LtTuneStats{.plans_timed = g_plans_timed.load(),
                     .candidates_timed = g_candidates_timed.load(),
                     .plans_untimed = g_plans_untimed.load(),
                     .bucket_reuses = g_bucket_reuses.load(),
                     .plans_single_candidate = g_plans_single.load(),
                     .extra_checked = g_extra_checked.load(),
                     .extra_accepted = g_extra_accepted.load(),
                     .extra_timed = g_extra_timed.load(),
                     .plans_extra_won = g_plans_extra_won.load(),
                     .forced_applied = g_forced_applied.load(),
                     .forced_missing = g_forced_missing.load()};
}

void CountLtSingleCandidate(const std::string& label) {
  g_plans_single.fetch_add(1);
  LOG(INFO) << "cuBLASLt " << label << ": the heuristic offers one algorithm, nothing to tune";
}

void CountLtBucketReuse() { g_bucket_reuses.fetch_add(1); }

}  // namespace tandem
