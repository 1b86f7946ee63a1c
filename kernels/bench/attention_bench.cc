// Benchmark of the attention-path kernels on the GPU: paged decode attention (FlashDecoding),
// paged causal prefill attention and the fused RoPE/KV-store, with the ceilings measured in the
// same run (device-to-device copy, cuBLAS bf16 GEMM). Prints one "RESULT key=value ..." line per
// kernel and shape; kernels/bench/attention_table.py joins them with the PyTorch peer's lines.
//
// Timing: CUDA events around a run of back-to-back launches, median of the repetitions, after
// warm-up. Decode rotates over several disjoint sets of pages (>= 256 MB in all) so the KV
// stream never comes from the 60 MB L2. Inputs are random bf16 in [-1, 1), never zeros.
//
// Files: attention_bench.h (shared pieces), attention_bench_decode.cc (decode),
// attention_bench_util.cc (timing, inputs, ceilings); here the modes, prefill and RoPE.
#include "kernels/bench/attention_bench.h"

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

namespace tandem::attention_bench {
namespace {

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
}  // namespace tandem::attention_bench

int main(int argc, char** argv) {
  using namespace tandem;
  using namespace tandem::attention_bench;
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
    // --launch-skip ...); dequant / fused: an fp8 cache and that fp8 decode kernel (how the
    // stream kernel fills its stages: TANDEM_DECODE_COPIES=cp.async|tma).
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
