// Embedding gather: out[t, :] = table[token_ids[t], :].
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"

namespace tandem {

struct EmbeddingArgs {
  const int32_t* token_ids = nullptr;  // [num_tokens], each in [0, vocab_size)
  const void* table = nullptr;         // [vocab_size, hidden], dtype
  void* out = nullptr;                 // [num_tokens, hidden], dtype
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t hidden = 0;
  DType dtype = DType::kBF16;  // kF32 or kBF16
};

void EmbeddingRef(const EmbeddingArgs& args);
absl::Status Embedding(const EmbeddingArgs& args, cudaStream_t stream);

}  // namespace tandem
