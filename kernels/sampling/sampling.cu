// Sampling() (sampling.h): the CUDA dispatch over the two kernels of sampling_variants.h.
#include "absl/status/status.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_variants.h"

namespace tandem {

// The resident cluster kernel wherever a row fits its shared memory (each row read once, by 8 SMs:
// kernels/sampling/README.md), else the one-block-per-row kernel.
absl::Status Sampling(const SamplingArgs& args, cudaStream_t stream) {
  if (args.vocab_size > 0 && SamplingClusterSupports(args.vocab_size)) {
    return SamplingCluster(args, stream);
  }
  return SamplingOneBlockPerRow(args, stream);
}

}  // namespace tandem
