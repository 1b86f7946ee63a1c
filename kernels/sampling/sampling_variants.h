// The two CUDA sampling kernels behind Sampling() (sampling.h), callable one by one so that tests
// can check each against SamplingRef on every vocabulary and kb_bench can time them side by side.
// Production callers use Sampling(), which picks by vocabulary size.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling/sampling.h"

namespace tandem {

// The resident cluster kernel (sampling_cluster.cu): a cluster of 8 CTAs per row holds the row in
// shared memory, so each row is read from HBM once, by 8 SMs. Every row kind, exactly.
// vocab_size <= 155648 (SamplingClusterSupports): what Sampling() runs there.
absl::Status SamplingCluster(const SamplingArgs& args, cudaStream_t stream);
bool SamplingClusterSupports(int64_t vocab_size);

// One 1024-thread block per row (sampling_one_block.cu): every pass after the first re-reads the
// row, and top-k / top-p rows take several. vocab_size <= 262144: what Sampling() runs above
// 155648.
absl::Status SamplingOneBlockPerRow(const SamplingArgs& args, cudaStream_t stream);

}  // namespace tandem
