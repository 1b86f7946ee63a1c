// The two CUDA sampling kernels behind Sampling() (sampling.h), callable one by one so tests can
// check each against SamplingRef and kb_bench can time them side by side. Production callers use
// Sampling(), which picks one.
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

}  // namespace tandem
