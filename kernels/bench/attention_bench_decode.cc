// attention_bench's decode benchmarks (attention_bench.h): the decode kernel over rotated page
// sets, in a stream and from graph replays, with RoPE + decode pairs; and decode through the
// prefill kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "kernels/bench/attention_bench.h"
#include "kernels/common/kv_layout.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem::attention_bench {

// BenchDecode's contract: attention_bench.h.
void BenchDecode(int batch, int len, int page_size, double copy_tbs, AttentionPlan& plan,
                 DType kv_dtype, Fp8DecodeKernel fp8_kernel, int num_q_heads) {
  // TANDEM_BENCH_RAGGED=1: sequence lengths drawn uniformly from [1, 2 len - 1] (mean len, as
  // a served batch's), else all len.
  const bool ragged = std::getenv("TANDEM_BENCH_RAGGED") != nullptr;
  const int max_len = ragged ? 2 * len - 1 : len;
  const int pages_per_seq = (max_len + page_size - 1) / page_size;
  const KvLayout page_layout{.num_layers = 1,
                             .num_pages = 1,
                             .page_size = page_size,
                             .num_kv_heads = kNkv,
                             .head_dim = kD,
                             .dtype = kv_dtype};
  const bool fp8 = page_layout.fp8();
  const int64_t page_bytes = page_layout.PageBytes();
  const int64_t set_bytes = int64_t{batch} * pages_per_seq * page_bytes;
  // TANDEM_BENCH_SETS (diagnostic): rotate over that many sets instead (1: K/V reread from L2).
  const char* sets_env = std::getenv("TANDEM_BENCH_SETS");
  const int sets = sets_env != nullptr
                       ? std::max(1, std::atoi(sets_env))
                       : static_cast<int>(std::clamp<int64_t>(kRotateBytes / set_bytes + 1, 1, 8));
  const int64_t num_pages = int64_t{sets} * batch * pages_per_seq;
  void *kv, *q, *out;
  CK(cudaMalloc(&kv, num_pages * page_bytes));
  CK(cudaMalloc(&q, int64_t{batch} * num_q_heads * kD * 2));
  CK(cudaMalloc(&out, int64_t{batch} * num_q_heads * kD * 2));
  if (fp8) {
    // Codes 0x38 (1.0) and scales of bytes 0x38383838 (4.4e-5): finite values throughout.
    CK(cudaMemset(kv, 0x38, num_pages * page_bytes));
  } else {
    FillRandomBf16(kv, num_pages * page_bytes / 2, 4);
  }
  FillRandomBf16(q, int64_t{batch} * num_q_heads * kD, 5);
  // The block tables name a random permutation of the pool's pages (as an engine's allocator
  // after a while). TANDEM_BENCH_CONTIGUOUS_PAGES=1 (diagnostic): pages in pool order instead.
  std::vector<int32_t> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  if (std::getenv("TANDEM_BENCH_CONTIGUOUS_PAGES") == nullptr) {
    std::shuffle(ids.begin(), ids.end(), std::mt19937(6));
  }
  int32_t* tables;
  CK(cudaMalloc(&tables, ids.size() * 4));
  CK(cudaMemcpy(tables, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> lens(batch, len), starts(batch + 1);
  if (ragged) {
    std::mt19937 rng(7);
    for (int32_t& l : lens) l = 1 + static_cast<int32_t>(rng() % max_len);
  }
  std::iota(starts.begin(), starts.end(), 0);
  int32_t *d_lens, *d_starts;
  CK(cudaMalloc(&d_lens, batch * 4));
  CK(cudaMalloc(&d_starts, (batch + 1) * 4));
  CK(cudaMemcpy(d_lens, lens.data(), batch * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_starts, starts.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  CHECK_OK(plan.BuildDecode({lens.data(), starts.data(), batch, num_q_heads, kNkv}, nullptr));
  PagedAttentionArgs a;
  a.q = q;
  a.out = out;
  a.kv_layer = kv;
  a.seq_lens = d_lens;
  a.query_start = d_starts;
  a.num_seqs = batch;
  a.num_tokens = batch;
  a.num_q_heads = num_q_heads;
  a.num_kv_heads = kNkv;
  a.head_dim = kD;
  a.page_size = page_size;
  a.max_pages_per_seq = pages_per_seq;
  a.scale = 1.0f / std::sqrt(float{kD});
  a.kv_dtype = kv_dtype;
  a.fp8_decode = fp8_kernel;
  const double us = MedianUs(
      [&](int i) {
        a.block_tables = tables + int64_t{i % sets} * batch * pages_per_seq;
        CHECK_OK(PagedAttentionDecode(a, plan, nullptr));
      },
      std::max(sets, 10), 15);
  CK(cudaGetLastError());
  // The same launches replayed from a CUDA graph (how the engine's decode step runs them):
  // per-call time without the host launch path; with PDL (the default: each launch's first K/V
  // copies overlap the previous launch's tail) and as plain launches.
  const int calls = std::max(sets, 10);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto graph_time = [&](const std::function<void(int)>& enqueue) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) enqueue(i);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const double t =
        MedianUs([&](int) { CK(cudaGraphLaunch(exec, stream)); }, 1, 15, stream) / calls;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return t;
  };
  auto decode = [&](bool pdl) {
    return [&, pdl](int i) {
      PagedAttentionArgs x = a;
      x.block_tables = tables + int64_t{i % sets} * batch * pages_per_seq;
      x.overlap_launch = pdl;
      CHECK_OK(PagedAttentionDecode(x, plan, stream));
    };
  };
  const double graph_us = graph_time(decode(true));
  const double graph_plain_us = graph_time(decode(false));
  // A decode step's RopeKvStore -> attention pair (RopeKvStore rotates q in place in the fused
  // QKV buffer and stores each sequence's newest K/V row; it releases the attention at its
  // start): per pair, the attention with and without PDL.
  const int heads = num_q_heads + 2 * kNkv;
  void* qkv;
  CK(cudaMalloc(&qkv, int64_t{batch} * heads * kD * 2));
  FillRandomBf16(qkv, int64_t{batch} * heads * kD, 11);
  std::vector<int32_t> positions(batch), slots(int64_t{sets} * batch);
  for (int s = 0; s < batch; ++s) positions[s] = lens[s] - 1;
  for (int64_t i = 0; i < int64_t{sets} * batch; ++i) {
    const int pos = positions[i % batch];
    slots[i] = ids[i * pages_per_seq + pos / page_size] * page_size + pos % page_size;
  }
  std::vector<float> inv_freq(kD / 2);
  for (int i = 0; i < kD / 2; ++i) inv_freq[i] = std::pow(5e5f, -2.0f * i / kD);
  int32_t *d_positions, *d_slots;
  float* d_freq;
  CK(cudaMalloc(&d_positions, batch * 4));
  CK(cudaMalloc(&d_slots, slots.size() * 4));
  CK(cudaMalloc(&d_freq, inv_freq.size() * 4));
  CK(cudaMemcpy(d_positions, positions.data(), batch * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_freq, inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice));
  RopeKvStoreArgs rope{.qkv = qkv,
                       .positions = d_positions,
                       .kv_layer = kv,
                       .inv_freq = d_freq,
                       .num_tokens = batch,
                       .num_q_heads = num_q_heads,
                       .num_kv_heads = kNkv,
                       .head_dim = kD,
                       .page_size = page_size,
                       .num_pages = static_cast<int>(num_pages),
                       .kv_dtype = kv_dtype};
  auto pair = [&](bool pdl) {
    return [&, pdl](int i) {
      RopeKvStoreArgs r = rope;
      r.slot_mapping = d_slots + int64_t{i % sets} * batch;
      CHECK_OK(RopeKvStore(r, stream));
      PagedAttentionArgs x = a;
      x.q = qkv;
      x.q_stride = int64_t{heads} * kD;
      x.block_tables = tables + int64_t{i % sets} * batch * pages_per_seq;
      x.overlap_launch = pdl;
      CHECK_OK(PagedAttentionDecode(x, plan, stream));
    };
  };
  const double pair_us = graph_time(pair(true));
  const double pair_plain_us = graph_time(pair(false));
  CK(cudaFree(qkv));
  for (void* p :
       {static_cast<void*>(d_positions), static_cast<void*>(d_slots), static_cast<void*>(d_freq)}) {
    CK(cudaFree(p));
  }
  CK(cudaStreamDestroy(stream));
#ifdef TANDEM_DECODE_TRACE
  // Diagnostic builds: phase stamps of single launches (after a synchronize, so no overlap
  // with a previous launch), two of them per shape.
  for (int rep = 0; rep < 2; ++rep) {
    a.block_tables = tables + int64_t{rep % sets} * batch * pages_per_seq;
    DecodeTraceClear();
    CHECK_OK(PagedAttentionDecode(a, plan, nullptr));
    CK(cudaDeviceSynchronize());
    char label[64];
    std::snprintf(label, sizeof(label), "B=%d L=%d page=%d", batch, len, page_size);
    DecodeTracePrint(label);
  }
#endif
  // K and V bytes read: bf16 values, or fp8 codes plus their fp32 scales.
  const double keys = std::accumulate(lens.begin(), lens.end(), 0.0);
  const double bytes = keys * kNkv * 2 * (fp8 ? kD + 4 : kD * 2);
  const char* per_slot = std::getenv("TANDEM_DECODE_ITEMS_PER_SLOT");
  std::printf(
      "RESULT kernel=decode kv=%s fp8_kernel=%s B=%d L=%d%s page=%d group=%d ips=%s us=%.2f "
      "TBps=%.3f frac_copy=%.3f graph_us=%.2f graph_TBps=%.3f items=%d merges=%d "
      "graph_plain_us=%.2f rope_pair_us=%.2f rope_pair_plain_us=%.2f\n",
      fp8 ? "fp8" : "bf16", fp8 ? Fp8DecodeKernelName(fp8_kernel) : "-", batch, len,
      ragged ? " ragged=1" : "", page_size, num_q_heads / kNkv, per_slot ? per_slot : "default", us,
      bytes / us * 1e-6, bytes / us * 1e-6 / copy_tbs, graph_us, bytes / graph_us * 1e-6,
      plan.num_items(), plan.num_merges(), graph_plain_us, pair_us, pair_plain_us);
  for (void* p : {kv, q, out}) CK(cudaFree(p));
  for (int32_t* p : {tables, d_lens, d_starts}) CK(cudaFree(p));
}

// Decode through the prefill kernel (FlashInfer's tensor-core decode is its prefill kernel with
// one query per request): `batch` sequences of `len` tokens, one query each, the query heads of a
// KV group packed as rows of the mma tiles. Times the default prefill dispatch and the decode
// kernel on the same inputs, and checks that both give the same output (input for [decode-tc]).
void BenchDecodeAsPrefill(int batch, int len, int page_size, AttentionPlan& plan) {
  const int pages_per_seq = (len + page_size - 1) / page_size;
  const int64_t page_elems = int64_t{2} * kNkv * page_size * kD;
  const int64_t num_pages = int64_t{batch} * pages_per_seq;
  const int64_t q_elems = int64_t{batch} * kNq * kD;
  void *kv, *q, *out_prefill, *out_decode;
  CK(cudaMalloc(&kv, num_pages * page_elems * 2));
  CK(cudaMalloc(&q, q_elems * 2));
  CK(cudaMalloc(&out_prefill, q_elems * 2));
  CK(cudaMalloc(&out_decode, q_elems * 2));
  FillRandomBf16(kv, num_pages * page_elems, 12);
  FillRandomBf16(q, q_elems, 13);
  std::vector<int32_t> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(14));
  std::vector<int32_t> lens(batch, len), starts(batch + 1);
  std::iota(starts.begin(), starts.end(), 0);
  int32_t *tables, *d_lens, *d_starts;
  CK(cudaMalloc(&tables, ids.size() * 4));
  CK(cudaMalloc(&d_lens, batch * 4));
  CK(cudaMalloc(&d_starts, (batch + 1) * 4));
  CK(cudaMemcpy(tables, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_lens, lens.data(), batch * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_starts, starts.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  PagedAttentionArgs a;
  a.q = q;
  a.kv_layer = kv;
  a.block_tables = tables;
  a.seq_lens = d_lens;
  a.query_start = d_starts;
  a.num_seqs = batch;
  a.num_tokens = batch;
  a.num_q_heads = kNq;
  a.num_kv_heads = kNkv;
  a.head_dim = kD;
  a.page_size = page_size;
  a.max_pages_per_seq = pages_per_seq;
  a.scale = 1.0f / std::sqrt(float{kD});
  const AttentionBatchShape shape{lens.data(), starts.data(), batch, kNq, kNkv};
  PagedAttentionArgs d = a;
  d.out = out_decode;
  CHECK_OK(plan.BuildDecode(shape, nullptr));
  const double decode_us =
      MedianUs([&](int) { CHECK_OK(PagedAttentionDecode(d, plan, nullptr)); }, 10, 15);
  CHECK_OK(PagedAttentionDecode(d, plan, nullptr));
  PagedAttentionArgs p = a;
  p.out = out_prefill;
  CHECK_OK(plan.BuildPrefill(shape, nullptr));
  const double prefill_us =
      MedianUs([&](int) { CHECK_OK(PagedAttentionPrefill(p, plan, nullptr)); }, 10, 15);
  CHECK_OK(PagedAttentionPrefill(p, plan, nullptr));
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> hp(q_elems), hd(q_elems);
  CK(cudaMemcpy(hp.data(), out_prefill, q_elems * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hd.data(), out_decode, q_elems * 2, cudaMemcpyDeviceToHost));
  auto f32 = [](uint16_t b) {
    uint32_t u = uint32_t{b} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  double max_diff = 0;
  for (int64_t i = 0; i < q_elems; ++i) {
    max_diff = std::max(max_diff, double(std::fabs(f32(hp[i]) - f32(hd[i]))));
  }
  const double bytes = double(batch) * len * kNkv * kD * 2 * 2;
  const char* path = std::getenv("TANDEM_PREFILL_KERNEL");
  std::printf(
      "RESULT kernel=decode_as_prefill B=%d L=%d page=%d path=%s prefill_us=%.2f "
      "prefill_TBps=%.3f decode_us=%.2f decode_TBps=%.3f max_abs_diff=%.5f\n",
      batch, len, page_size, path != nullptr ? path : "default", prefill_us,
      bytes / prefill_us * 1e-6, decode_us, bytes / decode_us * 1e-6, max_diff);
  for (void* x : {kv, q, out_prefill, out_decode}) CK(cudaFree(x));
  for (int32_t* x : {tables, d_lens, d_starts}) CK(cudaFree(x));
}

}  // namespace tandem::attention_bench
