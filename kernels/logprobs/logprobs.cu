// CUDA logprobs; semantics in logprobs.h, design and what to measure in WORKLOG.md.
//
// A cluster of kParts CTAs per row; CTA p streams part p of the row once (HBM -> registers, no
// copy on chip). Part and warp ranges depend on the vocabulary only, and every reduction has a
// fixed order, so a row's results do not depend on the batch, the grid or thread timing:
//   - each lane keeps an online (max m, sum s of exp(x - m)) over its logits, four fp32 partial
//     sums (one per float4 of a group); lanes, warps and then the parts (in part order, by the
//     leader CTA, rank 0) are combined with Combine();
//   - when the row wants top logprobs (N > 0), each warp keeps its candidates
//     (logprobs_topn.cuh), each CTA merges its warps' top N and pushes them into the leader's
//     shared memory (DSMEM), and the leader merges the parts' and writes the row's outputs.
// A row with num_top < 0 returns at once in all of its CTAs (before any cluster barrier).
#include <cooperative_groups.h>

#include <cmath>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/logprobs/logprobs.h"
#include "kernels/logprobs/logprobs_topn.cuh"

namespace tandem {
namespace {

namespace cg = cooperative_groups;
using namespace logprobs_internal;  // NOLINT: the kernel's own internals

constexpr int kParts = 8;  // CTAs per row (one cluster)
constexpr int kTop = kMaxTopLogprobs;

struct LogprobsShared {
  uint64_t cand[kWarps][kWarpCap];  // each warp's candidate buffer
  uint64_t warp_top[kWarps][kTop];  // each warp's top N, descending
  uint32_t warp_len[kWarps];
  float warp_m[kWarps], warp_s[kWarps];
  // Leader (rank 0) only, written by every CTA of the cluster:
  uint64_t part_top[kParts][kTop];  // each part's top N, descending
  uint32_t part_len[kParts];
  float part_m[kParts], part_s[kParts];
  uint64_t row_top[kTop];  // the row's top N, descending
};
static_assert(sizeof(LogprobsShared) <= 48 * 1024, "static shared memory");

// (m, s) <- the logsumexp state of the union of (m, s) and (m2, s2). Symmetric in its two
// operands (every lane of a butterfly gets the same bits). A -inf max has nothing to rescale (s
// is 0, or NaN after a NaN logit, which stays NaN); a +inf max makes s NaN.
__device__ __forceinline__ void Combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  const float ref = mx == -INFINITY ? 0.0f : mx;
  s = __fadd_rn(__fmul_rn(s, __expf(m - ref)), __fmul_rn(s2, __expf(m2 - ref)));
  m = mx;
}

// This lane's 4 x 4 logits of the group starting at `pos` (ids pos + i * 128 + 4 * lane + k),
// -inf past `end`. kVec: the row is 16-byte aligned and end is a multiple of 4.
template <bool kVec>
__device__ __forceinline__ void LoadGroup(const float* row, int64_t pos, int64_t end,
                                          float (&v)[kGroupVecs][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kGroupVecs; ++i) {
    const int64_t at = pos + i * 128 + 4 * lane;
    if constexpr (kVec) {
      float4 q = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      if (at < end) q = __ldcs(reinterpret_cast<const float4*>(row + at));
      v[i][0] = q.x, v[i][1] = q.y, v[i][2] = q.z, v[i][3] = q.w;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) v[i][k] = at + k < end ? __ldcs(row + at + k) : -INFINITY;
    }
  }
}

// Streams [begin, end) of the row (this warp's range): the lane's (m, s), and the warp's
// candidates when n > 0.
template <bool kVec>
__device__ __forceinline__ void StreamRange(const float* row, int64_t begin, int64_t end, int n,
                                            WarpTop& top, float& m, float& s_out) {
  const int lane = threadIdx.x % 32;
  float s[kGroupVecs] = {};
  for (int64_t pos = begin; pos < end; pos += kGroupElems) {
    float v[kGroupVecs][4];
    LoadGroup<kVec>(row, pos, end, v);
    float gmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < kGroupVecs; ++i) {
      gmax = fmaxf(fmaxf(gmax, fmaxf(v[i][0], v[i][1])), fmaxf(v[i][2], v[i][3]));
    }
    if (gmax > m) {
      const float scale = __expf(m - gmax);  // 0 while m is -inf
#pragma unroll
      for (int i = 0; i < kGroupVecs; ++i) s[i] = __fmul_rn(s[i], scale);
      m = gmax;
    }
    const float ref = m == -INFINITY ? 0.0f : m;  // all logits so far -inf: each adds 0
#pragma unroll
    for (int i = 0; i < kGroupVecs; ++i) {
      s[i] += (__expf(v[i][0] - ref) + __expf(v[i][1] - ref)) +
              (__expf(v[i][2] - ref) + __expf(v[i][3] - ref));
    }
    if (n > 0) {  // uniform over the row
      // Padding (-inf) must not become a candidate while thr_logit is NaN: the range check.
      const int rem = static_cast<int>(min(end - pos, int64_t{kGroupElems})) - 4 * lane;
      uint32_t want = 0;
#pragma unroll
      for (int i = 0; i < kGroupVecs; ++i) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const bool in_range = i * 128 + k < rem;
          want |= (in_range && !(v[i][k] <= top.thr_logit) ? 1u : 0u) << (4 * i + k);
        }
      }
      if (__any_sync(0xffffffffu, want != 0)) {
        top.Append(v, want, pos);
        top.Compact(n);
      }
    }
  }
  s_out = (s[0] + s[1]) + (s[2] + s[3]);
}

// The CTA's (m, s) into the leader's part slot; all threads.
__device__ void PushPartSums(LogprobsShared& sh, float m, float s, int part) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    Combine(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) sh.warp_m[warp] = m, sh.warp_s[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float cm = sh.warp_m[0], cs = sh.warp_s[0];
    for (int w = 1; w < kWarps; ++w) Combine(cm, cs, sh.warp_m[w], sh.warp_s[w]);
    LogprobsShared* leader = cg::this_cluster().map_shared_rank(&sh, 0);
    leader->part_m[part] = cm, leader->part_s[part] = cs;
  }
}

// Leader, all threads, after the cluster barrier: the row's outputs.
__device__ void WriteRow(LogprobsShared& sh, const LogprobsArgs& args, int64_t r, int n) {
  float m = sh.part_m[0], s = sh.part_s[0];
  for (int p = 1; p < kParts; ++p) Combine(m, s, sh.part_m[p], sh.part_s[p]);
  const bool defined = !isnan(s) && !isinf(m);  // isinf(m): +inf present, or every logit -inf
  const double md = m, log_s = log(static_cast<double>(s));
  auto logprob = [&](float x) { return static_cast<float>((static_cast<double>(x) - md) - log_s); };
  const float* row = args.logits + r * args.vocab_size;
  if (threadIdx.x == 0) {
    const int64_t token = args.tokens[r];
    const bool token_ok = token >= 0 && token < args.vocab_size;
    args.token_logprob[r] = defined && token_ok ? logprob(row[token]) : NAN;
  }
  if (n == 0) return;
  MergeRegions<kParts>(sh.part_top, sh.part_len, n, sh.row_top);
  __syncthreads();
  uint32_t total = 0;
  for (int p = 0; p < kParts; ++p) total += sh.part_len[p];
  const int i = static_cast<int>(threadIdx.x);
  if (i < n) {
    int32_t id = -1;
    float lp = NAN;
    if (defined) {
      lp = -INFINITY;
      if (static_cast<uint32_t>(i) < total)
        id = PairId(sh.row_top[i]), lp = logprob(PairLogit(sh.row_top[i]));
    }
    args.top_tokens[r * kTop + i] = id;
    args.top_logprobs[r * kTop + i] = lp;
  }
}

template <bool kVec>
__global__ void __cluster_dims__(kParts, 1, 1) __launch_bounds__(kThreads)
    LogprobsKernel(const __grid_constant__ LogprobsArgs args, int part_len, int warp_len) {
  __shared__ LogprobsShared sh;
  const int64_t r = blockIdx.x / kParts;
  const int32_t want = args.num_top[r];
  if (want < 0) return;  // every CTA of the row's cluster returns here
  const int n = min(want, kTop);
  const int part = static_cast<int>(cg::this_cluster().block_rank());
  const int warp = threadIdx.x / 32;
  const int64_t part_begin = min(int64_t{part} * part_len, args.vocab_size);
  const int64_t part_end = min(part_begin + part_len, args.vocab_size);
  const int64_t begin = min(part_begin + int64_t{warp} * warp_len, part_end);
  const int64_t end = min(begin + warp_len, part_end);
  const float* row = args.logits + r * args.vocab_size;
  WarpTop top{sh.cand[warp]};
  float m = -INFINITY, s = 0.0f;
  StreamRange<kVec>(row, begin, end, n, top, m, s);
  PushPartSums(sh, m, s, part);
  if (n > 0) {
    const uint32_t len = top.Finish(n, sh.warp_top[warp]);
    if (threadIdx.x % 32 == 0) sh.warp_len[warp] = len;
    __syncthreads();
    LogprobsShared* leader = cg::this_cluster().map_shared_rank(&sh, 0);
    MergeRegions<kWarps>(sh.warp_top, sh.warp_len, n, leader->part_top[part]);
    if (threadIdx.x == 0) {
      uint32_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += sh.warp_len[w];
      leader->part_len[part] = min(total, static_cast<uint32_t>(n));
    }
  }
  cg::this_cluster().sync();  // the parts' pushes are visible to the leader
  if (part == 0) WriteRow(sh, args, r, n);
}

}  // namespace

absl::Status Logprobs(const LogprobsArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateLogprobsArgs(args));
  if (args.batch == 0) return absl::OkStatus();
  if (args.batch > INT32_MAX / kParts)
    return absl::InvalidArgumentError("Logprobs: batch too large");
  // Ranges rounded up to whole float4s, fixed by the vocabulary alone.
  const int64_t part_len = ((args.vocab_size + kParts - 1) / kParts + 3) / 4 * 4;
  const int64_t warp_len = ((part_len + kWarps - 1) / kWarps + 3) / 4 * 4;
  const bool vec = args.vocab_size % 4 == 0 && reinterpret_cast<uintptr_t>(args.logits) % 16 == 0;
  const unsigned grid = static_cast<unsigned>(args.batch * kParts);
  if (vec) {
    LogprobsKernel<true><<<grid, kThreads, 0, stream>>>(args, static_cast<int>(part_len),
                                                        static_cast<int>(warp_len));
  } else {
    LogprobsKernel<false><<<grid, kThreads, 0, stream>>>(args, static_cast<int>(part_len),
                                                         static_cast<int>(warp_len));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
