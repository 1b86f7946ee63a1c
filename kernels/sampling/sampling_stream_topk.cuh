// Top-k rows in the streaming kernel (sampling_stream.cu): one pass over HBM, no copy of the row
// on chip. A row with top-k needs only its top-k set (the max is in it), never the whole row's
// mass, so per row:
//   every CTA streams its slice in groups of kGroup tiles; in the first group each warp proposes
//     the ceil(k / kWarps)-th largest of its lanes' maxima, every warp counts its lanes' maxima at
//     or above each proposal, and the largest proposal with >= k of them (the smallest one always
//     has) is a lower bound of the row's k-th largest logit (that many logits of the CTA reach it);
//     that threshold never drops a logit of the top-k set, and logits >= it, in every group, are
//     appended to the CTA's candidates (~0.75% of the slice at k = 50); the later groups have no
//     block barrier (a bound per group raised the threshold little and cost two barriers each),
//   every CTA ranks its candidates (a logit is in the local top-k set iff fewer than k candidates
//     are larger; ties kept), then orders that set (larger first, ties by candidate index; float4
//     comparisons, a loop over the set only for a tied logit), pushes it, sorted, into its region
//     of the row's leader CTA (DSMEM) and arrives on the leader's mbarrier (release, cluster
//     scope); only the leader waits on it, so the other CTAs go on to their next row at once,
//   the leader (rank = the cluster's top-k row count mod kCluster, so each CTA does the tail of
//     one row in kCluster, overlapped with the others' streaming) counts, for each
//     gathered logit, the larger ones in every sorted region (binary searches): fewer than k
//     exactly for the row's top-k set (ties with the k-th largest kept), since every logit larger
//     than one of the set is in its CTA's local top-k set. Then fixed-point weights, top-p over
//     that set, and the draw in id order; all as the resident kernel computes them
//     (sampling_cluster_select.cuh, sampling_cluster_draw.cuh).
// Buffers that overflow (flat or tied rows, adversarial orders such as logits ascending within a
// slice) give kFallbackToken: the resident kernel, launched next, samples those rows.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_draw.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_stream.cuh"

namespace tandem::sampling_stream {

// The j-th largest key (ties counted, j in [1, 32]) of the warp's lanes, in every lane.
__device__ __forceinline__ uint32_t WarpJthLargestKey(uint32_t key, int j) {
  for (;;) {
    const uint32_t m = __reduce_max_sync(0xffffffffu, key);
    j -= __popc(__ballot_sync(0xffffffffu, key == m));
    if (j <= 0) return m;
    if (key == m) key = 0;  // below every key of a non-NaN float
  }
}

// How many of the first n logits of xs (16-byte aligned) are larger than x (.x), and how many equal
// it (.y; a caller that reads only .x pays nothing for it once inlined). Every thread of a warp
// loops the same n, so the shared-memory loads are broadcasts; four independent counters keep the
// loop from being one long dependency chain.
__device__ __forceinline__ uint2 CountAboveEqual(const float* xs, uint32_t n, float x) {
  uint32_t a[4] = {0, 0, 0, 0}, e = 0;
  const uint32_t n4 = n / 4;
#pragma unroll 4
  for (uint32_t c = 0; c < n4; ++c) {
    const float4 v = reinterpret_cast<const float4*>(xs)[c];
    a[0] += v.x > x ? 1u : 0u, a[1] += v.y > x ? 1u : 0u;
    a[2] += v.z > x ? 1u : 0u, a[3] += v.w > x ? 1u : 0u;
    e += (v.x == x ? 1u : 0u) + (v.y == x ? 1u : 0u) + (v.z == x ? 1u : 0u) + (v.w == x ? 1u : 0u);
  }
  for (uint32_t j = 4 * n4; j < n; ++j) a[0] += xs[j] > x ? 1u : 0u, e += xs[j] == x ? 1u : 0u;
  return make_uint2(a[0] + a[1] + a[2] + a[3], e);
}

// Pass over this CTA's slice: appends the logits >= a lower bound of the row's k-th largest (from
// the first load group) to s.topk.x / id (count may exceed kLocalCap: overflow). Ends with a block
// barrier.
__device__ void TopKStreamPass(StreamShared& s, const Slice& sl, bool vec_ok, int k) {
  auto& t = s.topk;
  const int per_warp = (k + kWarps - 1) / kWarps;  // kWarps warps x per_warp >= k logits
  float thr = -INFINITY;
  for (int t0 = 0; t0 < kSliceTiles; t0 += kGroup) {
    if (t0 * kTileElems >= sl.n) break;  // uniform
    float q[kGroup][4];
    LoadGroup(sl, vec_ok, t0, q);
    float tmax = -INFINITY;  // padding is -inf: never above a real logit
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      tmax = fmaxf(fmaxf(fmaxf(tmax, q[i][0]), fmaxf(q[i][1], q[i][2])), q[i][3]);
    }
    if (t0 == 0) {  // uniform
      // Each warp proposes a bound; the largest one that >= k lanes' maxima reach is the row's.
      const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
      const uint32_t key = KeyOf(tmax);
      const uint32_t proposal = WarpJthLargestKey(key, per_warp);
      if (lane == 0) t.proposal[warp] = proposal;
      __syncthreads();
      uint32_t votes = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const uint32_t c = __popc(__ballot_sync(0xffffffffu, key >= t.proposal[w]));
        votes = lane == w ? c : votes;
      }
      if (lane < kWarps) atomicAdd(&t.votes[lane], votes);  // zero (reset at the pass's end)
      __syncthreads();
      uint32_t bound = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        if (t.votes[w] >= static_cast<uint32_t>(k)) bound = max(bound, t.proposal[w]);
      }
      thr = fmaxf(thr, KeyToFloat(bound));  // NaN (fewer logits than k) keeps -inf
    }
    if (tmax >= thr) {
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        const int local = (t0 + i) * kTileElems + 4 * threadIdx.x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (local + e < sl.n && q[i][e] >= thr) {
            const uint32_t slot = atomicAdd(&t.count, 1u);
            if (slot < kLocalCap) t.x[slot] = q[i][e], t.id[slot] = sl.base + local + e;
          }
        }
      }
    }
  }
  __syncthreads();  // every read of votes and proposal before the reset
  if (threadIdx.x < kWarps) t.votes[threadIdx.x] = 0;
}

// Ranks this CTA's candidates: its top-k set (with ties) into lx / lid / lidx, then each one's
// position in it (larger first, ties by candidate index) and there into its region of the leader,
// with its size; flags the leader when the candidates or the set overflowed. Resets the candidate
// count for the next row.
__device__ void PushLocalTopK(StreamShared& s, int k, int leader, int rank) {
  auto& t = s.topk;
  const uint32_t count = t.count;
  const uint32_t n = count < kLocalCap ? count : kLocalCap;
  const int lane = threadIdx.x % 32;
  if (count <= kLocalCap) {
    for (uint32_t i0 = 0; i0 < n; i0 += kThreads) {  // uniform
      const uint32_t i = i0 + threadIdx.x;
      const float x = i < n ? t.x[i] : 0.0f;
      const bool want = i < n && CountAboveEqual(t.x, n, x).x < static_cast<uint32_t>(k);
      const uint32_t mask = __ballot_sync(0xffffffffu, want);
      if (mask == 0) continue;
      const int first = __ffs(mask) - 1;
      uint32_t slot = 0;
      if (lane == first) slot = atomicAdd(&t.len, __popc(mask));
      slot = __shfl_sync(0xffffffffu, slot, first) + __popc(mask & ((1u << lane) - 1));
      if (want && slot < kRegion) t.lx[slot] = x, t.lid[slot] = t.id[i], t.lidx[slot] = i;
    }
  }
  __syncthreads();
  const uint32_t len = t.len;
  if (count <= kLocalCap && len <= kRegion) {
    float* gx = sampling_cluster::Peer(t.gx[rank], leader);
    int32_t* gid = sampling_cluster::Peer(t.gid[rank], leader);
    for (uint32_t i = threadIdx.x; i < len; i += kThreads) {
      const float x = t.lx[i];
      const uint2 above_equal = CountAboveEqual(t.lx, len, x);
      uint32_t pos = above_equal.x;
      if (above_equal.y > 1) {  // tied with another one: those with a lower candidate index first
        const uint32_t idx = t.lidx[i];
        for (uint32_t j = 0; j < len; ++j) pos += t.lx[j] == x && t.lidx[j] < idx ? 1u : 0u;
      }
      gx[pos] = x, gid[pos] = t.lid[i];
    }
  }
  __syncthreads();  // every read of the candidates and of len before the reset
  if (threadIdx.x == 0) {
    *sampling_cluster::Peer(&t.g_len[rank], leader) = len;
    if (count > kLocalCap || len > kRegion) *sampling_cluster::Peer(&t.g_overflow, leader) = 1u;
    t.count = 0, t.len = 0;
  }
}

// Number of logits larger than x in a region sorted in descending order, len <= kRegion of them:
// a branchless binary search (fixed trip count, so searches over several regions interleave).
__device__ __forceinline__ uint32_t CountAboveSorted(const float* a, uint32_t len, float x) {
  uint32_t pos = 0;
#pragma unroll
  for (uint32_t step = kRegion; step > 0; step /= 2) {
    if (pos + step <= len && a[pos + step - 1] > x) pos += step;
  }
  return pos;
}

// Leader, all threads: from the gathered regions (a superset of the row's top-k set), the top-k
// set into kx / kid; returns its size (may exceed kKeptCap) and the row max in *max_logit.
__device__ uint32_t SelectTopK(StreamShared& s, int k, float* max_logit) {
  auto& t = s.topk;
  uint32_t len[kCluster], begin[kCluster], n = 0;
  float mx = -INFINITY;
#pragma unroll
  for (int c = 0; c < kCluster; ++c) {
    len[c] = t.g_len[c], begin[c] = n, n += len[c];
    if (len[c] > 0) mx = fmaxf(mx, t.gx[c][0]);  // each region starts with its CTA's max
  }
  *max_logit = mx;
  const int lane = threadIdx.x % 32;
  for (uint32_t i0 = 0; i0 < n; i0 += kThreads) {  // uniform
    const uint32_t i = i0 + threadIdx.x;
    bool want = false;
    float x = 0.0f;
    int32_t id = 0;
    if (i < n) {
      int c = 0;
#pragma unroll
      for (int r = 1; r < kCluster; ++r) c = i >= begin[r] ? r : c;
      x = t.gx[c][i - begin[c]], id = t.gid[c][i - begin[c]];
      uint32_t above = 0;
#pragma unroll
      for (int r = 0; r < kCluster; ++r) above += CountAboveSorted(t.gx[r], len[r], x);
      want = above < static_cast<uint32_t>(k);
    }
    const uint32_t mask = __ballot_sync(0xffffffffu, want);
    if (mask == 0) continue;
    const int first = __ffs(mask) - 1;
    uint32_t slot = 0;
    if (lane == first) slot = atomicAdd(&t.k_count, __popc(mask));
    slot = __shfl_sync(0xffffffffu, slot, first) + __popc(mask & ((1u << lane) - 1));
    if (want && slot < kKeptCap) t.kx[slot] = x, t.kid[slot] = id;
  }
  __syncthreads();
  return t.k_count;
}

// Leader, all threads, after the cluster barrier that published the pushes: samples row r from
// the gathered candidates, writes out_tokens[r] (kFallbackToken on overflow) and resets the
// leader's buffers for its next row as leader.
__device__ void TopKTail(StreamShared& s, const SamplingArgs& args, int64_t r, int k) {
  auto& t = s.topk;
  if (t.g_overflow == 0) {  // uniform
    float max_logit;
    const uint32_t m = SelectTopK(s, k, &max_logit);
    if (m <= kKeptCap && max_logit != -INFINITY) {  // uniform
      const float scale = kSamplingLog2e / args.temperature[r];
      uint64_t mine = 0;
      for (uint32_t i = threadIdx.x; i < m; i += kThreads) {
        const uint64_t w = sampling_cluster::RowMath::Fixed(exp2f((t.kx[i] - max_logit) * scale));
        t.kw[i] = w;
        mine += w;
      }
      const uint64_t z = sampling_internal::BlockSum<kWarps>(mine, s.scratch);  // publishes kw
      const float top_p = args.top_p[r];
      if (top_p < 1.0f)
        sampling_internal::ApplyTopPToKept<kThreads, kKeptCap>(t.kx, t.kw, m, z, top_p);
      sampling_internal::DrawKeptById<kThreads>(
          t.kid, t.kw, m, SamplingUniformImpl(args.seeds[r], args.steps[r]), s.scratch, &t.token);
    }
  }
  __syncthreads();  // every read of the leader's buffers and flags before the reset
  if (threadIdx.x == 0) {
    args.out_tokens[r] = t.token;
    t.g_overflow = 0, t.k_count = 0, t.token = kFallbackToken;
  }
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initial state of the top-k buffers and the mbarrier (before the kernel's first cluster barrier).
__device__ __forceinline__ void InitTopK(TopKShared& t) {
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarps; ++w) t.votes[w] = 0;
    t.count = 0, t.len = 0, t.g_overflow = 0, t.k_count = 0, t.token = kFallbackToken;
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(&t.full)),
                 "r"(kCluster * kThreads)
                 : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
}

// This thread's arrival on CTA `rank`'s mbarrier, releasing its earlier stores (DSMEM pushes).
__device__ __forceinline__ void ArriveRemote(const uint64_t* bar, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(SharedAddress(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote)
               : "memory");
}

// Waits until this CTA's mbarrier completes the phase with the given parity (acquire, cluster
// scope: the pushes released by the arrivals are then visible).
__device__ __forceinline__ void WaitParity(const uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

// One top-k row, the cluster's index-th; every CTA of the cluster calls it with the same row and
// index. Its leader, rank index % kCluster, leads again kCluster top-k rows later; every CTA passes
// a cluster barrier after each kCluster-th top-k row, which the leader reaches after this row's
// tail (it leads at most one of those rows), so its buffers and its mbarrier's next phase are
// written only after the tail has read them.
__device__ __noinline__ void TopKRow(const SamplingArgs& args, int64_t r, int index, bool vec_ok,
                                     int slice_len) {
  StreamShared& s = SharedOf<StreamShared>();
  const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  const int leader = index % kCluster;
  const int64_t begin = int64_t{rank} * slice_len;
  const Slice sl{args.logits + r * args.vocab_size + begin,
                 sampling_cluster::SliceLength(slice_len, args.vocab_size, rank),
                 static_cast<int32_t>(begin)};
  const int k = static_cast<int>(args.top_k[r]);
  TopKStreamPass(s, sl, vec_ok, k);
  PushLocalTopK(s, k, leader, rank);
  ArriveRemote(&s.topk.full, leader);
  if (rank == leader) {
    WaitParity(&s.topk.full, (index / kCluster) & 1);
    TopKTail(s, args, r, k);
  }
  if (index % kCluster == kCluster - 1) cooperative_groups::this_cluster().sync();
}

}  // namespace tandem::sampling_stream
