// Linear layer with quantized weights: c[m, n] = a[m, k] · dequant(w)[n, k]ᵀ (+ bias[n]), the
// GemmArgs contract (kernels/gemm/gemm.h) with the weight in one of three code types and fp32
// scales, in the one canonical layout every checkpoint format is converted to at load time
// (engine/model/quant_checkpoint.cc: FP8 per-channel and block, compressed-tensors INT8, AWQ and
// GPTQ INT4):
//
//   dequant(w)[j, kk] = (code(j, kk) - zero(j, g)) * scales[j * num_groups + g],
//   g = kk / group_size, num_groups = ceil(k / group_size)   (the last group may be partial)
//
// A per-output-channel scale is group_size = k; a 128x128 block scale is group_size = 128 with
// the block's scale repeated on each of its rows (so fused q/k/v rows concatenate freely).
//
// Activations may be quantized to FP8 e4m3 on the fly (W8A8, "dynamic" activation scales):
// a row's (or a row's group's) scale is max|a| / 448, each element is rounded to e4m3 at that
// scale and the product uses the rounded values.
//
// QuantGemmRef dequantizes each weight tile to fp32 and then runs GemmRef's loop: fp32
// accumulation in increasing kk, bias (and with accumulate the old c) added before the one
// rounding to c_dtype. So a quantized model and a dense fp32 model whose weights are exactly
// the dequantized values give the same bits.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"
#include "kernels/gemm/gemm.h"
#include "kernels/quant_gemm/quant_gemm_tc_split.h"

namespace tandem {

enum class QuantCode : uint8_t {
  kFp8E4M3,  // one byte per weight, e4m3 (kernels/quant_gemm/fp8_e4m3.h); zero 0
  kInt8,     // one byte per weight, two's complement -128..127; zero 0
  kUint4,    // two weights per byte (below); codes 0..15, zero points from `zeros`
};

enum class ActQuant : uint8_t {
  kNone,              // a is used as it is (weight-only: W8A16, W4A16)
  kFp8PerToken,       // one scale per row of a
  kFp8PerTokenGroup,  // one scale per row and group of act_group_size along k
};

// QuantGemmTc's split-K scratch (WORKLOG.md step 8), preallocated by the caller (a call never
// allocates: it is captured into CUDA graphs). Calls that use it must be ordered (one stream, or
// PDL launches: the kernel touches it only after griddepcontrol.wait).
struct QuantTcWorkspace {
  // [partial_floats] fp32, contents free between calls: the splits' partial sums of a call,
  // [row tiles, splits, 32 rows x m_tile tokens] in the kernel's accumulator order (not [m, n]:
  // each block writes and its tile's last block reads whole 128-byte lines).
  float* partials = nullptr;
  int64_t partial_floats = 0;
  // [num_counters] arrival counters, one per 32-row tile. Zero before the first call (cudaMemset
  // once); every call leaves them zero (the last block of a tile resets its counter), so graph
  // replays need no reset.
  uint32_t* counters = nullptr;
  int64_t num_counters = 0;
};

// How a weight's codes lie in memory.
enum class QuantLayout : uint8_t {
  // [n, QuantRowBytes] row-major (below): every kernel and the reference.
  kRowMajor,
  // The tensor-core kernels' tile-major layout (QuantGemv only, WORKLOG.md step 10): 16-row tiles
  // of 64-byte chunks (QuantGemmTcChunkK weights), each tile's chunk as 1 KB in the order its
  // warp loads it: the 16 bytes at ((tile * chunks + chunk) * 2 + h) * 512 + 16 * (4 g + t) are
  // bytes [16 t, 16 t + 16) of that chunk of row 16 tile + 8 h + g (g 0..7, t 0..3, h 0..1; zero
  // past n). Each 16-byte load of a warp then lands in one 512-byte contiguous run instead of 8
  // rows' 64-byte pieces. QuantTc16Bytes is its size, QuantRepackTc16 writes it.
  kTc16,
};

struct QuantGemmArgs {
  const void* a = nullptr;     // [m, k] row-major, a_dtype (kF32 or kBF16)
  const void* bias = nullptr;  // [n], c_dtype; may be null
  void* c = nullptr;           // [m, n] row-major, c_dtype (kF32 or kBF16)
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  DType a_dtype = DType::kF32;
  DType c_dtype = DType::kF32;
  bool accumulate = false;  // c += ... (GemmArgs::accumulate)
  // QuantGemmSkinny and QuantGemmTc only: launch with programmatic dependent launch
  // (GemmArgs::overlap_launch's contract: w, scales and zeros are not written by any kernel that
  // may still be running).
  bool overlap_launch = false;

  QuantCode code = QuantCode::kInt8;
  // kFp8E4M3 / kInt8: [n, k] bytes, row-major. kUint4: [n, ceil(k / 2)] bytes: weight (j, kk)
  // is in byte j * ceil(k / 2) + kk / 2, the low nibble for even kk, the high nibble for odd.
  const uint8_t* w = nullptr;
  const float* scales = nullptr;  // [n, num_groups] fp32
  // kUint4 only: [n, num_groups] zero points, 0..16 (GPTQ's stored zero + 1 can reach 16);
  // null means 8 (symmetric). Must be null for the 8-bit codes.
  const uint8_t* zeros = nullptr;
  int64_t group_size = 0;  // along k, >= 1 (k: one scale per output channel)

  ActQuant act_quant = ActQuant::kNone;
  int64_t act_group_size = 128;  // kFp8PerTokenGroup only

  // QuantGemmTc only. Without a workspace (or with one too small for the plan) a call runs
  // unsplit. tc_splits: 0 the automatic plan (QuantGemmTcPlan); S >= 1 forces S splits (as near
  // as whole groups allow; tests and kb_bench), an error if the workspace cannot hold them.
  QuantTcWorkspace tc_workspace = {};
  int tc_splits = 0;
  // QuantGemv only: chunks in flight per warp (2, 4 or 8; 0 the default, 8). Tests and kb_bench.
  int gemv_depth = 0;
  // QuantGemv reads kRowMajor and kTc16; every other kernel and QuantGemmRef kRowMajor only.
  QuantLayout layout = QuantLayout::kRowMajor;
};

inline int64_t QuantNumGroups(int64_t k, int64_t group_size) {
  return (k + group_size - 1) / group_size;
}
// Bytes of one row of codes.
inline int64_t QuantRowBytes(QuantCode code, int64_t k) {
  return code == QuantCode::kUint4 ? (k + 1) / 2 : k;
}

// dequant(w)[j, 0 : k] into out[0 : k] (fp32).
void QuantDequantizeRow(const QuantGemmArgs& args, int64_t j, float* out);

// Rounds x[0 : k] in place to e4m3 at dynamic scales (act_quant, act_group_size), as the GEMM
// does to each row of a.
void QuantizeActivationRow(ActQuant act_quant, int64_t act_group_size, int64_t k, float* x);

// The multi-threaded CPU reference (and the CPU backend's quantized hot path).
void QuantGemmRef(const QuantGemmArgs& args);

// A quantized weight's args (codes, scales, shape) with a linear layer's call: its activations,
// bias, output, rows, dtypes and accumulate (GemmArgs' shape is the caller's to check).
inline QuantGemmArgs WithActivations(QuantGemmArgs q, const GemmArgs& a) {
  q.a = a.a;
  q.bias = a.bias;
  q.c = a.c;
  q.m = a.m;
  q.a_dtype = a.a_dtype;
  q.c_dtype = a.c_dtype;
  q.accumulate = a.accumulate;
  q.overlap_launch = a.overlap_launch;
  return q;
}

// CUDA, decode-shaped (quant_gemm.cu): weight-only kInt8 (W8A16), kUint4 (W4A16) and kFp8E4M3
// codes with act_quant kNone (FP8 W8A8 runs QuantizeActivations first, then this kernel on the
// rounded activations), m <= kQuantSkinnyMaxM, a and c both kBF16 or both kF32. Needs k % 32 == 0,
// group_size == k or a multiple of 32, and 16-byte-aligned w and a; anything else is
// InvalidArgument (QuantGemmSkinnyCovers says so without launching; the caller then takes the
// dequantize + dense GEMM path). fp32 accumulation in an order other than the reference's:
// results match QuantGemmRef to rounding, not bit for bit. Above m = 4 the fp32 FMAs (m per
// weight) make it slower than dequantizing into bf16 and running the dense GEMM (measured:
// WORKLOG.md step 3).
inline constexpr int64_t kQuantSkinnyMaxM = 4;
absl::Status QuantGemmSkinnyCovers(const QuantGemmArgs& args);
absl::Status QuantGemmSkinny(const QuantGemmArgs& args, cudaStream_t stream);

// CUDA, mixed-input tensor cores (quant_gemm_tc.cu): weight-only kInt8 (W8A16) and kUint4
// (W4A16) codes with act_quant kNone, a and c kBF16, 1 <= m <= kQuantTcMaxM: the codes are read
// once and dequantized in registers straight into mma.sync operands (WORKLOG.md step 7), instead
// of QuantDequantize into bf16 + the dense GEMM. Needs k and group_size (unless it is k) to be
// multiples of QuantGemmTcChunkK(code) (64 for int8, 128 for uint4; a partial last group is
// fine), 16-byte-aligned w and a; n is free. Anything else is InvalidArgument without a launch
// (QuantGemmTcCovers). Bias and accumulate as GemmArgs, one rounding to bf16; fp32 accumulation
// of exact code values, scaled per group in fp32: matches QuantGemmRef to fp32 summation order.
// QuantGemmArgs::overlap_launch launches it with PDL. Deterministic (fixed reduction order).
// Split-K across blocks (quant_gemm_tc_split.h, WORKLOG.md step 8) where the 32-row tiles alone
// give too few blocks for the device: one launch, each split's fp32 partial into
// args.tc_workspace, and the last block of each row tile to arrive sums the tile's partials in
// split order (bitwise the same on every run, whatever the arrival order), then bias / the old c
// and the one bf16 rounding. Scales stay per group in fp32; a split boundary is a group boundary.
inline constexpr int64_t kQuantTcMaxM = 64;
int64_t QuantGemmTcChunkK(QuantCode code);
absl::Status QuantGemmTcCovers(const QuantGemmArgs& args);
absl::Status QuantGemmTc(const QuantGemmArgs& args, cudaStream_t stream);
// The split plan a QuantGemmTc call of these args runs (args.tc_splits and the workspace taken
// into account; the shape QuantGemmTcCovers). Host; queries the current device's SM count and the
// kernel's occupancy once per process (call it, or QuantGemmTcWorkspaceFloats, outside graph
// capture first).
QuantTcSplitPlan QuantGemmTcPlan(const QuantGemmArgs& args);
// Workspace a weight needs so that every automatic plan of m <= max_m tokens can split: fp32
// partials (QuantTcWorkspace::partial_floats) and counters (num_counters). Only w's shape,
// code, group_size and overlap_launch are read.
int64_t QuantGemmTcWorkspaceFloats(const QuantGemmArgs& w, int64_t max_m);
inline int64_t QuantGemmTcWorkspaceCounters(int64_t n) { return QuantTcRowTiles(n); }

// CUDA, tensor-core GEMV for decode steps (quant_gemv.cu): QuantGemmTc's contract and numbers
// (the same dequantization into mma.sync operands, fp32 sums of exact code values scaled per group
// in fp32, one rounding to bf16, deterministic) for 1 <= m <= kQuantGemvMaxM, with a structure for
// one 8-token tile (WORKLOG.md step 10): persistent blocks of 16-row tiles, each warp streaming its
// chunks through a ring of gemv_depth slots in flight across tile boundaries, no split-K
// workspace. QuantGemvCovers: QuantGemmTcCovers plus the m range, InvalidArgument otherwise.
// QuantGemmArgs::overlap_launch launches it with PDL. Measured slower than QuantGemmSkinny at m = 1
// and QuantGemmTc at m >= 2 on an H100 (WORKLOG.md step 10): CudaOps runs it only with
// TANDEM_QUANT_GEMV=1, a base for the next attempt at batch 1.
inline constexpr int64_t kQuantGemvMaxM = 8;
absl::Status QuantGemvCovers(const QuantGemmArgs& args);
absl::Status QuantGemv(const QuantGemmArgs& args, cudaStream_t stream);

// Bytes of an INT8 / UINT4 weight's codes in QuantLayout::kTc16 (n rounded up to 16 rows; k a
// multiple of QuantGemmTcChunkK).
int64_t QuantTc16Bytes(QuantCode code, int64_t n, int64_t k);
// The byte offset in QuantLayout::kTc16 of byte `byte` (0 .. QuantRowBytes - 1) of row j: the
// layout's definition, for host code and tests.
int64_t QuantTc16Offset(QuantCode code, int64_t k, int64_t j, int64_t byte);
// CUDA (quant_gemv.cu): w's row-major codes (args.w, n, k, code; layout kRowMajor) rewritten into
// out (QuantTc16Bytes of them, not overlapping w) in QuantLayout::kTc16. InvalidArgument for a
// shape QuantGemmTcCovers would refuse (code, k).
absl::Status QuantRepackTc16(const QuantGemmArgs& w, uint8_t* out, cudaStream_t stream);

// CUDA (quant_dequant.cu): dequant(w) [n, k] into out (out_dtype kF32 or kBF16, row-major), for
// every code, any k and group size: out[j, kk] = QuantDequantizeRow's value, rounded once to
// out_dtype (bit-exact with it in kF32). Only w, scales, zeros, code, n, k and group_size of
// `args` are read. The prefill path of a quantized layer: dequantize into a scratch buffer, then
// the dense GEMM.
absl::Status QuantDequantize(const QuantGemmArgs& args, void* out, DType out_dtype,
                             cudaStream_t stream);

// CUDA (quant_dequant.cu): out[i, :] = x[i, :] rounded to e4m3 at dynamic scales, as
// QuantizeActivationRow does (scale = max|x| / 448 per row or per row and act_group_size group;
// an all-zero group is copied as it is), then stored in `dtype` (kF32: bit-exact with the
// reference on the same fp32 input; kBF16: the reference's value rounded once to bf16). x and
// out are [m, k] row-major in `dtype` and may be the same buffer. act_quant kNone copies.
absl::Status QuantizeActivations(ActQuant act_quant, int64_t act_group_size, const void* x,
                                 void* out, int64_t m, int64_t k, DType dtype, cudaStream_t stream);

}  // namespace tandem
