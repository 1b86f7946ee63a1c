// CPU reference of paged attention (the oracle for the CUDA kernels and the CPU backend).
//
// Work is split into items of (sequence, KV head, block of up to kQueryBlock query tokens) and
// run with ParallelFor. An item gathers the K and V rows its block can see (positions
// [0, last query position]) from the pages into contiguous fp32 buffers once, then every query
// head of the KV group and every token of the block reads them: the gather is amortised over
// kQueryBlock * group rows, and the inner loops run over contiguous fp32 (vectorisable).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/common/host_elem.h"
#include "kernels/common/kv_layout.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quant_gemm/fp8_e4m3.h"

namespace tandem {
namespace {

constexpr int64_t kQueryBlock = 16;

struct WorkItem {
  int seq;
  int kv_head;
  int64_t token_begin;  // first query token (row of q) of the block
  int64_t token_end;
};

// Copies K and V of KV head `kv_head` for positions [0, len) of sequence `seq` into k, v
// ([len][head_dim] fp32 each).
// An fp8 cache is dequantized here: code * its row's scale, in fp32.
void GatherKv(const PagedAttentionArgs& a, int seq, int kv_head, int64_t len, float* k, float* v) {
  if (a.kv_dtype == DType::kF8E4M3) {
    const KvLayout layout{.num_layers = 1,
                          .page_size = a.page_size,
                          .num_kv_heads = a.num_kv_heads,
                          .head_dim = a.head_dim,
                          .dtype = a.kv_dtype};
    const int32_t* table = a.block_tables + int64_t{seq} * a.max_pages_per_seq;
    const auto* bytes = static_cast<const uint8_t*>(a.kv_layer);
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t slot = int64_t{table[pos / a.page_size]} * a.page_size + pos % a.page_size;
      for (int kv = 0; kv < 2; ++kv) {
        float scale;
        std::memcpy(&scale, bytes + layout.ScaleOffset(slot, kv, kv_head), sizeof(scale));
        const uint8_t* codes = bytes + layout.SlotOffset(slot, kv, kv_head);
        float* dst = (kv == 0 ? k : v) + pos * a.head_dim;
        for (int d = 0; d < a.head_dim; ++d) dst[d] = Fp8E4M3ToF32(codes[d]) * scale;
      }
    }
    return;
  }
  const int32_t* table = a.block_tables + int64_t{seq} * a.max_pages_per_seq;
  const int64_t head_elems = int64_t{a.page_size} * a.head_dim;
  const int64_t page_elems = 2 * a.num_kv_heads * head_elems;
  for (int64_t pos0 = 0; pos0 < len; pos0 += a.page_size) {
    const int64_t page = table[pos0 / a.page_size];
    const int64_t n = std::min<int64_t>(a.page_size, len - pos0) * a.head_dim;
    const int64_t k_base = page * page_elems + kv_head * head_elems;
    const int64_t v_base = k_base + a.num_kv_heads * head_elems;
    float* kd = k + pos0 * a.head_dim;
    float* vd = v + pos0 * a.head_dim;
    for (int64_t i = 0; i < n; ++i) {
      kd[i] = LoadElem(a.kv_layer, a.kv_dtype, k_base + i);
      vd[i] = LoadElem(a.kv_layer, a.kv_dtype, v_base + i);
    }
  }
}

// Attention of one query row q ([head_dim] fp32) over keys [0, len); writes out ([head_dim]).
void AttendRow(const float* q, const float* k, const float* v, int64_t len, int head_dim,
               float scale, float* scores, float* out) {
  float max_score = -INFINITY;
  for (int64_t j = 0; j < len; ++j) {
    const float* kj = k + j * head_dim;
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot += q[d] * kj[d];
    scores[j] = dot * scale;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t j = 0; j < len; ++j) {
    const float p = std::exp(scores[j] - max_score);
    sum += p;
    const float* vj = v + j * head_dim;
    for (int d = 0; d < head_dim; ++d) out[d] += p * vj[d];
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < head_dim; ++d) out[d] *= inv;
}

void RunItem(const PagedAttentionArgs& a, const WorkItem& item) {
  const int64_t q_begin = a.query_start[item.seq];
  const int64_t q_len = a.query_start[item.seq + 1] - q_begin;
  const int64_t first_pos = a.seq_lens[item.seq] - q_len;          // position of query row q_begin
  const int64_t visible = first_pos + (item.token_end - q_begin);  // keys the last row sees
  const int group = a.num_q_heads / a.num_kv_heads;
  const int64_t q_stride = a.q_stride != 0 ? a.q_stride : int64_t{a.num_q_heads} * a.head_dim;

  std::vector<float> k(visible * a.head_dim), v(visible * a.head_dim);
  std::vector<float> q(a.head_dim), out(a.head_dim), scores(visible);
  GatherKv(a, item.seq, item.kv_head, visible, k.data(), v.data());
  for (int64_t t = item.token_begin; t < item.token_end; ++t) {
    const int64_t len = first_pos + (t - q_begin) + 1;
    for (int g = 0; g < group; ++g) {
      const int h = item.kv_head * group + g;
      const int64_t q_off = t * q_stride + int64_t{h} * a.head_dim;
      for (int d = 0; d < a.head_dim; ++d) q[d] = LoadElem(a.q, a.dtype, q_off + d);
      AttendRow(q.data(), k.data(), v.data(), len, a.head_dim, a.scale, scores.data(), out.data());
      const int64_t o_off = (t * a.num_q_heads + h) * int64_t{a.head_dim};
      for (int d = 0; d < a.head_dim; ++d) StoreElem(a.out, a.dtype, o_off + d, out[d]);
    }
  }
}

void CheckArgs(const PagedAttentionArgs& a) {
  CHECK(a.dtype == DType::kF32 || a.dtype == DType::kBF16) << DTypeName(a.dtype);
  CHECK(a.kv_dtype == DType::kF32 || a.kv_dtype == DType::kBF16 || a.kv_dtype == DType::kF8E4M3)
      << DTypeName(a.kv_dtype);
  CHECK_GT(a.num_kv_heads, 0);
  CHECK_EQ(a.num_q_heads % a.num_kv_heads, 0);
  CHECK_GT(a.head_dim, 0);
  CHECK_GT(a.page_size, 0);
  CHECK(a.q != nullptr && a.out != nullptr && a.kv_layer != nullptr);
  CHECK(a.block_tables != nullptr && a.seq_lens != nullptr && a.query_start != nullptr);
  CHECK_EQ(a.query_start[a.num_seqs], a.num_tokens);
}

}  // namespace

void PagedAttentionRef(const PagedAttentionArgs& args) {
  if (args.num_seqs == 0 || args.num_tokens == 0) return;
  CheckArgs(args);
  std::vector<WorkItem> items;
  for (int s = 0; s < args.num_seqs; ++s) {
    const int64_t begin = args.query_start[s];
    const int64_t end = args.query_start[s + 1];
    CHECK_LE(begin, end);
    CHECK_LE(end - begin, args.seq_lens[s]) << "seq " << s << " has more queries than keys";
    CHECK_LE(args.seq_lens[s], int64_t{args.max_pages_per_seq} * args.page_size)
        << "seq " << s << " is longer than its block table";
    for (int h = 0; h < args.num_kv_heads; ++h) {
      for (int64_t t = begin; t < end; t += kQueryBlock) {
        items.push_back({s, h, t, std::min(end, t + kQueryBlock)});
      }
    }
  }
  ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) RunItem(args, items[i]);
  });
}

}  // namespace tandem
