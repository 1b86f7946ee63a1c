// CudaOps: a step's inputs on the device, in one copy (cuda_ops.h).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_ops.h"

namespace tandem {
namespace {

// The step's arrays padded for a graph of `pad` sequences (or unpadded when pad is 0).
struct Padded {
  std::vector<int32_t> token_ids, positions, slot_mapping, query_start, seq_lens, logits_rows;
  std::vector<float> temperature, top_p, min_p, repetition, frequency, presence;
  std::vector<int32_t> top_k, num_logprobs, history_start, num_prompt_history, bias_start;
  std::vector<uint64_t> seeds, steps;
  // Compact block tables: row s is the pages sequence s uses.
  std::vector<int32_t> table_values, table_start;
};

void PadTokens(const StepInputs& in, int pad_seqs, int page_size, Padded* p) {
  p->token_ids = in.token_ids;
  p->positions = in.positions;
  p->slot_mapping = in.slot_mapping;
  p->query_start = in.query_start;
  p->seq_lens = in.seq_lens;
  p->logits_rows = in.logits_rows;
  // Padding sequences: one token each (id 0, position 0) that stores nothing, one logits row.
  for (int s = in.num_seqs; s < pad_seqs; ++s) {
    p->token_ids.push_back(0);
    p->positions.push_back(0);
    p->slot_mapping.push_back(-1);
    p->query_start.push_back(static_cast<int32_t>(p->token_ids.size()));
    p->seq_lens.push_back(1);
    p->logits_rows.push_back(static_cast<int32_t>(p->token_ids.size()) - 1);
  }
  p->table_start.assign(1, 0);
  p->table_values.clear();
  for (int s = 0; s < in.num_seqs; ++s) {
    const int pages = (in.seq_lens[s] + page_size - 1) / page_size;
    const int32_t* row = in.block_tables.data() + int64_t{s} * in.max_pages_per_seq;
    p->table_values.insert(p->table_values.end(), row, row + pages);
    p->table_start.push_back(static_cast<int32_t>(p->table_values.size()));
  }
}

void PadRows(const StepInputs& in, size_t rows, Padded* p) {
  const size_t real = in.sampling.size();
  for (auto* v :
       {&p->temperature, &p->top_p, &p->min_p, &p->repetition, &p->frequency, &p->presence}) {
    v->resize(rows);
  }
  for (auto* v : {&p->top_k, &p->num_logprobs, &p->num_prompt_history}) v->resize(rows);
  p->seeds.resize(rows);
  p->steps.resize(rows);
  for (size_t i = 0; i < rows; ++i) {
    // Rows past the sampling rows (padding, or a ComputeLogits step): greedy, nothing else.
    const SamplingRow r = i < real ? in.sampling[i] : SamplingRow{.temperature = 0.0f};
    p->temperature[i] = r.temperature;
    p->top_p[i] = r.top_p;
    p->min_p[i] = r.min_p;
    p->repetition[i] = r.repetition_penalty;
    p->frequency[i] = r.frequency_penalty;
    p->presence[i] = r.presence_penalty;
    p->top_k[i] = r.top_k;
    p->num_logprobs[i] = r.num_logprobs;
    p->seeds[i] = r.seed;
    p->steps[i] = r.step;
    p->num_prompt_history[i] = i < in.num_prompt_history.size() ? in.num_prompt_history[i] : 0;
  }
  // List starts continue flat past the real rows (empty lists).
  auto starts = [&](const std::vector<int32_t>& s, size_t total) {
    std::vector<int32_t> out = s.empty() ? std::vector<int32_t>(1, 0) : s;
    out.resize(rows + 1, static_cast<int32_t>(total));
    return out;
  };
  p->history_start = starts(in.history_start, in.history_tokens.size());
  p->bias_start = starts(in.bias_start, in.bias_tokens.size());
}

}  // namespace

absl::Status CudaOps::ReserveStep(const StepCapacity& capacity) {
  if (capacity.max_seqs < 1 || capacity.max_tokens < capacity.max_seqs ||
      capacity.max_pages_per_seq < 1 || capacity.num_kv_heads < 1 ||
      capacity.num_q_heads % capacity.num_kv_heads != 0) {
    return absl::InvalidArgumentError("CudaOps::ReserveStep: bad capacity");
  }
  capacity_ = capacity;
  RETURN_IF_ERROR(AllocateStepArrays());
  // The quantized GEMMs' scratch (cuda_ops.h, Gemm): allocated once, never under capture.
  if (quant_max_weight_elems_ > 0 && dequant_scratch_ == nullptr) {
    ASSIGN_OR_RETURN(dequant_scratch_, DeviceAlloc(quant_max_weight_elems_ * 2));
  }
  if (quant_tc_counters_ > 0 && quant_tc_workspace_.counters == nullptr) {
    ASSIGN_OR_RETURN(void* partials, DeviceAlloc(quant_tc_partial_floats_ * 4));
    ASSIGN_OR_RETURN(void* counters, DeviceAlloc(quant_tc_counters_ * 4));
    CUDA_RETURN_IF_ERROR(cudaMemset(counters, 0, quant_tc_counters_ * 4));
    quant_tc_workspace_ = {.partials = static_cast<float*>(partials),
                           .partial_floats = quant_tc_partial_floats_,
                           .counters = static_cast<uint32_t*>(counters),
                           .num_counters = quant_tc_counters_};
  }
  if (quant_max_act_k_ > 0 && act_scratch_rows_ < capacity.max_tokens) {
    ASSIGN_OR_RETURN(act_scratch_, DeviceAlloc(capacity.max_tokens * quant_max_act_k_ * 2));
    act_scratch_rows_ = capacity.max_tokens;
  }
  RETURN_IF_ERROR(ReserveFp8Lt(capacity.max_tokens));
  return absl::OkStatus();
}

absl::Status CudaOps::AllocateStepArrays() {
  const int64_t t = capacity_.max_tokens, s = capacity_.max_seqs, r = MaxRows(capacity_);
  const int64_t h = std::max<int64_t>(capacity_.max_history_tokens, 1);
  const int64_t b = std::max<int64_t>(capacity_.max_bias_entries, 1);
  // Every array gets 16 bytes of slack: Unpack copies whole 16-byte vectors.
  auto alloc = [&](auto** out, int64_t elems) -> absl::Status {
    ASSIGN_OR_RETURN(void* p, DeviceAlloc(elems * int64_t{sizeof(**out)} + 16));
    CUDA_RETURN_IF_ERROR(cudaMemset(p, 0, elems * sizeof(**out) + 16));
    *out = static_cast<std::remove_reference_t<decltype(*out)>>(p);
    return absl::OkStatus();
  };
  StepArrays& a = arrays_;
  RETURN_IF_ERROR(alloc(&a.token_ids, t));
  RETURN_IF_ERROR(alloc(&a.positions, t));
  RETURN_IF_ERROR(alloc(&a.slot_mapping, t));
  RETURN_IF_ERROR(alloc(&a.query_start, s + 1));
  RETURN_IF_ERROR(alloc(&a.seq_lens, s));
  RETURN_IF_ERROR(alloc(&a.block_tables, s * capacity_.max_pages_per_seq));
  RETURN_IF_ERROR(alloc(&a.logits_rows, r));
  RETURN_IF_ERROR(alloc(&a.temperature, r));
  RETURN_IF_ERROR(alloc(&a.top_k, r));
  RETURN_IF_ERROR(alloc(&a.top_p, r));
  RETURN_IF_ERROR(alloc(&a.min_p, r));
  RETURN_IF_ERROR(alloc(&a.seeds, r));
  RETURN_IF_ERROR(alloc(&a.steps, r));
  RETURN_IF_ERROR(alloc(&a.repetition_penalty, r));
  RETURN_IF_ERROR(alloc(&a.frequency_penalty, r));
  RETURN_IF_ERROR(alloc(&a.presence_penalty, r));
  RETURN_IF_ERROR(alloc(&a.num_logprobs, r));
  RETURN_IF_ERROR(alloc(&a.history_tokens, h));
  RETURN_IF_ERROR(alloc(&a.history_start, r + 1));
  RETURN_IF_ERROR(alloc(&a.num_prompt_history, r));
  RETURN_IF_ERROR(alloc(&a.bias_tokens, b));
  RETURN_IF_ERROR(alloc(&a.bias_values, b));
  RETURN_IF_ERROR(alloc(&a.bias_start, r + 1));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status CudaOps::Pack(const StepInputs& in, int page_size, int pad_seqs, int num_decode,
                           DeviceStep* d) {
  Padded p;
  PadTokens(in, pad_seqs, page_size, &p);
  const size_t rows = p.logits_rows.size();
  PadRows(in, rows, &p);
  StepArrays& a = arrays_;
  UnpackBuilder& u = builder_;
  u.Reset();
  RETURN_IF_ERROR(u.AddCopy(a.token_ids, p.token_ids));
  RETURN_IF_ERROR(u.AddCopy(a.positions, p.positions));
  RETURN_IF_ERROR(u.AddCopy(a.slot_mapping, p.slot_mapping));
  RETURN_IF_ERROR(u.AddCopy(a.query_start, p.query_start));
  RETURN_IF_ERROR(u.AddCopy(a.seq_lens, p.seq_lens));
  RETURN_IF_ERROR(u.AddCopy(a.logits_rows, p.logits_rows));
  RETURN_IF_ERROR(
      u.AddRows(a.block_tables, capacity_.max_pages_per_seq, p.table_values, p.table_start));
  RETURN_IF_ERROR(u.AddCopy(a.temperature, p.temperature));
  RETURN_IF_ERROR(u.AddCopy(a.top_k, p.top_k));
  RETURN_IF_ERROR(u.AddCopy(a.top_p, p.top_p));
  RETURN_IF_ERROR(u.AddCopy(a.min_p, p.min_p));
  RETURN_IF_ERROR(u.AddCopy(a.seeds, p.seeds));
  RETURN_IF_ERROR(u.AddCopy(a.steps, p.steps));
  RETURN_IF_ERROR(u.AddCopy(a.repetition_penalty, p.repetition));
  RETURN_IF_ERROR(u.AddCopy(a.frequency_penalty, p.frequency));
  RETURN_IF_ERROR(u.AddCopy(a.presence_penalty, p.presence));
  RETURN_IF_ERROR(u.AddCopy(a.num_logprobs, p.num_logprobs));
  RETURN_IF_ERROR(u.AddCopy(a.history_tokens, in.history_tokens));
  RETURN_IF_ERROR(u.AddCopy(a.history_start, p.history_start));
  RETURN_IF_ERROR(u.AddCopy(a.num_prompt_history, p.num_prompt_history));
  RETURN_IF_ERROR(u.AddCopy(a.bias_tokens, in.bias_tokens));
  RETURN_IF_ERROR(u.AddCopy(a.bias_values, in.bias_values));
  RETURN_IF_ERROR(u.AddCopy(a.bias_start, p.bias_start));
  const int n = in.num_seqs;
  if (num_decode > 0) {
    RETURN_IF_ERROR(decode_plan_->PlanDecode({in.seq_lens.data(), in.query_start.data(), num_decode,
                                              capacity_.num_q_heads, capacity_.num_kv_heads}));
    const int32_t* counts = decode_plan_->host_counts();
    RETURN_IF_ERROR(u.AddCopy(decode_plan_->device_items(), decode_plan_->host_items(),
                              int64_t{counts[0]} * sizeof(AttentionWorkItem)));
    RETURN_IF_ERROR(u.AddCopy(decode_plan_->device_merges(), decode_plan_->host_merges(),
                              int64_t{counts[1]} * sizeof(AttentionMergeItem)));
    RETURN_IF_ERROR(u.AddCopy(decode_plan_->device_counts(), counts, 2 * sizeof(int32_t)));
  }
  if (n > num_decode) {
    RETURN_IF_ERROR(prefill_plan_->PlanPrefill({in.seq_lens.data() + num_decode,
                                                in.query_start.data() + num_decode, n - num_decode,
                                                capacity_.num_q_heads, capacity_.num_kv_heads}));
    const int32_t* counts = prefill_plan_->host_counts();
    RETURN_IF_ERROR(u.AddCopy(prefill_plan_->device_items(), prefill_plan_->host_items(),
                              int64_t{counts[0]} * sizeof(AttentionWorkItem)));
    RETURN_IF_ERROR(u.AddCopy(prefill_plan_->device_counts(), counts, 2 * sizeof(int32_t)));
  }
  d->num_tokens = static_cast<int64_t>(p.token_ids.size());
  d->num_rows = static_cast<int64_t>(rows);
  return absl::OkStatus();
}

absl::Status CudaOps::Upload() {
  const int slot = next_slot_;
  next_slot_ ^= 1;
  const int64_t bytes = builder_.size();
  // The slot's previous copy must have left it before it is overwritten.
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_done_[slot]));
  if (staging_bytes_[slot] < bytes) {
    cudaFreeHost(staging_[slot]);
    staging_[slot] = nullptr;
    staging_bytes_[slot] = 0;
    const int64_t grown = std::max<int64_t>(bytes * 2, int64_t{1} << 20);
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&staging_[slot], grown));
    staging_bytes_[slot] = grown;
  }
  if (upload_bytes_ < bytes) {
    // Stream order: every earlier Unpack has finished reading the old buffer before the free.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    cudaFree(upload_);
    allocated_bytes_ -= upload_bytes_;
    upload_ = nullptr;
    upload_bytes_ = 0;
    const int64_t grown = std::max<int64_t>(bytes * 2, int64_t{1} << 20);
    CUDA_RETURN_IF_ERROR(cudaMalloc(&upload_, grown));
    upload_bytes_ = grown;
    allocated_bytes_ += grown;
  }
  std::memcpy(staging_[slot], builder_.data(), bytes);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(upload_, staging_[slot], bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_done_[slot], stream_));
  return Unpack(upload_, builder_.header(), stream_);
}

absl::StatusOr<DeviceStep> CudaOps::BeginStep(const StepInputs& in, const KvLayout& layout,
                                              int pad_seqs) {
  if (capacity_.max_seqs == 0) return absl::FailedPreconditionError("BeginStep before ReserveStep");
  const int num_decode = in.attention_by_prefill_kernel ? 0 : in.NumLeadingSingleTokenSeqs();
  if (pad_seqs > in.num_seqs && num_decode != in.num_seqs) {
    return absl::InvalidArgumentError("only an all-decode step can be padded for a graph");
  }
  const int seqs = std::max(pad_seqs, in.num_seqs);
  const int64_t tokens = in.num_tokens + std::max(0, pad_seqs - in.num_seqs);
  const int64_t rows = std::max<int64_t>(static_cast<int64_t>(in.logits_rows.size()), seqs);
  if (seqs > capacity_.max_seqs || tokens > capacity_.max_tokens || rows > MaxRows(capacity_) ||
      in.max_pages_per_seq > capacity_.max_pages_per_seq ||
      static_cast<int64_t>(in.history_tokens.size()) > capacity_.max_history_tokens ||
      static_cast<int64_t>(in.bias_tokens.size()) > capacity_.max_bias_entries) {
    return absl::InternalError(absl::StrCat("step (", seqs, " sequences, ", tokens,
                                            " tokens) beyond the capacity reserved at start-up"));
  }
  DeviceStep d;
  d.num_seqs = in.num_seqs;
  d.num_decode_seqs = num_decode;
  ++num_steps_;
  profiling_ = profile_every_ > 0 && num_steps_ % profile_every_ == 0;
  num_op_events_ = 0;
  RETURN_IF_ERROR(Pack(in, layout.page_size, pad_seqs, num_decode, &d));
  RETURN_IF_ERROR(Timed([] { return std::string("upload + unpack"); }, [&] { return Upload(); }));
  num_seqs_ = in.num_seqs;
  num_decode_ = num_decode;
  const StepArrays& a = arrays_;
  d.block_table_stride = capacity_.max_pages_per_seq;
  d.token_ids = a.token_ids;
  d.positions = a.positions;
  d.slot_mapping = a.slot_mapping;
  d.query_start = a.query_start;
  d.seq_lens = a.seq_lens;
  d.block_tables = a.block_tables;
  d.logits_rows = a.logits_rows;
  d.temperature = a.temperature;
  d.top_k = a.top_k;
  d.top_p = a.top_p;
  d.min_p = a.min_p;
  d.seeds = a.seeds;
  d.steps = a.steps;
  d.repetition_penalty = a.repetition_penalty;
  d.frequency_penalty = a.frequency_penalty;
  d.presence_penalty = a.presence_penalty;
  d.num_logprobs = a.num_logprobs;
  d.history_tokens = a.history_tokens;
  d.history_start = a.history_start;
  d.num_prompt_history = a.num_prompt_history;
  d.bias_tokens = a.bias_tokens;
  d.bias_values = a.bias_values;
  d.bias_start = a.bias_start;
  for (const SamplingRow& r : in.sampling) {
    d.any_processing |= r.has_penalties();
    d.any_logprobs |= r.num_logprobs >= 0;
    d.any_top_k |= r.top_k > 0;
  }
  d.any_processing |= !in.bias_tokens.empty();
  return d;
}

}  // namespace tandem
