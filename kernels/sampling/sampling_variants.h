// The CUDA sampling kernels behind Sampling() (sampling.h), callable one by one so tests can check
// each against SamplingRef and kb_bench can time them side by side. Production callers use
// Sampling(), which picks.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/sampling/sampling.h"

namespace tandem {

// One 1024-thread block per row; every pass after the first re-reads the row (sampling.cu).
// vocab_size <= 262144.
absl::Status SamplingOneBlockPerRow(const SamplingArgs& args, cudaStream_t stream);

// A cluster of 8 CTAs per row holds the row in shared memory: one HBM read per row
// (sampling_cluster.cu). vocab_size <= 155648
// (SamplingClusterSupports).
absl::Status SamplingCluster(const SamplingArgs& args, cudaStream_t stream);
bool SamplingClusterSupports(int64_t vocab_size);
// The two builds of the streaming kernel (kernels/sampling/WORKLOG.md, session 5): with the
// top-k row code (k <= 128 streamed once), and without it (greedy and temperature rows only; 55
// registers, no spills, ~4 KB of shared memory per CTA). Sampling() picks by
// SamplingArgs::rows_may_use_top_k.
enum class StreamBuild { kWithTopK, kNoTopK };
// The streaming cluster kernel (sampling_stream.cu): a cluster of 8 small CTAs per row streams it
// once. It samples the rows without top-k or top-p (greedy, temperature) and, with_top_k (build
// kWithTopK only), the top-k rows with k <= 128 (any top-p), writing kFallbackToken (-2) for those
// whose candidates overflow; it skips the other rows.
absl::Status SamplingStreamLaunch(const SamplingArgs& args, bool with_top_k, cudaStream_t stream,
                                  StreamBuild build = StreamBuild::kWithTopK);
// One line on a build of the streaming kernel on the current device: clusters that fit at once,
// registers, local memory (spills / call stack) and static shared memory per thread / CTA.
std::string SamplingStreamDescribe(StreamBuild build);
// The rows the resident cluster kernel samples (others are skipped cheaply: a persistent grid).
enum class ClusterRows {
  kAll,
  kFiltered,             // rows with top-k or top-p
  kLeftByStream,         // those the streaming kernel with top-k, launched before, did not sample
  kLeftByRowPipe,        // those the row-pipelined kernel with top-k did not sample
  kLeftByRowPipeNoTopK,  // those the row-pipelined kernel without top-k did not sample
};
// Every set but kAll is launched with programmatic dependent launch behind the first kernel of
// Sampling(), whose tokens (kFallbackToken marks) it reads after griddepcontrol.wait.
absl::Status SamplingClusterLaunch(const SamplingArgs& args, ClusterRows rows, cudaStream_t stream);

// The row-pipelined kernel (sampling_rowpipe.cu): one CTA per row, the row streamed through
// shared memory by bulk asynchronous copies. It samples greedy, temperature-only and top-p-only
// rows (the last in two passes) and, with_top_k, the top-k rows of the streaming kernel (k <= 128,
// any top-p); kFallbackToken for the top-k and top-p rows it cannot finish (overflowing buffers,
// a failed bracket). It skips the others (k > 128, and top-k rows without with_top_k). Needs
// vocab % 4 == 0, vocab <= 155648 and 16-byte aligned logits (SamplingRowPipeSupports).
bool SamplingRowPipeSupports(const SamplingArgs& args);
absl::Status SamplingRowPipeLaunch(const SamplingArgs& args, bool with_top_k, cudaStream_t stream);
// Sampling() picks the row-pipelined kernel for the rows the streaming kernel would take from
// this batch size on (where it supports the logits): from 96 rows it is faster for every row
// kind (B = 96: greedy 23.3 vs 26.4 us, temperature 31.7 vs 35.3, top-k 53.9 vs 57.1, top-p
// 81.2 vs 107.2); at 64 the streaming kernel still is for temperature and top-k rows
// (kernels/sampling/WORKLOG.md, sessions 7 and 10). Without top-k rows
// (SamplingArgs::rows_may_use_top_k false: OpenAI-style requests) it is picked from 64 rows:
// there its top-p rows take 48.2 / 47.8 us (N(0, 3^2) / LLM-like rows) against 62.9 / 61.4 on the
// streaming and resident kernels, its greedy rows 19.1 against 21.1, its temperature rows 30.4
// against 28.7 (run AC, session 13); at 32 the streaming kernel is faster for greedy and
// temperature rows and as fast for top-p rows (43.4 us either way).
constexpr int64_t kRowPipeMinBatch = 96;
constexpr int64_t kRowPipeMinBatchNoTopK = 64;
// Sampling() with its first kernel forced (tests and kb_bench): the streaming cluster kernel, or
// the row-pipelined one wherever it supports the logits, at any batch size.
enum class FirstKernel { kStream, kRowPipe };
absl::Status SamplingWithFirstKernel(const SamplingArgs& args, FirstKernel first,
                                     cudaStream_t stream);

}  // namespace tandem
