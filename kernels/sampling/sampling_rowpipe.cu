// Row-pipelined sampling kernel for large batches: one CTA per row, the row streamed from HBM
// through a ring of shared-memory stages filled by bulk asynchronous copies (TMA, cp.async.bulk,
// issued by thread 0 as each stage is read), so the loads in flight do not depend on registers or
// on what the CTA computes: while it works on a chunk, or on a cut of its top-k candidates, the
// next `stages` chunks (of this row or of its next one) are on their way. Why (WORKLOG.md,
// session 7): the streaming cluster kernel (sampling_stream.cu) holds its loads in registers and
// ends each row in a serial, cluster-wide tail; at batch 256 it ran ~4 rows per cluster in five
// rounds of 62 clusters, latency-bound. Here a batch of up to two rows per SM is in flight at once
// and every row's tail overlaps the others'. Below kRowPipeMinBatch rows a lone CTA per row
// streams too slowly and the streaming kernel stays faster.
//
// Rows it samples (the others are left to the resident cluster kernel, launched after it):
//   greedy: the exact argmax (lowest id on ties);
//   temperature only: per entry of 128 logits S_e = sum 2^((x - m) * scale), m the max of the
//     four entries a warp takes from a chunk (the streaming kernel: of the entry), then, after the
//     row, entry masses in fixed point, the entry holding u * total, and the draw inside it with
//     exact weights (the entry re-read, 512 bytes);
//   with_top_k, top-k rows with k <= kStreamTopKMax (any top-p; StreamsTopK): a running threshold
//     theta, the exact k-th largest of the candidates so far (by their order-preserving keys; -0.0
//     counts below 0.0 as in the other kernels' selects), is a lower bound of the row's k-th
//     largest, so logits >= theta are appended to the candidates and nothing of the top-k set is
//     lost; when the candidates pass kCandTrigger (the first chunk, then once or twice more over a
//     N(0, 3^2) row) an exact radix select raises theta and drops the rest. After the row the
//     candidates are the top-k set (ties kept): fixed-point weights, top-p, the draw in id order
//     (sampling_draw.cuh, as the streaming kernel's leader). Ties that keep the candidates above
//     the trigger, kMaxCuts selects, or a set above kKeptCap give kFallbackToken: the resident
//     kernel samples that row.
//   top-p rows without top-k (TopPOnly), in two passes over the row (the second in reverse chunk
//     order, so that it starts on the chunks the first read last, still in L2):
//     pass 1: the row max, the total weight z and a histogram of the weights, all relative to a
//       reference logit rbase (the first chunk's max), so no pass needs the row max beforehand: a
//       weight's float bits give its bin (32 per octave, 64 octaves above rbase and 64 below)
//       and its mantissa the bin's fixed-point increment (TopPWindow). After it: the bins whose
//       cumulative mass from the top can hold top_p of z, [b_lo, b_hi] (FindTopPBand: usually one
//       bin, the margin about the histogram's error: sim/topp_two_pass.py).
//     pass 2: per entry the weight above the band (surely kept), and the logits in the band as
//       candidates. Then exactly as the other kernels: need = ceil(top_p z); the band must hold
//       the threshold (mass above < need <= mass above + candidates); a mass-weighted radix select
//       over the candidates gives the smallest kept key; kept candidates join their entries; the
//       draw as temperature rows, over the kept logits.
//     A failed bracket (the histogram's rounding at a bin edge), more than kTopPCandCap candidates
//     (a nearly flat row, a wide band), a row of -inf, with +inf or with a logit 64 octaves of
//     weight above the first chunk's max, or a temperature whose log2(e) / T overflows gives
//     kFallbackToken.
// Needs 16-byte aligned rows (vocab % 4 == 0, aligned logits) for the bulk copies.
#include <algorithm>
#include <atomic>
#include <cstdint>
#ifdef TANDEM_SAMPLING_TRACE
#include <cstdio>
#include <cstdlib>
#include <vector>
#endif

#include "absl/status/statusor.h"
#include "base/cuda_check.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/sampling/block_reduce.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_cluster.cuh"
#include "kernels/sampling/sampling_draw.cuh"
#include "kernels/sampling/sampling_internal.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_variants.h"

namespace tandem {
namespace {

#ifdef TANDEM_SAMPLING_TRACE
// Diagnostic builds only (-DTANDEM_SAMPLING_TRACE): thread 0 of each CTA stamps the phases of
// its first top-p row with clock64 (SM cycles) and %globaltimer (ns); printed by
// SamplingRowPipeLaunch on its 10th launch when TANDEM_SAMPLING_TRACE_DUMP is set.
constexpr int kTraceCtas = 512;
__device__ unsigned long long g_rowpipe_trace[kTraceCtas][16];
__device__ __forceinline__ void RowPipeTrace(int e) {
  if (threadIdx.x == 0 && blockIdx.x < kTraceCtas) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t)::"memory");
    g_rowpipe_trace[blockIdx.x][e] = clock64();
    g_rowpipe_trace[blockIdx.x][8 + e] = t;
  }
}
#define ROWPIPE_TRACE(e) RowPipeTrace(e)
#else
#define ROWPIPE_TRACE(e)
#endif

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
    struct {                          // top-p rows, pass 1: the weight histogram
      uint32_t hist[kTopPBins + 32];  // + a slot per lane for weights outside the bins
    } topp1;
    struct {  // top-p rows, pass 2: candidates (logit, id), and per entry the kept mass
      float x[kTopPCandCap];
      int32_t id[kTopPCandCap];
      float entry[kEntrySlots];
    } topp2;
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

// The chunk a row reads at step c of its row_chunks steps: top-p rows read the row twice
// (row_chunks == 2 chunks), the second time from the last chunk down.
__device__ __forceinline__ int ChunkAt(int c, int chunks, int row_chunks) {
  return c < chunks ? c : row_chunks - 1 - c;
}

// Thread 0's cursor over the chunks this CTA copies: rows blockIdx.x, + gridDim.x, ... that it
// samples, each in ceil(vocab / kChunk) chunks (twice for top-p rows), in the order the CTA
// consumes them.
struct Producer {
  int64_t row;
  int step;        // of the row's row_chunks
  int row_chunks;  // chunks, or 2 chunks for a top-p row
  int stage;
  int keep_from;  // top-p rows: pass 1's chunks from this one on are read evict-normal

  __device__ void SkipTo(const SamplingArgs& a, bool with_top_k, int64_t r, int chunks) {
    RowKind kind = kSkip;
    while (r < a.batch && (kind = KindOf(a, r, with_top_k)) == kSkip) r += gridDim.x;
    row = r, step = 0, row_chunks = kind == kTopP ? 2 * chunks : chunks;
  }
  __device__ void IssueNext(PipeShared& s, float* ring, int stages, const SamplingArgs& a,
                            bool with_top_k, int chunks) {
    if (row >= a.batch) return;
    const int64_t first = int64_t{ChunkAt(step, chunks, row_chunks)} * kChunk;
    const int64_t left = a.vocab_size - first;
    const int n = left < kChunk ? static_cast<int>(left) : kChunk;
    IssueChunk(ring + stage * kChunk, a.logits + row * a.vocab_size + first, 4u * n, &s.full[stage],
               /*read_again=*/step < row_chunks - chunks && step >= keep_from);
    if (++stage == stages) stage = 0;
    if (++step == row_chunks) SkipTo(a, with_top_k, row + gridDim.x, chunks);
  }
};

// The candidates' smallest and largest keys, from each warp's (lo, hi) in s.warp_lo / warp_hi
// (after a barrier).
__device__ __forceinline__ void WarpKeyRange(PipeShared& s, const float* xs, uint32_t n) {
  uint32_t lo = ~0u, hi = 0;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t key = KeyOf(xs[i]);
    lo = min(lo, key), hi = max(hi, key);
  }
  lo = __reduce_min_sync(0xffffffffu, lo), hi = __reduce_max_sync(0xffffffffu, hi);
  if (threadIdx.x % 32 == 0) s.warp_lo[threadIdx.x / 32] = lo, s.warp_hi[threadIdx.x / 32] = hi;
}

// The largest key kappa among the n logits xs whose (count, or with kMass fixed-point mass) of
// keys >= kappa reaches rest (the exact k-th largest key, ties counted, for a count of k; the
// smallest key top-p keeps for a mass), in every thread. Radix rounds over d = key - (the smallest
// key), at most 8 bits each from the top bit of the largest d down. Digits of d rather than of
// the key: candidates are the top of a row, so their keys share their high bits, and a histogram
// of the key's top byte would put them all in one bin (one shared-memory address for every
// atomic; WORKLOG.md, session 7, step 15b). rest must be >= 1 and at most the total.
// These are its radix rounds, after WarpKeyRange and a barrier; SelectKey does both.
template <bool kMass>
__device__ uint32_t SelectKeyInRange(PipeShared& s, const float* xs, uint32_t n, uint64_t rest,
                                     const RowMath& row) {
  const int lane = threadIdx.x % 32;
  uint32_t lo = ~0u, hi = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) lo = min(lo, s.warp_lo[w]), hi = max(hi, s.warp_hi[w]);
  uint32_t prefix = 0;  // the chosen high bits of d (from bit `top` up)
  for (int top = 32 - __clz(hi - lo); top > 0;) {
    const int shift = top > 8 ? top - 8 : 0;
    const uint32_t bins = 1u << (top - shift);
    s.hist[threadIdx.x] = 0;
    if (kMass) s.hist_hi[threadIdx.x] = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
      const float x = xs[i];
      const uint32_t d = KeyOf(x) - lo;
      const uint32_t high = top == 32 ? 0u : d >> top;
      if (high == (top == 32 ? 0u : prefix >> top)) {
        const uint32_t digit = (d >> shift) & (bins - 1);
        if constexpr (kMass) {
          const uint64_t w = row.Weight(x);
          if (w != 0) sampling_internal::AtomicAddSplit64(&s.hist[digit], &s.hist_hi[digit], w);
        } else {
          atomicAdd(&s.hist[digit], 1u);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // digits from the top: lane l holds 255 - 8l - j
      uint64_t v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int digit = 255 - 8 * lane - j;
        v[j] = kMass ? sampling_internal::Split64(s.hist[digit], s.hist_hi[digit]) : s.hist[digit];
      }
      const sampling_internal::WarpPick p = sampling_internal::WarpFirstReaching<8>(v, rest);
      if (lane == 0) {
        const uint32_t digit = p.index < 0 ? 0u : 255u - static_cast<uint32_t>(p.index);
        s.sel_prefix = prefix | digit << shift;
        s.sel_rest = p.index < 0 ? 1u : p.rest;
      }
    }
    __syncthreads();
    prefix = s.sel_prefix, rest = s.sel_rest, top = shift;
  }
  return lo + prefix;
}

// SelectKeyInRange with its key range (top-k cuts; the top-p tail fuses the range into its
// mass reduction).
template <bool kMass>
__device__ uint32_t SelectKey(PipeShared& s, const float* xs, uint32_t n, uint64_t rest,
                              const RowMath& row) {
  WarpKeyRange(s, xs, n);
  __syncthreads();
  return SelectKeyInRange<kMass>(s, xs, n, rest, row);
}

// All threads: keeps the candidates >= the k-th largest (ties kept) and raises theta to it;
// flags an overflow when they stay above the trigger (ties) or, streaming (not the row's last
// select), when the row has had kMaxCuts. Ends with a block barrier.
__device__ void CutCandidates(PipeShared& s, uint32_t k, bool streaming) {
  const uint32_t n = s.count;
  const uint32_t kth = SelectKey<false>(s, s.u.cand.x, n, k, RowMath{});
  float x[kCandPerThread];
  int32_t id[kCandPerThread];
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {
    const uint32_t i = j * kThreads + threadIdx.x;
    x[j] = i < n ? s.u.cand.x[i] : -INFINITY;
    id[j] = i < n ? s.u.cand.id[i] : -1;
  }
  __syncthreads();
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {
    const bool keep = id[j] >= 0 && KeyOf(x[j]) >= kth;
    const uint32_t mask = __ballot_sync(0xffffffffu, keep);
    if (mask == 0) continue;
    uint32_t base = 0;
    if (lane == __ffs(mask) - 1) base = atomicAdd(&s.count, __popc(mask));
    base = __shfl_sync(0xffffffffu, base, __ffs(mask) - 1);
    if (keep) {
      const uint32_t slot = base + __popc(mask & ((1u << lane) - 1));
      s.u.cand.x[slot] = x[j], s.u.cand.id[slot] = id[j];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s.theta = KeyToFloat(kth);
    // No more appends once the candidates stay above the trigger or the row has had its selects.
    if (s.count > kCandTrigger || (streaming && ++s.cuts > kMaxCuts)) s.overflow = 1, s.theta = NAN;
  }
  __syncthreads();
}

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

__device__ __forceinline__ void GreedyChunk(const ChunkView& c, ArgMaxPair& best) {
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    float q[4];
    const int local = c.Load(j, q);
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // ids grow within a thread: the first strict max is lowest
      if (q[e] > best.value) best = ArgMaxPair{q[e], c.first + local + e};
    }
  }
}

// A warp's per-lane sums of its kPerWarp entries, reduced transposed: two exchange steps leave
// each group of 8 lanes one entry, then three steps within the group (6 shuffles instead of 20).
// Lanes 0, 8, 16, 24 return the totals of entries 0, 1, 2, 3 (lane / 8).
__device__ __forceinline__ float ReduceFourEntries(const float (&sum)[kPerWarp]) {
  const int lane = threadIdx.x % 32;
  const bool hi16 = (lane & 16) != 0, hi8 = (lane & 8) != 0;
  // Lanes 16-31 keep entries 2 and 3, lanes 0-15 entries 0 and 1.
  float k0 = hi16 ? sum[2] : sum[0], k1 = hi16 ? sum[3] : sum[1];
  k0 += __shfl_xor_sync(0xffffffffu, hi16 ? sum[0] : sum[2], 16);
  k1 += __shfl_xor_sync(0xffffffffu, hi16 ? sum[1] : sum[3], 16);
  // Lanes with bit 3 set keep the second of the two.
  float mine = hi8 ? k1 : k0;
  mine += __shfl_xor_sync(0xffffffffu, hi8 ? k0 : k1, 8);
#pragma unroll
  for (int off = 4; off > 0; off /= 2) mine += __shfl_xor_sync(0xffffffffu, mine, off);
  return mine;
}

// The warp's kPerWarp entries share one reference m (their max, one REDUX): S_e is then relative
// to m, which is all the tail needs (entry mass = S_e 2^((m - M) scale), M the max of the m's).
__device__ __forceinline__ void TemperatureChunk(PipeShared& s, const ChunkView& c, int chunk,
                                                 float scale) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float q[kPerWarp][4];
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) c.Load(j, q[j]);
  float lane_max = q[0][0];
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) lane_max = fmaxf(lane_max, q[j][e]);
  }
  const float m = KeyToFloat(__reduce_max_sync(0xffffffffu, KeyOf(lane_max)));
  float sum[kPerWarp] = {};
  if (m != -INFINITY) {
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[j] += FastExp2((q[j][e] - m) * scale);
    }
  }
  const float mine = ReduceFourEntries(sum);
  if ((lane & 7) == 0) {
    const int e = chunk * kChunkEntries + kPerWarp * warp + lane / 8;
    s.u.entry.max[e] = m, s.u.entry.sum[e] = mine;
  }
}

// Top-k candidates: appends the lane's logits flagged in want (bit 4j + e: logit e of q[j], whose
// id is first + local[j] + e) at the slots from *count on (one shared atomic per warp: a prefix
// over the lanes places them); the caller guarantees room (at most kChunk after at most
// kCandTrigger). Returns where the warp's appends end (0 if the warp has none). All 16 bits are
// tested, unrolled: a row's first chunks append most of their logits, and the one-bit-at-a-time
// loop of AppendTopPCandidates made the top-k rows slower (WORKLOG.md, session 11, run W3).
__device__ __forceinline__ uint32_t AppendFlagged(uint32_t* count, float* xs, int32_t* ids,
                                                  const float (&q)[kPerWarp][4],
                                                  const int (&local)[kPerWarp], int32_t first,
                                                  uint32_t want) {
  const int lane = threadIdx.x % 32;
  const uint32_t mine = __popc(want);
  if (!__any_sync(0xffffffffu, mine != 0)) return 0;
  uint32_t incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  uint32_t base = 0;
  if (lane == 31) base = atomicAdd(count, incl);
  base = __shfl_sync(0xffffffffu, base, 31);
  uint32_t slot = base + incl - mine;
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (want >> (4 * j + e) & 1u) {
        xs[slot] = q[j][e], ids[slot] = first + local[j] + e;
        ++slot;
      }
    }
  }
  return base + __shfl_sync(0xffffffffu, incl, 31);
}

// Top-p candidates: the same for the logits of the band, slots at or past cap counted, not
// written. The logits are read again from the stage, one set bit at a time: a lane has one or
// none in most chunks (~170 candidates in a N(0, 3^2) row at p = 0.95), where the unrolled test
// of all 16 bits cost ~48 instructions per warp and chunk: 6.5% fewer instructions, top-p rows
// ~8% faster at B = 256 and ~10% at B = 128 (WORKLOG.md, session 11, runs W5-W6).
__device__ __forceinline__ void AppendTopPCandidates(uint32_t* count, float* xs, int32_t* ids,
                                                     uint32_t cap, const ChunkView& c,
                                                     uint32_t want) {
  const int lane = threadIdx.x % 32;
  const uint32_t mine = __popc(want);
  if (!__any_sync(0xffffffffu, mine != 0)) return;
  uint32_t incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  uint32_t base = 0;
  if (lane == 31) base = atomicAdd(count, incl);
  base = __shfl_sync(0xffffffffu, base, 31);
  for (uint32_t slot = base + incl - mine; want != 0; want &= want - 1, ++slot) {
    const int bit = __ffs(want) - 1;
    const int local = ChunkView::Local(bit >> 2) + (bit & 3);
    if (slot < cap) xs[slot] = c.stage[local], ids[slot] = c.first + local;
  }
}

// Appends this warp's logits >= theta of the chunk to the candidates. Returns where the warp's
// appends end (0 if none): the largest over the warps is the new count, so a barrier that ORs
// "end > trigger" decides the select uniformly (reading the count after the barrier would race
// with the next chunk's appends).
__device__ __forceinline__ uint32_t TopKChunk(PipeShared& s, const ChunkView& c) {
  const float theta = s.theta;
  float q[kPerWarp][4];
  int local[kPerWarp];
  uint32_t want = 0;  // bit 4j + e: logit e of the lane's j-th float4 (-inf beyond the row)
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    local[j] = c.Load(j, q[j]);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      want |= (local[j] < c.n && q[j][e] >= theta ? 1u : 0u) << (4 * j + e);
  }
  return AppendFlagged(&s.count, s.u.cand.x, s.u.cand.id, q, local, c.first, want);
}

// Top-p rows: the histogram window (uniform over the CTA, in registers). A logit's weight
// relative to rbase, w = 2^((x - rbase) * scale) (one FFMA and one MUFU.EX2), is binned by its
// top float bits: bin = top - (bits(w) >> 18) (8 exponent and 5 mantissa bits: 32 bins per
// octave, each a weight ratio of at most 1 + 1/32), bin 0 at w = 2^64. It adds its mantissa (24
// bits with the hidden one, >> 10: the weight relative to 2^exponent in 14-bit fixed point).
// rbase is the max of the first chunk with a finite logit; the window reaches 64 octaves above
// it (a later max more than 2^64 times heavier sends the row to the fallback) and 64 below
// (lighter weights are below 2^-64 of the max: 0 in fixed point). Pass 2 bins with the same
// instructions, so both passes put every logit in the same bin.
struct TopPWindow {
  float rbase = -INFINITY;  // -inf until a chunk with a finite logit
  float c0 = 0.0f;          // -rbase * scale
  __device__ __forceinline__ float Weight(float x, float scale) const {
    return FastExp2(fmaf(x, scale, c0));
  }
  __device__ __forceinline__ static int Bin(float w) {
    return kKeyTop - static_cast<int>(__float_as_uint(w) >> kKeyShift);
  }
  // Bin b's histogram slot, kTopPBins - 1 - b (as unsigned: weights below the window wrap). The
  // compiler folds it to the key less a constant: one VIADDMNMX with the caller's clamp.
  __device__ __forceinline__ static uint32_t Slot(float w) {
    return static_cast<uint32_t>(kTopPBins - 1 - Bin(w));
  }
  __device__ __forceinline__ void Start(float x, float scale) { rbase = x, c0 = -x * scale; }
};
__device__ __forceinline__ uint32_t InBinWeight(float w) {
  // (bits & 0x7ffc00) | 0x800000 as one LOP3 with the mask in a register (the compiler would
  // emit two: LOP3 encodes one immediate), then the shift.
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;"
      : "=r"(r)
      : "r"(__float_as_uint(w)), "r"(0x7ffc00u), "n"(0x800000));
  return r >> 10;
}

// Top-p row, pass 1, one chunk: the lane's max; before the first finite logit, the chunk's max
// starts the window (a block-wide max: every thread takes this branch or none); every logit adds
// its weight to the lane's z (relative to rbase) and, if it falls in a bin, to that bin.
// Per logit, no branches, so that the 16 chains interleave: FFMA, MUFU.EX2, FADD, FMNMX, the
// slot (SHF, VIADDMNMX, its address), the increment (LOP3, SHF) and a shared atomic. Logits
// outside the bins add to a spill slot: below the last bin they weigh less than 2^-64 of rbase;
// above the first (w >= 2^64, +inf, NaN) the row falls back (FindTopPBand: the max's bin, z).
__device__ __forceinline__ void TopPHistogramChunk(PipeShared& s, const ChunkView& c, float scale,
                                                   TopPWindow& win, float& lane_max, double& z) {
  float q[kPerWarp][4];
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) c.LoadRaw(j, q[j]);  // -inf beyond the row
  if (win.rbase == -INFINITY) {                           // uniform
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) m = fmaxf(m, q[j][e]);
    }
    m = sampling_internal::BlockArgMax<kWarps>(ArgMaxPair{m, 0}, s.argmax_scratch).value;
    if (m == -INFINITY) return;
    win.Start(m, scale);
  }
  // The histogram holds bin b at slot kTopPBins - 1 - b (TopPWindow::Slot: the key less the
  // lowest bin's, one VIADDMNMX with the clamp); slots out of range (below the window the
  // difference wraps) go to a slot of this lane past the histogram, never read, so that they
  // need no test and share no address.
  const uint32_t spill = kTopPBins + threadIdx.x % 32;
  float zc = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = q[j][e];
      lane_max = fmaxf(lane_max, x);
      const float w = win.Weight(x, scale);
      zc += w;
      atomicAdd(&s.u.topp1.hist[min(TopPWindow::Slot(w), spill)], InBinWeight(w));
    }
  }
  z += zc;
}

// Top-p row, between the passes (all threads; uniform result): the row max, and the band of bins
// that may hold the threshold: bin masses relative to the octave of the max (the histogram times
// 2^(exponent - the max's exponent), 16-bit fixed point), ranked from the top; the band runs from
// the first bin whose cumulative mass reaches top_p of the total less a margin to the first that
// reaches it plus the margin. The margin, (2.5e-4 p (1 - p) + 1e-6) of the total: each weight's
// increment is truncated by less than 2^-13 of it, which moves the share of the mass above a bin
// edge, f, by less than 1.2e-4 f (1 - f) (numerator and denominator err alike), so twice that at
// f = p, and 1e-6 for the absolute terms (the shift to the max's octave, float sums). Pass 2
// checks the band exactly: a margin too narrow costs a fallback, never a wrong token. Session 8's
// 1e-4 of the total left ~4k candidates in the band at p = 0.999, T ~ 1: 1% of such rows went
// over the 4096 cap on the GPU and the appends slowed the rest (WORKLOG.md, session 9, run S6).
// False (fallback) for rows of -inf, with +inf, NaN or a logit above the window, and for a band
// at the bottom.
struct TopPBand {
  float max_logit;
  // The band [b_lo, b_hi] as pass 2 tests it, on a weight's float bits: >= above_bits is above
  // the band (bin < b_lo), in [band_bits, above_bits) in it.
  uint32_t above_bits, band_bits;
  double z_rel;  // the total weight relative to rbase
};
__device__ bool FindTopPBand(PipeShared& s, const TopPWindow& win, float lane_max, double z_rel,
                             float scale, float top_p, TopPBand* band) {
  {  // the row max and z in one round (the histogram's scan below reuses s.scratch)
    const uint32_t max_key = __reduce_max_sync(0xffffffffu, KeyOf(lane_max));
#pragma unroll
    for (int off = 16; off > 0; off /= 2) z_rel += __shfl_xor_sync(0xffffffffu, z_rel, off);
    if (threadIdx.x % 32 == 0) {
      s.warp_hi[threadIdx.x / 32] = max_key;
      s.scratch2[threadIdx.x / 32] = __double_as_longlong(z_rel);
    }
    __syncthreads();
    uint32_t m = 0;
    double z = 0.0;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) {
      m = max(m, s.warp_hi[i]);
      z += __longlong_as_double(s.scratch2[i]);
    }
    band->max_logit = KeyToFloat(m), band->z_rel = z;
  }
  if (!isfinite(band->max_logit) || !isfinite(win.rbase) || !isfinite(band->z_rel)) return false;
  const int max_bin = TopPWindow::Bin(win.Weight(band->max_logit, scale));
  if (max_bin < 0) return false;  // a weight 2^64 times rbase's: not in the histogram
  const int max_octave = (kKeyTop - max_bin) >> 5;
  constexpr int kPer = kTopPBins / kThreads;
  uint64_t mass[kPer], mine = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int b = kPer * threadIdx.x + i;
    const int down = max(max_octave - ((kKeyTop - b) >> 5), 0);
    mass[i] = down < 48 ? (uint64_t{s.u.topp1.hist[kTopPBins - 1 - b]} << 16) >> down : 0;
    mine += mass[i];
  }
  if (threadIdx.x == 0) s.b_lo = kTopPBins, s.b_hi = kTopPBins;
  uint64_t total = 0;
  const uint64_t before = sampling_internal::BlockExclusiveScan<kWarps>(mine, s.scratch, &total);
  const double target = static_cast<double>(top_p) * static_cast<double>(total);
  const float share = 2.5e-4f * top_p * (1.0f - top_p) + 1e-6f;  // of the total
  const double margin = static_cast<double>(share) * static_cast<double>(total);
  const uint64_t lo = max(static_cast<uint64_t>(max(target - margin, 0.0)), uint64_t{1});
  const uint64_t hi = min(static_cast<uint64_t>(ceil(target + margin)), total);
  uint64_t cum = before;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const uint64_t next = cum + mass[i];
    if (cum < lo && lo <= next) s.b_lo = kPer * threadIdx.x + i;
    if (cum < hi && hi <= next) s.b_hi = kPer * threadIdx.x + i;
    cum = next;
  }
  __syncthreads();
  const int b_lo = s.b_lo, b_hi = s.b_hi;
  band->above_bits = static_cast<uint32_t>(kKeyTop + 1 - b_lo) << kKeyShift;
  band->band_bits = static_cast<uint32_t>(kKeyTop - b_hi) << kKeyShift;
  return b_hi < kTopPBins - 1;
}

// Top-p row, pass 2, one chunk: per entry the weight (relative to rbase) of the logits above the
// band, surely kept, and the logits in the band appended as candidates. The band by the weight's
// float bits (the same bins as pass 1's without computing them): FFMA, MUFU.EX2, two compares, a
// predicated FADD per logit.
__device__ __forceinline__ void TopPCollectChunk(PipeShared& s, const ChunkView& c, int chunk,
                                                 float scale, const TopPWindow& win,
                                                 const TopPBand& band) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float q[kPerWarp][4];
  float kept[kPerWarp] = {};
  uint32_t want = 0;
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) c.LoadRaw(j, q[j]);  // -inf beyond the row
  const uint32_t width = band.above_bits - band.band_bits;
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float w = win.Weight(q[j][e], scale);
      const uint32_t u = __float_as_uint(w);
      if (u >= band.above_bits) kept[j] += w;
      want |= (u - band.band_bits < width ? 1u : 0u) << (4 * j + e);
    }
  }
  const float kept_entry = ReduceFourEntries(kept);
  if ((lane & 7) == 0)
    s.u.topp2.entry[chunk * kChunkEntries + kPerWarp * warp + lane / 8] = kept_entry;
  AppendTopPCandidates(&s.count, s.u.topp2.x, s.u.topp2.id, kTopPCandCap, c, want);
}

// After a row's entry masses (mass[j]: entry threadIdx.x * kEntriesPerThread + j): the entry
// holding u * total and the draw inside it (one warp; the entry re-read, 512 bytes) over the
// logits with key >= min_key. Warp 0 returns the token (`otherwise` if the entry has no weight;
// the caller keeps the argmax). All threads; begins with a barrier.
__device__ int32_t DrawFromEntries(PipeShared& s, const SamplingArgs& args, int64_t r,
                                   const RowMath& row, const uint64_t (&mass)[kEntriesPerThread],
                                   uint32_t min_key, int32_t otherwise) {
  const int e0 = threadIdx.x * kEntriesPerThread;
  uint64_t mine = 0;
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) mine += mass[j];
  if (threadIdx.x == 0) s.draw_entry = 0, s.draw_rest = 0;  // set again by the owner
  uint64_t total = 0;
  const uint64_t before = sampling_internal::BlockExclusiveScan<kWarps>(mine, s.scratch, &total);
  if (total == 0) return otherwise;  // cannot happen: the max has weight 1
  const double u = SamplingUniformImpl(args.seeds[r], args.steps[r]);
  const uint64_t target = min(static_cast<uint64_t>(u * static_cast<double>(total)), total - 1);
  if (before <= target && target < before + mine) {
    uint64_t rest = target - before;
#pragma unroll
    for (int j = 0; j < kEntriesPerThread; ++j) {
      if (rest < mass[j]) {
        s.draw_entry = e0 + j, s.draw_rest = rest;
        break;
      }
      rest -= mass[j];
    }
  }
  __syncthreads();
  int32_t token = otherwise;
  if (threadIdx.x < 32) {
    const int64_t first = int64_t{s.draw_entry} * kEntryLen;
    const int64_t local = first + 4 * threadIdx.x;
    float q[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    if (local < args.vocab_size) {  // vocab % 4 == 0
      const float4 v =
          __ldcs(reinterpret_cast<const float4*>(args.logits + r * args.vocab_size + local));
      q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
#pragma unroll
      for (int e = 0; e < 4; ++e) q[e] = isnan(q[e]) || KeyOf(q[e]) < min_key ? -INFINITY : q[e];
    }
    const int32_t t =
        sampling_internal::DrawIn128(q, static_cast<int32_t>(first), row, s.draw_rest);
    if (t >= 0) token = t;
  }
  return token;
}

// Temperature row, after its chunks: entry masses, the entry holding u * total, the draw in it.
__device__ int32_t TemperatureTail(PipeShared& s, const SamplingArgs& args, int64_t r,
                                   float scale) {
  const int entries = static_cast<int>((args.vocab_size + kEntryLen - 1) / kEntryLen);
  const int e0 = threadIdx.x * kEntriesPerThread;
  ArgMaxPair best{-INFINITY, INT32_MAX};
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) {
    if (e0 + j < entries) best = Better(best, ArgMaxPair{s.u.entry.max[e0 + j], (e0 + j) * 128});
  }
  best = sampling_internal::BlockArgMax<kWarps>(best, s.argmax_scratch);
  if (best.value == -INFINITY) return 0;  // every logit -inf or NaN: the lowest id
  const RowMath row{best.value, scale, 0.0f};
  uint64_t mass[kEntriesPerThread];
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) {
    const int e = e0 + j;
    const bool live = e < entries && s.u.entry.max[e] != -INFINITY;
    mass[j] = live ? RowMath::Fixed(s.u.entry.sum[e] * row.WeightF(s.u.entry.max[e])) : 0;
  }
  return DrawFromEntries(s, args, r, row, mass, /*min_key=*/0, best.id);
}

// Top-p row, after pass 2 (all threads; uniform early returns). Weights relative to rbase become
// relative to the max by one factor 2^((rbase - max) * scale): z (pass 1), the mass above the band
// (the entries), then need = ceil(top_p z) (HF: the smallest prefix, by descending logit, whose
// mass reaches need). The band must hold the threshold: mass above < need <= mass above +
// candidates. Then the smallest kept key kappa (the mass-weighted select over the candidates,
// exact weights, for need - mass above), the kept candidates into their entries, and the draw
// over the logits >= kappa.
__device__ int32_t TopPTail(PipeShared& s, const SamplingArgs& args, int64_t r, float scale,
                            const TopPWindow& win, const TopPBand& band) {
  const RowMath row{band.max_logit, scale, 0.0f};
  const float factor = exp2f((win.rbase - band.max_logit) * scale);
  const int entries = static_cast<int>((args.vocab_size + kEntryLen - 1) / kEntryLen);
  const int e0 = threadIdx.x * kEntriesPerThread;
  const uint32_t n = s.count;
  if (n > kTopPCandCap) return kFallbackToken;  // uniform
  // One round for the mass above the band, the candidates' mass and their key range.
  uint64_t above = 0, cand = 0;
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) {
    above += e0 + j < entries ? RowMath::Fixed(s.u.topp2.entry[e0 + j] * factor) : 0;
  }
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) cand += row.Weight(s.u.topp2.x[i]);
  above = sampling_internal::WarpSum(above), cand = sampling_internal::WarpSum(cand);
  if (threadIdx.x % 32 == 0)
    s.scratch[threadIdx.x / 32] = above, s.scratch2[threadIdx.x / 32] = cand;
  WarpKeyRange(s, s.u.topp2.x, n);
  __syncthreads();
  above = 0, cand = 0;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) above += s.scratch[i], cand += s.scratch2[i];
  const double z = band.z_rel * exp2(static_cast<double>(win.rbase - band.max_logit) * scale) *
                   sampling_internal::kFixedScale;
  const double need_d = ceil(static_cast<double>(args.top_p[r]) * z);
  const uint64_t need = need_d >= 1.0 ? static_cast<uint64_t>(need_d) : 1;
  if (above >= need || above + cand < need) return kFallbackToken;  // not in the band
  const uint32_t kappa = SelectKeyInRange<true>(s, s.u.topp2.x, n, need - above, row);
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    const float x = s.u.topp2.x[i];
    if (KeyOf(x) >= kappa) {
      atomicAdd(&s.u.topp2.entry[s.u.topp2.id[i] / kEntryLen], win.Weight(x, scale));
    }
  }
  __syncthreads();
  uint64_t mass[kEntriesPerThread];
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) {
    mass[j] = e0 + j < entries ? RowMath::Fixed(s.u.topp2.entry[e0 + j] * factor) : 0;
  }
  return DrawFromEntries(s, args, r, row, mass, kappa, kFallbackToken);
}

// Top-k row, after its chunks: the exact top-k set, weights, top-p, the draw in id order.
__device__ int32_t TopKTail(PipeShared& s, const SamplingArgs& args, int64_t r) {
  const uint32_t k = static_cast<uint32_t>(args.top_k[r]);
  if (s.overflow == 0 && s.count > k) CutCandidates(s, k, /*streaming=*/false);
  const uint32_t m = s.count;
  if (s.overflow != 0 || m > kKeptCap) return kFallbackToken;  // uniform
  float mx = -INFINITY;
  for (uint32_t i = threadIdx.x; i < m; i += kThreads) mx = fmaxf(mx, s.u.cand.x[i]);
  mx = sampling_internal::BlockArgMax<kWarps>(ArgMaxPair{mx, 0}, s.argmax_scratch).value;
  if (mx == -INFINITY) return kFallbackToken;  // every logit -inf or NaN: the resident kernel
  const float scale = kSamplingLog2e / args.temperature[r];
  uint64_t mine = 0;
  for (uint32_t i = threadIdx.x; i < m; i += kThreads) {
    const uint64_t w = RowMath::Fixed(exp2f((s.u.cand.x[i] - mx) * scale));
    s.u.cand.w[i] = w;
    mine += w;
  }
  const uint64_t z = sampling_internal::BlockSum<kWarps>(mine, s.scratch);  // publishes w
  const float top_p = args.top_p[r];
  if (top_p < 1.0f) {
    sampling_internal::ApplyTopPToKept<kThreads, kKeptCap>(s.u.cand.x, s.u.cand.w, m, z, top_p);
  }
  if (threadIdx.x == 0) s.token = kFallbackToken;
  __syncthreads();
  sampling_internal::DrawKeptById<kThreads>(s.u.cand.id, s.u.cand.w, m,
                                            SamplingUniformImpl(args.seeds[r], args.steps[r]),
                                            s.scratch, &s.token);
  return s.token;
}

// The CTA's side of the ring: waits for each of a row's chunks (steps c0 .. c1 - 1 of its
// row_chunks), hands it to body(c, chunk, view), which returns whether the CTA must act after the
// barrier (a top-k select), refills the stage after the barrier that ends its reading (thread
// 0), then calls after(c, flag) with the OR of the flags. One loop per row kind (the kernel's
// switch), so each kind's loop is compact and scheduled on its own.
struct Ring {
  PipeShared& s;
  float* ring;
  Producer& producer;  // thread 0's
  const SamplingArgs& args;
  bool with_top_k;
  int stages, chunks, stage = 0;
  uint32_t phase = 0;

  // Waits until stage st (of parity ph) holds the row's chunk at step c; its view.
  __device__ __forceinline__ ChunkView Arrived(int c, int row_chunks, int st, uint32_t ph,
                                               int* chunk) const {
    WaitFull(&s.full[st], ph);
    *chunk = ChunkAt(c, chunks, row_chunks);
    const int32_t first = *chunk * kChunk;
    const int64_t left = args.vocab_size - first;
    const ChunkView view{ring + st * kChunk, left < kChunk ? static_cast<int>(left) : kChunk,
                         first};
    if (view.n < kChunk) view.FillTail();  // uniform: the row's last chunk
    return view;
  }

  template <bool kMayFlag, typename Body, typename After>
  __device__ __forceinline__ void Stream(int c0, int c1, int row_chunks, Body&& body,
                                         After&& after) {
    for (int c = c0; c < c1; ++c) {
      int chunk;
      const ChunkView view = Arrived(c, row_chunks, stage, phase, &chunk);
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
  __device__ __forceinline__ void Stream(int c0, int c1, int row_chunks, Body&& body) {
    Stream<false>(
        c0, c1, row_chunks,
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
  __device__ __forceinline__ void StreamPairs(int c0, int c1, int row_chunks, Body&& body) {
    for (int c = c0; c < c1; c += 2) {
      const int n = c + 1 < c1 ? 2 : 1;
      int st = stage;
      uint32_t ph = phase;
      for (int k = 0; k < n; ++k) {
        int chunk;
        const ChunkView view = Arrived(c + k, row_chunks, st, ph, &chunk);
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

__global__ void __launch_bounds__(kThreads, 2)
    SamplingRowPipeKernel(const __grid_constant__ SamplingArgs args, bool with_top_k, int stages,
                          int keep_from) {
  extern __shared__ __align__(128) unsigned char smem[];
  PipeShared& s = *reinterpret_cast<PipeShared*>(smem);
  float* ring = reinterpret_cast<float*>(smem + kRingOffset);
  const int chunks = static_cast<int>((args.vocab_size + kChunk - 1) / kChunk);
  Producer producer{0, 0, 0, 0, keep_from};
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(SharedAddress(&s.full[i]))
                   : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    producer.SkipTo(args, with_top_k, blockIdx.x, chunks);
    for (int i = 0; i < stages; ++i) producer.IssueNext(s, ring, stages, args, with_top_k, chunks);
  }
  __syncthreads();
  Ring ring_io{s, ring, producer, args, with_top_k, stages, chunks};
  for (int64_t r = blockIdx.x; r < args.batch; r += gridDim.x) {
    const RowKind kind = KindOf(args, r, with_top_k);
    if (kind == kSkip) continue;
    const float scale = kind == kGreedy ? 0.0f : kSamplingLog2e / args.temperature[r];
    int32_t token;
    switch (kind) {
      case kGreedy: {
        ArgMaxPair best{-INFINITY, INT32_MAX};
        ring_io.Stream(0, chunks, chunks, [&](int c, int, const ChunkView& view) {
          if (c == 0) {  // the lowest id of this thread's first logit, for rows of -inf
            const int local = kPerWarp * (threadIdx.x / 32) * kEntryLen + 4 * (threadIdx.x % 32);
            if (local < view.n) best.id = local;
          }
          GreedyChunk(view, best);
        });
        token = sampling_internal::BlockArgMax<kWarps>(best, s.argmax_scratch).id;
        break;
      }
      case kTemperature:
        ring_io.Stream(0, chunks, chunks, [&](int, int chunk, const ChunkView& view) {
          TemperatureChunk(s, view, chunk, scale);
        });
        token = TemperatureTail(s, args, r, scale);
        break;
      case kTopK:
        if (threadIdx.x == 0) s.count = 0, s.theta = -INFINITY, s.overflow = 0, s.cuts = 0;
        __syncthreads();
        ring_io.Stream<true>(
            0, chunks, chunks,
            [&](int, int, const ChunkView& view) { return TopKChunk(s, view) > kCandTrigger; },
            [&](int, bool cut) {  // select when the candidates passed the trigger
              if (cut) CutCandidates(s, static_cast<uint32_t>(args.top_k[r]), /*streaming=*/true);
            });
        token = TopKTail(s, args, r);
        break;
      default: {  // kTopP: pass 1, the band, pass 2 (the chunks in reverse order)
#pragma unroll
        for (int i = 0; i < kTopPBins / kThreads; ++i)
          s.u.topp1.hist[i * kThreads + threadIdx.x] = 0;
        if (threadIdx.x == 0) s.count = 0;
        __syncthreads();
        bool ok = isfinite(scale);  // uniform
        float lane_max = -INFINITY;
        TopPWindow win;
        double z_rel = 0.0;  // the lane's weights relative to win.rbase
        ROWPIPE_TRACE(0);
        ring_io.StreamPairs(0, chunks, 2 * chunks, [&](int, int, const ChunkView& view) {
          if (ok) TopPHistogramChunk(s, view, scale, win, lane_max, z_rel);
        });
        ROWPIPE_TRACE(1);
        TopPBand band{};
        ok = ok && FindTopPBand(s, win, lane_max, z_rel, scale, args.top_p[r], &band);
        ROWPIPE_TRACE(2);
        ring_io.StreamPairs(chunks, 2 * chunks, 2 * chunks,
                            [&](int, int chunk, const ChunkView& view) {
                              if (ok) TopPCollectChunk(s, view, chunk, scale, win, band);
                            });
        ROWPIPE_TRACE(3);
        token = ok ? TopPTail(s, args, r, scale, win, band) : kFallbackToken;
        ROWPIPE_TRACE(4);
        break;
      }
    }
    if (threadIdx.x == 0) args.out_tokens[r] = token;
    __syncthreads();  // the row's buffers are read before the next row writes them
  }
  // The resident kernel, launched behind this one with programmatic dependent launch
  // (SamplingClusterLaunch), may start once every CTA has come here; it waits for this kernel's
  // end before it reads a token.
  AllowDependentLaunch();
}

// CTAs per SM with the shared ring (2 expected), once per device. The one-CTA-per-SM ring's query
// comes last, so the shared-memory limit the kernel keeps allows both sizes.
absl::StatusOr<int> CtasPerSmShared() {
  static std::atomic<int> shared[kMaxDevices], alone[kMaxDevices];
  const absl::StatusOr<int> per_sm = BlocksPerSm(
      SamplingRowPipeKernel, kThreads, static_cast<int>(SmemBytes(kStagesShared)), shared);
  if (!per_sm.ok()) return per_sm;
  const absl::StatusOr<int> one =
      BlocksPerSm(SamplingRowPipeKernel, kThreads, static_cast<int>(SmemBytes(kMaxStages)), alone);
  if (!one.ok()) return one;
  return per_sm;
}

}  // namespace

bool SamplingRowPipeSupports(const SamplingArgs& args) {
  return args.vocab_size > 0 && args.vocab_size <= kMaxVocab && args.vocab_size % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(args.logits) & 15u) == 0;
}

absl::Status SamplingRowPipeLaunch(const SamplingArgs& args, bool with_top_k, cudaStream_t stream) {
  if (args.batch < 0 || !SamplingRowPipeSupports(args)) {
    return absl::InvalidArgumentError(
        "SamplingRowPipe: needs batch >= 0, 0 < vocab <= 155648, vocab % 4 == 0, 16-byte aligned "
        "logits");
  }
  if (args.batch == 0) return absl::OkStatus();
  const absl::StatusOr<int> per_sm = CtasPerSmShared();
  if (!per_sm.ok()) return per_sm.status();
  // One CTA per row up to the CTAs that fit; the big ring while there is at most one per SM.
  const int sms = NumSms();
  const int stages = args.batch <= sms ? kMaxStages : kStagesShared;
  const int64_t grid = std::min<int64_t>(args.batch, int64_t{*per_sm} * sms);
  // Top-p rows: pass 2 reads pass 1's chunks again, the last first. Only the chunks it can still
  // find in L2 are read evict-normal in pass 1: as many of each row's last chunks as fit in 2/3
  // of the L2 for the rows in flight; the earlier ones evict-first, so that they do not push the
  // kept ones out. Top-p rows 2-3 us faster at B = 256 than with every chunk of pass 1
  // evict-normal (WORKLOG.md, session 11, runs W1-W5).
  const int chunks = static_cast<int>((args.vocab_size + kChunk - 1) / kChunk);
  const int64_t keep = int64_t{L2Bytes()} * 2 / 3 / (grid * int64_t{4} * kChunk);
  const int keep_from = chunks - static_cast<int>(std::min<int64_t>(keep, chunks));
  SamplingRowPipeKernel<<<grid, kThreads, SmemBytes(stages), stream>>>(args, with_top_k, stages,
                                                                       keep_from);
  CUDA_RETURN_IF_LAUNCH_ERROR();
#ifdef TANDEM_SAMPLING_TRACE
  static int launches = 0;
  if (getenv("TANDEM_SAMPLING_TRACE_DUMP") != nullptr && ++launches == 10) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    static unsigned long long h[kTraceCtas][16];
    CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(h, g_rowpipe_trace, sizeof(h)));
    const int n = static_cast<int>(std::min<int64_t>(grid, kTraceCtas));
    unsigned long long t0 = ~0ull, t_end = 0;
    for (int i = 0; i < n; ++i) t0 = std::min(t0, h[i][8]), t_end = std::max(t_end, h[i][12]);
    std::printf("rowpipe trace: %d CTAs, first start -> last tail end %.2f us\n", n,
                (t_end - t0) * 1e-3);
    const char* names[] = {"pass 1", "band", "pass 2", "tail"};
    for (int e = 0; e < 4; ++e) {
      std::vector<double> us, cyc;
      for (int i = 0; i < n; ++i) {
        us.push_back((h[i][9 + e] - h[i][8 + e]) * 1e-3);
        cyc.push_back(static_cast<double>(h[i][1 + e] - h[i][e]));
      }
      std::sort(us.begin(), us.end()), std::sort(cyc.begin(), cyc.end());
      std::printf("rowpipe trace %-6s us min %.2f med %.2f max %.2f | cycles med %.0f\n", names[e],
                  us[0], us[n / 2], us[n - 1], cyc[n / 2]);
    }
    std::vector<double> start;
    for (int i = 0; i < n; ++i) start.push_back((h[i][8] - t0) * 1e-3);
    std::sort(start.begin(), start.end());
    std::printf("rowpipe trace start offset us med %.2f max %.2f\n", start[n / 2], start[n - 1]);
  }
#endif
  return absl::OkStatus();
}

}  // namespace tandem
