// The CUDA sampling kernels behind Sampling() (sampling.h), callable one by one so tests can check
// each against SamplingRef and kb_bench can time them side by side. Production callers use
// Sampling(), which picks.
#pragma once

#include <cstdint>

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
// Rows without top-k or top-p only (greedy, temperature): a cluster of 8 small CTAs per row
// streams it once (sampling_stream.cu); rows with top-k or top-p are skipped.
absl::Status SamplingStream(const SamplingArgs& args, cudaStream_t stream);
// The resident cluster kernel, skipping (cheaply: a persistent grid) rows without top-k or top-p
// when only_filtered.
absl::Status SamplingClusterLaunch(const SamplingArgs& args, bool only_filtered,
                                   cudaStream_t stream);

}  // namespace tandem
