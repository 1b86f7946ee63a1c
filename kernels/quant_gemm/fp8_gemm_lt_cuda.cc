// The cuBLASLt half of the FP8 W8A8 path (fp8_gemm_lt.h): the per-device handle + workspace +
// plan cache and the matmuls (the format checks and the weight-scale packing are
// fp8_gemm_lt_scales_cuda.cc). The conventions of kernels/gemm/gemm_lt_cuda.cc: plans per shape,
// the heuristic's first algorithm or, with tuning on, the fastest of its candidates and of the
// extra configurations cuBLASLt accepts (kernels/common/cublaslt_autotune.h; the heuristic offers
// a single FP8 algorithm for these scale modes on CUDA 13), scale / bias pointers set on the cached
// descriptor under the device's mutex before each enqueue. Every cuBLASLt call is checked; a
// refusal while planning (no algorithm, or a configuration cuBLASLt calls unsupported) is cached
// and returned as Unimplemented, so the caller's fallback costs no further heuristic query.
#include <cublasLt.h>
#include <cublas_v2.h>  // cublasGetStatusString, used by CUBLAS_RETURN_IF_ERROR
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/common/cublaslt_device.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/fp8_gemm_lt_layout.h"
#include "kernels/quant_gemm/fp8_gemm_lt_split.h"

namespace tandem {
namespace {

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The scale modes of one call: weight (cuBLASLt's A) and activations (B).
struct Modes {
  cublasLtMatmulMatrixScale_t w, a;
};
Modes ModesOf(Fp8LtWeightScales w) {
  switch (w) {
    case Fp8LtWeightScales::kPerChannel:
      return {CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
              CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F};
    case Fp8LtWeightScales::kBlock128x128:
      return {CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F};
    case Fp8LtWeightScales::kRow128:
      break;
  }
  return {CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F};
}

struct Plan {
  absl::Status status;  // a cached refusal (Unimplemented) when not OK
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, a_layout = nullptr, d_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// (rows of the call, n, k, weight scale mode, D fp32 (the tail or a split part), bias,
// accumulate, tuning mode as LtTuneMode encodes it, leading dimension of w and a (0: k; a split
// part's k is a slice of the full rows)) -> plan (rows first: ChooseLtAlgo's bucket).
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int, bool, bool, bool, int, int64_t>;

using LtDevice = CublasLtDevice<PlanKey, Plan>;  // kernels/common/cublaslt_device.h

absl::StatusOr<LtDevice*> DeviceContext() {
  return CublasLtDeviceContext<PlanKey, Plan>(kFp8LtWorkspaceBytes);
}

// A planning-time cuBLASLt status: success, a refusal of this configuration (Unimplemented:
// the caller falls back), or an error.
absl::Status PlanStatus(cublasStatus_t st, const char* what, const PlanKey& key) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg =
      absl::StrCat("cuBLASLt FP8: ", what, " failed (", cublasGetStatusString(st),
                   ") for rows=", std::get<0>(key), " n=", std::get<1>(key),
                   " k=", std::get<2>(key), " weight scales ", std::get<3>(key));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
      st == CUBLAS_STATUS_ARCH_MISMATCH) {
    return absl::UnimplementedError(msg);
  }
  return absl::InternalError(msg);
}

#define PLAN_CHECK(expr, what)                                                \
  do {                                                                        \
    if (absl::Status _s = PlanStatus((expr), what, key); !_s.ok()) return _s; \
  } while (0)

// The pointers of the call that makes a plan: its scale and bias pointers go on the
// descriptor (each call sets its own after), and the tuner reads w and a and runs on the
// stream's workspace.
struct PlanCall {
  const void* w = nullptr;  // [n, k] e4m3 codes (cuBLASLt's A)
  const void* w_scales = nullptr;
  const void* a = nullptr;  // [rows, k] e4m3 activation codes (B)
  const void* a_scales = nullptr;
  const void* bias = nullptr;
  void* workspace = nullptr;  // the stream's (kFp8LtWorkspaceBytes)
  cudaStream_t stream = nullptr;
};

// The descriptors of one configuration.
absl::Status MakeDescriptors(const PlanKey& key, Modes modes, const PlanCall& call, Plan& plan) {
  const auto [rows, n, k, wmode, d_f32, has_bias, accumulate, tune, ld] = key;
  const cudaDataType_t d_type = d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  PLAN_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  PLAN_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)),
      "TRANSA");
  PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans,
                                            sizeof(no_trans)),
             "TRANSB");
  // Promote partial sums to fp32 (the block modes allow nothing else; outer vectors could).
  const int8_t fast_accum = 0;
  PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                            sizeof(fast_accum)),
             "FAST_ACCUM");
  const int32_t a_mode = modes.w, b_mode = modes.a;  // cuBLASLt's A is the weight
  PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                            sizeof(a_mode)),
             "A_SCALE_MODE");
  PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                            sizeof(b_mode)),
             "B_SCALE_MODE");
  PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                            &call.w_scales, sizeof(call.w_scales)),
             "A_SCALE_POINTER");
  PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                            &call.a_scales, sizeof(call.a_scales)),
             "B_SCALE_POINTER");
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    PLAN_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        "EPILOGUE");
    PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                              &bias_type, sizeof(bias_type)),
               "BIAS_DATA_TYPE");
    PLAN_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                              &call.bias, sizeof(call.bias)),
               "BIAS_POINTER");
  }
  const int64_t lda = ld > 0 ? ld : k;
  PLAN_CHECK(cublasLtMatrixLayoutCreate(&plan.w_layout, CUDA_R_8F_E4M3, k, n, lda), "w layout");
  PLAN_CHECK(cublasLtMatrixLayoutCreate(&plan.a_layout, CUDA_R_8F_E4M3, k, rows, lda), "a layout");
  PLAN_CHECK(cublasLtMatrixLayoutCreate(&plan.d_layout, d_type, n, rows, n), "d layout");
  return absl::OkStatus();
}

// Descriptors and the algorithm for one configuration: the heuristic's first, or with tuning
// the fastest of its candidates (and of the extra configurations, in tuning mode 2) on this
// call's inputs, or the forced candidate of the test hook.
absl::Status MakePlan(LtDevice& dev, const PlanKey& key, Modes modes, const PlanCall& call,
                      Plan& plan) {
  RETURN_IF_ERROR(MakeDescriptors(key, modes, call, plan));
  const auto [rows, n, k, wmode, d_f32, has_bias, accumulate, tune, ld] = key;
  const LtTuneProblem problem{
      .handle = dev.handle,
      .op = plan.op,
      .a_layout = plan.w_layout,
      .b_layout = plan.a_layout,
      .d_layout = plan.d_layout,
      .a = call.w,
      .b = call.a,
      .d_bytes = static_cast<size_t>(rows * n * (d_f32 ? 4 : 2)),
      .beta = accumulate ? 1.0f : 0.0f,
      .workspace = call.workspace,
      .workspace_bytes = kFp8LtWorkspaceBytes,
      .stream = call.stream,
      .label = absl::StrCat("FP8 rows=", rows, " n=", n, " k=", k, " weight scales ", wmode,
                            d_f32 ? " fp32 out" : "", accumulate ? " accumulate" : "",
                            has_bias ? " bias" : "", ld > 0 ? absl::StrCat(" ld=", ld) : "")};
  std::vector<cublasLtMatmulHeuristicResult_t> found;
  PLAN_CHECK(LtHeuristic(problem, tune != 0 ? kLtTuneMaxCandidates : 1, found), "heuristic");
  if (found.empty()) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt FP8: no algorithm for ", problem.label));
  }
  plan.algo = ChooseLtAlgo(dev, key, problem, found, LtModeTunes(tune), tune);
  return absl::OkStatus();
}

void DestroyPlan(Plan& p) {  // a failed plan's partial descriptors (failures are not checked)
  if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
  if (p.w_layout != nullptr) cublasLtMatrixLayoutDestroy(p.w_layout);
  if (p.a_layout != nullptr) cublasLtMatrixLayoutDestroy(p.a_layout);
  if (p.d_layout != nullptr) cublasLtMatrixLayoutDestroy(p.d_layout);
  p.op = nullptr;
  p.w_layout = p.a_layout = p.d_layout = nullptr;
}

// The cached plan for `key` (made on first use; a refusal is cached as its status, a failure
// to get the stream's workspace is returned uncached).
absl::StatusOr<Plan*> GetPlan(LtDevice& dev, const PlanKey& key, Modes modes, PlanCall call) {
  auto it = dev.plans.find(key);
  if (it == dev.plans.end()) {
    ASSIGN_OR_RETURN(call.workspace, dev.WorkspaceFor(call.stream));
    Plan fresh;
    fresh.status = MakePlan(dev, key, modes, call, fresh);
    if (!fresh.status.ok()) DestroyPlan(fresh);
    it = dev.plans.emplace(key, fresh).first;  // std::map nodes are stable; never erased
  }
  if (!it->second.status.ok()) return it->second.status;
  return &it->second;
}

// One call's matmuls: the main GEMM into c and, in the block modes with m % 4 != 0, the 4-row
// tail into the scratch's fp32 region.
struct Calls {
  Fp8LtScratchLayout layout;
  Modes modes;
  PlanKey main, tail;
};

Calls CallsOf(const QuantGemmArgs& args, const Fp8LtWeight& w) {
  Calls c;
  c.layout = Fp8LtLayout(args.act_quant == ActQuant::kFp8PerTokenGroup, args.m, args.k, args.n);
  c.modes = ModesOf(w.mode);
  const int mode = static_cast<int>(w.mode);
  const int tune = LtTuneMode();
  const bool bias = args.bias != nullptr;
  c.main = {c.layout.main_rows, args.n, args.k, mode, false, bias, args.accumulate, tune, 0};
  c.tail = {kFp8LtTailRows, args.n, args.k, mode, true, false, false, tune, 0};
  return c;
}

absl::Status CheckCall(const QuantGemmArgs& args, const Fp8LtWeight& w, const void* scratch,
                       int64_t scratch_bytes) {
  RETURN_IF_ERROR(Fp8LtCovers(args));
  if (w.n != args.n || w.k != args.k || w.w == nullptr || w.scales == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8GemmLt: a [", w.n, ", ", w.k, "] weight asked for [", args.n, ", ", args.k, "]"));
  }
  const bool block_act = args.act_quant == ActQuant::kFp8PerTokenGroup;
  if (block_act != (w.mode != Fp8LtWeightScales::kPerChannel)) {
    return absl::InvalidArgumentError("Fp8GemmLt: weight scales packed for other activations");
  }
  if (!Aligned16(w.w) || !Aligned16(w.scales) || !Aligned16(args.a) || !Aligned16(args.c) ||
      (args.bias != nullptr && !Aligned16(args.bias))) {
    return absl::InvalidArgumentError(
        "Fp8GemmLt: w, scales, a, c and bias must be 16-byte aligned");
  }
  const int64_t need = Fp8LtLayout(block_act, args.m, args.k, args.n).bytes;
  if (scratch == nullptr || scratch_bytes < need ||
      (reinterpret_cast<uintptr_t>(scratch) & 255u) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8GemmLt: needs a 256-byte aligned scratch of ", need, " bytes, got ", scratch_bytes));
  }
  return absl::OkStatus();
}

absl::Status Enqueue(LtDevice& dev, Plan& plan, const void* w, const void* w_scales, const void* a,
                     const void* a_scales, const void* bias, void* d, bool accumulate,
                     cudaStream_t stream) {
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales, sizeof(a_scales)));
  if (bias != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // accumulate: D = A·B + C with C = D (in place, as cuBLASLt allows for equal layouts).
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  auto workspace = dev.WorkspaceFor(stream);
  if (!workspace.ok()) return workspace.status();
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(dev.handle, plan.op, &alpha, w, plan.w_layout, a,
                                        plan.a_layout, &beta, d, plan.d_layout, d, plan.d_layout,
                                        &plan.algo, *workspace, kFp8LtWorkspaceBytes, stream));
  return absl::OkStatus();
}

// The split path's per-stream resources (fp8_gemm_lt_split.h): side streams, the fork and join
// events and the parts' fp32 buffer, for every split up to kFp8LtMaxSplit, so that a graph
// captured with them never sees them replaced (the buffer never grows: 64 MiB, made once). Made
// by the calling stream's first eager split call, with the side streams' cuBLASLt workspaces
// (`sides`: how many side streams have one); never freed.
struct SplitStreams {
  cudaStream_t side[kFp8LtMaxSplit - 1] = {};
  cudaEvent_t fork = nullptr;
  cudaEvent_t join[kFp8LtMaxSplit - 1] = {};
  float* parts = nullptr;  // [kFp8LtMaxSplit][kFp8LtSplitMaxRows, kFp8LtSplitMaxN] fp32
  int sides = 0;
};
constexpr size_t kSplitPartsBytes =
    sizeof(float) * kFp8LtMaxSplit * kFp8LtSplitMaxRows * kFp8LtSplitMaxN;

std::atomic<int64_t> g_split_calls{0};

// The resources of (current device, stream) with at least `splits - 1` side streams ready, or
// nullptr when they are not and the stream is capturing (nothing may be created in a capture:
// the call runs unsplit). With dev.mu held (the map has its own mutex: devices differ).
absl::StatusOr<SplitStreams*> SplitResources(LtDevice& dev, cudaStream_t stream, int splits) {
  static std::mutex map_mu;
  static std::map<std::pair<int, cudaStream_t>, SplitStreams> all;  // guarded by map_mu
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  SplitStreams* r = nullptr;
  {
    std::lock_guard<std::mutex> lock(map_mu);
    r = &all[{device, stream}];  // std::map nodes are stable
  }
  if (r->parts != nullptr && r->sides >= splits - 1) return r;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  if (r->parts == nullptr) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r->fork, cudaEventDisableTiming));
    for (int i = 0; i < kFp8LtMaxSplit - 1; ++i) {
      CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r->side[i], cudaStreamNonBlocking));
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r->join[i], cudaEventDisableTiming));
    }
    CUDA_RETURN_IF_ERROR(cudaMalloc(&r->parts, kSplitPartsBytes));
  }
  for (; r->sides < splits - 1; ++r->sides) {
    RETURN_IF_ERROR(dev.WorkspaceFor(r->side[r->sides]).status());
  }
  return r;
}

// The call through our split-k when it qualifies (fp8_gemm_lt_split.h): false, launching nothing
// and not calling `quantize`, when it does not, when cuBLASLt refuses a part's plan or when the
// resources are missing under capture; true once `quantize`, the parts and the sum are enqueued.
absl::StatusOr<bool> RunSplit(LtDevice& dev, const QuantGemmArgs& args, const Fp8LtWeight& w,
                              const Calls& calls, const uint8_t* codes, const void* a_scales,
                              cudaStream_t stream, absl::FunctionRef<absl::Status()> quantize) {
  const std::vector<Fp8LtSplitPart> parts = Fp8LtSplitParts(
      args.m, args.n, args.k, w.mode == Fp8LtWeightScales::kPerChannel && !calls.layout.block,
      Fp8LtSplitK());
  if (parts.empty()) return false;
  const int splits = static_cast<int>(parts.size());
  std::vector<Plan*> plans(splits);
  for (int s = 0; s < splits; ++s) {
    PlanKey key = calls.main;  // rows m (no tail: m % 4 == 0), the call's n and tuning mode
    std::get<2>(key) = parts[s].k;
    std::get<4>(key) = true;   // fp32 parts
    std::get<5>(key) = false;  // the bias and c join in the sum
    std::get<6>(key) = false;
    std::get<8>(key) = args.k;
    const PlanCall call{.w = w.w + parts[s].k0,
                        .w_scales = w.scales,
                        .a = codes + parts[s].k0,
                        .a_scales = a_scales,
                        .stream = stream};
    absl::StatusOr<Plan*> p = GetPlan(dev, key, calls.modes, call);
    if (!p.ok() && absl::IsUnimplemented(p.status())) return false;
    if (!p.ok()) return p.status();
    plans[s] = *p;
  }
  ASSIGN_OR_RETURN(SplitStreams * r, SplitResources(dev, stream, splits));
  if (r == nullptr) return false;
  RETURN_IF_ERROR(quantize());
  const int64_t part_elems = args.m * args.n;
  CUDA_RETURN_IF_ERROR(cudaEventRecord(r->fork, stream));
  for (int s = 0; s < splits; ++s) {
    cudaStream_t on = s == 0 ? stream : r->side[s - 1];
    if (s > 0) CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(on, r->fork, 0));
    RETURN_IF_ERROR(Enqueue(dev, *plans[s], w.w + parts[s].k0, w.scales, codes + parts[s].k0,
                            a_scales, nullptr, r->parts + s * part_elems, false, on));
    if (s > 0) CUDA_RETURN_IF_ERROR(cudaEventRecord(r->join[s - 1], on));
  }
  for (int s = 1; s < splits; ++s) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, r->join[s - 1], 0));
  }
  RETURN_IF_ERROR(
      Fp8LtSumParts(r->parts, splits, args.bias, args.c, args.m, args.n, args.accumulate, stream));
  g_split_calls.fetch_add(1);
  return true;
}

// Plans for both calls (under dev.mu), then `quantize` (the activations into the scratch), the
// matmuls and the tail kernel (or our split-k, when it is on and the call qualifies).
absl::Status Run(const QuantGemmArgs& args, const Fp8LtWeight& w, void* scratch,
                 int64_t scratch_bytes, cudaStream_t stream,
                 absl::FunctionRef<absl::Status()> quantize) {
  RETURN_IF_ERROR(CheckCall(args, w, scratch, scratch_bytes));
  if (args.m <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(LtDevice * dev, DeviceContext());
  const Calls calls = CallsOf(args, w);
  const Fp8LtScratchLayout& l = calls.layout;
  uint8_t* base = static_cast<uint8_t*>(scratch);
  const uint8_t* codes = base + l.codes;
  const void* a_scales = base + l.scales;
  const void* tail_scales = base + l.tail_scales;
  float* tail_out = reinterpret_cast<float*>(base + l.tail_out);
  std::lock_guard<std::mutex> lock(dev->mu);
  ASSIGN_OR_RETURN(const bool split,
                   RunSplit(*dev, args, w, calls, codes, a_scales, stream, quantize));
  if (split) return absl::OkStatus();
  Plan* main = nullptr;
  Plan* tail = nullptr;
  int64_t main_rows = l.main_rows;
  bool tail_split = l.tail;
  if (main_rows > 0) {
    const PlanCall call{.w = w.w,
                        .w_scales = w.scales,
                        .a = codes,
                        .a_scales = a_scales,
                        .bias = args.bias,
                        .stream = stream};
    absl::StatusOr<Plan*> p = GetPlan(*dev, calls.main, calls.modes, call);
    if (!p.ok() && absl::IsUnimplemented(p.status()) && !l.block && l.tail_start < args.m) {
      // Outer vectors refused at m % 4 != 0 too: the block modes' split (the layout holds the
      // tail's scales for this case; the vector's prefix serves the main rows).
      tail_split = true;
      main_rows = l.tail_start;
      PlanKey key = calls.main;
      std::get<0>(key) = main_rows;
      p = main_rows > 0 ? GetPlan(*dev, key, calls.modes, call) : absl::StatusOr<Plan*>(nullptr);
    }
    if (!p.ok()) return p.status();
    main = *p;
  }
  if (tail_split) {
    const PlanCall call{.w = w.w,
                        .w_scales = w.scales,
                        .a = codes + l.tail_start * args.k,
                        .a_scales = tail_scales,
                        .stream = stream};
    ASSIGN_OR_RETURN(tail, GetPlan(*dev, calls.tail, calls.modes, call));
  }
  RETURN_IF_ERROR(quantize());
  if (main != nullptr) {
    RETURN_IF_ERROR(Enqueue(*dev, *main, w.w, w.scales, codes, a_scales, args.bias, args.c,
                            args.accumulate, stream));
  }
  if (tail != nullptr) {
    RETURN_IF_ERROR(Enqueue(*dev, *tail, w.w, w.scales, codes + l.tail_start * args.k, tail_scales,
                            nullptr, tail_out, false, stream));
    RETURN_IF_ERROR(Fp8LtAddTail(tail_out, args.bias, args.c, args.n, l.tail_start, args.m,
                                 args.accumulate, stream));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Fp8LtSplitCalls() { return g_split_calls.load(); }

int64_t Fp8LtScratchBytes(int64_t m, int64_t k, int64_t n) {
  return std::max(Fp8LtLayout(true, m, k, n).bytes, Fp8LtLayout(false, m, k, n).bytes);
}

absl::Status Fp8LtInitDevice() { return DeviceContext().status(); }

absl::Status Fp8LtMatmul(const QuantGemmArgs& args, const Fp8LtWeight& w, void* scratch,
                         int64_t scratch_bytes, cudaStream_t stream) {
  return Run(args, w, scratch, scratch_bytes, stream, [] { return absl::OkStatus(); });
}

absl::Status Fp8GemmLt(const QuantGemmArgs& args, const Fp8LtWeight& w, void* scratch,
                       int64_t scratch_bytes, cudaStream_t stream) {
  return Run(args, w, scratch, scratch_bytes, stream,
             [&] { return Fp8LtQuantizeActivations(args, scratch, scratch_bytes, stream); });
}

absl::Status Fp8GemmLtWith(const QuantGemmArgs& args, const Fp8LtWeight& w, void* scratch,
                           int64_t scratch_bytes, cudaStream_t stream,
                           absl::FunctionRef<absl::Status()> quantize) {
  return Run(args, w, scratch, scratch_bytes, stream, quantize);
}

}  // namespace tandem
