// Inputs of the decode-attention peer benchmark (flashinfer_peer_main.cu) and their check: a
// paged bf16 KV pool in tandem's layout holding `sets` disjoint copies of one batch's pages (so
// back-to-back runs rotating over the copies read DRAM, not the 60 MB L2), each copy's block
// table a random permutation of pool pages, random q, and an fp32 reference on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/bench/peers/flashinfer_peer.h"

namespace tandem::peer {

class PeerKvPool {
 public:
  // Allocates and fills everything for sequences of lengths `lens` (each >= 1): enough copies
  // that all of them hold >= rotate_bytes of K/V (at most 8, at least 1). Random bf16 in [-1, 1)
  // from `seed`, never zeros. Returns "" or the error; on error the pool is unusable.
  std::string Build(const std::vector<int>& lens, int num_q_heads, int num_kv_heads, int page_size,
                    int64_t rotate_bytes, uint32_t seed);
  ~PeerKvPool();

  // The batch the FlashInfer paths plan for (kv, indptrs on the device), shared by every copy.
  const PeerBatch& batch() const { return batch_; }
  int sets() const { return sets_; }
  // Device block table of copy `set` (page_indptr.back() page ids).
  const int32_t* table(int set) const { return tables_ + int64_t{set} * table_len_; }
  const void* q() const { return q_; }  // [batch, num_q_heads, head_dim] bf16
  void* out() const { return out_; }    // same shape, for the path under test
  // K and V bytes one decode reads: sum of lens * num_kv_heads * head_dim * 2 (K, V) * 2 bytes.
  double kv_bytes() const { return kv_bytes_; }

  // Compares `out` (bf16, [batch, num_q_heads, head_dim], computed from copy 0) with the fp32
  // reference of copy 0. Passes if every output is finite and within kTolerance * (RMS of its
  // reference row) + kBf16Rounding * |reference| of it: a wrong page, head or scale moves outputs
  // by about their row's RMS; bf16 rounding of P stays well below 1% of it, and of the output
  // itself below one bf16 ulp (2^-7 relative). Sets max |out - ref| and the worst ratio of an
  // error to its bound (<= 1 passes).
  static constexpr double kTolerance = 0.05;
  static constexpr double kBf16Rounding = 1.0 / 128;
  bool Check(const void* out, double* max_abs_err, double* err_ratio, std::string* error) const;

 private:
  PeerBatch batch_;
  int sets_ = 0;
  int64_t table_len_ = 0;
  int max_len_ = 0;
  double kv_bytes_ = 0;
  void* kv_ = nullptr;
  void* q_ = nullptr;
  void* out_ = nullptr;
  int32_t* tables_ = nullptr;
  int32_t* indptrs_ = nullptr;  // page indptr [batch + 1], last_page_len [batch], qo [batch + 1]
};

}  // namespace tandem::peer
