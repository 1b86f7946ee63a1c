// CUDA logits processing; semantics in logits_process.h, design in WORKLOG.md.
//
// One CTA of kThreads per row. A row with nothing to do returns after reading its parameters.
// Otherwise the vocabulary is covered in `passes` ranges of `range_words` tokens, with one 32-bit
// state word per token of the range in shared memory (up to kMaxRangeWords: 208 KiB, so a
// 152064-token vocabulary takes 3 passes). Per pass:
//   mark:  every history entry in the range sets kPromptBit (prompt part) or adds 1 to the count
//          (output part); every bias entry sets kBiasBit. Integer atomics: the words do not
//          depend on the order of the threads;
//   claim: every entry in the range swaps its token's word with 0; exactly one thread per
//          distinct token gets the non-zero word and applies the token's three steps with one
//          read and one write of its logit. Claiming resets every marked word, so the array is
//          zero again for the next pass (it is cleared once per row).
// Each logit is written by one thread with the operations of the reference (IEEE intrinsics, no
// contraction), so the result equals LogitsProcessRef bit for bit.
#include <atomic>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/logits_process/logits_process.h"

namespace tandem {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kMaxRangeWords = 53248;                   // 208 KiB of state words per pass
constexpr uint32_t kPromptBit = 1u << 31;                   // in the history's prompt part
constexpr uint32_t kBiasBit = 1u << 30;                     // has bias pairs
constexpr uint32_t kCountMask = kBiasBit - 1;               // occurrences among the output tokens
constexpr uint32_t kHistoryMask = kPromptBit | kCountMask;  // anywhere in the history

// Row r's work, read once by every thread (the same addresses: broadcasts).
struct RowPlan {
  float rp = 1.0f, freq = 0.0f, pres = 0.0f;
  int64_t scan_begin = 0;  // history entries [scan_begin, hist_end) are marked
  int64_t prompt_end = 0;  // entries before it are prompt tokens
  int64_t hist_end = 0;
  int64_t bias_begin = 0, bias_end = 0;
  bool use_rep = false, use_freq = false;
  __device__ bool Idle() const { return scan_begin == hist_end && bias_begin == bias_end; }
};

// [*begin, *end) of row r in a flat list with offsets `start`; empty when the offsets are bad.
__device__ __forceinline__ void RowSpan(const int32_t* start, int64_t r, int64_t* begin,
                                        int64_t* end) {
  *begin = *end = 0;
  if (start == nullptr) return;
  const int64_t b = start[r], e = start[r + 1];
  if (b >= 0 && e > b) *begin = b, *end = e;
}

__device__ RowPlan PlanRow(const LogitsProcessArgs& a, int64_t r) {
  RowPlan p;
  if (a.repetition_penalty != nullptr) p.rp = a.repetition_penalty[r];
  if (a.frequency_penalty != nullptr) p.freq = a.frequency_penalty[r];
  if (a.presence_penalty != nullptr) p.pres = a.presence_penalty[r];
  int64_t begin, end;
  RowSpan(a.history_start, r, &begin, &end);
  int64_t prompt = a.num_prompt_history != nullptr ? a.num_prompt_history[r] : 0;
  prompt = prompt < 0 ? 0 : (prompt > end - begin ? end - begin : prompt);
  p.prompt_end = begin + prompt;
  p.use_rep = p.rp != 1.0f && end > begin;
  p.use_freq = (p.freq != 0.0f || p.pres != 0.0f) && end > p.prompt_end;
  // The repetition penalty needs every history token; the other two only the output tokens.
  p.scan_begin = p.use_rep ? begin : (p.use_freq ? p.prompt_end : end);
  p.hist_end = end;
  RowSpan(a.bias_start, r, &p.bias_begin, &p.bias_end);
  return p;
}

// The token's three steps (logits_process.h), with the reference's operations.
__device__ __forceinline__ void ApplyToken(const LogitsProcessArgs& a, const RowPlan& p, float* row,
                                           int64_t t, uint32_t w) {
  float x = row[t];
  if (p.use_rep && (w & kHistoryMask) != 0) {
    x = x > 0.0f ? __fdiv_rn(x, p.rp) : __fmul_rn(x, p.rp);
  }
  const uint32_t count = w & kCountMask;
  if (p.use_freq && count != 0) {
    x = __fsub_rn(x, __fmaf_rn(p.freq, static_cast<float>(count), p.pres));
  }
  if ((w & kBiasBit) != 0) {
#pragma unroll 8
    for (int64_t j = p.bias_begin; j < p.bias_end; ++j) {
      if (a.bias_tokens[j] == t) x = __fadd_rn(x, a.bias_values[j]);
    }
  }
  row[t] = x;
}

__global__ void __launch_bounds__(kThreads)
    LogitsProcessKernel(const __grid_constant__ LogitsProcessArgs args, int range_words,
                        int passes) {
  extern __shared__ uint4 state_raw[];
  uint32_t* state = reinterpret_cast<uint32_t*>(state_raw);
  const int64_t r = blockIdx.x;
  const RowPlan p = PlanRow(args, r);
  if (p.Idle()) return;
  for (int i = threadIdx.x; i < range_words / 4; i += kThreads)
    state_raw[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  float* row = args.logits + r * args.vocab_size;
  const int32_t* hist = args.history_tokens;
  for (int pass = 0; pass < passes; ++pass) {
    const int64_t lo = int64_t{pass} * range_words;
    const int64_t hi = min(lo + range_words, args.vocab_size);  // ids outside [0, vocab) never hit
    for (int64_t i = p.scan_begin + threadIdx.x; i < p.hist_end; i += kThreads) {
      const int64_t t = hist[i];
      if (t < lo || t >= hi) continue;
      if (i >= p.prompt_end) {
        atomicAdd(&state[t - lo], 1u);
      } else {
        atomicOr(&state[t - lo], kPromptBit);
      }
    }
    for (int64_t j = p.bias_begin + threadIdx.x; j < p.bias_end; j += kThreads) {
      const int64_t t = args.bias_tokens[j];
      if (t >= lo && t < hi) atomicOr(&state[t - lo], kBiasBit);
    }
    __syncthreads();
    for (int64_t i = p.scan_begin + threadIdx.x; i < p.hist_end; i += kThreads) {
      const int64_t t = hist[i];
      if (t < lo || t >= hi) continue;
      const uint32_t w = atomicExch(&state[t - lo], 0u);
      if (w != 0) ApplyToken(args, p, row, t, w);
    }
    for (int64_t j = p.bias_begin + threadIdx.x; j < p.bias_end; j += kThreads) {
      const int64_t t = args.bias_tokens[j];
      if (t < lo || t >= hi) continue;
      const uint32_t w = atomicExch(&state[t - lo], 0u);
      if (w != 0) ApplyToken(args, p, row, t, w);
    }
    __syncthreads();  // every claim of this pass before the next pass marks
  }
}

}  // namespace

absl::Status LogitsProcess(const LogitsProcessArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateLogitsProcessArgs(args));
  if (args.batch == 0) return absl::OkStatus();
  if (args.batch > INT32_MAX) return absl::InvalidArgumentError("LogitsProcess: batch >= 2^31");
  const int64_t passes = (args.vocab_size + kMaxRangeWords - 1) / kMaxRangeWords;
  const int64_t per_pass = (args.vocab_size + passes - 1) / passes;
  const int range_words = static_cast<int>((per_pass + 3) / 4 * 4);
  const size_t smem = static_cast<size_t>(range_words) * sizeof(uint32_t);
  // The shared-memory limit is per device and function: raised to the maximum once per device.
  static std::atomic<int> limit_set[kMaxDevices];
  RETURN_IF_ERROR(CachedPerDevice(limit_set, []() -> absl::StatusOr<int> {
                    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
                        LogitsProcessKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                        static_cast<int>(kMaxRangeWords * sizeof(uint32_t))));
                    return 1;
                  }).status());
  LogitsProcessKernel<<<static_cast<unsigned>(args.batch), kThreads, smem, stream>>>(
      args, range_words, static_cast<int>(passes));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
