#include "engine/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

// Scratch buffer ids (Ops::Buffer).
enum BufferId : int {
  kResidual,
  kHidden,
  kQkv,
  kAttn,
  kGateUp,
  kAct,
  kGathered,
  kLogits,
  kSampled,    // the sampler's output block (device_sampler.h)
  kPromptIn,   // prompt logprob rows | targets | top counts, int32 [3, P]
  kPromptOut,  // prompt logprobs: token [P] f32 | top tokens [P, K] i32 | top logprobs [P, K] f32
};

absl::StatusOr<const void*> Adopt(Ops& ops, HostTensor t) {
  if (t.empty()) return nullptr;
  return ops.AdoptWeight(std::move(t));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelConfig& config,
                                                               ModelWeights weights,
                                                               std::unique_ptr<Ops> ops,
                                                               Backend backend, GroupRank tp) {
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, std::move(ops), backend, tp));
  RETURN_IF_ERROR(model->AdoptWeights(std::move(weights)));
  return model;
}

absl::Status LlamaModel::AdoptWeights(ModelWeights w) {
  Ops& ops = *ops_;
  ASSIGN_OR_RETURN(embed_tokens_, Adopt(ops, std::move(w.embed_tokens)));
  ASSIGN_OR_RETURN(norm_, Adopt(ops, std::move(w.norm)));
  lm_head_ = embed_tokens_;
  if (!config_.tie_word_embeddings && tp_.samples) {
    ASSIGN_OR_RETURN(lm_head_, Adopt(ops, std::move(w.lm_head)));
  }
  for (LayerWeights& lw : w.layers) {
    Layer l;
    ASSIGN_OR_RETURN(l.qkv_proj, Adopt(ops, std::move(lw.qkv_proj)));
    ASSIGN_OR_RETURN(l.qkv_bias, Adopt(ops, std::move(lw.qkv_bias)));
    ASSIGN_OR_RETURN(l.o_proj, Adopt(ops, std::move(lw.o_proj)));
    ASSIGN_OR_RETURN(l.q_norm, Adopt(ops, std::move(lw.q_norm)));
    ASSIGN_OR_RETURN(l.k_norm, Adopt(ops, std::move(lw.k_norm)));
    ASSIGN_OR_RETURN(l.gate_up_proj, Adopt(ops, std::move(lw.gate_up_proj)));
    ASSIGN_OR_RETURN(l.down_proj, Adopt(ops, std::move(lw.down_proj)));
    ASSIGN_OR_RETURN(l.input_layernorm, Adopt(ops, std::move(lw.input_layernorm)));
    ASSIGN_OR_RETURN(l.post_attention_layernorm,
                     Adopt(ops, std::move(lw.post_attention_layernorm)));
    layers_.push_back(l);
  }
  const std::vector<float> inv = config_.RopeInvFreq();
  HostTensor t{DType::kF32, {static_cast<int64_t>(inv.size())}, {}};
  t.bytes.resize(inv.size() * sizeof(float));
  std::memcpy(t.bytes.data(), inv.data(), t.bytes.size());
  ASSIGN_OR_RETURN(const void* inv_freq, ops.AdoptWeight(std::move(t)));
  inv_freq_ = static_cast<const float*>(inv_freq);
  return absl::OkStatus();
}

GemmArgs LlamaModel::Linear(const void* a, const void* w, void* c, int64_t m, int64_t n,
                            int64_t k) const {
  const DType t = ops_->compute_dtype();
  return GemmArgs{
      .a = a, .w = w, .c = c, .m = m, .n = n, .k = k, .a_dtype = t, .w_dtype = t, .c_dtype = t};
}

void LlamaModel::FuseNorm(GemmArgs& gemm, const void* residual, const void* norm_weight) const {
  gemm.a = residual;
  gemm.a_norm_weight = norm_weight;
  gemm.a_norm_eps = config_.rms_norm_eps;
}

RmsNormArgs LlamaModel::Norm(const void* input, void* residual, const void* weight, void* out,
                             int64_t rows) const {
  return RmsNormArgs{.input = input,
                     .residual = residual,
                     .weight = weight,
                     .out = out,
                     .num_rows = rows,
                     .hidden = config_.hidden_size,
                     .eps = config_.rms_norm_eps,
                     .dtype = ops_->compute_dtype()};
}

absl::StatusOr<LlamaModel::Activations> LlamaModel::GetActivations(int64_t t, int64_t r) {
  Ops& ops = *ops_;
  const ModelConfig& c = config_;
  auto buffer = [&](int id, int64_t elems) {
    return ops.Buffer(id, std::max<int64_t>(elems, 1) * DTypeSize(ops.compute_dtype()));
  };
  const int64_t qkv_dim = int64_t{c.num_q_heads + 2 * c.num_kv_heads} * c.head_dim;
  Activations b;
  ASSIGN_OR_RETURN(b.residual, buffer(kResidual, t * c.hidden_size));
  ASSIGN_OR_RETURN(b.hidden, buffer(kHidden, t * c.hidden_size));
  ASSIGN_OR_RETURN(b.qkv, buffer(kQkv, t * qkv_dim));
  ASSIGN_OR_RETURN(b.attn, buffer(kAttn, t * c.num_q_heads * c.head_dim));
  ASSIGN_OR_RETURN(b.gate_up, buffer(kGateUp, t * 2 * c.intermediate_size));
  ASSIGN_OR_RETURN(b.act, buffer(kAct, t * c.intermediate_size));
  ASSIGN_OR_RETURN(b.gathered, buffer(kGathered, r * c.hidden_size));
  ASSIGN_OR_RETURN(void* logits, ops.Buffer(kLogits, std::max<int64_t>(r * c.vocab_size, 1) * 4));
  b.logits = static_cast<float*>(logits);
  return b;
}

absl::StatusOr<SampledBlock> LlamaModel::GetSampledBlock(int64_t rows) {
  ASSIGN_OR_RETURN(void* base,
                   ops_->Buffer(kSampled, std::max<int64_t>(SampledBlock::Bytes(rows), 16)));
  return SampledBlock{base, rows};
}

absl::StatusOr<float*> LlamaModel::Forward(const DeviceStep& d, const KvLayout& layout,
                                           void* kv_pool) {
  const int64_t t = d.num_tokens;
  ASSIGN_OR_RETURN(const Activations b, GetActivations(t, d.num_rows));
  const int64_t residual_bytes = t * config_.hidden_size * DTypeSize(ops_->compute_dtype());
  if (tp_.prev_stage_rank >= 0) {
    RETURN_IF_ERROR(tp_.pp_comm->Recv(b.residual, residual_bytes, tp_.prev_stage_rank));
  } else {
    RETURN_IF_ERROR(ops_->Embedding(EmbeddingArgs{.token_ids = d.token_ids,
                                                  .table = embed_tokens_,
                                                  .out = b.residual,
                                                  .num_tokens = t,
                                                  .vocab_size = config_.vocab_size,
                                                  .hidden = config_.hidden_size,
                                                  .dtype = ops_->compute_dtype()}));
  }
  // The residual stream: o_proj and down_proj add into it in place (GemmArgs::accumulate), and
  // the norm before QKV and gate-up either runs on its own into `hidden` or, where the backend
  // fuses it into the GEMM (batch-1 decode on CUDA, opt-in), inside the GEMM that reads the
  // residual.
  const bool fused_norm = ops_->FusesNormIntoGemm(t);
  for (int l = 0; l < config_.num_layers; ++l) {
    if (!fused_norm) {
      RETURN_IF_ERROR(
          ops_->RmsNorm(Norm(b.residual, nullptr, layers_[l].input_layernorm, b.hidden, t)));
    }
    RETURN_IF_ERROR(Attention(l, d, b, layout, kv_pool, fused_norm));
    if (layer_hook_ != nullptr) {  // layer l's KV is stored (or enqueued before the event)
      ASSIGN_OR_RETURN(void* event, ops_->RecordKvEvent(l));
      (*layer_hook_)(l, event);
    }
    if (!fused_norm) {
      RETURN_IF_ERROR(ops_->RmsNorm(
          Norm(b.residual, nullptr, layers_[l].post_attention_layernorm, b.hidden, t)));
    }
    RETURN_IF_ERROR(Mlp(l, t, b, fused_norm));
  }
  if (tp_.next_stage_rank >= 0) {
    RETURN_IF_ERROR(tp_.pp_comm->Send(b.residual, residual_bytes, tp_.next_stage_rank));
  }
  RETURN_IF_ERROR(Logits(d, b));
  return b.logits;
}

absl::Status LlamaModel::Attention(int l, const DeviceStep& d, const Activations& b,
                                   const KvLayout& layout, void* kv_pool, bool fused_norm) {
  const ModelConfig& c = config_;
  const DType dt = ops_->compute_dtype();
  const Layer& w = layers_[l];
  const int64_t t = d.num_tokens;
  const int64_t qkv_dim = int64_t{c.num_q_heads + 2 * c.num_kv_heads} * c.head_dim;
  const int64_t q_dim = int64_t{c.num_q_heads} * c.head_dim;
  GemmArgs qkv = Linear(b.hidden, w.qkv_proj, b.qkv, t, qkv_dim, c.hidden_size);
  qkv.bias = w.qkv_bias;
  if (fused_norm) FuseNorm(qkv, b.residual, w.input_layernorm);
  RETURN_IF_ERROR(ops_->Gemm(qkv));
  void* kv_layer =
      static_cast<uint8_t*>(kv_pool) + layout.PageOffset(l, 0) * DTypeSize(layout.dtype);
  RETURN_IF_ERROR(ops_->RopeKvStore(RopeKvStoreArgs{.qkv = b.qkv,
                                                    .positions = d.positions,
                                                    .slot_mapping = d.slot_mapping,
                                                    .kv_layer = kv_layer,
                                                    .inv_freq = inv_freq_,
                                                    .q_norm_weight = w.q_norm,
                                                    .k_norm_weight = w.k_norm,
                                                    .norm_eps = c.rms_norm_eps,
                                                    .num_tokens = t,
                                                    .num_q_heads = c.num_q_heads,
                                                    .num_kv_heads = c.num_kv_heads,
                                                    .head_dim = c.head_dim,
                                                    .page_size = layout.page_size,
                                                    .num_pages = layout.num_pages,
                                                    .dtype = dt,
                                                    .kv_dtype = layout.dtype}));
  RETURN_IF_ERROR(ops_->PagedAttention(
      PagedAttentionArgs{.q = b.qkv,
                         .out = b.attn,
                         .kv_layer = kv_layer,
                         .block_tables = d.block_tables,
                         .seq_lens = d.seq_lens,
                         .query_start = d.query_start,
                         .num_seqs = d.num_seqs,
                         .num_tokens = t,
                         .num_q_heads = c.num_q_heads,
                         .num_kv_heads = c.num_kv_heads,
                         .head_dim = c.head_dim,
                         .page_size = layout.page_size,
                         .max_pages_per_seq = d.block_table_stride,
                         .q_stride = qkv_dim,
                         .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                         .dtype = dt,
                         .kv_dtype = layout.dtype}));
  return RowParallel(Linear(b.attn, w.o_proj, b.residual, t, c.hidden_size, q_dim), t);
}

absl::Status LlamaModel::RowParallel(GemmArgs gemm, int64_t t) {
  if (tp_.tp_comm == nullptr) {
    gemm.accumulate = true;
    return ops_->Gemm(gemm);
  }
  // Rank 0: residual + its partial; every other rank: its partial alone. The sum over ranks is
  // residual + the whole projection, on every rank.
  gemm.accumulate = tp_.tp_comm->rank() == 0;
  RETURN_IF_ERROR(ops_->Gemm(gemm));
  ++collectives_;
  const int64_t count = t * config_.hidden_size;
  return capturing_ ? tp_.tp_comm->EnqueueAllReduceSum(gemm.c, count, ops_->compute_dtype())
                    : tp_.tp_comm->AllReduceSum(gemm.c, count, ops_->compute_dtype());
}

absl::Status LlamaModel::Mlp(int l, int64_t t, const Activations& b, bool fused_norm) {
  const ModelConfig& c = config_;
  const Layer& w = layers_[l];
  GemmArgs gate_up =
      Linear(b.hidden, w.gate_up_proj, b.gate_up, t, 2 * c.intermediate_size, c.hidden_size);
  if (fused_norm) FuseNorm(gate_up, b.residual, w.post_attention_layernorm);
  RETURN_IF_ERROR(ops_->Gemm(gate_up));
  RETURN_IF_ERROR(ops_->SiluMul(SiluMulArgs{.gate_up = b.gate_up,
                                            .out = b.act,
                                            .num_tokens = t,
                                            .intermediate = c.intermediate_size,
                                            .dtype = ops_->compute_dtype()}));
  return RowParallel(Linear(b.act, w.down_proj, b.residual, t, c.hidden_size, c.intermediate_size),
                     t);
}

absl::StatusOr<LlamaModel::PromptBlock> LlamaModel::GetPromptBlock(int64_t rows) {
  const int64_t n = std::max<int64_t>(rows, 1);
  ASSIGN_OR_RETURN(void* in, ops_->Buffer(kPromptIn, 3 * n * 4));
  ASSIGN_OR_RETURN(void* out, ops_->Buffer(kPromptOut, PromptBlock::OutBytes(n)));
  return PromptBlock{static_cast<int32_t*>(in), out, rows};
}

absl::StatusOr<LlamaModel::PromptBlock> LlamaModel::UploadPromptRows(const StepInputs& in) {
  const int64_t p = static_cast<int64_t>(in.prompt_logprob_rows.size());
  if (p == 0 || !tp_.samples) return PromptBlock{};
  ASSIGN_OR_RETURN(PromptBlock block, GetPromptBlock(p));
  std::vector<int32_t> host;
  host.reserve(3 * p);
  host.insert(host.end(), in.prompt_logprob_rows.begin(), in.prompt_logprob_rows.end());
  host.insert(host.end(), in.prompt_logprob_targets.begin(), in.prompt_logprob_targets.end());
  host.insert(host.end(), in.prompt_logprob_top.begin(), in.prompt_logprob_top.end());
  RETURN_IF_ERROR(ops_->CopyToDevice(block.in, host.data(), 3 * p * 4));
  return block;
}

absl::Status LlamaModel::PromptLogprobs(const DeviceStep& d, const PromptBlock& p) {
  if (p.rows == 0) return absl::OkStatus();
  const ModelConfig& c = config_;
  // The logits buffers hold MaxRows rows (the sampler is done with them): the prompt rows go
  // through them that many at a time.
  const int64_t chunk = capacity_.max_seqs > 0 ? MaxRows(capacity_) : p.rows;
  ASSIGN_OR_RETURN(const Activations b,
                   GetActivations(d.num_tokens, std::max(d.num_rows, std::min(chunk, p.rows))));
  // Logits() normalised every row into `hidden` when the step had logits rows; else it is done
  // here.
  if (d.num_rows == 0) {
    RETURN_IF_ERROR(ops_->RmsNorm(Norm(b.residual, nullptr, norm_, b.hidden, d.num_tokens)));
  }
  const int32_t* rows = p.in;
  const int32_t* targets = p.in + p.rows;
  const int32_t* top = p.in + 2 * p.rows;
  for (int64_t start = 0; start < p.rows; start += chunk) {
    const int64_t r = std::min(chunk, p.rows - start);
    RETURN_IF_ERROR(ops_->Embedding(EmbeddingArgs{.token_ids = rows + start,
                                                  .table = b.hidden,
                                                  .out = b.gathered,
                                                  .num_tokens = r,
                                                  .vocab_size = d.num_tokens,
                                                  .hidden = c.hidden_size,
                                                  .dtype = ops_->compute_dtype()}));
    GemmArgs head = Linear(b.gathered, lm_head_, b.logits, r, c.vocab_size, c.hidden_size);
    head.c_dtype = DType::kF32;
    RETURN_IF_ERROR(ops_->Gemm(head));
    RETURN_IF_ERROR(
        ops_->Logprobs(LogprobsArgs{.logits = b.logits,
                                    .tokens = targets + start,
                                    .num_top = top + start,
                                    .token_logprob = p.token_logprobs() + start,
                                    .top_tokens = p.top_tokens() + start * kMaxTopLogprobs,
                                    .top_logprobs = p.top_logprobs() + start * kMaxTopLogprobs,
                                    .batch = r,
                                    .vocab_size = c.vocab_size}));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::ReadPromptLogprobs(const PromptBlock& p, StepOutput* out) {
  if (p.rows == 0) return absl::OkStatus();
  std::vector<uint8_t> host(PromptBlock::OutBytes(p.rows));
  RETURN_IF_ERROR(ops_->CopyToHost(host.data(), p.out, static_cast<int64_t>(host.size())));
  const PromptBlock h{nullptr, host.data(), p.rows};
  const int64_t k = kMaxTopLogprobs;
  out->prompt_token_logprobs.assign(h.token_logprobs(), h.token_logprobs() + p.rows);
  out->prompt_top_tokens.assign(h.top_tokens(), h.top_tokens() + p.rows * k);
  out->prompt_top_logprobs.assign(h.top_logprobs(), h.top_logprobs() + p.rows * k);
  return absl::OkStatus();
}

absl::Status LlamaModel::Logits(const DeviceStep& d, const Activations& b) {
  const ModelConfig& c = config_;
  const int64_t r = d.num_rows;
  if (r == 0 || !tp_.samples) return absl::OkStatus();
  RETURN_IF_ERROR(ops_->RmsNorm(Norm(b.residual, nullptr, norm_, b.hidden, d.num_tokens)));
  // The embedding gather doubles as a row gather: "vocabulary" = this step's hidden rows.
  RETURN_IF_ERROR(ops_->Embedding(EmbeddingArgs{.token_ids = d.logits_rows,
                                                .table = b.hidden,
                                                .out = b.gathered,
                                                .num_tokens = r,
                                                .vocab_size = d.num_tokens,
                                                .hidden = c.hidden_size,
                                                .dtype = ops_->compute_dtype()}));
  GemmArgs head = Linear(b.gathered, lm_head_, b.logits, r, c.vocab_size, c.hidden_size);
  head.c_dtype = DType::kF32;
  return ops_->Gemm(head);
}

}  // namespace tandem
