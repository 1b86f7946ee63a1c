// CPU reference of the embedding gather: a row copy per token (bit-exact, any dtype).
#include <cstring>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/embedding/embedding.h"

namespace tandem {

void EmbeddingRef(const EmbeddingArgs& args) {
  const int64_t row_bytes = args.hidden * DTypeSize(args.dtype);
  const auto* table = static_cast<const uint8_t*>(args.table);
  auto* out = static_cast<uint8_t*>(args.out);
  ParallelFor(args.num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t id = args.token_ids[t];
      // The engine validates prompt ids; an id out of range here is a bug.
      CHECK(id >= 0 && id < args.vocab_size) << "token id " << id << " vocab " << args.vocab_size;
      std::memcpy(out + t * row_bytes, table + id * row_bytes, row_bytes);
    }
  });
}

}  // namespace tandem
