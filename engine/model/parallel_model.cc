#include "engine/model/parallel_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "engine/model/device_placement.h"
#include "engine/model/step_validation.h"
#include "engine/model/tensor_shard.h"

namespace tandem {

absl::StatusOr<ParallelGroups> ParallelGroups::Create(const ParallelConfig& p,
                                                      ThreadCommOptions options) {
  if (p.tensor_parallel < 1 || p.pipeline_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", p.tensor_parallel,
                                                   " and pipeline_parallel ", p.pipeline_parallel,
                                                   " must be >= 1"));
  }
  ParallelGroups g;
  for (int s = 0; s < p.pipeline_parallel; ++s) {
    ASSIGN_OR_RETURN(std::shared_ptr<ThreadCommGroup> stage,
                     ThreadCommGroup::Create(p.tensor_parallel, options));
    g.stages.push_back(std::move(stage));
  }
  ASSIGN_OR_RETURN(g.world,
                   ThreadCommGroup::Create(p.tensor_parallel * p.pipeline_parallel, options));
  return g;
}

std::vector<CommGroupHandle> ParallelGroups::Handles() const {
  std::vector<CommGroupHandle> handles;
  for (const auto& g : stages) handles.push_back(CommGroupHandle::Of(g));
  if (world != nullptr) handles.push_back(CommGroupHandle::Of(world));
  return handles;
}

ParallelModel::ParallelModel(const ModelConfig& config, const ParallelConfig& parallel,
                             Backend backend, std::vector<CommGroupHandle> groups,
                             std::vector<Rank> ranks)
    : config_(config),
      shard_config_(ShardConfig(config, parallel.tensor_parallel)),
      parallel_(parallel),
      backend_(backend),
      groups_(std::move(groups)),
      ranks_(std::move(ranks)),
      stage_busy_(parallel.pipeline_parallel, -1),
      threads_(static_cast<int>(ranks_.size())) {
  CHECK_GE(parallel.micro_batches, 0);
  CHECK_EQ(static_cast<int>(ranks_.size()), parallel.tensor_parallel * parallel.pipeline_parallel);
  int64_t layer = 0;
  for (const Rank& r : ranks_) {
    first_layer_.push_back(layer);
    layer += r.num_layers;
  }
  CHECK_EQ(layer, int64_t{config.num_layers} * parallel.tensor_parallel);
}

// A launched step: what its ranks read until it is collected, and what the sampling rank wrote.
struct ParallelModel::Flight {
  StepInputs inputs;
  KvLayout layout;
  void* kv_pool = nullptr;
  int64_t micro_batch = 0;
  int64_t ticket = 0;
  StepOutput out;
  std::vector<int32_t> read_pages;     // sorted: every page of its sequences' KV
  std::vector<int32_t> written_pages;  // sorted: the pages of its new tokens' slots
};

namespace {

std::vector<int32_t> SortedUnique(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// A page in both sorted lists, or -1.
int32_t CommonPage(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    if (a[i] == b[j]) return a[i];
    a[i] < b[j] ? ++i : ++j;
  }
  return -1;
}

}  // namespace

ParallelModel::~ParallelModel() {
  // The ranks may still be running launched steps over the KV pool and the flights.
  while (!launched_.empty()) {
    threads_.Wait(launched_.front()->ticket);
    launched_.pop_front();
  }
  // Each rank's backend goes on its own thread, with its device current.
  threads_.Run([this](int r) {
    absl::Status entered = Enter(r);
    ranks_[r].model.reset();
    return entered;
  });
}

absl::Status ParallelModel::Enter(int r) const {
  return ranks_[r].enter ? ranks_[r].enter() : absl::OkStatus();
}

absl::Status ParallelModel::OnEveryRank(const std::function<absl::Status(int)>& fn) {
  const std::vector<absl::Status> results = threads_.Run([&](int r) -> absl::Status {
    RETURN_IF_ERROR(Enter(r));
    return fn(r);
  });
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
    if (!results[r].ok()) {
      return absl::Status(results[r].code(),
                          absl::StrCat("parallel rank ", r, ": ", results[r].message()));
    }
  }
  return absl::OkStatus();
}

int ParallelModel::MaxStepsInFlight() const {
  if (parallel_.pipeline_parallel == 1) return 1;
  return parallel_.micro_batches > 0 ? parallel_.micro_batches : parallel_.pipeline_parallel;
}

int ParallelModel::MaxBusyStages() const {
  absl::MutexLock lock(&stage_mu_);
  return max_busy_stages_;
}

void ParallelModel::MarkStage(int stage, int64_t micro_batch) {
  absl::MutexLock lock(&stage_mu_);
  stage_busy_[stage] = micro_batch;
  // Stages on distinct micro-batches: a stage waiting to receive the micro-batch its
  // predecessor still computes does not count.
  std::vector<int64_t> distinct;
  for (int64_t mb : stage_busy_) {
    if (mb >= 0 && std::find(distinct.begin(), distinct.end(), mb) == distinct.end()) {
      distinct.push_back(mb);
    }
  }
  max_busy_stages_ = std::max(max_busy_stages_, static_cast<int>(distinct.size()));
}

KvLayout ParallelModel::KvPoolLayout(int page_size) const {
  KvLayout layout = Model::KvPoolLayout(page_size);
  layout.num_layers = config_.num_layers * parallel_.tensor_parallel;
  layout.num_kv_heads = shard_config_.num_kv_heads;
  return layout;
}

KvLayout ParallelModel::RankLayout(const KvLayout& layout, int r) const {
  KvLayout rank = layout;
  rank.num_layers = ranks_[r].num_layers;
  return rank;
}

void* ParallelModel::RankPool(void* kv_pool, const KvLayout& layout, int r) const {
  return static_cast<uint8_t*>(kv_pool) + first_layer_[r] * layout.LayerBytes();
}

absl::Status ParallelModel::Validate(const StepInputs& in, const KvLayout& layout) const {
  const KvLayout want = KvPoolLayout(layout.page_size);
  if (layout.num_layers != want.num_layers || layout.num_kv_heads != want.num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step inputs: KV layout (layers ", layout.num_layers, ", kv heads ", layout.num_kv_heads,
        ") is not the parallel group's (", want.num_layers, ", ", want.num_kv_heads, ")"));
  }
  ModelConfig rank0 = shard_config_;
  rank0.num_layers = ranks_[0].num_layers;
  RETURN_IF_ERROR(ValidateStep(in, rank0, RankLayout(layout, 0)));
  return absl::OkStatus();
}

absl::Status ParallelModel::GroupStatus() const {
  for (const CommGroupHandle& g : groups_) RETURN_IF_ERROR(g.status());
  return absl::OkStatus();
}

void ParallelModel::AbortAll(const absl::Status& reason) {
  for (const CommGroupHandle& g : groups_) g.abort(reason);
}

absl::Status ParallelModel::RunRanks(const std::function<absl::Status(int)>& fn) {
  if (absl::Status s = GroupStatus(); !s.ok()) {
    return absl::InternalError(absl::StrCat("parallel group is down: ", s.message()));
  }
  RETURN_IF_ERROR(RanksStatus(threads_.Run([&](int r) {
    absl::Status s = Enter(r);
    if (s.ok()) s = fn(r);
    // Peers may be waiting for this rank in a collective or a receive: abort them now.
    if (!s.ok()) AbortAll(s);
    return s;
  })));
  // Every rank returned OK, but a device barrier may have given up (the peer group's error
  // words) or a group been aborted from outside meanwhile: the step's results are not to be
  // trusted then.
  if (absl::Status s = GroupStatus(); !s.ok()) {
    AbortAll(s);
    return absl::InternalError(
        absl::StrCat("parallel group failed (the group is down): ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ParallelModel::RanksStatus(const std::vector<absl::Status>& results) const {
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    if (results[r].ok()) continue;
    absl::Status cause = GroupStatus();
    if (cause.ok()) cause = results[r];
    return absl::InternalError(
        absl::StrCat("parallel rank failed (the group is down): ", cause.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ParallelModel::Launch(const StepInputs& in, const KvLayout& layout, void* kv_pool) {
  if (static_cast<int>(launched_.size()) >= MaxStepsInFlight()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "launch with ", launched_.size(), " steps in flight (at most ", MaxStepsInFlight(), ")"));
  }
  RETURN_IF_ERROR(Validate(in, layout));
  RETURN_IF_ERROR(ValidateSampling(in, config_));
  if (absl::Status s = GroupStatus(); !s.ok()) {
    return absl::InternalError(absl::StrCat("parallel group is down: ", s.message()));
  }
  // Steps in flight together must not touch each other's writes (Model::Launch): disjoint
  // sequences. Checked here so that a scheduling bug fails a batch instead of mixing KV.
  std::vector<int32_t> read, written;
  for (int s = 0; s < in.num_seqs; ++s) {
    const int pages =
        std::min(in.max_pages_per_seq, (in.seq_lens[s] + layout.page_size - 1) / layout.page_size);
    for (int i = 0; i < pages; ++i) read.push_back(in.block_tables[s * in.max_pages_per_seq + i]);
  }
  for (int32_t slot : in.slot_mapping) written.push_back(slot / layout.page_size);
  read = SortedUnique(std::move(read));
  written = SortedUnique(std::move(written));
  for (const std::shared_ptr<Flight>& f : launched_) {
    int32_t page = CommonPage(written, f->read_pages);
    if (page < 0) page = CommonPage(read, f->written_pages);
    if (page >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step inputs: KV page ", page, " is also used by micro-batch ", f->micro_batch,
          ", still in flight, and one of the two writes it (steps in flight together must be of "
          "disjoint sequences)"));
    }
  }
  auto flight = std::make_shared<Flight>();
  flight->read_pages = std::move(read);
  flight->written_pages = std::move(written);
  flight->inputs = in;
  flight->layout = layout;
  flight->kv_pool = kv_pool;
  flight->micro_batch = next_micro_batch_++;
  flight->ticket = threads_.Submit([this, flight](int r) -> absl::Status {
    Flight& f = *flight;
    const int stage = r / parallel_.tensor_parallel;
    const bool stage_lead = r % parallel_.tensor_parallel == 0;
    if (stage_lead) {
      MarkStage(stage, f.micro_batch);
      if (stage_hook_) stage_hook_(stage, f.micro_batch);
    }
    absl::Status s = GroupStatus();  // a fault in an earlier micro-batch: nothing to wait for
    if (s.ok()) s = Enter(r);
    if (s.ok()) {
      absl::StatusOr<StepOutput> o = ranks_[r].model->Step(f.inputs, RankLayout(f.layout, r),
                                                           RankPool(f.kv_pool, f.layout, r));
      if (o.ok() && r == sampling_rank()) f.out = *std::move(o);
      s = o.status();
    }
    if (stage_lead) MarkStage(stage, -1);
    // Peers may be waiting for this rank in a collective or a receive: abort them now.
    if (!s.ok()) AbortAll(s);
    return s;
  });
  launched_.push_back(std::move(flight));
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> ParallelModel::Collect() {
  if (launched_.empty()) return absl::FailedPreconditionError("no launched step to collect");
  std::shared_ptr<Flight> flight = std::move(launched_.front());
  launched_.pop_front();
  RETURN_IF_ERROR(RanksStatus(threads_.Wait(flight->ticket)));
  return std::move(flight->out);
}

absl::StatusOr<StepOutput> ParallelModel::Step(const StepInputs& in, const KvLayout& layout,
                                               void* kv_pool) {
  RETURN_IF_ERROR(Validate(in, layout));
  RETURN_IF_ERROR(ValidateSampling(in, config_));
  StepOutput out;
  std::vector<char> replayed(ranks_.size(), 0);
  RETURN_IF_ERROR(RunRanks([&](int r) -> absl::Status {
    ASSIGN_OR_RETURN(StepOutput o, ranks_[r].model->Step(in, RankLayout(layout, r),
                                                         RankPool(kv_pool, layout, r)));
    replayed[r] = o.graph_replayed;
    if (r == sampling_rank()) out = std::move(o);
    return absl::OkStatus();
  }));
  // The ranks decide graph or eager from the same inputs and the same graphs, so they agree;
  // one replaying while another runs eagerly would pair a replay's barriers with a host
  // rendezvous (the group would fail at its deadline, its results undefined).
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (replayed[r] != replayed[0]) {
      const absl::Status mixed = absl::InternalError(absl::StrCat(
          "parallel rank ", r, (replayed[r] ? " replayed a CUDA graph" : " ran eagerly"),
          " where rank 0 did not"));
      AbortAll(mixed);
      return mixed;
    }
  }
  if (replayed[0]) {
    absl::MutexLock lock(&stage_mu_);
    ++graph_steps_;
  }
  return out;
}

absl::Status ParallelModel::ComputeLogits(const StepInputs& in, const KvLayout& layout,
                                          void* kv_pool, float* logits) {
  RETURN_IF_ERROR(Validate(in, layout));
  // Only the sampling rank writes `logits`.
  return RunRanks([&](int r) {
    return ranks_[r].model->ComputeLogits(in, RankLayout(layout, r), RankPool(kv_pool, layout, r),
                                          logits);
  });
}

absl::Status ParallelModel::ReserveStep(const StepCapacity& capacity) {
  StepCapacity rank = capacity;
  rank.num_q_heads = shard_config_.num_q_heads;
  rank.num_kv_heads = shard_config_.num_kv_heads;
  return OnEveryRank([&](int r) { return ranks_[r].model->ReserveStep(rank); });
}

absl::StatusOr<DeviceMemoryInfo> ParallelModel::MemoryInfo() {
  if (backend_ != Backend::kCuda) return DeviceMemoryInfo{};
  std::vector<DeviceMemoryInfo> infos(ranks_.size());
  std::vector<int> devices;
  std::vector<int64_t> layers;  // each rank's share of the stacked pool
  for (const Rank& r : ranks_) {
    devices.push_back(r.device);
    layers.push_back(r.num_layers);
  }
  RETURN_IF_ERROR(OnEveryRank([&](int r) -> absl::Status {
    ASSIGN_OR_RETURN(infos[r], ranks_[r].model->MemoryInfo());
    return absl::OkStatus();
  }));
  return CombineRankMemory(infos, devices, layers);
}

absl::StatusOr<std::unique_ptr<DeviceAllocation>> ParallelModel::AllocateKvPool(int64_t bytes) {
  if (backend_ != Backend::kCuda) return Model::AllocateKvPool(bytes);
  std::vector<int> devices;
  for (const Rank& r : ranks_) devices.push_back(r.device);
  if (!OnOneDevice(devices) && !split_pool_) {
    return absl::FailedPreconditionError("CUDA ranks on several GPUs without a split pool");
  }
  // Each rank's slice: its layers' share of the stacked pool (bytes = Σ layers · LayerBytes).
  const int64_t layers = int64_t{config_.num_layers} * parallel_.tensor_parallel;
  if (bytes % layers != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV pool of ", bytes, " bytes is not whole layers of ", layers));
  }
  std::vector<int64_t> slices;
  for (const Rank& r : ranks_) slices.push_back(bytes / layers * r.num_layers);
  // On rank 0's thread (its GPU current): one allocation there holds every slice, or the split
  // pool maps each slice onto its rank's GPU.
  std::unique_ptr<DeviceAllocation> pool;
  RETURN_IF_ERROR(OnEveryRank([&](int r) -> absl::Status {
    if (r != 0) return absl::OkStatus();
    if (split_pool_) {
      ASSIGN_OR_RETURN(pool, split_pool_(slices));
    } else {
      ASSIGN_OR_RETURN(pool, ranks_[0].model->AllocateKvPool(bytes));
    }
    return absl::OkStatus();
  }));
  return pool;
}

bool ParallelModel::SupportsCudaGraphs() const {
  if (backend_ != Backend::kCuda || parallel_.pipeline_parallel != 1) return false;
  for (const Rank& r : ranks_) {
    if (r.tp_comm != nullptr && !r.tp_comm->SupportsGraphCapture()) return false;
  }
  return true;
}

int64_t ParallelModel::GraphSteps() const {
  absl::MutexLock lock(&stage_mu_);
  return graph_steps_;
}

absl::Status ParallelModel::Prepare(const ModelPrepareOptions& options, const KvLayout& layout,
                                    void* kv_pool) {
  if (options.cuda_graph_sizes.empty()) return absl::OkStatus();
  if (!SupportsCudaGraphs()) {
    return absl::InvalidArgumentError(
        parallel_.pipeline_parallel > 1
            ? "a pipeline-parallel group runs eagerly (no graphs: its stage-to-stage Send / Recv "
              "cannot be captured)"
            : "this parallel group runs eagerly (no graphs: its communicators cannot be captured)");
  }
  const KvLayout want = KvPoolLayout(layout.page_size);
  if (layout.num_layers != want.num_layers || layout.num_kv_heads != want.num_kv_heads) {
    return absl::InvalidArgumentError("Prepare: the KV layout is not the parallel group's");
  }
  ModelPrepareOptions rank = options;
  rank.capacity.num_q_heads = shard_config_.num_q_heads;
  rank.capacity.num_kv_heads = shard_config_.num_kv_heads;
  // Every rank captures its own graphs over its slice of the pool, all at once (their captured
  // collectives rendezvous with each other); a rank that fails aborts the group, so no peer
  // waits for it.
  return RunRanks([&](int r) {
    return ranks_[r].model->Prepare(rank, RankLayout(layout, r), RankPool(kv_pool, layout, r));
  });
}

}  // namespace tandem
