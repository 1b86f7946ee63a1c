// FakeModel: a deterministic stand-in for the decoder, for engine tests that must run in
// milliseconds. It really uses the paged KV cache, so wrong block tables, slot mappings,
// positions or preemption bookkeeping change its output or fail the step:
//   - each token's K/V at its slot, in every layer and KV head, holds (token, position, layer,
//     head) as fp32 (layout dtype must be kF32, head_dim >= 4);
//   - a logits row reads back its sequence's whole history from the pages through the block
//     table, checks every position and layer tag (InternalError on mismatch), and scores the
//     vocabulary from the history it read:
//       kHash:  logits = a hash of all (token, position) pairs and the candidate id, so the
//               greedy continuation depends on every earlier token;
//       kCount: the argmax is (last token + 1) % vocab_size: predictable text for stop tests
//               (count_skip_period: + 2 at some positions).
// InjectFault makes ComputeLogits fail from a given call on: once (a bad batch) or for good (a
// sticky device error, Internal: the backend is unusable).
// Options::async makes it a model with asynchronous steps (Model::Launch / Collect) whose
// "device" runs the launched step when it is collected: the step reads and writes the pages
// then, so an engine that changed a launched step's sequences or pages in between fails the
// position and layer checks or changes the output.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/model.h"

namespace tandem::testing {

class FakeModel : public Model {
 public:
  enum class Mode { kHash, kCount };
  struct Options {
    Mode mode = Mode::kHash;
    int vocab_size = 101;
    int num_layers = 2;
    int num_kv_heads = 2;
    int head_dim = 4;
    int max_position_embeddings = 4096;
    std::vector<int> eos_token_ids;
    // kHash: mixed into the hash, so two salts are two different models over the same
    // vocabulary (a target and its draft in speculative-decoding tests).
    uint64_t salt = 0;
    bool async = false;  // SupportsAsyncSteps(): the step runs at Collect
    // kCount: at every position p with (p + 1) % count_skip_period == 0 the argmax skips one,
    // (last token + 2) % vocab_size (0: never). Such a model agrees with a plain kCount target
    // everywhere else: a different draft whose proposals are rejected at known positions, at
    // every schedule (the salt alone changes a kCount argmax only where penalties, bias or an
    // EOS ban push the count token down).
    int count_skip_period = 0;
  };

  explicit FakeModel(const Options& options);

  const ModelConfig& config() const override { return config_; }
  absl::Status ComputeLogits(const StepInputs& inputs, const KvLayout& layout, void* kv_pool,
                             float* logits) override;
  bool SupportsAsyncSteps() const override { return options_.async; }
  absl::Status Launch(const StepInputs& inputs, const KvLayout& layout, void* kv_pool) override;
  absl::StatusOr<StepOutput> Collect() override;
  int64_t num_launches() const { return num_launches_; }

  int64_t num_forward_calls() const { return num_forward_calls_; }
  int64_t max_tokens_per_forward() const { return max_tokens_per_forward_; }
  int max_seqs_per_forward() const { return max_seqs_per_forward_; }

  // ComputeLogits call number `at_call` (counting from 0; -1: the next call) returns `status`, and
  // so does every later call if `sticky`. Thread-safe: a test may arm it while an engine loop
  // thread steps the engine.
  void InjectFault(absl::Status status, int64_t at_call = -1, bool sticky = true);
  // Runs at the start of every ComputeLogits call, on the engine thread, before the fault check
  // (so it may arm a fault for that very call): lets a test pace the engine or act at a step of
  // its choosing. Set it before any request reaches the engine; null: none.
  void SetBeforeEachCall(std::function<void()> hook) { before_each_call_ = std::move(hook); }

 private:
  absl::Status Store(const StepInputs& inputs, const KvLayout& layout, float* pool) const;
  // Fills one logits row for query row `row` of sequence `seq`.
  absl::Status Score(const StepInputs& inputs, const KvLayout& layout, const float* pool, int seq,
                     int row, float* out) const;

  Options options_;
  ModelConfig config_;
  int64_t num_forward_calls_ = 0;
  int64_t max_tokens_per_forward_ = 0;
  int max_seqs_per_forward_ = 0;
  // The launched step (async).
  bool launched_ = false;
  StepInputs launched_inputs_;
  KvLayout launched_layout_;
  void* launched_pool_ = nullptr;
  int64_t num_launches_ = 0;
  std::function<void()> before_each_call_;

  // Returns the injected fault for the current call, if any.
  absl::Status Fault();
  absl::Mutex fault_mu_;
  absl::Status fault_ ABSL_GUARDED_BY(fault_mu_);
  int64_t fault_at_call_ ABSL_GUARDED_BY(fault_mu_) = -1;  // -1: none armed
  bool fault_sticky_ ABSL_GUARDED_BY(fault_mu_) = false;
};

}  // namespace tandem::testing
