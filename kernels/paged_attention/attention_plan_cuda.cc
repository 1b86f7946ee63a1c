// AttentionPlan: host-side scheduling of paged-attention work items (attention_plan.h).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_plan.h"

namespace tandem {
namespace {

constexpr int kDecodeCtasPerSm = 2;  // the decode kernel's occupancy (104 KB smem per CTA)

}  // namespace

int AttentionPlan::DecodeSlots() {
  static const int slots = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 132 * kDecodeCtasPerSm;
    }
    return sms * kDecodeCtasPerSm;
  }();
  return slots;
}

absl::StatusOr<std::unique_ptr<AttentionPlan>> AttentionPlan::Create(const Capacity& capacity) {
  std::unique_ptr<AttentionPlan> plan(new AttentionPlan(capacity));
  const Capacity& c = capacity;
  // 16 bytes of slack after each array: a caller that lands a host plan with a copy padded to
  // 16 bytes (PlanDecode + kernels/unpack) may write that far past the last item.
  constexpr size_t kSlack = 16;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&plan->items_, sizeof(AttentionWorkItem) * c.max_items + kSlack));
  CUDA_RETURN_IF_ERROR(
      cudaMalloc(&plan->merges_, sizeof(AttentionMergeItem) * c.max_merges + kSlack));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&plan->counts_, sizeof(int32_t) * 2 + kSlack));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&plan->merge_counters_, sizeof(int32_t) * c.max_merges));
  CUDA_RETURN_IF_ERROR(cudaMemset(plan->merge_counters_, 0, sizeof(int32_t) * c.max_merges));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&plan->partial_out_, sizeof(uint16_t) * int64_t{c.max_partials} *
                                                           kDecodeRows * c.max_head_dim));
  CUDA_RETURN_IF_ERROR(
      cudaMalloc(&plan->partial_lse_, sizeof(float) * int64_t{c.max_partials} * kDecodeRows));
  const size_t staging = sizeof(AttentionWorkItem) * c.max_items +
                         sizeof(AttentionMergeItem) * c.max_merges + sizeof(int32_t) * 2;
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&plan->staging_, staging));
  cudaEvent_t event;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  plan->uploaded_ = event;
  CUDA_RETURN_IF_ERROR(cudaEventRecord(event, 0));
  return plan;
}

int64_t AttentionPlan::DeviceBytes() const {
  const Capacity& c = capacity_;
  return int64_t{sizeof(AttentionWorkItem)} * c.max_items +
         int64_t{sizeof(AttentionMergeItem)} * c.max_merges +
         int64_t{sizeof(int32_t)} * (2 + c.max_merges) +
         int64_t{sizeof(uint16_t)} * c.max_partials * kDecodeRows * c.max_head_dim +
         int64_t{sizeof(float)} * c.max_partials * kDecodeRows + 3 * 16;
}

AttentionPlan::~AttentionPlan() {
  // Destructors cannot return a Status; failures here mean the context is already gone.
  if (uploaded_ != nullptr) {
    cudaEventSynchronize(uploaded_);
    cudaEventDestroy(uploaded_);
  }
  cudaFree(items_);
  cudaFree(merges_);
  cudaFree(counts_);
  cudaFree(merge_counters_);
  cudaFree(partial_out_);
  cudaFree(partial_lse_);
  cudaFreeHost(staging_);
}

absl::Status AttentionPlan::BuildDecode(const AttentionBatchShape& b, cudaStream_t stream) {
  RETURN_IF_ERROR(PlanDecode(b));
  return Upload(stream);
}

absl::Status AttentionPlan::BuildPrefill(const AttentionBatchShape& b, cudaStream_t stream) {
  RETURN_IF_ERROR(PlanPrefill(b));
  return Upload(stream);
}

const AttentionWorkItem* AttentionPlan::host_items() const {
  return reinterpret_cast<const AttentionWorkItem*>(staging_);
}

const AttentionMergeItem* AttentionPlan::host_merges() const {
  return reinterpret_cast<const AttentionMergeItem*>(host_items() + capacity_.max_items);
}

const int32_t* AttentionPlan::host_counts() const {
  return reinterpret_cast<const int32_t*>(host_merges() + capacity_.max_merges);
}

absl::Status AttentionPlan::PlanDecode(const AttentionBatchShape& b) {
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploaded_));
  // Benchmark switches, read once per process (PlanDecode runs every step).
  // TANDEM_DECODE_ITEMS_PER_SLOT: the split target's items per CTA (1: one wave, fewest merges,
  // measured equal or faster than 2 at every benchmarked shape); TANDEM_DECODE_BALANCE:
  // DecodeBalance; TANDEM_DECODE_ORDER: DecodeOrder (decode_plan.h).
  static const int per_slot = [] {
    const char* env = std::getenv("TANDEM_DECODE_ITEMS_PER_SLOT");
    return env != nullptr ? std::max(1, std::atoi(env)) : 1;
  }();
  static const absl::StatusOr<DecodeBalance> balance =
      ParseDecodeBalance(std::getenv("TANDEM_DECODE_BALANCE"));
  RETURN_IF_ERROR(balance.status());
  static const absl::StatusOr<DecodeOrder> order =
      ParseDecodeOrder(std::getenv("TANDEM_DECODE_ORDER"));
  RETURN_IF_ERROR(order.status());
  auto* items = reinterpret_cast<AttentionWorkItem*>(staging_);
  auto* merges = reinterpret_cast<AttentionMergeItem*>(items + capacity_.max_items);
  ASSIGN_OR_RETURN(
      const DecodePlanCounts counts,
      decode_planner_.Plan(b, {DecodeSlots(), per_slot, *balance, *order},
                           {capacity_.max_items, capacity_.max_merges, capacity_.max_partials},
                           items, merges));
  num_items_ = counts.items;
  num_merges_ = counts.merges;
  num_partials_ = counts.partials;
  split_kv_ = counts.split_kv;
  SetHostCounts();
  return absl::OkStatus();
}

absl::Status AttentionPlan::PlanPrefill(const AttentionBatchShape& b) {
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploaded_));
  std::vector<AttentionWorkItem> list;
  for (int s = 0; s < b.num_seqs; ++s) {
    const int rows = PackedRows(b, s);
    for (int h = 0; h < b.num_kv_heads; ++h) {
      for (int r = 0; r < rows; r += kPrefillRows) {
        const int num_rows = std::min(kPrefillRows, rows - r);
        const int q0 = b.query_start[s];
        const int first_pos = b.seq_lens[s] - (b.query_start[s + 1] - q0);
        list.push_back(
            {s, h, r, num_rows, 0, RowsKeyEnd(b, s, r + num_rows), -1, -1, q0, first_pos});
      }
    }
  }
  if (static_cast<int64_t>(list.size()) > capacity_.max_items) {
    return absl::ResourceExhaustedError(
        absl::StrCat("attention plan: ", list.size(), " prefill tiles exceed capacity"));
  }
  // Longest first: the causal tail tiles are the most work, so start them first.
  std::stable_sort(list.begin(), list.end(), [](const auto& x, const auto& y) {
    return x.key_end - x.key_begin > y.key_end - y.key_begin;
  });
  std::memcpy(staging_, list.data(), list.size() * sizeof(AttentionWorkItem));
  num_items_ = static_cast<int>(list.size());
  num_merges_ = 0;
  num_partials_ = 0;
  SetHostCounts();
  return absl::OkStatus();
}

void AttentionPlan::SetHostCounts() {
  int32_t* counts = const_cast<int32_t*>(host_counts());
  counts[0] = num_items_;
  counts[1] = num_merges_;
}

absl::Status AttentionPlan::Upload(cudaStream_t stream) {
  auto* items = reinterpret_cast<AttentionWorkItem*>(staging_);
  auto* merges = reinterpret_cast<AttentionMergeItem*>(items + capacity_.max_items);
  auto* counts = reinterpret_cast<int32_t*>(merges + capacity_.max_merges);
  if (num_items_ > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(items_, items, sizeof(*items) * num_items_,
                                         cudaMemcpyHostToDevice, stream));
  }
  if (num_merges_ > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(merges_, merges, sizeof(*merges) * num_merges_,
                                         cudaMemcpyHostToDevice, stream));
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(counts_, counts, sizeof(int32_t) * 2, cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_, stream));
  return absl::OkStatus();
}

}  // namespace tandem
