// Causal attention over the paged KV cache (kernels/common/kv_layout.h), for a ragged batch in
// which each sequence contributes q_len >= 1 new query tokens (a prefill chunk, or 1 for decode).
// The new tokens' K/V are already in the cache (RopeKvStore runs first). Query token i of
// sequence s sits at position seq_lens[s] - q_len(s) + i and attends to positions [0, that].
// GQA: query head h reads KV head h / (num_q_heads / num_kv_heads). Softmax in fp32.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"
#include "kernels/paged_attention/attention_plan.h"

namespace tandem {

// Which CUDA decode kernel reads an FP8 cache (kernels/paged_attention/README.md, WORKLOG.md step
// 13). kDequant: each warp dequantizes its quarter of a tile into a shared bf16 tile that the bf16
// kernel's math reads. kFused: the e4m3 codes go from the shared stage straight into registers
// (f16 mma), the K scale multiplies the scores and the V scale the probabilities, with more
// (half-size) pipeline stages. kDefault: the environment's TANDEM_FP8_DECODE ("dequant" or
// "fused", read once per process), else kFp8DecodeBuiltin (kFused: 1.7-1.8x faster than kDequant
// on an H200 at batch >= 32, context >= 4k, WORKLOG.md steps 13-14). Both compute the same
// function.
enum class Fp8DecodeKernel : uint8_t { kDefault, kDequant, kFused };
inline constexpr Fp8DecodeKernel kFp8DecodeBuiltin = Fp8DecodeKernel::kFused;

inline const char* Fp8DecodeKernelName(Fp8DecodeKernel k) {
  switch (k) {
    case Fp8DecodeKernel::kDequant:
      return "dequant";
    case Fp8DecodeKernel::kFused:
      return "fused";
    case Fp8DecodeKernel::kDefault:
      break;
  }
  return "default";
}

// How the stream decode kernel (plans without splits: large batches, balanced plans) fills its
// pipeline stages (kernels/paged_attention/README.md, WORKLOG.md steps 19 and 21). kCpAsync:
// every thread issues 16-byte cp.async copies of its share of a tile. kTma: one warp issues the
// tile's TMA copies, one lane per page segment (a tensor copy per 64 head dims or per fp8 code row
// block, in TMA's 128-byte swizzle; fp8 scales by bulk copies), on the stage's mbarrier; head_dim
// 128 and power-of-two pages of 8 keys or more, elsewhere it runs as kCpAsync (as do split plans,
// whichever is asked for). kDefault: the environment's TANDEM_DECODE_COPIES ("cp.async" or
// "tma", read once per process), else BuiltinDecodeCopies of the cache. Both compute the same
// function.
enum class DecodeCopies : uint8_t { kDefault, kCpAsync, kTma };

// The filling when neither the call nor TANDEM_DECODE_COPIES names one, by measurement (WORKLOG.md
// steps 19 and 21, H100): on a bf16 cache TMA is 2-5% faster at every shape of [decode-tc]'s table
// and level with FlashInfer's tensor-core decode; on an fp8 cache it is 1-13% slower at page 16.
inline constexpr DecodeCopies BuiltinDecodeCopies(DType kv_dtype) {
  return kv_dtype == DType::kF8E4M3 ? DecodeCopies::kCpAsync : DecodeCopies::kTma;
}

inline const char* DecodeCopiesName(DecodeCopies c) {
  switch (c) {
    case DecodeCopies::kCpAsync:
      return "cp.async";
    case DecodeCopies::kTma:
      return "tma";
    case DecodeCopies::kDefault:
      break;
  }
  return "default";
}

// `requested` unless kDefault; then what `env_value` (TANDEM_DECODE_COPIES, null when unset)
// names, BuiltinDecodeCopies(kv_dtype) when it is null or empty, InvalidArgument for anything
// else.
inline absl::StatusOr<DecodeCopies> ResolveDecodeCopies(DecodeCopies requested,
                                                        const char* env_value, DType kv_dtype) {
  if (requested != DecodeCopies::kDefault) return requested;
  if (env_value == nullptr || *env_value == '\0') return BuiltinDecodeCopies(kv_dtype);
  const std::string_view v(env_value);
  if (v == "cp.async") return DecodeCopies::kCpAsync;
  if (v == "tma") return DecodeCopies::kTma;
  return absl::InvalidArgumentError("TANDEM_DECODE_COPIES must be \"cp.async\" or \"tma\", not \"" +
                                    std::string(v) + "\"");
}

// The kernel `requested` names: itself unless kDefault; then the one `env_value` (the value of
// TANDEM_FP8_DECODE, null when unset) names, kFp8DecodeBuiltin when it is null or empty, and
// InvalidArgument when it names neither kernel.
inline absl::StatusOr<Fp8DecodeKernel> ResolveFp8DecodeKernel(Fp8DecodeKernel requested,
                                                              const char* env_value) {
  if (requested != Fp8DecodeKernel::kDefault) return requested;
  if (env_value == nullptr || *env_value == '\0') return kFp8DecodeBuiltin;
  const std::string_view v(env_value);
  if (v == "dequant") return Fp8DecodeKernel::kDequant;
  if (v == "fused") return Fp8DecodeKernel::kFused;
  return absl::InvalidArgumentError("TANDEM_FP8_DECODE must be \"dequant\" or \"fused\", not \"" +
                                    std::string(v) + "\"");
}

struct PagedAttentionArgs {
  const void* q = nullptr;  // [num_tokens, num_q_heads, head_dim], token stride q_stride, dtype
  void* out = nullptr;      // [num_tokens, num_q_heads, head_dim] contiguous, dtype
  const void* kv_layer = nullptr;  // [num_pages][2][num_kv_heads][page_size][head_dim], kv_dtype
  const int32_t* block_tables = nullptr;  // [num_seqs, max_pages_per_seq] page ids
  const int32_t* seq_lens = nullptr;      // [num_seqs] KV length including the new tokens
  const int32_t* query_start =
      nullptr;  // [num_seqs + 1] prefix sums of q_len; [num_seqs] = num_tokens
  int num_seqs = 0;
  int64_t num_tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  int max_pages_per_seq = 0;
  int64_t q_stride = 0;        // elements between tokens of q; 0 means num_q_heads * head_dim
  float scale = 0.0f;          // softmax scale, usually 1/sqrt(head_dim)
  DType dtype = DType::kBF16;  // q and out: kF32 or kBF16
  // cache: kF32, kBF16 or kF8E4M3 (codes + per-token scales, kernels/common/kv_layout.h)
  DType kv_dtype = DType::kBF16;
  // Programmatic dependent launch (PDL, sm_90) of the CUDA decode kernel (PagedAttentionDecode,
  // for plans with split merges, i.e. small batches; larger batches, the prefill path and the
  // reference ignore it: kernels/paged_attention/WORKLOG.md, step 10). The kernel may then start
  // while the kernel before it in the stream (RopeKvStore in a decode step) is still running: it
  // reads its plan and block tables and issues the copies of its first K/V tiles that lie before
  // every item's new tokens, then waits for that kernel to complete before it reads q or a new
  // token's K/V or writes anything, and lets the next kernel start early in turn
  // (kernels/common/pdl.cuh). So the launch ramp and the first tiles' latency overlap the
  // previous kernel's tail. Contract: the plan, block_tables, seq_lens, query_start and the cache
  // rows of positions before each sequence's new tokens are not written by a kernel that may
  // still be running (the host and earlier steps write them); q, out and the new tokens' K/V keep
  // stream-order semantics. Off: a plain launch.
  bool overlap_launch = true;
  // FP8 cache, CUDA decode only: which kernel (see Fp8DecodeKernel); ignored elsewhere.
  Fp8DecodeKernel fp8_decode = Fp8DecodeKernel::kDefault;
  // CUDA decode, the stream kernel (bf16 and fused fp8): how it fills its stages (DecodeCopies).
  DecodeCopies decode_copies = DecodeCopies::kDefault;
};

// CPU reference: any head_dim, kF32/kBF16 q/out, kF32/kBF16/kF8E4M3 cache, any q_len.
// Multi-threaded.
void PagedAttentionRef(const PagedAttentionArgs& args);

// CUDA (sm_90a), bf16 q/out/cache, head_dim 64 or 128, any page_size. `plan` must have been
// built for this batch (AttentionPlan::BuildDecode / BuildPrefill) on the same stream or before
// it; num_seqs == 0 launches nothing. Both compute the same function as PagedAttentionRef:
// Decode is FlashDecoding (split-KV + merge), fastest when q_len * group <= 16; Prefill is for
// prompt chunks (any q_len, chunked-prefill positions): FlashAttention-3 style (wgmma + TMA) for
// head_dim 128 with a power-of-two page size >= 8 and 16-byte aligned q / cache, FlashAttention-2
// style otherwise (or with TANDEM_PREFILL_KERNEL=fa2).
absl::Status PagedAttentionDecode(const PagedAttentionArgs& args, const AttentionPlan& plan,
                                  cudaStream_t stream);
absl::Status PagedAttentionPrefill(const PagedAttentionArgs& args, const AttentionPlan& plan,
                                   cudaStream_t stream);

}  // namespace tandem
