// Writing safetensors checkpoints in the exact Hugging Face layout, streaming: tensor bytes are
// produced chunk by chunk by a callback, so a 16 GB checkpoint never sits in memory.
//
// One shard: DIR/model.safetensors. Several: DIR/model-0000i-of-0000n.safetensors plus
// DIR/model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}). Tensors keep
// their given order; a file's header is padded with spaces to a multiple of 8 bytes, as the
// safetensors package does, so every tensor starts 8-byte aligned.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"

namespace tandem {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;

  int64_t NumElements() const;
  int64_t NumBytes() const { return NumElements() * DTypeSize(dtype); }
};

// Fills `count` elements [first, first + count) of `spec` (row-major), dtype-encoded, into `out`.
using TensorFiller =
    std::function<void(const TensorSpec& spec, int64_t first, int64_t count, uint8_t* out)>;

struct CheckpointWriteOptions {
  int num_shards = 0;                          // > 0: exactly this many (if tensors allow)
  int64_t max_shard_bytes = int64_t{5} << 30;  // used when num_shards == 0
  std::string format_metadata = "pt";          // __metadata__ {"format": ...}, as HF writes it
};

// Writes one .safetensors file with `specs` in order.
absl::Status WriteSafetensorsFile(const std::string& path, const std::vector<TensorSpec>& specs,
                                  const TensorFiller& fill, const std::string& format_metadata);

// Splits `specs` (in order) into shards and writes them, with the index when there are several.
absl::Status WriteSafetensorsCheckpoint(const std::string& dir,
                                        const std::vector<TensorSpec>& specs,
                                        const TensorFiller& fill,
                                        const CheckpointWriteOptions& options);

}  // namespace tandem
