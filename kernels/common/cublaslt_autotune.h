// Autotuning of cuBLASLt algorithms when a plan is made (the bf16 GEMM, kernels/gemm/
// gemm_lt_cuda.cc, and the FP8 GEMM, kernels/quant_gemm/fp8_gemm_lt_cuda.cc): the plan asks the
// heuristic for up to kLtTuneMaxCandidates algorithms, times each on the plan's own shape and
// keeps the fastest, as TensorRT-LLM's GEMM profiler does. The heuristic's first choice may not
// be the fastest where the output has few tiles for the SMs (Llama-3-8B's O and down
// projections, n = 4096, at a decode batch of 256; kernels/quant_gemm/WORKLOG.md step 5, the
// gain to be measured).
//
// Timing never touches the caller's output: each candidate writes a scratch D of the plan's
// shape (for beta = 1 plans also its C: D = C in place, as the real call), allocated for the
// tuning and freed after; it reads the call's own A and B and the scale / bias pointers the
// descriptor carries, and uses the call stream's cuBLASLt workspace. The choice falls back to
// the heuristic's first when tuning is off, when the stream is capturing a CUDA graph, when the
// scratch cannot be allocated, or when no candidate ran; a candidate that errors is skipped.
// Timing synchronises the stream, so a plan's first call is slow (~10-25 ms at decode shapes;
// up to ~1 s for the largest prefill shapes) and steady-state calls are unchanged.
//
// Tuning buckets bound the cost for eager steps whose row counts vary (prefill chunks): rows
// 1..8 are tuned each, rows up to 512 in buckets of 8 (the decode graphs' batch sizes are 1, 2,
// 4 and multiples of 8, each its own bucket, and are planned first, at capture warm-up), larger
// rows in power-of-two buckets. The first plan of a bucket is timed; later plans of the bucket
// take its winner if cuBLASLt accepts it for their shape (cublasLtMatmulAlgoCheck), else the
// heuristic's first.
//
// Extra candidates (the FP8 plans, in tuning mode 2): where the heuristic offers one algorithm
// (cuBLASLt 13 for FP8 with outer-vector or block scales), the plan also times configurations
// built from every algorithm id's capabilities (split-k with an fp32 reduction, tiles, stages,
// swizzle: cublaslt_configs.h) that cublasLtMatmulAlgoCheck accepts for its descriptors, at most
// kLtExtraMaxTimed of them (kernels/quant_gemm/WORKLOG.md step 6).
//
// The choice may differ between runs (timing noise between near-equal algorithms): every
// algorithm computes the same product up to fp32 summation order, which the GEMMs' contracts
// already allow (a split-k candidate sums its parts in fp32 and rounds once).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/cublaslt_configs.h"
#include "kernels/common/cublaslt_device.h"

namespace tandem {

// The most candidates a plan asks the heuristic for.
inline constexpr int kLtTuneMaxCandidates = 16;
// The bounds of the extra candidates (cublaslt_configs.h) per plan: configurations checked with
// cublasLtMatmulAlgoCheck (host work only, a few µs each) and, of those it accepts, the most that
// are timed. SetLtExtraLimits overrides both (the benchmark's landscape dump).
inline constexpr int kLtExtraMaxChecked = 256;
inline constexpr int kLtExtraMaxTimed = 64;

// Whether plans made from now on are tuned: TANDEM_LT_AUTOTUNE, read once per process ("1": on;
// unset or anything else: off, the heuristic's first choice), unless SetLtAutotune has
// overridden it. Off by default: on an H200 (run 36) cuBLASLt offered a single FP8 algorithm for
// every served shape, the bf16 lm_head's best of 8 was the heuristic's first, and Llama-3-8B FP8
// throughput was the same tuned and untuned (23,404 / 23,486 tokens/s) with graph capture
// 1.1 s slower (kernels/quant_gemm/WORKLOG.md step 5).
bool LtAutotuneEnabled();
// Overrides TANDEM_LT_AUTOTUNE for plans made after the call (benchmarks and tests compare both
// in one process; the plan caches key on the flag, so tuned and untuned plans coexist).
void SetLtAutotune(bool on);

// SetLtAutotune(on) for a scope, then the switch as it was (tests and benchmarks).
class ScopedLtAutotune {
 public:
  explicit ScopedLtAutotune(bool on) : was_(LtAutotuneEnabled()) { SetLtAutotune(on); }
  ~ScopedLtAutotune() { SetLtAutotune(was_); }
  ScopedLtAutotune(const ScopedLtAutotune&) = delete;
  ScopedLtAutotune& operator=(const ScopedLtAutotune&) = delete;

 private:
  bool was_;
};

// Whether tuning plans also time configurations beyond the heuristic's (cublaslt_configs.h,
// built and checked by AppendLtExtraCandidates): TANDEM_LT_AUTOTUNE_EXTRA, read once per process
// ("0": off; anything else: on), unless SetLtExtraCandidates has overridden it. Only where tuning
// is on (TANDEM_LT_AUTOTUNE=1), so the default behaviour stays the heuristic's first; only the FP8
// plans ask for extras (the bf16 plans' heuristic already offers several candidates).
bool LtExtraCandidatesEnabled();
void SetLtExtraCandidates(bool on);

class ScopedLtExtraCandidates {
 public:
  explicit ScopedLtExtraCandidates(bool on) : was_(LtExtraCandidatesEnabled()) {
    SetLtExtraCandidates(on);
  }
  ~ScopedLtExtraCandidates() { SetLtExtraCandidates(was_); }
  ScopedLtExtraCandidates(const ScopedLtExtraCandidates&) = delete;
  ScopedLtExtraCandidates& operator=(const ScopedLtExtraCandidates&) = delete;

 private:
  bool was_;
};

// A test and benchmark hook: while an index >= 0 is set, plans made take candidate `index` of
// their list (the heuristic's candidates, then the accepted extras, as AppendLtExtraCandidates
// orders them) without timing anything, so each accepted configuration can be run against the
// reference or timed on rotated weights. A plan whose list is shorter takes the heuristic's
// first (counted in LtTuneStats::forced_missing). The FP8 plan keys carry the index.
void SetLtForcedCandidate(int index);
int LtForcedCandidate();

class ScopedLtForcedCandidate {
 public:
  explicit ScopedLtForcedCandidate(int index) : was_(LtForcedCandidate()) {
    SetLtForcedCandidate(index);
  }
  ~ScopedLtForcedCandidate() { SetLtForcedCandidate(was_); }
  ScopedLtForcedCandidate(const ScopedLtForcedCandidate&) = delete;
  ScopedLtForcedCandidate& operator=(const ScopedLtForcedCandidate&) = delete;

 private:
  int was_;
};

// The tuning mode of a plan made now, as the FP8 plan key stores it: 0 untuned (the heuristic's
// first), 1 tuned among the heuristic's candidates, 2 tuned with the extra candidates too,
// 3 + i forced to candidate i (with the extras enumerated). And its parts.
int LtTuneMode();
inline bool LtModeTunes(int mode) { return mode == 1 || mode == 2; }
inline bool LtModeWantsExtras(int mode) { return mode >= 2; }
inline int LtModeForced(int mode) { return mode >= 3 ? mode - 3 : -1; }

// Overrides kLtExtraMaxChecked / kLtExtraMaxTimed for plans made after the call (<= 0: the
// defaults).
void SetLtExtraLimits(int max_checked, int max_timed);
int LtExtraMaxChecked();
int LtExtraMaxTimed();

// One plan's matmul as the tuner runs it: D = alpha A·B + beta D (C = D), alpha 1.
struct LtTuneProblem {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;  // with the scale / bias pointers of the plan's first call
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  const void* a = nullptr;  // cuBLASLt's A and B (device; read only)
  const void* b = nullptr;
  size_t d_bytes = 0;  // bytes of D in d_layout (the scratch the candidates write)
  float beta = 0.0f;   // 1 for accumulate plans
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  std::string label;  // names the plan in the log line ("FP8 rows=256 n=4096 k=4096 ...")
};

// The heuristic's candidates for the problem's descriptors within p.workspace_bytes, best first,
// at most `max` (into `out`); returns the query's status, which callers map to their own
// refusals (an empty `out` with success: no algorithm).
cublasStatus_t LtHeuristic(const LtTuneProblem& p, int max,
                           std::vector<cublasLtMatmulHeuristicResult_t>& out);

// Appends to `candidates` (the heuristic's, which it reads as the seeds of variations) the
// extra configurations cublasLtMatmulAlgoCheck accepts for the problem's descriptors within its
// workspace (cublaslt_configs.h: every algorithm id of the descriptors' type combination, its
// capabilities, the enumeration's order), at most the timed bound, none equal to a heuristic
// candidate; each entry's algo is the configured algorithm. Counts extra_checked and
// extra_accepted and records LastLtPlanCandidates. A problem enumerated before in the process
// (the same label, heuristic count and bounds) takes its earlier list, checking nothing.
// Failures of the enumeration's own queries leave `candidates` as it was (the plan then tunes
// among the heuristic's alone). Host only.
void AppendLtExtraCandidates(const LtTuneProblem& p,
                             std::vector<cublasLtMatmulHeuristicResult_t>& candidates);

// An algorithm's configuration fields (cublasLtMatmulAlgoConfigGetAttribute; a field it cannot
// read stays at its default), and as text.
LtAlgoConfig LtConfigOfAlgo(const cublasLtMatmulAlgo_t& algo);
std::string LtAlgoName(const cublasLtMatmulAlgo_t& algo);

// The candidate list of the last plan that enumerated extras (tests and the benchmark read it
// right after making a plan): its label, how many came from the heuristic, every candidate's
// configuration (heuristic's first), the capabilities of each algorithm id, and how many extra
// configurations were checked.
struct LtPlanCandidates {
  std::string label;
  int heuristic = 0;
  std::vector<std::string> names;
  std::vector<std::string> caps;
  int extra_checked = 0;
};
LtPlanCandidates LastLtPlanCandidates();

// What TuneLtAlgo chose.
struct LtTuneChoice {
  int index = 0;                // into the candidates; 0 when nothing was timed
  int timed = 0;                // candidates that ran; 0: untimed (the heuristic's first)
  float first_us = 0;           // median time of candidate 0 (0 if it failed or nothing was timed)
  float chosen_us = 0;          // median time of the choice
  float best_heuristic_us = 0;  // the fastest of the heuristic's candidates (0: none ran)
  const char* why = "";         // why nothing was timed, when timed == 0
};

// Times candidates[0 .. count) on the problem (warm-up, then the median of a few cudaEvent-timed
// samples on p.stream) and returns the fastest; never fails (untimed: index 0). Candidates from
// `heuristic_count` on are extras (counted in extra_timed, and plans_extra_won when one wins;
// -1: all are the heuristic's). Logs the choice once (INFO): the winner's configuration and its
// time against the heuristic's first and best.
LtTuneChoice TuneLtAlgo(const LtTuneProblem& p, const cublasLtMatmulHeuristicResult_t* candidates,
                        int count, int heuristic_count = -1);

// The tuning bucket of a plan's rows (above).
int64_t LtTuneBucket(int64_t rows);

// Whether cuBLASLt accepts `algo` for the problem's shape within its workspace.
bool LtAlgoFits(const LtTuneProblem& p, const cublasLtMatmulAlgo_t& algo);

// Enqueues a one-thread kernel that spins for `ns` nanoseconds on `stream` (the tuner queues each
// sample's launches behind it, so a sample times the GPU running them back to back, as a graph
// replay does, not the host's launch rate; cublaslt_autotune.cu).
cudaError_t LaunchLtTuneDelay(int64_t ns, cudaStream_t stream);

// Process-wide counters (tests check that tuning ran; monotonic).
struct LtTuneStats {
  int64_t plans_timed = 0;             // plans whose candidates were timed
  int64_t candidates_timed = 0;        // candidates that ran, over those plans
  int64_t plans_untimed = 0;           // tuning plans that kept the heuristic's first untimed
  int64_t bucket_reuses = 0;           // plans that took their bucket's winner
  int64_t plans_single_candidate = 0;  // tuning plans with one candidate (extras included)
  int64_t extra_checked = 0;           // extra configurations given to cublasLtMatmulAlgoCheck
  int64_t extra_accepted = 0;          // of those, accepted (and kept within the timed bound)
  int64_t extra_timed = 0;             // extra candidates that ran in a tuning
  int64_t plans_extra_won = 0;         // timed plans whose winner was an extra candidate
  int64_t forced_applied = 0;          // plans that took a forced candidate (the test hook)
  int64_t forced_missing = 0;          // plans forced to an index beyond their list
};
LtTuneStats GetLtTuneStats();
void CountLtBucketReuse();
void CountLtSingleCandidate(const std::string& label);  // counted and logged once per plan
void CountLtExtras(int64_t checked, int64_t accepted);  // AppendLtExtraCandidates' counts
// The forced candidate `index` of `count` (-1 when index >= count: the caller takes the first);
// counted and logged.
int ApplyLtForcedCandidate(const LtTuneProblem& p, const cublasLtMatmulHeuristicResult_t* found,
                           int count, int index);

// The algorithm for a plan of `key` (std::get<0>(key): its rows) among `candidates` (the
// heuristic's; `mode` as LtTuneMode encodes it, for plans that know one, else 1 when `tuning`):
// with a forced index, that candidate of the list with extras; else its bucket's winner when
// one fits; else TuneLtAlgo's choice among the heuristic's candidates and, when the mode asks,
// the extras (recorded as the bucket's winner when timed). `tuning`: the plan asked for
// candidates (a single one is counted in plans_single_candidate). With dev.mu held.
template <typename Key, typename Plan>
cublasLtMatmulAlgo_t ChooseLtAlgo(CublasLtDevice<Key, Plan>& dev, const Key& key,
                                  const LtTuneProblem& p,
                                  std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                                  bool tuning, int mode = -1) {
  if (mode < 0) mode = tuning ? 1 : 0;
  const int heuristic = static_cast<int>(candidates.size());
  if (const int forced = LtModeForced(mode); forced >= 0) {
    AppendLtExtraCandidates(p, candidates);
    const int i =
        ApplyLtForcedCandidate(p, candidates.data(), static_cast<int>(candidates.size()), forced);
    return candidates[i < 0 ? 0 : i].algo;
  }
  if (!tuning) return candidates[0].algo;
  Key bucket = key;
  std::get<0>(bucket) = LtTuneBucket(std::get<0>(key));
  if (auto it = dev.tuned.find(bucket); it != dev.tuned.end()) {
    if (!LtAlgoFits(p, it->second)) return candidates[0].algo;
    CountLtBucketReuse();
    return it->second;
  }
  if (LtModeWantsExtras(mode)) AppendLtExtraCandidates(p, candidates);
  const int count = static_cast<int>(candidates.size());
  if (count <= 1) {
    CountLtSingleCandidate(p.label);
    return candidates[0].algo;
  }
  const LtTuneChoice choice = TuneLtAlgo(p, candidates.data(), count, heuristic);
  if (choice.timed > 0) dev.tuned.emplace(bucket, candidates[choice.index].algo);
  return candidates[choice.index].algo;
}

}  // namespace tandem
