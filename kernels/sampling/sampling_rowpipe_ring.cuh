// The row-pipelined sampling kernel (sampling_rowpipe.cu): its constants, its shared memory
// (PipeShared: a per-row-kind union, then the ring of stages) and the ring itself: thread 0's
// cursor over the chunks the CTA copies (Producer: bulk asynchronous copies, cp.async.bulk with an
// L2 policy per chunk, completing on one mbarrier per stage), the view of an arrived chunk
// (ChunkView) and the CTA's side of the ring (Ring: wait, hand the chunk to a body, refill after
// the barrier that ends its reading).
#pragma once

#include <cstdint>
#include <utility>

#include "kernels/sampling/block_reduce.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_cluster.cuh"
#include "kernels/sampling/sampling_internal.cuh"
#include "kernels/sampling/sampling_rng.h"

namespace tandem::sampling_rowpipe {

using sampling_cluster::kFallbackToken;
using sampling_cluster::kStreamTopKMax;
using sampling_internal::ArgMaxPair;
using sampling_internal::Better;
using sampling_internal::FastExp2;
using sampling_internal::KeyOf;
using sampling_internal::KeyToFloat;
using sampling_internal::RowMath;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 4096;  // logits per stage (16 KiB): 32 entries, 4 per warp
// Stages of the ring (runtime: its size is chosen per launch). With more rows than SMs, two CTAs
// share an SM and each has kStagesShared (64 KiB in flight per CTA, 128 KiB per SM); with at most
// one row per SM, one CTA has kMaxStages (176 KiB).
constexpr int kMaxStages = 11;
constexpr int kStagesShared = 4;
constexpr int kEntryLen = 128;
constexpr int kChunkEntries = kChunk / kEntryLen;
constexpr int kPerWarp = kChunkEntries / kWarps;  // entries of a chunk per warp
constexpr int64_t kMaxVocab = 155648;
constexpr int kEntriesPerThread =
    static_cast<int>((kMaxVocab / kEntryLen + kThreads - 1) / kThreads);
constexpr int kEntrySlots = kEntriesPerThread * kThreads;
constexpr int kCandTrigger = 1024;               // candidates that start a select
constexpr int kCandCap = kCandTrigger + kChunk;  // a chunk appends at most kChunk
constexpr int kCandPerThread = kCandCap / kThreads;
constexpr int kKeptCap = 512;  // the top-k set (k + ties) that the tail samples from
// Selects per row before it is left to the resident kernel: a row whose logits keep rising (an
// ascending row: every chunk beats the last threshold) would otherwise select after every chunk.
constexpr int kMaxCuts = 8;
static_assert(kPerWarp == 4 && kCandCap % kThreads == 0 && kKeptCap <= kCandCap);
static_assert(kStreamTopKMax <= kCandTrigger);
// Top-p rows (TopPWindow): histogram bins (32 per octave of weight relative to rbase, from 2^64
// down to 2^-64; the last one weighs nothing once shifted to the max's octave), the candidates the
// band may hold, and the float bits that make a weight's bin key (8 exponent and 5 mantissa bits;
// the key of 1.0).
constexpr int kTopPBins = 4096;
constexpr int kTopPCandCap = 4096;
constexpr int kKeyShift = 18;
constexpr int kKeyOfOne = 127 << 5;
constexpr int kOctavesAbove = 64;
constexpr int kKeyTop = kKeyOfOne + 32 * kOctavesAbove;  // bin 0's key (w = 2^64): bin = top - key
// Top-p rows whose logits that can reach the band lie in at most this many entries outside the
// chunks pass 2 already has in the ring read those entries alone instead of the rest of the row
// (TopPPlanPass2).
constexpr int kTopPGatherCap = 256;
constexpr int kTopPGatherBatch = 8;  // entries a warp loads at once
// Pass 2's chunks the ring copies before the plan (Producer::hold_at): enough to cover the
// latency of the first copies after it when the row is streamed. A row of `chunks` chunks has
// TopPPrefetched(chunks) of them in the ring when its plan is made (all of a one-chunk row).
constexpr int kTopPPrefetch = 1;
__host__ __device__ constexpr int TopPPrefetched(int chunks) {
  return chunks < kTopPPrefetch ? chunks : kTopPPrefetch;
}
static_assert(kTopPGatherCap % (kWarps * kTopPGatherBatch) == 0 && kTopPPrefetch <= kStagesShared);
static_assert(kTopPBins % kThreads == 0 && kTopPBins == 32 * 2 * kOctavesAbove);
static_assert(kMaxVocab * 16384 < (int64_t{1} << 32), "a bin's 14-bit weights fit 32 bits");

enum RowKind : int { kSkip = 0, kGreedy, kTemperature, kTopK, kTopP };

// Shared memory: this fixed part, then the ring (stages x kChunk logits, 128-byte aligned).
struct PipeShared {
  union {
    struct {  // temperature rows: per entry of 128 logits
      float max[kEntrySlots];
      float sum[kEntrySlots];
    } entry;
    struct {  // top-k rows: candidates (logit, id), then the kept set's weights
      alignas(16) float x[kCandCap];
      int32_t id[kCandCap];
      uint64_t w[kKeptCap];
    } cand;
    struct {  // top-p rows
      union {
        uint32_t hist[kTopPBins + 32];  // pass 1: the weight histogram, + a slot per lane for
                                        // weights outside the bins
        struct {                        // pass 2: the band's candidates (logit, id)
          float x[kTopPCandCap];
          int32_t id[kTopPCandCap];
        } cand;
      };
      float entry[kEntrySlots];         // per entry: pass 1 its weight, pass 2 its kept mass
      uint32_t entry_key[kEntrySlots];  // pass 1: per entry its max logit's key
      uint16_t gather[kTopPGatherCap];  // pass 2: the entries it reads alone
      struct {                          // the draws from the whole distribution (TopPDrawAttempts)
        int32_t token[kTopPAttempts];   // -1: the entry drawn had no weight (rounding)
        float x[kTopPAttempts];         // the token's logit
        int entry[kWarps];              // a round's entries, one per warp,
        uint64_t rest[kWarps];          //   and the targets less the masses before them
        int n;                          // draws made; TopPTail takes the first it keeps
      } attempt;
    } topp;
  } u;
  uint64_t full[kMaxStages];  // mbarriers: stage holds its chunk
  uint32_t hist[256];         // radix selects: counts, or the low halves of masses
  uint32_t hist_hi[256];      //   and their high halves (AtomicAddSplit64)
  uint64_t scratch[kWarps];
  uint64_t scratch2[kWarps];  // top-p rows: a second value per warp in the fused reductions
  ArgMaxPair argmax_scratch[kWarps];
  uint32_t count;     // candidates
  float theta;        // top-k rows: a logit is a candidate iff x >= theta (NaN: none)
  uint32_t overflow;  // top-k rows: the candidates cannot be cut below the trigger (ties), or
                      // kMaxCuts selects did not keep them there
  uint32_t cuts;
  int b_lo, b_hi;  // top-p rows: the band, bins that may hold the threshold
  uint32_t sel_prefix;
  uint64_t sel_rest;
  uint32_t warp_lo[kWarps], warp_hi[kWarps];
  int draw_entry;
  uint64_t draw_rest;
  int32_t token;
};

static_assert(sizeof(std::declval<PipeShared&>().u.topp) <=
                  sizeof(std::declval<PipeShared&>().u.cand),
              "top-p rows' buffers fit in the top-k rows' (the ring starts where it did)");
constexpr size_t kRingOffset = (sizeof(PipeShared) + 127) / 128 * 128;
constexpr size_t SmemBytes(int stages) { return kRingOffset + size_t{4} * kChunk * stages; }
static_assert(SmemBytes(kMaxStages) <= 227 * 1024, "one CTA per SM");
static_assert(SmemBytes(kStagesShared) + 1024 <= 114 * 1024, "two CTAs per SM");

__device__ __forceinline__ RowKind KindOf(const SamplingArgs& a, int64_t r, bool with_top_k) {
  const sampling_cluster::RowParams p = sampling_cluster::RowParams::Load(a, r);
  if (p.Greedy()) return kGreedy;
  if (!p.FiltersK(a.vocab_size)) return p.FiltersP() ? kTopP : kTemperature;
  return with_top_k && p.StreamsTopK(a.vocab_size) ? kTopK : kSkip;
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Thread 0: the bulk copy of `bytes` (a multiple of 16) from src into dst, completing on bar.
// Logits read for the last time are evict-first in L2; the chunks of a top-p row's first pass
// that its second pass reads again from L2 (Producer::keep_from), evict-normal.
__device__ __forceinline__ void IssueChunk(float* dst, const float* src, uint32_t bytes,
                                           uint64_t* bar, bool read_again) {
  const uint32_t b = SharedAddress(bar), d = SharedAddress(dst);
  uint64_t policy;
  if (read_again) {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  }
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;\n" ::"r"(d),
      "l"(src), "r"(bytes), "r"(b), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void WaitFull(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

// The chunk a row reads at step c: top-p rows read the row twice, the second time from the last
// chunk down (and may stop early: Producer::Release).
__device__ __forceinline__ int ChunkAt(int c, int chunks) {
  return c < chunks ? c : 2 * chunks - 1 - c;
}

// Thread 0's cursor over the chunks this CTA copies: rows blockIdx.x, + gridDim.x, ... that it
// samples, each in ceil(vocab / kChunk) chunks (twice for top-p rows), in the order the CTA
// consumes them. A top-p row's cursor stops after kTopPPrefetch chunks of pass 2 (hold_at) until
// the CTA knows how much of pass 2 it reads (Release); the copies it owes meanwhile are issued
// then, so that the ring stays `stages` chunks ahead of the CTA.
struct Producer {
  int64_t row;
  int step;        // of the row's row_chunks
  int row_chunks;  // chunks, or 2 chunks for a top-p row (fewer once Release cuts pass 2)
  int stage;
  int keep_from;  // top-p rows: pass 1's chunks from this one on are read evict-normal
  int hold_at;    // top-p rows: the step the cursor waits at for Release (-1: none)
  int owed;       // copies not issued while it waits

  __device__ void SkipTo(const SamplingArgs& a, bool with_top_k, int64_t r, int chunks) {
    RowKind kind = kSkip;
    while (r < a.batch && (kind = KindOf(a, r, with_top_k)) == kSkip) r += gridDim.x;
    row = r, step = 0, row_chunks = kind == kTopP ? 2 * chunks : chunks;
    hold_at =
        kind == kTopP && TopPPrefetched(chunks) < chunks ? chunks + TopPPrefetched(chunks) : -1;
  }
  __device__ void IssueNext(PipeShared& s, float* ring, int stages, const SamplingArgs& a,
                            bool with_top_k, int chunks) {
    if (row >= a.batch) return;
    if (step == hold_at) {
      ++owed;
      return;
    }
    const int64_t first = int64_t{ChunkAt(step, chunks)} * kChunk;
    const int64_t left = a.vocab_size - first;
    const int n = left < kChunk ? static_cast<int>(left) : kChunk;
    IssueChunk(ring + stage * kChunk, a.logits + row * a.vocab_size + first, 4u * n, &s.full[stage],
               /*read_again=*/row_chunks > chunks && step < chunks && step >= keep_from);
    if (++stage == stages) stage = 0;
    if (++step == row_chunks) SkipTo(a, with_top_k, row + gridDim.x, chunks);
  }
  // Row r (a top-p row, its pass 1 read) takes `steps` steps in all: 2 chunks to stream pass 2,
  // or fewer (the steps issued before the hold) to end it there; then the owed copies. Nothing
  // if the cursor never held at r (a row of at most kTopPPrefetch chunks: all of it issued).
  __device__ void Release(int64_t r, int steps, PipeShared& s, float* ring, int stages,
                          const SamplingArgs& a, bool with_top_k, int chunks) {
    if (row != r || hold_at < 0) return;
    hold_at = -1, row_chunks = steps;
    int n = owed;
    owed = 0;
    if (step >= row_chunks) SkipTo(a, with_top_k, row + gridDim.x, chunks);
    for (; n > 0; --n) IssueNext(s, ring, stages, a, with_top_k, chunks);
  }
};

// One chunk of a row (n logits from `first`), warp w: entries kPerWarp w .. kPerWarp w + 3.
struct ChunkView {
  const float* stage;
  int n;
  int32_t first;
  // Where this lane's 4 logits of the warp's j-th entry are in the chunk.
  __device__ __forceinline__ static int Local(int j) {
    return (kPerWarp * (threadIdx.x / 32) + j) * kEntryLen + 4 * (threadIdx.x % 32);
  }
  // This lane's 4 logits of the warp's j-th entry (NaN -> -inf; beyond the row -inf: FillTail),
  // and their position in the chunk.
  __device__ __forceinline__ int Load(int j, float (&q)[4]) const {
    const int local = LoadRaw(j, q);
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = fmaxf(q[e], -INFINITY);  // NaN -> -inf, one FMNMX
    return local;
  }
  // The same with NaN kept (top-p rows: a NaN makes z NaN and the row falls back).
  __device__ __forceinline__ int LoadRaw(int j, float (&q)[4]) const {
    const int local = Local(j);
    const float4 v = *reinterpret_cast<const float4*>(stage + local);
    q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
    return local;
  }
  // A row's last chunk (n < kChunk): every thread sets the slots it reads beyond the row to -inf,
  // so that the loads need no bound test. Then fences its generic writes against the next bulk
  // copy into the stage (async proxy), issued after the block barrier that ends the chunk.
  __device__ __forceinline__ void FillTail() const {
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
      const int local = Local(j);
      if (local >= n) {  // n % 4 == 0
        *reinterpret_cast<float4*>(const_cast<float*>(stage) + local) =
            make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
};

// The CTA's side of the ring: waits for each of a row's chunks (steps c0 .. c1 - 1), hands it to
// body(c, chunk, view), which returns whether the CTA must act after the barrier (a top-k select),
// refills the stage after the barrier that ends its reading (thread 0), then calls after(c, flag)
// with the OR of the flags. One loop per row kind (the kernel's switch), so each kind's loop is
// compact and scheduled on its own.
struct Ring {
  PipeShared& s;
  float* ring;
  Producer& producer;  // thread 0's
  const SamplingArgs& args;
  bool with_top_k;
  int stages, chunks, stage = 0;
  uint32_t phase = 0;

  // Waits until stage st (of parity ph) holds the row's chunk at step c; its view.
  __device__ __forceinline__ ChunkView Arrived(int c, int st, uint32_t ph, int* chunk) const {
    WaitFull(&s.full[st], ph);
    *chunk = ChunkAt(c, chunks);
    const int32_t first = *chunk * kChunk;
    const int64_t left = args.vocab_size - first;
    const ChunkView view{ring + st * kChunk, left < kChunk ? static_cast<int>(left) : kChunk,
                         first};
    if (view.n < kChunk) view.FillTail();  // uniform: the row's last chunk
    return view;
  }

  template <bool kMayFlag, typename Body, typename After>
  __device__ __forceinline__ void Stream(int c0, int c1, Body&& body, After&& after) {
    for (int c = c0; c < c1; ++c) {
      int chunk;
      const ChunkView view = Arrived(c, stage, phase, &chunk);
      bool flag = body(c, chunk, view);
      if constexpr (kMayFlag) {
        flag = __syncthreads_or(flag);
      } else {
        __syncthreads();
      }
      if (threadIdx.x == 0) producer.IssueNext(s, ring, stages, args, with_top_k, chunks);
      if (++stage == stages) stage = 0, phase ^= 1;
      after(c, flag);
    }
  }
  template <typename Body>  // bodies that return nothing: no flag, nothing after the barrier
  __device__ __forceinline__ void Stream(int c0, int c1, Body&& body) {
    Stream<false>(
        c0, c1,
        [&](int c, int chunk, const ChunkView& view) {
          body(c, chunk, view);
          return false;
        },
        [](int, bool) {});
  }
  // As Stream for bodies that return nothing, two chunks per block barrier (the last alone when
  // the count is odd): half the barriers, and a warp's time over two chunks evens out more than
  // over one (top-p rows: WORKLOG.md, session 9).
  template <typename Body>
  __device__ __forceinline__ void StreamPairs(int c0, int c1, Body&& body) {
    for (int c = c0; c < c1; c += 2) {
      const int n = c + 1 < c1 ? 2 : 1;
      int st = stage;
      uint32_t ph = phase;
      for (int k = 0; k < n; ++k) {
        int chunk;
        const ChunkView view = Arrived(c + k, st, ph, &chunk);
        body(c + k, chunk, view);
        if (++st == stages) st = 0, ph ^= 1;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int k = 0; k < n; ++k) producer.IssueNext(s, ring, stages, args, with_top_k, chunks);
      }
      stage = st, phase = ph;
    }
  }
};

}  // namespace tandem::sampling_rowpipe
