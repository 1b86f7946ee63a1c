// RefOps: the Ops of the CPU backend, on the reference kernels and host memory.
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/ops.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {
namespace {

class HostAllocation final : public DeviceAllocation {
 public:
  explicit HostAllocation(int64_t bytes) : bytes_(bytes) {
    // 64-byte aligned and zero-filled.
    data_ = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
    if (data_ != nullptr) std::memset(data_, 0, static_cast<size_t>(bytes));
  }
  ~HostAllocation() override { std::free(data_); }
  void* data() override { return data_; }
  int64_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// The step's sampling rows as the structure of arrays the kernels take.
struct HostRows {
  std::vector<float> temperature, top_p, min_p, repetition, frequency, presence;
  std::vector<int32_t> top_k, num_logprobs;
  std::vector<uint64_t> seeds, steps;
  std::vector<int32_t> history_start, num_prompt_history, bias_start;

  void Fill(const StepInputs& in) {
    const size_t n = in.sampling.size();
    for (auto* v : {&temperature, &top_p, &min_p, &repetition, &frequency, &presence}) {
      v->resize(n);
    }
    top_k.resize(n);
    num_logprobs.resize(n);
    seeds.resize(n);
    steps.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const SamplingRow& r = in.sampling[i];
      temperature[i] = r.temperature;
      top_p[i] = r.top_p;
      min_p[i] = r.min_p;
      repetition[i] = r.repetition_penalty;
      frequency[i] = r.frequency_penalty;
      presence[i] = r.presence_penalty;
      top_k[i] = r.top_k;
      num_logprobs[i] = r.num_logprobs;
      seeds[i] = r.seed;
      steps[i] = r.step;
    }
    // Rows without lists: empty ranges (the runner leaves these vectors empty then).
    history_start = in.history_start.empty() ? std::vector<int32_t>(n + 1, 0) : in.history_start;
    num_prompt_history =
        in.num_prompt_history.empty() ? std::vector<int32_t>(n, 0) : in.num_prompt_history;
    bias_start = in.bias_start.empty() ? std::vector<int32_t>(n + 1, 0) : in.bias_start;
  }
};

class RefOps final : public Ops {
 public:
  DType compute_dtype() const override { return DType::kF32; }

  // A quantized weight (HostTensor::quant) is kept whole; its address is that of its codes, and
  // Gemm() with that address as w runs QuantGemmRef on it.
  absl::StatusOr<const void*> AdoptWeight(HostTensor tensor) override {
    if (tensor.quant != nullptr) {
      const void* key = tensor.quant->codes.data();
      quantized_[key] = std::move(tensor.quant);
      return key;
    }
    weights_.push_back(std::move(tensor.bytes));
    return static_cast<const void*>(weights_.back().data());
  }
  absl::StatusOr<void*> Buffer(int id, int64_t bytes) override {
    std::vector<float>& b = buffers_[id];
    const size_t floats = static_cast<size_t>((bytes + 3) / 4);
    if (b.size() < floats) {
      if (frozen_) {
        return absl::InternalError(absl::StrCat("buffer ", id, " needs ", bytes,
                                                " bytes, beyond the reserved ", b.size() * 4));
      }
      b.resize(floats);
    }
    return static_cast<void*>(b.data());
  }
  void Freeze() override { frozen_ = true; }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<DeviceAllocation>> Allocate(int64_t bytes) override {
    auto a = std::make_unique<HostAllocation>(bytes);
    if (a->data() == nullptr && bytes > 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes >> 20, " MiB of host memory"));
    }
    return std::unique_ptr<DeviceAllocation>(std::move(a));
  }
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo() override { return DeviceMemoryInfo{}; }

  absl::Status ReserveStep(const StepCapacity&) override { return absl::OkStatus(); }

  // Host memory is device memory: the step's arrays are used where they are (`in` must outlive
  // the step), the sampling rows converted to arrays.
  absl::StatusOr<DeviceStep> BeginStep(const StepInputs& in, const KvLayout& layout,
                                       int pad_seqs) override {
    if (pad_seqs > in.num_seqs) {
      return absl::InvalidArgumentError("the CPU backend runs steps unpadded (no graphs)");
    }
    rows_.Fill(in);
    DeviceStep d;
    d.num_seqs = in.num_seqs;
    d.num_decode_seqs = in.attention_by_prefill_kernel ? 0 : in.NumLeadingSingleTokenSeqs();
    d.num_tokens = in.num_tokens;
    d.num_rows = static_cast<int64_t>(in.logits_rows.size());
    d.block_table_stride = in.max_pages_per_seq;
    d.token_ids = in.token_ids.data();
    d.positions = in.positions.data();
    d.slot_mapping = in.slot_mapping.data();
    d.query_start = in.query_start.data();
    d.seq_lens = in.seq_lens.data();
    d.block_tables = in.block_tables.data();
    d.logits_rows = in.logits_rows.data();
    d.temperature = rows_.temperature.data();
    d.top_k = rows_.top_k.data();
    d.top_p = rows_.top_p.data();
    d.min_p = rows_.min_p.data();
    d.seeds = rows_.seeds.data();
    d.steps = rows_.steps.data();
    d.repetition_penalty = rows_.repetition.data();
    d.frequency_penalty = rows_.frequency.data();
    d.presence_penalty = rows_.presence.data();
    d.num_logprobs = rows_.num_logprobs.data();
    // Empty lists travel as null (the kernels' "no row has any").
    if (!in.history_tokens.empty()) {
      d.history_tokens = in.history_tokens.data();
      d.history_start = rows_.history_start.data();
      d.num_prompt_history = rows_.num_prompt_history.data();
    }
    if (!in.bias_tokens.empty()) {
      d.bias_tokens = in.bias_tokens.data();
      d.bias_values = in.bias_values.data();
      d.bias_start = rows_.bias_start.data();
    }
    for (const SamplingRow& r : in.sampling) {
      d.any_processing |= r.has_penalties();
      d.any_logprobs |= r.num_logprobs >= 0;
      d.any_top_k |= r.top_k > 0;
    }
    d.any_processing |= !in.bias_tokens.empty();
    return d;
  }

  absl::Status Embedding(const EmbeddingArgs& a) override { return Run(EmbeddingRef, a); }
  absl::Status RmsNorm(const RmsNormArgs& a) override { return Run(RmsNormRef, a); }
  absl::Status Gemm(const GemmArgs& a) override {
    auto it = quantized_.find(a.w);
    if (it == quantized_.end()) return Run(GemmRef, a);
    const QuantizedWeight& w = *it->second;
    if (a.m < 0 || a.n != w.n || a.k != w.k || a.a_norm_weight != nullptr) {
      return absl::InternalError(absl::StrCat("quantized GEMM: [", a.n, ", ", a.k, "] asked of a [",
                                              w.n, ", ", w.k, "] weight"));
    }
    QuantGemmRef(WithActivations(w.Args(), a));
    return absl::OkStatus();
  }
  absl::Status RopeKvStore(const RopeKvStoreArgs& a) override { return Run(RopeKvStoreRef, a); }
  absl::Status PagedAttention(const PagedAttentionArgs& a) override {
    return Run(PagedAttentionRef, a);
  }
  absl::Status SiluMul(const SiluMulArgs& a) override { return Run(SiluMulRef, a); }
  absl::Status LogitsProcess(const LogitsProcessArgs& a) override {
    return Run(LogitsProcessRef, a);
  }
  absl::Status Logprobs(const LogprobsArgs& a) override { return Run(LogprobsRef, a); }
  absl::Status Sampling(const SamplingArgs& a) override { return Run(SamplingRef, a); }

 private:
  template <typename Args>
  static absl::Status Run(void (*fn)(const Args&), const Args& args) {
    fn(args);
    return absl::OkStatus();
  }

  // Adopted weight bytes. Each inner buffer keeps its address when the outer vector grows
  // (elements are moved, and a move keeps the heap buffer).
  std::vector<std::vector<uint8_t>> weights_;
  std::map<const void*, std::shared_ptr<const QuantizedWeight>> quantized_;
  std::map<int, std::vector<float>> buffers_;  // float storage: 4-byte aligned or better
  bool frozen_ = false;
  HostRows rows_;
};

}  // namespace

std::unique_ptr<Ops> MakeRefOps() { return std::make_unique<RefOps>(); }

}  // namespace tandem
