// The row-pipelined sampling kernel's top-p rows without top-k (sampling_rowpipe.cu's header and
// kernels/sampling/README.md say why and how): pass 1's entry weights and weight histogram, the
// band of bins that may hold the threshold, the draws from the whole distribution decided against
// it (one read of the row for most rows), and for the others pass 2's kept mass per entry and band
// candidates and the tail (the exact threshold by a mass-weighted select, then the draws decided).
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_rowpipe_entries.cuh"
#include "kernels/sampling/sampling_rowpipe_ring.cuh"
#include "kernels/sampling/sampling_rowpipe_select.cuh"

namespace tandem::sampling_rowpipe {

// Top-p candidates: appends the lane's band logits flagged in want (bit 4j + e: logit e of the
// lane's j-th float4 of the chunk) at the slots from *count on (ReserveWarpSlots), slots at or past
// cap counted, not written. Unlike the top-k rows' AppendFlagged (sampling_rowpipe_select.cuh), the
// logits are read again from the stage, one set bit at a time: a lane has one or none in most
// chunks (~170 candidates in a N(0, 3^2) row at p = 0.95), where the unrolled test of all 16 bits
// cost ~48 instructions per warp and chunk: 6.5% fewer instructions, top-p rows ~8% faster at B =
// 256 and ~10% at B = 128 (WORKLOG.md, session 11, runs W5-W6).
__device__ __forceinline__ void AppendTopPCandidates(uint32_t* count, float* xs, int32_t* ids,
                                                     uint32_t cap, const ChunkView& c,
                                                     uint32_t want) {
  uint32_t slot;
  if (!ReserveWarpSlots(count, __popc(want), &slot, /*end=*/nullptr)) return;  // uniform
  for (; want != 0; want &= want - 1, ++slot) {
    const int bit = __ffs(want) - 1;
    const int local = ChunkView::Local(bit >> 2) + (bit & 3);
    if (slot < cap) xs[slot] = c.stage[local], ids[slot] = c.first + local;
  }
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

// Top-p row, pass 1, one chunk: each entry's max (its key, for pass 2's plan: TopPPlanPass2) and
// the lane's; before the first finite logit, the chunk's max starts the window (a block-wide max:
// every thread takes this branch or none); every logit adds its weight (relative to rbase) to its
// entry's sum (for the draws of TopPDrawAttempts; the lane's z is their sum) and, if it falls in
// a bin, to that bin. Per logit, no branches, so that the 16 chains interleave: FFMA, MUFU.EX2,
// FADD, FMNMX, the slot (SHF, VIADDMNMX, its address), the increment (LOP3, SHF) and a shared
// atomic; per entry a REDUX, and the entry sums' transposed reduction. Logits outside the bins
// add to a spill slot: below the last bin they weigh less than 2^-64 of rbase; above the first
// (w >= 2^64, +inf, NaN) the row falls back (FindTopPBand: the max's bin, z).
__device__ __forceinline__ void TopPHistogramChunk(PipeShared& s, const ChunkView& c, int chunk,
                                                   float scale, TopPWindow& win, float& lane_max,
                                                   double& z) {
  float q[kPerWarp][4];
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) c.LoadRaw(j, q[j]);  // -inf beyond the row
  float chunk_max = -INFINITY;
  uint32_t key[kPerWarp];
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    const float m = fmaxf(fmaxf(q[j][0], q[j][1]), fmaxf(q[j][2], q[j][3]));
    chunk_max = fmaxf(chunk_max, m);
    key[j] = __reduce_max_sync(0xffffffffu, KeyOf(m));  // the warp's j-th entry
  }
  if (threadIdx.x % 32 == 0) {
    const int e0 = chunk * kChunkEntries + kPerWarp * (threadIdx.x / 32);
    *reinterpret_cast<uint4*>(&s.u.topp.entry_key[e0]) = make_uint4(key[0], key[1], key[2], key[3]);
  }
  const int lane = threadIdx.x % 32;
  const int entry = chunk * kChunkEntries + kPerWarp * (threadIdx.x / 32) + lane / 8;
  if (win.rbase == -INFINITY) {  // uniform
    const float m =
        sampling_internal::BlockArgMax<kWarps>(ArgMaxPair{chunk_max, 0}, s.argmax_scratch).value;
    if (m == -INFINITY) {  // the chunk weighs nothing
      if ((lane & 7) == 0) s.u.topp.entry[entry] = 0.0f;
      return;
    }
    win.Start(m, scale);
  }
  lane_max = fmaxf(lane_max, chunk_max);
  // The histogram holds bin b at slot kTopPBins - 1 - b (TopPWindow::Slot: the key less the
  // lowest bin's, one VIADDMNMX with the clamp); slots out of range (below the window the
  // difference wraps) go to a slot of this lane past the histogram, never read, so that they
  // need no test and share no address.
  const uint32_t spill = kTopPBins + lane;
  float sum[kPerWarp] = {};
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float w = win.Weight(q[j][e], scale);
      sum[j] += w;
      atomicAdd(&s.u.topp.hist[min(TopPWindow::Slot(w), spill)], InBinWeight(w));
    }
  }
  z += (sum[0] + sum[1]) + (sum[2] + sum[3]);
  const float entry_sum = ReduceFourEntries(sum);
  if ((lane & 7) == 0) s.u.topp.entry[entry] = entry_sum;
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
  // The histogram's scale and the band's ends in its units (TopPDrawAttempts' in-band draws):
  // bins are shifted down by the octaves between theirs and the max's, and the band runs from the
  // bin whose cumulative mass reaches lo_mass to the one reaching hi_mass.
  int max_octave;
  uint64_t lo_mass, hi_mass;
};

// Bin b's mass in FindTopPBand's units (16-bit fixed point relative to the max's octave).
__device__ __forceinline__ uint64_t TopPBinMass(uint32_t hist_sum, int b, int max_octave) {
  const int down = max(max_octave - ((kKeyTop - b) >> 5), 0);
  return down < 48 ? (uint64_t{hist_sum} << 16) >> down : 0;
}
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
    mass[i] = TopPBinMass(s.u.topp.hist[kTopPBins - 1 - b], b, max_octave);
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
  band->max_octave = max_octave, band->lo_mass = lo, band->hi_mass = hi;
  band->above_bits = static_cast<uint32_t>(kKeyTop + 1 - b_lo) << kKeyShift;
  band->band_bits = static_cast<uint32_t>(kKeyTop - b_hi) << kKeyShift;
  return b_hi < kTopPBins - 1;
}

// Top-p row, a draw of weight w (relative to rbase) in the band (all threads; uniform result):
// whether top-p keeps it, from the histogram alone when it can tell. The logits heavier than w
// weigh at least the bins above w's and at most those plus w's own bin less w's increment: below
// the band's lower end (lo_mass) w is kept, at or above its upper end (hi_mass) it is not (the
// band's margin covers the histogram's rounding, as for the bins outside the band). An LLM-like
// row's threshold is often one strong token alone in its bin, which this decides. 1 kept, 0 not,
// -1 unknown (pass 2 decides). Ends with a barrier.
__device__ int TopPResolveInBand(PipeShared& s, const TopPBand& band, float w) {
  const int bin = TopPWindow::Bin(w);
  constexpr int kPer = kTopPBins / kThreads;
  uint64_t above = 0, same = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int b = kPer * threadIdx.x + i;
    const uint64_t m = TopPBinMass(s.u.topp.hist[kTopPBins - 1 - b], b, band.max_octave);
    above += b < bin ? m : 0;
    same += b == bin ? m : 0;
  }
  above = sampling_internal::WarpSum(above), same = sampling_internal::WarpSum(same);
  if (threadIdx.x % 32 == 0) {
    s.scratch[threadIdx.x / 32] = above, s.scratch2[threadIdx.x / 32] = same;
  }
  __syncthreads();
  above = 0, same = 0;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) above += s.scratch[i], same += s.scratch2[i];
  __syncthreads();  // s.scratch is read before it is written again
  const uint64_t own = TopPBinMass(InBinWeight(w), bin, band.max_octave);
  if (above + (same - min(own, same)) < band.lo_mass) return 1;
  return above >= band.hi_mass ? 0 : -1;
}

// Top-p row, after the band (all threads; uniform result): the draws of sampling.h's step 5 from
// the whole distribution, kWarps at a time. Entry masses from pass 1's sums; every thread finds
// which of a round's targets u_a * total fall in its entries; warp w draws attempt a0 + w inside
// its entry with exact weights (DrawFromEntries' arithmetic, the entry re-read: 512 bytes) and
// keeps the token and its logit. Then, in attempt order, the token's weight against the band,
// with the float bits pass 2 would test: above it the token is surely kept (its bin's cumulative
// mass from the top is below top_p of z by more than FindTopPBand's margin), below it surely not.
// A draw in the band is decided by the histogram when it can (TopPResolveInBand). Returns the
// first draw kept when no draw before it is undecided: the row's token, from one read of the row.
// Otherwise -1, with s.u.topp.attempt.n the draws made (up to the first kept one, or to the end of
// the round with the first undecided one, or all kTopPAttempts): TopPTail decides them with the
// exact threshold after pass 2. A N(0, 3^2) row at p = 0.95 draws in its band with a probability of
// ~1e-3 per draw (its threshold's bin holds ~7e-4 of the mass; an LLM-like row's threshold may be
// one strong token holding several percent: sim/topp_rejection.py).
__device__ int32_t TopPDrawAttempts(PipeShared& s, const SamplingArgs& args, int64_t r, float scale,
                                    const TopPWindow& win, const TopPBand& band) {
  const RowMath row{band.max_logit, scale, 0.0f};
  const float factor = exp2f((win.rbase - band.max_logit) * scale);
  const int entries = static_cast<int>((args.vocab_size + kEntryLen - 1) / kEntryLen);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint64_t mass[kEntriesPerThread];
  const uint64_t mine = EntryMasses(s.u.topp.entry, factor, entries, mass);
  uint64_t total = 0;
  const uint64_t before = sampling_internal::BlockExclusiveScan<kWarps>(mine, s.scratch, &total);
  if (threadIdx.x == 0) s.u.topp.attempt.n = 0;
  if (total == 0) return -1;  // uniform; cannot happen (the max weighs 1): TopPTail falls back
  const float* logits = args.logits + r * args.vocab_size;
  bool undecided = false;
  for (int a0 = 0; a0 < static_cast<int>(kTopPAttempts); a0 += kWarps) {
#pragma unroll 1
    for (int w = 0; w < kWarps; ++w) {
      const double u = SamplingUniformImpl(args.seeds[r], args.steps[r], a0 + w);
      const uint64_t target = min(static_cast<uint64_t>(u * static_cast<double>(total)), total - 1);
      FindEntry(mass, mine, before, target, &s.u.topp.attempt.entry[w], &s.u.topp.attempt.rest[w]);
    }
    __syncthreads();
    {  // warp `warp`: draw a0 + warp inside its entry
      const int64_t first = int64_t{s.u.topp.attempt.entry[warp]} * kEntryLen;
      const int64_t local = first + 4 * lane;
      float q[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
      if (local < args.vocab_size) {  // vocab % 4 == 0
        const float4 v = __ldg(reinterpret_cast<const float4*>(logits + local));
        q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
      }
      const int32_t t = sampling_internal::DrawIn128(q, static_cast<int32_t>(first), row,
                                                     s.u.topp.attempt.rest[warp]);
      const int at = t - static_cast<int32_t>(first);  // the token's lane and element
      const float x = (at & 3) == 0 ? q[0] : (at & 3) == 1 ? q[1] : (at & 3) == 2 ? q[2] : q[3];
      const float tx = __shfl_sync(0xffffffffu, x, (at >> 2) & 31);
      if (lane == 0) s.u.topp.attempt.token[a0 + warp] = t, s.u.topp.attempt.x[a0 + warp] = tx;
    }
    __syncthreads();
    for (int w = 0; w < kWarps; ++w) {  // uniform: every thread reads the same draws
      const int a = a0 + w;
      const int32_t t = s.u.topp.attempt.token[a];
      const float weight = win.Weight(s.u.topp.attempt.x[a], scale);
      const uint32_t bits = __float_as_uint(weight);
      if (t < 0) {  // no draw: TopPTail falls back
        if (threadIdx.x == 0) s.u.topp.attempt.n = a;
        return -1;
      }
      const int kept = bits >= band.above_bits ? 1
                       : bits < band.band_bits ? 0
                                               : TopPResolveInBand(s, band, weight);
      if (kept == 1) {
        if (!undecided) return t;
        if (threadIdx.x == 0) s.u.topp.attempt.n = a + 1;
        return -1;
      }
      undecided = undecided || kept < 0;
    }
    if (undecided) {  // pass 2 decides; the draws after this round are not needed unless it
      if (threadIdx.x == 0) s.u.topp.attempt.n = a0 + kWarps;  // rejects every one (then: fallback)
      return -1;
    }
  }
  if (threadIdx.x == 0) s.u.topp.attempt.n = kTopPAttempts;
  return -1;
}

// Top-p row, pass 2, one logit: adds its weight to `kept` if it is above the band (surely kept);
// returns whether it is in the band (a candidate). The band by the weight's float bits (the same
// bins as pass 1's without computing them).
__device__ __forceinline__ uint32_t TopPKeepOrBand(float x, float scale, const TopPWindow& win,
                                                   const TopPBand& band, float& kept) {
  const float w = win.Weight(x, scale);
  const uint32_t u = __float_as_uint(w);
  if (u >= band.above_bits) kept += w;
  return u - band.band_bits < band.above_bits - band.band_bits ? 1u : 0u;
}

// Top-p row, pass 2, one chunk: per entry the weight (relative to rbase) of the logits above the
// band, surely kept, and the logits in the band appended as candidates: FFMA, MUFU.EX2, two
// compares, a predicated FADD per logit.
__device__ __forceinline__ void TopPCollectChunk(PipeShared& s, const ChunkView& c, int chunk,
                                                 float scale, const TopPWindow& win,
                                                 const TopPBand& band) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float q[kPerWarp][4];
  float kept[kPerWarp] = {};
  uint32_t want = 0;
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) c.LoadRaw(j, q[j]);  // -inf beyond the row
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      want |= TopPKeepOrBand(q[j][e], scale, win, band, kept[j]) << (4 * j + e);
  }
  const float kept_entry = ReduceFourEntries(kept);
  if ((lane & 7) == 0)
    s.u.topp.entry[chunk * kChunkEntries + kPerWarp * warp + lane / 8] = kept_entry;
  AppendTopPCandidates(&s.count, s.u.topp.cand.x, s.u.topp.cand.id, kTopPCandCap, c, want);
}

// Top-p row, between the band and pass 2 (all threads; uniform result): which entries pass 2 must
// read. A logit is kept or a candidate only if its weight's bits reach band_bits, so an entry
// whose max (its key from pass 1) weighs less holds neither (the weight is monotone in the logit;
// kWeightSlack float steps spare MUFU.EX2's rounding). The ring holds pass 2's first `pre`
// chunks already (the row's last ones, copied before the band was known). If the row's other
// chunks have at most kTopPGatherCap entries that may hold such a logit, they are listed in
// s.u.topp.gather for TopPGatherEntries and their number is returned: pass 2 reads them instead
// of the rest of the row. An LLM-like row, whose nucleus is a few strong tokens, has a few such
// entries, or tens (sim/topp_nucleus_sizes.py); a N(0, 3^2) row at p = 0.95 has hundreds to all
// of them. -1: pass 2 streams the row. Zeroes the entries' kept mass (the entries pass 2 skips
// hold none).
constexpr uint32_t kWeightSlack = 8;
__device__ int TopPPlanPass2(PipeShared& s, const TopPWindow& win, const TopPBand& band,
                             float scale, int chunks, int pre) {
  const int e0 = threadIdx.x * kEntriesPerThread;
  const int tested = (chunks - pre) * kChunkEntries;
  uint32_t flags = 0;
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) {
    s.u.topp.entry[e0 + j] = 0.0f;
    if (e0 + j < tested) {
      const float w = win.Weight(KeyToFloat(s.u.topp.entry_key[e0 + j]), scale);
      flags |= (__float_as_uint(w) + kWeightSlack >= band.band_bits ? 1u : 0u) << j;
    }
  }
  uint64_t total = 0;
  const uint64_t before =
      sampling_internal::BlockExclusiveScan<kWarps>(__popc(flags), s.scratch, &total);
  if (total > kTopPGatherCap) return -1;  // uniform
  for (uint32_t slot = static_cast<uint32_t>(before); flags != 0; flags &= flags - 1, ++slot) {
    s.u.topp.gather[slot] = static_cast<uint16_t>(e0 + __ffs(flags) - 1);
  }
  __syncthreads();
  return static_cast<int>(total);
}

// Top-p row, pass 2 over the n entries TopPPlanPass2 listed, outside the ring: a warp reads an
// entry (a float4 per lane, 512 bytes; kTopPGatherBatch entries in flight per warp) with
// TopPCollectChunk's arithmetic (TopPKeepOrBand) and reduction order (ReduceFourEntries pairs the
// lanes as the butterfly here does), so that an entry's kept mass is the same float and its
// candidates the same logits as if pass 2 had streamed its chunk. All threads; ends with a barrier.
__device__ void TopPGatherEntries(PipeShared& s, const SamplingArgs& args, int64_t r, int n,
                                  float scale, const TopPWindow& win, const TopPBand& band) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* row = args.logits + r * args.vocab_size;
  for (int i0 = warp * kTopPGatherBatch; i0 < n; i0 += kWarps * kTopPGatherBatch) {  // per warp
    float q[kTopPGatherBatch][4];
#pragma unroll
    for (int k = 0; k < kTopPGatherBatch; ++k) {
      const int64_t at =
          i0 + k < n ? int64_t{s.u.topp.gather[i0 + k]} * kEntryLen + 4 * lane : args.vocab_size;
      float4 v = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      if (at < args.vocab_size) v = __ldg(reinterpret_cast<const float4*>(row + at));  // % 4 == 0
      q[k][0] = v.x, q[k][1] = v.y, q[k][2] = v.z, q[k][3] = v.w;
    }
#pragma unroll
    for (int k = 0; k < kTopPGatherBatch; ++k) {
      if (i0 + k >= n) break;  // uniform over the warp
      const int entry = s.u.topp.gather[i0 + k];
      float kept = 0.0f;
      uint32_t want = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) want |= TopPKeepOrBand(q[k][e], scale, win, band, kept) << e;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) kept += __shfl_xor_sync(0xffffffffu, kept, off);
      if (lane == 0) s.u.topp.entry[entry] = kept;
      uint32_t slot;
      if (!ReserveWarpSlots(&s.count, __popc(want), &slot, /*end=*/nullptr)) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // unrolled: q is in registers
        if (want >> e & 1u) {
          if (slot < kTopPCandCap) {
            s.u.topp.cand.x[slot] = q[k][e];
            s.u.topp.cand.id[slot] = entry * kEntryLen + 4 * lane + e;
          }
          ++slot;
        }
      }
    }
  }
  __syncthreads();
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
  const uint32_t n = s.count;
  if (n > kTopPCandCap) return kFallbackToken;  // uniform
  // One round for the mass above the band, the candidates' mass and their key range.
  uint64_t mass[kEntriesPerThread];
  uint64_t above = EntryMasses(s.u.topp.entry, factor, entries, mass), cand = 0;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) cand += row.Weight(s.u.topp.cand.x[i]);
  above = sampling_internal::WarpSum(above), cand = sampling_internal::WarpSum(cand);
  if (threadIdx.x % 32 == 0)
    s.scratch[threadIdx.x / 32] = above, s.scratch2[threadIdx.x / 32] = cand;
  WarpKeyRange(s, s.u.topp.cand.x, n);
  __syncthreads();
  above = 0, cand = 0;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) above += s.scratch[i], cand += s.scratch2[i];
  const double z = band.z_rel * exp2(static_cast<double>(win.rbase - band.max_logit) * scale) *
                   sampling_internal::kFixedScale;
  const double need_d = ceil(static_cast<double>(args.top_p[r]) * z);
  const uint64_t need = need_d >= 1.0 ? static_cast<uint64_t>(need_d) : 1;
  if (above >= need || above + cand < need) return kFallbackToken;  // not in the band
  const uint32_t kappa = SelectKeyInRange<true>(s, s.u.topp.cand.x, n, need - above, row);
  // The draws from the whole distribution (TopPDrawAttempts), in order: the first kept one.
  const int drawn = s.u.topp.attempt.n;
  for (int a = 0; a < drawn; ++a) {  // uniform
    if (KeyOf(s.u.topp.attempt.x[a]) >= kappa) return s.u.topp.attempt.token[a];
  }
  // None kept: all kTopPAttempts draws fell outside the nucleus (expected when few tokens hold
  // top_p of a row that is mostly tail), then the draw over the nucleus. Fewer draws made, none
  // kept: the round with an undecided draw had none kept after it (a draw in the band that pass 2
  // rejects, then up to 7 rejected ones: rare), or one TopPDrawAttempts took for kept is not (the
  // band's margin failed): the draws after them were not made; fall back.
  if (drawn < static_cast<int>(kTopPAttempts)) return kFallbackToken;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    const float x = s.u.topp.cand.x[i];
    if (KeyOf(x) >= kappa) {
      atomicAdd(&s.u.topp.entry[s.u.topp.cand.id[i] / kEntryLen], win.Weight(x, scale));
    }
  }
  __syncthreads();
  EntryMasses(s.u.topp.entry, factor, entries, mass);
  return DrawFromEntries(s, args, r, row, mass, kappa,
                         SamplingUniformImpl(args.seeds[r], args.steps[r], kTopPAttempts),
                         kFallbackToken);
}

}  // namespace tandem::sampling_rowpipe
