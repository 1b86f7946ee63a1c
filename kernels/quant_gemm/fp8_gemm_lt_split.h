// Our own split-k for the cuBLASLt FP8 GEMM with outer-vector scales (kernels/quant_gemm/
// WORKLOG.md step 6), for the decode step's narrow GEMMs: at n = 4096 and m = 256 a 128x128-tile
// GEMM has 64 output tiles for 132 SMs, and cuBLASLt's heuristic offers one FP8 algorithm
// (run 36), with split-k of its own unknown until measured. Here k is cut into S parts at
// multiples of 128; part s is an ordinary cuBLASLt FP8 matmul of the weight's and the codes'
// columns [k0, k0 + ks) (leading dimension k, so no copy) into its own fp32 buffer [m, n], with
// the same per-channel and per-token scales (they factor out of the sum over k: each part is
// sa(i) sw(j) times its partial dot product); the parts run on forked streams joined by events,
// so S small GEMMs fill S times the SMs, and one kernel sums them in a fixed order (+ bias, + c
// when accumulating) and rounds once to bf16. Capturable in a CUDA graph once a stream's side
// streams, events and fp32 buffer exist (made by the stream's first eager split call; a call
// under capture without them takes the unsplit GEMM).
//
// Taken only where it can pay and is exact in its layout: TANDEM_FP8_SPLITK=S (2..4; unset or 0:
// off, the default until measured), per-channel weights with per-token activations (the block
// scales along k would need a repacked scale array per part), kFp8LtSplitMinRows <= m <=
// kFp8LtSplitMaxRows with m % 4 == 0 (every decode graph size above 64), n <= kFp8LtSplitMaxN and
// at least kFp8LtSplitMinK of k per part. Everything else, and a part plan cuBLASLt refuses,
// runs the unsplit GEMM.
//
// Memory, per calling stream that splits: 64 MiB of fp32 parts (sized for S = 4, m = 512,
// n = 8192, so it is never replaced under a captured graph) and one 32 MiB cuBLASLt workspace per
// side stream used, allocated outside the engine's gpu_memory_utilization budget (in the memory it
// leaves free, as the tuner's scratch is).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/stream.h"

namespace tandem {

inline constexpr int kFp8LtMaxSplit = 4;
inline constexpr int64_t kFp8LtSplitMinRows = 65;  // 64 < m: below, the GEMM is weight-bound
inline constexpr int64_t kFp8LtSplitMaxRows = 512;
inline constexpr int64_t kFp8LtSplitMaxN = 8192;
inline constexpr int64_t kFp8LtSplitMinK = 512;  // 4 FP8 k-blocks of 128 per part
inline constexpr int64_t kFp8LtSplitAlign = 128;

// TANDEM_FP8_SPLITK, read once per process (2..kFp8LtMaxSplit; anything else: 0, off), unless
// SetFp8LtSplitK has overridden it (tests and the benchmark).
int Fp8LtSplitK();
void SetFp8LtSplitK(int splits);

class ScopedFp8LtSplitK {
 public:
  explicit ScopedFp8LtSplitK(int splits) : was_(Fp8LtSplitK()) { SetFp8LtSplitK(splits); }
  ~ScopedFp8LtSplitK() { SetFp8LtSplitK(was_); }
  ScopedFp8LtSplitK(const ScopedFp8LtSplitK&) = delete;
  ScopedFp8LtSplitK& operator=(const ScopedFp8LtSplitK&) = delete;

 private:
  int was_;
};

// One part of k: columns [k0, k0 + k) of the weight and of the activation codes.
struct Fp8LtSplitPart {
  int64_t k0 = 0;
  int64_t k = 0;
};

// The parts of a call's k for `splits` parts (boundaries at multiples of kFp8LtSplitAlign, the
// longer parts first, the last part taking k's remainder below 128), or none when the call does
// not qualify (above: per_channel, m, n, k). Host only.
std::vector<Fp8LtSplitPart> Fp8LtSplitParts(int64_t m, int64_t n, int64_t k, bool per_channel,
                                            int splits);

// fp8_gemm_lt.cu: c[i, j] = round_bf16(sum_s parts[s][i, j] (+ bias[j]) (+ c[i, j] when
// accumulating)), parts [splits][m, n] fp32 contiguous, n % 4 == 0; the parts summed in order.
absl::Status Fp8LtSumParts(const float* parts, int splits, const void* bias, void* c, int64_t m,
                           int64_t n, bool accumulate, cudaStream_t stream);

// Calls that took the split path in this process (tests check it ran; monotonic).
int64_t Fp8LtSplitCalls();

}  // namespace tandem
