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
//   top-p rows without top-k (TopPOnly), in one pass over the row for most rows, two for the rest
//     (sampling.h, step 5: draws from the whole distribution, the first inside the nucleus kept):
//     pass 1: the row max, each entry's weight, the total z and a histogram of the weights, all
//       relative to a reference logit rbase (the first chunk's max), so no pass needs the row max
//       beforehand: a weight's float bits give its bin (32 per octave, 64 octaves above rbase and
//       64 below) and its mantissa the bin's fixed-point increment (TopPWindow). After it: the
//       bins whose cumulative mass from the top can hold top_p of z, [b_lo, b_hi] (FindTopPBand:
//       usually one bin, the margin about the histogram's error: sim/topp_two_pass.py).
//     the draws (TopPDrawAttempts): u_a * z over the entry weights, then inside the entry with
//       exact weights (the entry re-read, 512 bytes), kWarps draws at once. A draw above the band
//       is kept, below it is not, in it the histogram decides when it can (TopPResolveInBand);
//       the first kept draw with none undecided before it is the token: the row is done after
//       one read. Otherwise (a draw the histogram cannot decide, ~1e-3 of the draws in a N(0,
//       3^2) row; or all kTopPAttempts draws outside the nucleus) the exact threshold decides:
//     pass 2 (the second in reverse chunk order, so that it starts on the chunks the first read
//       last, still in L2): per entry the weight above the band (surely kept), and the logits in
//       the band as candidates. Only the entries whose max (pass 1 keeps each entry's) can reach
//       the band can hold either: when the row's other chunks have at most kTopPGatherCap of them
//       (LLM-like rows: a nucleus of a few strong tokens), pass 2 reads those entries alone (512
//       bytes each, TopPPlanPass2 and TopPGatherEntries) instead of the row; the ring, which
//       copies only kTopPPrefetch chunks of pass 2 before this plan, goes on to the next row.
//       Then exactly as the other kernels: need = ceil(top_p z); the band must hold the
//       threshold (mass above < need <= mass above + candidates); a mass-weighted radix select
//       over the candidates gives the smallest kept key; the first draw kept by it is the token,
//       or, if none is, the kept candidates join their entries and the last draw is made as
//       temperature rows draw, over the kept logits.
//     A failed bracket (the histogram's rounding at a bin edge), more than kTopPCandCap candidates
//     (a nearly flat row, a wide band), a row of -inf, with +inf or with a logit 64 octaves of
//     weight above the first chunk's max, or a temperature whose log2(e) / T overflows gives
//     kFallbackToken.
// Needs 16-byte aligned rows (vocab % 4 == 0, aligned logits) for the bulk copies.
// The pieces: sampling_rowpipe_ring.cuh (shared memory, the ring of bulk copies),
// sampling_rowpipe_select.cuh (the radix select, top-k rows), sampling_rowpipe_entries.cuh (entry
// sums and the draw), sampling_rowpipe_topp.cuh (top-p rows); here the greedy and temperature
// rows, the kernel and its launch.
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
#include "kernels/sampling/sampling_internal.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_rowpipe_entries.cuh"
#include "kernels/sampling/sampling_rowpipe_ring.cuh"
#include "kernels/sampling/sampling_rowpipe_select.cuh"
#include "kernels/sampling/sampling_rowpipe_topp.cuh"
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

using namespace sampling_rowpipe;  // NOLINT: this kernel's own helpers

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
  return DrawFromEntries(s, args, r, row, mass, /*min_key=*/0,
                         SamplingUniformImpl(args.seeds[r], args.steps[r]), best.id);
}

__global__ void __launch_bounds__(kThreads, 2)
    SamplingRowPipeKernel(const __grid_constant__ SamplingArgs args, bool with_top_k, int stages,
                          int keep_from) {
  extern __shared__ __align__(128) unsigned char smem[];
  PipeShared& s = *reinterpret_cast<PipeShared*>(smem);
  float* ring = reinterpret_cast<float*>(smem + kRingOffset);
  const int chunks = static_cast<int>((args.vocab_size + kChunk - 1) / kChunk);
  Producer producer{0, 0, 0, 0, keep_from, -1, 0};
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
        ring_io.Stream(0, chunks, [&](int c, int, const ChunkView& view) {
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
        ring_io.Stream(0, chunks, [&](int, int chunk, const ChunkView& view) {
          TemperatureChunk(s, view, chunk, scale);
        });
        token = TemperatureTail(s, args, r, scale);
        break;
      case kTopK:
        if (threadIdx.x == 0) s.count = 0, s.theta = -INFINITY, s.overflow = 0, s.cuts = 0;
        __syncthreads();
        ring_io.Stream<true>(
            0, chunks,
            [&](int, int, const ChunkView& view) { return TopKChunk(s, view) > kCandTrigger; },
            [&](int, bool cut) {  // select when the candidates passed the trigger
              if (cut) CutCandidates(s, static_cast<uint32_t>(args.top_k[r]), /*streaming=*/true);
            });
        token = TopKTail(s, args, r);
        break;
      default: {  // kTopP: pass 1, the band, pass 2 (the chunks in reverse order)
#pragma unroll
        for (int i = 0; i < kTopPBins / kThreads; ++i)
          s.u.topp.hist[i * kThreads + threadIdx.x] = 0;
        if (threadIdx.x == 0) s.count = 0;
        __syncthreads();
        bool ok = isfinite(scale);  // uniform
        float lane_max = -INFINITY;
        TopPWindow win;
        double z_rel = 0.0;  // the lane's weights relative to win.rbase
        ROWPIPE_TRACE(0);
        ring_io.StreamPairs(0, chunks, [&](int, int chunk, const ChunkView& view) {
          if (ok) TopPHistogramChunk(s, view, chunk, scale, win, lane_max, z_rel);
        });
        ROWPIPE_TRACE(1);
        TopPBand band{};
        ok = ok && FindTopPBand(s, win, lane_max, z_rel, scale, args.top_p[r], &band);
        // Draws from the whole distribution: most rows end here, with a draw surely kept.
        const int32_t drawn = ok ? TopPDrawAttempts(s, args, r, scale, win, band) : -1;
        const bool exact = ok && drawn < 0;  // uniform
        ROWPIPE_TRACE(2);
        // Pass 2, for the exact threshold: the ring holds its first `pre` chunks (the row's
        // last), copied during pass 1; then it streams the rest of the row, or reads alone the
        // few entries of the rest that may hold a kept or band logit (TopPPlanPass2) while the
        // ring moves on to the next row. A row that is drawn or falls back reads nothing more.
        const int pre = TopPPrefetched(chunks);
        const int gathered = exact ? TopPPlanPass2(s, win, band, scale, chunks, pre) : 0;
        const int steps = gathered >= 0 ? chunks + pre : 2 * chunks;
        if (threadIdx.x == 0) {
          producer.Release(r, steps, s, ring, stages, args, with_top_k, chunks);
        }
        ring_io.StreamPairs(chunks, steps, [&](int, int chunk, const ChunkView& view) {
          if (exact) TopPCollectChunk(s, view, chunk, scale, win, band);
        });
        if (gathered > 0) TopPGatherEntries(s, args, r, gathered, scale, win, band);
        ROWPIPE_TRACE(3);
        token = drawn >= 0 ? drawn
                : exact    ? TopPTail(s, args, r, scale, win, band)
                           : kFallbackToken;
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
    const char* names[] = {"pass 1", "band+draws", "pass 2", "tail"};
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
