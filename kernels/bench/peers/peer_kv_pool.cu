// PeerKvPool (peer_kv_pool.h): device-side random fill, the block tables, and the fp32
// reference decode attention (one CTA per (sequence, query head), scores through global memory).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/bench/peers/peer_kv_pool.h"

namespace tandem::peer {
namespace {

constexpr int kD = kPeerHeadDim;
constexpr int kRefThreads = kD;  // the reference's CTA: one thread per output feature
constexpr int kMaxSets = 8;

#define PEER_TRY(expr)                                                              \
  do {                                                                              \
    const cudaError_t e_ = (expr);                                                  \
    if (e_ != cudaSuccess) return std::string(#expr ": ") + cudaGetErrorString(e_); \
  } while (0)

// Uniform bf16 in [-1, 1) from a hash of (seed, index); never exactly zero in practice, and
// independent of launch shape, so a pool is the same on every run.
__global__ void FillKernel(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (uint64_t(i) + (uint64_t(seed) << 40)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float u = float(h >> 40) * (1.0f / float(1 << 24));  // [0, 1)
    x[i] = __float2bfloat16(2.0f * u - 1.0f);
  }
}

std::string Fill(void* x, int64_t n, uint32_t seed) {
  FillKernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x), n, seed);
  PEER_TRY(cudaGetLastError());
  return "";
}

// Reference: out[s, h, :] = softmax(scale * q[s, h] . K[s, :]) V[s, :] in fp32, K/V of query
// head h from KV head h / group, read through the block table. scores: [batch, heads, max_len].
__global__ void ReferenceKernel(const __nv_bfloat16* kv, const int32_t* table,
                                const int32_t* page_indptr, const int32_t* last_page_len,
                                const __nv_bfloat16* q, float* scores, float* out, int num_q_heads,
                                int num_kv_heads, int page_size, int max_len, float scale) {
  const int s = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
  const int kv_head = h / (num_q_heads / num_kv_heads);
  const int pages = page_indptr[s + 1] - page_indptr[s];
  const int len = (pages - 1) * page_size + last_page_len[s];
  const int64_t page_elems = int64_t{2} * num_kv_heads * page_size * kD;
  auto row = [&](int key, int kv_half) {  // K (0) or V (1) row of `key`
    const int64_t page = table[page_indptr[s] + key / page_size];
    return kv + page * page_elems +
           ((int64_t{kv_half} * num_kv_heads + kv_head) * page_size + key % page_size) * kD;
  };
  __shared__ float q_s[kD];
  __shared__ float red[kRefThreads];
  q_s[t] = __bfloat162float(q[(int64_t{s} * num_q_heads + h) * kD + t]);
  __syncthreads();
  float* sc = scores + (int64_t{s} * num_q_heads + h) * max_len;
  float m = -INFINITY;
  for (int key = t; key < len; key += kRefThreads) {
    const __nv_bfloat16* k = row(key, 0);
    float dot = 0;
    for (int d = 0; d < kD; ++d) dot += q_s[d] * __bfloat162float(k[d]);
    sc[key] = dot * scale;
    m = fmaxf(m, dot * scale);
  }
  red[t] = m;
  __syncthreads();
  for (int w = kRefThreads / 2; w > 0; w /= 2) {
    if (t < w) red[t] = fmaxf(red[t], red[t + w]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0;
  for (int key = t; key < len; key += kRefThreads) {
    sc[key] = expf(sc[key] - m);
    sum += sc[key];
  }
  red[t] = sum;
  __syncthreads();
  for (int w = kRefThreads / 2; w > 0; w /= 2) {
    if (t < w) red[t] += red[t + w];
    __syncthreads();
  }
  float acc = 0;
  for (int key = 0; key < len; ++key) acc += sc[key] * __bfloat162float(row(key, 1)[t]);
  out[(int64_t{s} * num_q_heads + h) * kD + t] = acc / red[0];
}

}  // namespace

std::string PeerKvPool::Build(const std::vector<int>& lens, int num_q_heads, int num_kv_heads,
                              int page_size, int64_t rotate_bytes, uint32_t seed) {
  const int n = static_cast<int>(lens.size());
  if (n == 0 || num_kv_heads <= 0 || num_q_heads <= 0 || page_size <= 0 ||
      num_q_heads % num_kv_heads != 0) {
    return "bad batch shape";
  }
  batch_ = PeerBatch{.batch = n,
                     .num_q_heads = num_q_heads,
                     .num_kv_heads = num_kv_heads,
                     .page_size = page_size,
                     .sm_scale = 1.0f / std::sqrt(float{kD})};
  batch_.page_indptr.assign(1, 0);
  for (int len : lens) {
    if (len < 1) return "sequence lengths must be >= 1";
    batch_.page_indptr.push_back(batch_.page_indptr.back() + (len + page_size - 1) / page_size);
    batch_.last_page_len.push_back(len - (len - 1) / page_size * page_size);
    kv_bytes_ += double(len) * num_kv_heads * kD * 2 * 2;
    max_len_ = std::max(max_len_, len);
  }
  table_len_ = batch_.page_indptr.back();
  const int64_t page_elems = int64_t{2} * num_kv_heads * page_size * kD;
  const int64_t set_bytes = table_len_ * page_elems * 2;
  sets_ = static_cast<int>(std::clamp<int64_t>(rotate_bytes / set_bytes + 1, 1, kMaxSets));
  const int64_t num_pages = sets_ * table_len_;
  const int64_t q_elems = int64_t{n} * num_q_heads * kD;
  PEER_TRY(cudaMalloc(&kv_, num_pages * page_elems * 2));
  PEER_TRY(cudaMalloc(&q_, q_elems * 2));
  PEER_TRY(cudaMalloc(&out_, q_elems * 2));
  if (std::string e = Fill(kv_, num_pages * page_elems, seed); !e.empty()) return e;
  if (std::string e = Fill(q_, q_elems, seed + 1); !e.empty()) return e;
  // Block tables: a random permutation of the pool's pages, cut into the copies' tables (as an
  // engine's allocator hands out pages after a while).
  std::vector<int32_t> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed + 2));
  PEER_TRY(cudaMalloc(&tables_, ids.size() * 4));
  PEER_TRY(cudaMemcpy(tables_, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> indptrs = batch_.page_indptr;
  indptrs.insert(indptrs.end(), batch_.last_page_len.begin(), batch_.last_page_len.end());
  for (int i = 0; i <= n; ++i) indptrs.push_back(i);
  PEER_TRY(cudaMalloc(&indptrs_, indptrs.size() * 4));
  PEER_TRY(cudaMemcpy(indptrs_, indptrs.data(), indptrs.size() * 4, cudaMemcpyHostToDevice));
  batch_.kv = kv_;
  batch_.d_page_indptr = indptrs_;
  batch_.d_last_page_len = indptrs_ + n + 1;
  batch_.d_qo_indptr = indptrs_ + 2 * n + 1;
  PEER_TRY(cudaDeviceSynchronize());
  return "";
}

PeerKvPool::~PeerKvPool() {
  for (void* p : {kv_, q_, out_, static_cast<void*>(tables_), static_cast<void*>(indptrs_)}) {
    cudaFree(p);
  }
}

bool PeerKvPool::Check(const void* out, double* max_abs_err, double* err_ratio,
                       std::string* error) const {
  const int64_t rows = int64_t{batch_.batch} * batch_.num_q_heads, q_elems = rows * kD;
  float *scores = nullptr, *ref = nullptr;
  auto fail = [&](cudaError_t e) {
    *error = std::string("reference: ") + cudaGetErrorString(e);
    cudaFree(scores);
    cudaFree(ref);
    return false;
  };
  cudaError_t e = cudaMalloc(&scores, rows * max_len_ * 4);
  if (e == cudaSuccess) e = cudaMalloc(&ref, q_elems * 4);
  if (e != cudaSuccess) return fail(e);
  ReferenceKernel<<<dim3(batch_.batch, batch_.num_q_heads), kRefThreads>>>(
      static_cast<const __nv_bfloat16*>(kv_), table(0), batch_.d_page_indptr,
      batch_.d_last_page_len, static_cast<const __nv_bfloat16*>(q_), scores, ref,
      batch_.num_q_heads, batch_.num_kv_heads, batch_.page_size, max_len_, batch_.sm_scale);
  std::vector<float> h_ref(q_elems);
  std::vector<__nv_bfloat16> h_out(q_elems);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(h_ref.data(), ref, q_elems * 4, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(h_out.data(), out, q_elems * 2, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return fail(e);
  cudaFree(scores);
  cudaFree(ref);
  bool finite = true;
  *max_abs_err = 0;
  *err_ratio = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = h_ref.data() + r * kD;
    double sq = 0;
    for (int d = 0; d < kD; ++d) sq += double(x[d]) * x[d];
    const double row_rms = std::sqrt(sq / kD);
    for (int d = 0; d < kD; ++d) {
      const double o = __bfloat162float(h_out[r * kD + d]), diff = std::fabs(o - x[d]);
      finite = finite && std::isfinite(o);
      *max_abs_err = std::max(*max_abs_err, diff);
      *err_ratio =
          std::max(*err_ratio, diff / (kTolerance * row_rms + kBf16Rounding * std::fabs(x[d])));
    }
  }
  return finite && *err_ratio <= 1.0;
}

}  // namespace tandem::peer
