#include "tests/engine/fake_model.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace tandem::testing {
namespace {

uint64_t Mix(uint64_t x) {  // SplitMix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

FakeModel::FakeModel(const Options& options) : options_(options) {
  config_.model_type = "fake";
  config_.vocab_size = options.vocab_size;
  config_.hidden_size = options.num_kv_heads * options.head_dim;
  config_.num_layers = options.num_layers;
  config_.num_q_heads = options.num_kv_heads;
  config_.num_kv_heads = options.num_kv_heads;
  config_.head_dim = options.head_dim;
  config_.max_position_embeddings = options.max_position_embeddings;
  config_.eos_token_ids = options.eos_token_ids;
  config_.dtype = DType::kF32;
}

absl::Status FakeModel::Store(const StepInputs& in, const KvLayout& layout, float* pool) const {
  const int64_t slots = int64_t{layout.num_pages} * layout.page_size;
  for (int64_t i = 0; i < in.num_tokens; ++i) {
    const int32_t token = in.token_ids[i];
    const int32_t slot = in.slot_mapping[i];
    if (token < 0 || token >= options_.vocab_size || slot < 0 || slot >= slots) {
      return absl::InvalidArgumentError(absl::StrFormat("token %d / slot %d", token, slot));
    }
    for (int l = 0; l < layout.num_layers; ++l) {
      float* layer = pool + layout.PageOffset(l, 0);
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        for (int kv = 0; kv < 2; ++kv) {
          float* x = layer + layout.SlotOffset(slot, kv, h);
          x[0] = static_cast<float>(token);
          x[1] = static_cast<float>(in.positions[i]);
          x[2] = static_cast<float>(l);
          x[3] = static_cast<float>(h * 2 + kv);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status FakeModel::Score(const StepInputs& in, const KvLayout& layout, const float* pool,
                              int seq, int row, float* out) const {
  const int q_len = in.query_start[seq + 1] - in.query_start[seq];
  const int pos = in.seq_lens[seq] - q_len + (row - in.query_start[seq]);
  if (pos != in.positions[row]) {
    return absl::InternalError(
        absl::StrFormat("row %d: position %d, expected %d", row, in.positions[row], pos));
  }
  uint64_t h = 0x1234 ^ options_.salt;
  int32_t last = 0;
  for (int j = 0; j <= pos; ++j) {
    const int32_t page =
        in.block_tables[int64_t{seq} * in.max_pages_per_seq + j / layout.page_size];
    const int64_t slot = int64_t{page} * layout.page_size + j % layout.page_size;
    for (int l = 0; l < layout.num_layers; ++l) {
      const float* x = pool + layout.PageOffset(l, 0) + layout.SlotOffset(slot, 1, 1);
      if (x[1] != j || x[2] != l || x[3] != 3) {
        return absl::InternalError(absl::StrFormat(
            "seq %d position %d layer %d: the cache holds position %g layer %g tag %g", seq, j, l,
            x[1], x[2], x[3]));
      }
    }
    last = static_cast<int32_t>(pool[layout.SlotOffset(slot, 0, 0)]);
    h = Mix(h ^ (static_cast<uint64_t>(last) << 32 | static_cast<uint32_t>(j)));
  }
  for (int v = 0; v < options_.vocab_size; ++v) {
    out[v] = static_cast<float>(Mix(h + v) >> 40) / static_cast<float>(1 << 24);
  }
  if (options_.mode == Mode::kCount) {
    const int period = options_.count_skip_period;
    const int step = period > 0 && (pos + 1) % period == 0 ? 2 : 1;
    out[(last + step) % options_.vocab_size] = 2.0f;
  }
  return absl::OkStatus();
}

void FakeModel::InjectFault(absl::Status status, int64_t at_call, bool sticky) {
  absl::MutexLock lock(&fault_mu_);
  fault_ = std::move(status);
  fault_at_call_ = at_call;
  fault_sticky_ = sticky;
}

absl::Status FakeModel::Fault() {
  absl::MutexLock lock(&fault_mu_);
  if (fault_at_call_ == -1 && fault_.ok()) return absl::OkStatus();
  if (fault_at_call_ == -1) fault_at_call_ = num_forward_calls_;  // armed for "the next call"
  const bool hit =
      fault_sticky_ ? num_forward_calls_ >= fault_at_call_ : num_forward_calls_ == fault_at_call_;
  return hit ? fault_ : absl::OkStatus();
}

absl::Status FakeModel::ComputeLogits(const StepInputs& in, const KvLayout& layout, void* kv_pool,
                                      float* logits) {
  if (layout.dtype != DType::kF32 || layout.head_dim < 4) {
    return absl::InvalidArgumentError("FakeModel needs an fp32 cache with head_dim >= 4");
  }
  if (before_each_call_) before_each_call_();
  absl::Status fault = Fault();
  ++num_forward_calls_;
  RETURN_IF_ERROR(fault);
  max_tokens_per_forward_ = std::max(max_tokens_per_forward_, in.num_tokens);
  max_seqs_per_forward_ = std::max(max_seqs_per_forward_, in.num_seqs);
  float* pool = static_cast<float*>(kv_pool);
  RETURN_IF_ERROR(Store(in, layout, pool));
  for (size_t r = 0; r < in.logits_rows.size(); ++r) {
    const int row = in.logits_rows[r];
    const int seq =
        static_cast<int>(std::upper_bound(in.query_start.begin(), in.query_start.end(), row) -
                         in.query_start.begin() - 1);
    RETURN_IF_ERROR(Score(in, layout, pool, seq, row, logits + r * options_.vocab_size));
  }
  return absl::OkStatus();
}

absl::Status FakeModel::Launch(const StepInputs& inputs, const KvLayout& layout, void* kv_pool) {
  if (!options_.async) return Model::Launch(inputs, layout, kv_pool);
  if (launched_) return absl::FailedPreconditionError("a launched step is not collected");
  launched_ = true;
  launched_inputs_ = inputs;
  launched_layout_ = layout;
  launched_pool_ = kv_pool;
  ++num_launches_;
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> FakeModel::Collect() {
  if (!options_.async) return Model::Collect();
  if (!launched_) return absl::FailedPreconditionError("no launched step to collect");
  launched_ = false;
  return Step(launched_inputs_, launched_layout_, launched_pool_);
}

}  // namespace tandem::testing
