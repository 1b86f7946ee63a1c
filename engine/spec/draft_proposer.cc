#include "engine/spec/draft_proposer.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/runner/model_runner.h"
#include "engine/spec/token_distribution.h"
#include "engine/spec/verify.h"

namespace tandem {
namespace {

// A KV pool in the draft model's device memory.
class DraftDeviceMemory final : public KvMemory {
 public:
  explicit DraftDeviceMemory(std::unique_ptr<DeviceAllocation> a) : a_(std::move(a)) {}
  void* data() override { return a_->data(); }
  int64_t bytes() const override { return a_->bytes(); }

 private:
  std::unique_ptr<DeviceAllocation> a_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DraftProposer>> DraftProposer::Create(std::unique_ptr<Model> draft,
                                                                     const DraftOptions& options) {
  if (draft == nullptr) return absl::InvalidArgumentError("speculative decoding: no draft model");
  std::unique_ptr<KvCache> kv_cache;
  if (draft->backend() == Backend::kCpu) {
    ASSIGN_OR_RETURN(kv_cache, KvCache::CreateOnHost(options.layout));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceAllocation> pool,
                     draft->AllocateKvPool(options.layout.PoolBytes()));
    ASSIGN_OR_RETURN(
        kv_cache,
        KvCache::Create(options.layout, std::make_unique<DraftDeviceMemory>(std::move(pool))));
  }
  RETURN_IF_ERROR(draft->Prepare(ModelPrepareOptions{options.capacity, options.graph_sizes},
                                 options.layout, kv_cache->pool()));
  LOG(INFO) << "draft model: KV pool of " << options.layout.num_pages << " pages ("
            << (options.layout.PoolBytes() >> 20) << " MiB), " << options.graph_sizes.size()
            << " CUDA graphs";
  return std::unique_ptr<DraftProposer>(
      new DraftProposer(std::move(draft), options, std::move(kv_cache)));
}

DraftProposer::DraftProposer(std::unique_ptr<Model> draft, const DraftOptions& options,
                             std::unique_ptr<KvCache> kv_cache)
    : model_(std::move(draft)), options_(options), kv_cache_(std::move(kv_cache)) {}

void DraftProposer::Truncate(Sequence* mirror, int num_tokens) {
  mirror->num_computed_tokens = std::min(mirror->num_computed_tokens, num_tokens);
  const size_t keep = PagesForTokens(mirror->num_computed_tokens, options_.layout.page_size);
  if (mirror->block_table.size() > keep) {
    CHECK_OK(kv_cache_->allocator().Free(absl::MakeConstSpan(mirror->block_table).subspan(keep)));
    mirror->block_table.resize(keep);
  }
}

void DraftProposer::FreeAll(Sequence* mirror) { Truncate(mirror, 0); }

Sequence* DraftProposer::Sync(const Sequence& target) {
  std::unique_ptr<Sequence>& m = mirrors_[target.id];
  if (m == nullptr) {
    m = std::make_unique<Sequence>();
    m->id = target.id;
    m->status = SequenceStatus::kRunning;
  }
  const int limit = std::min(m->num_computed_tokens, target.num_tokens() - 1);
  int common = 0;
  while (common < limit && m->tokens[common] == target.tokens[common]) ++common;
  Truncate(m.get(), common);
  // Only the tokens past the common prefix change (the target's accepted ones, or a new prompt).
  m->tokens.resize(common);
  m->tokens.insert(m->tokens.end(), target.tokens.begin() + common, target.tokens.end());
  m->num_prompt_tokens = target.num_prompt_tokens;
  m->sampling = target.sampling;
  m->seed = target.seed;
  return m.get();
}

void DraftProposer::Forget(const std::string& id) {
  auto it = mirrors_.find(id);
  if (it == mirrors_.end()) return;
  FreeAll(it->second.get());
  mirrors_.erase(it);
}

absl::Status DraftProposer::Round(const std::vector<int>& active,
                                  const std::vector<Sequence*>& mirrors, std::vector<Proposal>* out,
                                  std::vector<bool>* sampled) {
  const int page_size = options_.layout.page_size;
  BlockAllocator& allocator = kv_cache_->allocator();
  ScheduleDecision decision;
  std::vector<int> chunk_request;  // decision.chunks[c] is the mirror of request chunk_request[c]
  int64_t budget = options_.capacity.max_tokens;
  bool evicted = false;
  for (int i : active) {
    Sequence* m = mirrors[i];
    const int n = static_cast<int>(std::min<int64_t>(m->num_uncomputed_tokens(), budget));
    if (n <= 0) break;
    const int need = PagesForTokens(m->num_computed_tokens + n, page_size) -
                     static_cast<int>(m->block_table.size());
    if (need > allocator.num_free() && !evicted) {
      // Mirrors of sequences not asking now (preempted, or not decoding) give their pages back.
      evicted = true;
      for (auto& [id, other] : mirrors_) {
        if (std::find(mirrors.begin(), mirrors.end(), other.get()) == mirrors.end()) {
          FreeAll(other.get());
        }
      }
    }
    if (need > allocator.num_free()) continue;  // no room: no proposal for it this step
    if (need > 0) {
      ASSIGN_OR_RETURN(std::vector<int32_t> pages, allocator.Allocate(need));
      m->block_table.insert(m->block_table.end(), pages.begin(), pages.end());
    }
    decision.chunks.push_back({m, n, std::max(need, 0), 0});
    decision.num_batched_tokens += n;
    chunk_request.push_back(i);
    budget -= n;
  }
  if (decision.chunks.empty()) return absl::OkStatus();
  std::vector<int> sampling_chunks;
  const StepInputs in =
      BuildStepInputs(decision, page_size, options_.eos_token_ids, &sampling_chunks);
  const int64_t vocab = model_->config().vocab_size;
  bool any_drawn = false;
  for (const SamplingRow& row : in.sampling) any_drawn |= row.temperature > 0.0f;
  std::vector<int32_t> tokens(sampling_chunks.size());
  std::vector<std::vector<float>> probs(sampling_chunks.size());
  if (!any_drawn) {
    ASSIGN_OR_RETURN(StepOutput step, model_->Step(in, kv_cache_->layout(), kv_cache_->pool()));
    tokens = std::move(step.tokens);
  } else {
    std::vector<float> logits(sampling_chunks.size() * static_cast<size_t>(vocab));
    RETURN_IF_ERROR(
        model_->ComputeLogits(in, kv_cache_->layout(), kv_cache_->pool(), logits.data()));
    for (size_t r = 0; r < sampling_chunks.size(); ++r) {
      std::vector<float> dist = TokenDistribution(logits.data() + r * vocab, vocab, in, r);
      const SamplingRow& row = in.sampling[r];
      if (row.temperature > 0.0f) {
        tokens[r] = DrawToken(dist, DraftUniform(row.seed, row.step));
        probs[r] = std::move(dist);
      } else {
        tokens[r] = static_cast<int32_t>(std::max_element(dist.begin(), dist.end()) - dist.begin());
      }
    }
  }
  CHECK_EQ(tokens.size(), sampling_chunks.size());
  for (const ScheduledChunk& chunk : decision.chunks) {
    chunk.seq->num_computed_tokens += chunk.num_new_tokens;
  }
  for (size_t r = 0; r < sampling_chunks.size(); ++r) {
    const int i = chunk_request[sampling_chunks[r]];
    mirrors[i]->tokens.push_back(tokens[r]);
    (*out)[i].tokens.push_back(tokens[r]);
    if (!probs[r].empty()) (*out)[i].probs.push_back(std::move(probs[r]));
    (*sampled)[i] = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Proposal>> DraftProposer::Propose(
    absl::Span<const ProposalRequest> requests) {
  std::vector<Proposal> out(requests.size());
  std::vector<Sequence*> mirrors(requests.size());
  std::vector<int> active;
  int rounds = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    mirrors[i] = Sync(*requests[i].seq);
    if (requests[i].max_tokens >= 1) active.push_back(static_cast<int>(i));
    rounds = std::max(rounds, requests[i].max_tokens);
  }
  for (int round = 0; round < rounds && !active.empty(); ++round) {
    std::vector<bool> sampled(requests.size(), false);
    absl::Status status = Round(active, mirrors, &out, &sampled);
    if (!status.ok()) {
      // Whatever the failed step wrote is unknown: drop the mirrors' KV (recomputed later).
      for (Sequence* m : mirrors) FreeAll(m);
      return status;
    }
    std::vector<int> next;
    for (int i : active) {
      if (sampled[i] && static_cast<int>(out[i].tokens.size()) < requests[i].max_tokens) {
        next.push_back(i);
      }
    }
    active = std::move(next);
  }
  return out;
}

}  // namespace tandem
