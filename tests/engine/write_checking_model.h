// WriteCheckingModel: a FakeModel that also fails the step when a write lands in a page another
// block table holds (prefix-cache hits and forked siblings share pages read-only).
#pragma once

#include "tests/engine/fake_model.h"

namespace tandem::testing {

// FakeModel that fails the step if a token's KV slot lands in a page that another sequence of
// the same step has in its block table (a shared page being written), or in a page of its own
// block table before the page its first new token belongs to (a full, possibly shared page).
class WriteCheckingModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  absl::Status ComputeLogits(const StepInputs& in, const KvLayout& layout, void* kv_pool,
                             float* logits) override {
    const int num_seqs = in.num_seqs;
    for (int s = 0; s < num_seqs; ++s) {
      const int begin = in.query_start[s];
      const int end = in.query_start[s + 1];
      if (begin == end) continue;
      const int first_page = in.positions[begin] / layout.page_size;
      for (int t = begin; t < end; ++t) {
        const int page = in.slot_mapping[t] / layout.page_size;
        for (int other = 0; other < num_seqs; ++other) {
          const int pages = (in.seq_lens[other] + layout.page_size - 1) / layout.page_size;
          for (int i = 0; i < pages; ++i) {
            const int held = in.block_tables[other * in.max_pages_per_seq + i];
            if (held != page) continue;
            if (other != s || i < first_page) {
              ++violations_;
              return absl::InternalError("a step writes a page another block table holds");
            }
          }
        }
      }
    }
    return FakeModel::ComputeLogits(in, layout, kv_pool, logits);
  }
  int violations() const { return violations_; }

 private:
  int violations_ = 0;
};

}  // namespace tandem::testing
