// Benchmark of the attention-path kernels on the GPU: paged decode attention (FlashDecoding),
// paged causal prefill attention and the fused RoPE/KV-store, with the ceilings measured in the
// same run (device-to-device copy, cuBLAS bf16 GEMM). Prints one "RESULT key=value ..." line per
// kernel and shape; kernels/bench/attention_table.py joins them with the PyTorch peer's lines.
//
// Timing: CUDA events around a run of back-to-back launches, median of the repetitions, after
// warm-up. Decode rotates over several disjoint sets of pages (>= 256 MB in all) so the KV
// stream never comes from the 60 MB L2. Inputs are random bf16 in [-1, 1), never zeros.
#include <cublas_v2.h>
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
#include "kernels/common/kv_layout.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem {
#ifdef TANDEM_DECODE_TRACE
void DecodeTraceClear();  // paged_attention.cu, diagnostic builds only
void DecodeTracePrint(const char* label);
#endif
namespace {

#define CK(expr) CHECK((expr) == cudaSuccess) << cudaGetErrorString(cudaGetLastError())

constexpr int kNq = 32, kNkv = 8, kD = 128;  // Llama-3-8B / Qwen3-8B attention shape
constexpr int64_t kRotateBytes = int64_t{256} << 20;

// Decode shapes of the full run: {batch, keys per sequence, page size}.
constexpr int kDecodeShapes[][3] = {
    {1, 1024, 16},   {1, 8192, 16},   {1, 8192, 64},   {1, 32768, 16}, {8, 4096, 16},
    {32, 4096, 16},  {32, 4096, 64},  {32, 16384, 16}, {64, 4096, 16}, {64, 16384, 16},
    {128, 4096, 16}, {256, 2048, 16}, {256, 1024, 128}};

// [decode-tc]'s shapes, {batch, keys per sequence, GQA group}, each at pages 16 and 64: the
// shapes kernels/bench/peers/flashinfer_peer times FlashInfer's two decode paths at (group 4:
// 32 query heads over 8 KV heads, Llama-3-8B; group 8: 64 query heads).
constexpr int kDecodeTcShapes[][3] = {
    {1, 8192, 4},   {8, 4096, 4},   {32, 4096, 4}, {64, 4096, 4}, {128, 4096, 4}, {64, 16384, 4},
    {256, 2048, 4}, {256, 1024, 4}, {256, 640, 4}, {32, 4096, 8}, {128, 4096, 8}};

// Median over `reps` of (time of `inner` calls of fn) / inner, in microseconds.
double MedianUs(const std::function<void(int)>& fn, int inner, int reps,
                cudaStream_t stream = nullptr) {
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  for (int i = 0; i < inner; ++i) fn(i);  // warm-up
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(start, stream));
    for (int i = 0; i < inner; ++i) fn(i);
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1e3 * ms / inner);
  }
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Fills n bf16 with random values: a 32 MB random block, replicated on the device.
void FillRandomBf16(void* dev, int64_t n, uint32_t seed) {
  const int64_t block = std::min<int64_t>(n, int64_t{16} << 20);
  std::vector<uint16_t> host(block);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (auto& x : host) x = F32ToBf16(uni(rng));
  auto* d = static_cast<uint16_t*>(dev);
  CK(cudaMemcpy(d, host.data(), block * 2, cudaMemcpyHostToDevice));
  for (int64_t done = block; done < n; done += block) {
    CK(cudaMemcpy(d + done, d, std::min(block, n - done) * 2, cudaMemcpyDeviceToDevice));
  }
}

double CopyTbs() {
  const int64_t bytes = int64_t{2} << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  FillRandomBf16(a, bytes / 2, 1);
  const double us =
      MedianUs([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 3, 7);
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / us * 1e-6;
}

double GemmTflops() {
  const int n = 8192;
  void *a, *b, *c;
  CK(cudaMalloc(&a, int64_t{n} * n * 2));
  CK(cudaMalloc(&b, int64_t{n} * n * 2));
  CK(cudaMalloc(&c, int64_t{n} * n * 2));
  FillRandomBf16(a, int64_t{n} * n, 2);
  FillRandomBf16(b, int64_t{n} * n, 3);
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  const double us = MedianUs(
      [&](int) {
        CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                           CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      },
      5, 7);
  cublasDestroy(h);
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(c));
  return 2.0 * n * n * double{n} / us * 1e-6;
}

// Decode: batch of `batch` sequences of `len` keys, one new token each. kv_dtype kF8E4M3: an fp8
// cache (codes + per-token scales) read by the fp8 decode kernel `fp8_kernel`; TBps then counts
// the fp8 page bytes read (codes + scales). num_q_heads: kNq (GQA group 4) or 64 (group 8), over
// kNkv KV heads.
void BenchDecode(int batch, int len, int page_size, double copy_tbs, AttentionPlan& plan,
                 DType kv_dtype = DType::kBF16,
                 Fp8DecodeKernel fp8_kernel = Fp8DecodeKernel::kDefault, int num_q_heads = kNq) {
  const int pages_per_seq = (len + page_size - 1) / page_size;
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
  std::vector<int32_t> positions(batch, len - 1), slots(int64_t{sets} * batch);
  for (int64_t i = 0; i < int64_t{sets} * batch; ++i) {
    slots[i] = ids[i * pages_per_seq + (len - 1) / page_size] * page_size + (len - 1) % page_size;
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
  const double bytes = double(batch) * len * kNkv * 2 * (fp8 ? kD + 4 : kD * 2);
  const char* per_slot = std::getenv("TANDEM_DECODE_ITEMS_PER_SLOT");
  std::printf(
      "RESULT kernel=decode kv=%s fp8_kernel=%s B=%d L=%d page=%d group=%d ips=%s us=%.2f "
      "TBps=%.3f frac_copy=%.3f graph_us=%.2f graph_TBps=%.3f items=%d merges=%d "
      "graph_plain_us=%.2f rope_pair_us=%.2f rope_pair_plain_us=%.2f\n",
      fp8 ? "fp8" : "bf16", fp8 ? Fp8DecodeKernelName(fp8_kernel) : "-", batch, len, page_size,
      num_q_heads / kNkv, per_slot ? per_slot : "default", us, bytes / us * 1e-6,
      bytes / us * 1e-6 / copy_tbs, graph_us, bytes / graph_us * 1e-6, plan.num_items(),
      plan.num_merges(), graph_plain_us, pair_us, pair_plain_us);
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

// Prefill: one causal prompt of `len` tokens whose K/V are already in the cache.
void BenchPrefill(int len, int page_size, double gemm_tflops, AttentionPlan& plan) {
  const int pages = (len + page_size - 1) / page_size;
  const int64_t page_elems = int64_t{2} * kNkv * page_size * kD;
  void *kv, *q, *out;
  CK(cudaMalloc(&kv, pages * page_elems * 2));
  CK(cudaMalloc(&q, int64_t{len} * kNq * kD * 2));
  CK(cudaMalloc(&out, int64_t{len} * kNq * kD * 2));
  FillRandomBf16(kv, pages * page_elems, 7);
  FillRandomBf16(q, int64_t{len} * kNq * kD, 8);
  std::vector<int32_t> ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(9));
  std::vector<int32_t> lens{len}, starts{0, len};
  int32_t *tables, *d_lens, *d_starts;
  CK(cudaMalloc(&tables, pages * 4));
  CK(cudaMalloc(&d_lens, 4));
  CK(cudaMalloc(&d_starts, 8));
  CK(cudaMemcpy(tables, ids.data(), pages * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_lens, lens.data(), 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_starts, starts.data(), 8, cudaMemcpyHostToDevice));
  CHECK_OK(plan.BuildPrefill({lens.data(), starts.data(), 1, kNq, kNkv}, nullptr));
  PagedAttentionArgs a;
  a.q = q;
  a.out = out;
  a.kv_layer = kv;
  a.block_tables = tables;
  a.seq_lens = d_lens;
  a.query_start = d_starts;
  a.num_seqs = 1;
  a.num_tokens = len;
  a.num_q_heads = kNq;
  a.num_kv_heads = kNkv;
  a.head_dim = kD;
  a.page_size = page_size;
  a.max_pages_per_seq = pages;
  a.scale = 1.0f / std::sqrt(float{kD});
  const double us = MedianUs([&](int) { CHECK_OK(PagedAttentionPrefill(a, plan, nullptr)); }, 3, 7);
  // Causal FLOPs as FlashAttention counts them: 4 * L^2 * D * heads / 2.
  const double flops = 4.0 * len * double(len) * kD * kNq / 2.0;
  const char* path = std::getenv("TANDEM_PREFILL_KERNEL");  // unset: the default dispatch
  std::printf("RESULT kernel=prefill L=%d page=%d us=%.1f TFLOPs=%.1f frac_gemm=%.3f path=%s\n",
              len, page_size, us, flops / us * 1e-6, flops / us * 1e-6 / gemm_tflops,
              path != nullptr ? path : "default");
  for (void* p : {kv, q, out}) CK(cudaFree(p));
  for (int32_t* p : {tables, d_lens, d_starts}) CK(cudaFree(p));
}

void BenchRope(int tokens, bool qk_norm, double copy_tbs) {
  const int heads = kNq + 2 * kNkv, page_size = 16;
  const int pages = (tokens + page_size - 1) / page_size;
  void *qkv, *kv, *w;
  CK(cudaMalloc(&qkv, int64_t{tokens} * heads * kD * 2));
  CK(cudaMalloc(&kv, int64_t{pages} * 2 * kNkv * page_size * kD * 2));
  CK(cudaMalloc(&w, kD * 2));
  FillRandomBf16(qkv, int64_t{tokens} * heads * kD, 10);
  FillRandomBf16(w, kD, 11);
  std::vector<int32_t> pos(tokens), slots(tokens);
  std::iota(pos.begin(), pos.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<float> inv_freq(kD / 2);
  for (int i = 0; i < kD / 2; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / kD);
  int32_t *d_pos, *d_slots;
  float* d_freq;
  CK(cudaMalloc(&d_pos, tokens * 4));
  CK(cudaMalloc(&d_slots, tokens * 4));
  CK(cudaMalloc(&d_freq, kD * 2));
  CK(cudaMemcpy(d_pos, pos.data(), tokens * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_slots, slots.data(), tokens * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_freq, inv_freq.data(), kD * 2, cudaMemcpyHostToDevice));
  RopeKvStoreArgs a;
  a.qkv = qkv;
  a.positions = d_pos;
  a.slot_mapping = d_slots;
  a.kv_layer = kv;
  a.inv_freq = d_freq;
  a.q_norm_weight = qk_norm ? w : nullptr;
  a.k_norm_weight = qk_norm ? w : nullptr;
  a.num_tokens = tokens;
  a.num_q_heads = kNq;
  a.num_kv_heads = kNkv;
  a.head_dim = kD;
  a.page_size = page_size;
  a.num_pages = pages;
  const double us = MedianUs([&](int) { CHECK_OK(RopeKvStore(a, nullptr)); }, 5, 9);
  // Read all of qkv; write Q and K back and K and V to the cache.
  const double bytes = double(tokens) * kD * 2 * (heads + (kNq + kNkv) + 2 * kNkv);
  std::printf("RESULT kernel=rope_kv_store T=%d qk_norm=%d us=%.1f TBps=%.3f frac_copy=%.3f\n",
              tokens, qk_norm ? 1 : 0, us, bytes / us * 1e-6, bytes / us * 1e-6 / copy_tbs);
  for (void* p : {qkv, kv, w}) CK(cudaFree(p));
  for (void* p :
       {static_cast<void*>(d_pos), static_cast<void*>(d_slots), static_cast<void*>(d_freq)}) {
    CK(cudaFree(p));
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  if (argc > 1 && std::string_view(argv[1]) == "ncu") {
    // One decode and one prefill shape only, for `ncu -k regex:...` (see gpu_run_ka.sh).
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    BenchDecode(32, 4096, 16, 4.27, **plan);
    BenchPrefill(16384, 64, 790.0, **plan);
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "prefill") {
    // Prefill only, both kernels in one run (gpu_run_prefill.sh): the default dispatch (the
    // Hopper kernel) and TANDEM_PREFILL_KERNEL=fa2, page sizes 16 and 64.
    const double gemm = GemmTflops();
    std::printf("RESULT kernel=ceiling copy_TBps=%.3f gemm_TFLOPs=%.1f\n", CopyTbs(), gemm);
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    for (const char* path : {"sm90", "fa2"}) {
      setenv("TANDEM_PREFILL_KERNEL", path, 1);
      for (int len : {4096, 16384}) BenchPrefill(len, 64, gemm, **plan);
      BenchPrefill(16384, 16, gemm, **plan);
    }
    unsetenv("TANDEM_PREFILL_KERNEL");
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "prefill_ncu") {  // one 16k prefill, for ncu
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    BenchPrefill(16384, 64, 790.0, **plan);
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "decode_rope") {
    // Decode and RoPE/KV-store only, with the copy ceiling (gpu_run_bw.sh; run twice with the
    // old and new kernels in one call). Small batches first, then batch >= 32.
    const double copy = CopyTbs();
    std::printf("RESULT kernel=ceiling copy_TBps=%.3f gemm_TFLOPs=0\n", copy);
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    for (const auto& c : {std::array{1, 1024, 16},
                          {1, 8192, 16},
                          {1, 8192, 64},
                          {1, 32768, 16},
                          {8, 4096, 16},
                          {32, 4096, 16},
                          {32, 4096, 64},
                          {64, 4096, 16},
                          {256, 1024, 128}}) {
      BenchDecode(c[0], c[1], c[2], copy, **plan);
    }
    BenchRope(16384, false, copy);
    BenchRope(16384, true, copy);
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "decode") {
    // Every decode shape of the full run, with the copy ceiling (A/B of two decode kernels).
    const double copy = CopyTbs();
    std::printf("RESULT kernel=ceiling copy_TBps=%.3f gemm_TFLOPs=0\n", copy);
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    for (const auto& c : kDecodeShapes) BenchDecode(c[0], c[1], c[2], copy, **plan);
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "decode_tc") {
    // [decode-tc]'s shapes at pages 16 and 64, groups 4 and 8, with the copy ceiling: tandem's
    // side of the table beside kernels/bench/peers/flashinfer_peer (attention_table.py).
    const double copy = CopyTbs();
    std::printf("RESULT kernel=ceiling copy_TBps=%.3f gemm_TFLOPs=0\n", copy);
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    for (const auto& c : kDecodeTcShapes) {
      for (int page : {16, 64}) {
        BenchDecode(c[0], c[1], page, copy, **plan, DType::kBF16, Fp8DecodeKernel::kDefault,
                    c[2] * kNkv);
      }
    }
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "decode_as_prefill") {
    // Every decode shape through the prefill kernels ([decode-tc]): the default dispatch and
    // TANDEM_PREFILL_KERNEL=fa2, beside the decode kernel on the same inputs.
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    for (const char* path : {"default", "fa2"}) {
      if (std::string_view(path) == "fa2") setenv("TANDEM_PREFILL_KERNEL", path, 1);
      for (const auto& c : kDecodeShapes) BenchDecodeAsPrefill(c[0], c[1], c[2], **plan);
    }
    unsetenv("TANDEM_PREFILL_KERNEL");
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "decode_fp8") {
    // FP8 KV decode beside bf16 at the same shapes (batch >= 32, context >= 4k, and small
    // batches), both fp8 decode kernels (dequant, fused), with the copy ceiling; TBps of the fp8
    // rows counts fp8 page bytes.
    const double copy = CopyTbs();
    std::printf("RESULT kernel=ceiling copy_TBps=%.3f gemm_TFLOPs=0\n", copy);
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    for (const auto& c : {std::array{32, 4096, 16},
                          {64, 4096, 16},
                          {128, 4096, 16},
                          {256, 4096, 16},
                          {32, 8192, 16},
                          {32, 4096, 64},
                          {1, 8192, 16},
                          {8, 4096, 16}}) {
      BenchDecode(c[0], c[1], c[2], copy, **plan, DType::kBF16);
      for (Fp8DecodeKernel k : {Fp8DecodeKernel::kDequant, Fp8DecodeKernel::kFused}) {
        BenchDecode(c[0], c[1], c[2], copy, **plan, DType::kF8E4M3, k);
      }
    }
    return 0;
  }
  if ((argc == 5 || argc == 6) && std::string_view(argv[1]) == "one") {
    // One decode shape: `one B L page [bf16|dequant|fused]` (for ncu -k regex:DecodeKernel
    // --launch-skip ...); dequant / fused: an fp8 cache and that fp8 decode kernel.
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    const std::string_view kv = argc == 6 ? argv[5] : "bf16";
    CHECK(kv == "bf16" || kv == "dequant" || kv == "fused") << kv;
    BenchDecode(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), 4.27, **plan,
                kv == "bf16" ? DType::kBF16 : DType::kF8E4M3,
                kv == "fused" ? Fp8DecodeKernel::kFused : Fp8DecodeKernel::kDequant);
    return 0;
  }
  if (argc > 1 && std::string_view(argv[1]) == "small") {
    // Small-batch decode only (to compare plan settings, e.g. TANDEM_DECODE_ITEMS_PER_SLOT).
    auto plan = AttentionPlan::Create({});
    CHECK_OK(plan.status());
    for (const auto& c : {std::array{1, 8192, 16}, {1, 32768, 16}, {8, 4096, 16}}) {
      BenchDecode(c[0], c[1], c[2], 4.27, **plan);
    }
    return 0;
  }
  const double copy = CopyTbs();
  const double gemm = GemmTflops();
  std::printf("RESULT kernel=ceiling copy_TBps=%.3f gemm_TFLOPs=%.1f\n", copy, gemm);
  auto plan = AttentionPlan::Create({});
  CHECK_OK(plan.status());
  // TANDEM_DECODE_ITEMS_PER_SLOT (if set) overrides the plan's split target; it is printed.
  for (const auto& c : kDecodeShapes) BenchDecode(c[0], c[1], c[2], copy, **plan);
  for (int len : {4096, 16384}) BenchPrefill(len, 64, gemm, **plan);
  BenchRope(16384, false, copy);
  BenchRope(16384, true, copy);
  return 0;
}
