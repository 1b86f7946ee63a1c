// FlashInfer's decode attention as a peer of tandem's (issue [decode-tc]), in the same GPU call
// as attention_bench: its tensor-core path (batch prefill kernel, one query per request) and its
// CUDA-core BatchDecode, bf16, head_dim 128, paged KV in tandem's page layout, every decode shape
// of the issue at pages 16 and 64 and GQA groups 4 (32 query heads, 8 KV heads: Llama-3-8B) and
// 8 (64 query heads).
//
//   flashinfer_peer             every shape: check, then time both paths
//   flashinfer_peer check       correctness only, on awkward and ragged batches
//   flashinfer_peer one B L page group
//
// Each shape is first checked against an fp32 reference on the GPU (peer_kv_pool.h), then timed
// like attention_bench's decode rows: `us` from CUDA events around max(sets, 10) back-to-back
// launches rotating over the pool's copies (>= 256 MB of K/V, so L2 does not serve them), median
// of 15 repetitions after a warm-up; `graph_us` the same launches captured in one CUDA graph,
// per launch, median of 15 replays. PDL on (FlashInfer's wrappers' default on Hopper);
// TANDEM_PEER_PDL=0 turns it off. One "PEER kernel=decode impl=flashinfer_tc|flashinfer_cc ..."
// line per shape and path (attention_table.py joins them with attention_bench's RESULT lines).
// Exit status 1 if any check failed or any path could not run, 77 without a CUDA device, 2 on
// bad arguments.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/bench/peers/flashinfer_peer.h"
#include "kernels/bench/peers/peer_kv_pool.h"

namespace tandem::peer {
namespace {

constexpr int kNumKvHeads = 8;
constexpr int64_t kRotateBytes = int64_t{256} << 20;
constexpr int kReps = 15;
constexpr int kSkipped = 77;  // exit status without a device (the CTest's SKIP_RETURN_CODE)

struct Shape {
  int batch, len, group;
};
// The issue's shapes; each runs at pages 16 and 64.
constexpr Shape kShapes[] = {{1, 8192, 4},   {8, 4096, 4},   {32, 4096, 4},  {64, 4096, 4},
                             {128, 4096, 4}, {64, 16384, 4}, {256, 2048, 4}, {256, 1024, 4},
                             {256, 640, 4},  {32, 4096, 8},  {128, 4096, 8}};
constexpr int kPageSizes[] = {16, 64};

enum class Impl { kTensorCore, kCudaCore };
const char* ImplName(Impl i) { return i == Impl::kTensorCore ? "flashinfer_tc" : "flashinfer_cc"; }

// "" for success, else the error's name (the harness's error convention, flashinfer_peer.h).
std::string CudaError(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }

bool Pdl() {
  const char* v = std::getenv("TANDEM_PEER_PDL");
  return v == nullptr || std::string_view(v) != "0";
}

// Median over kReps of (time of `inner` calls of fn) / inner, in microseconds; after `inner`
// warm-up calls. Returns a negative value if a call failed (its message in *error).
double MedianUs(const std::function<std::string(int)>& fn, int inner, cudaStream_t stream,
                std::string* error) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int r = -1; r < kReps && error->empty(); ++r) {  // r = -1: warm-up
    cudaEventRecord(start, stream);
    for (int i = 0; i < inner && error->empty(); ++i) *error = fn(i);
    cudaEventRecord(stop, stream);
    if (error->empty()) *error = CudaError(cudaEventSynchronize(stop));
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (r >= 0) times.push_back(1e3 * ms / inner);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!error->empty()) return -1;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Per-launch time of `calls` launches captured in one graph, median of kReps replays.
double GraphUs(const std::function<std::string(int)>& fn, int calls, cudaStream_t stream,
               std::string* error) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < calls && error->empty(); ++i) *error = fn(i);
  cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (e == cudaSuccess && error->empty()) e = cudaGraphInstantiate(&exec, graph, 0);
  if (e != cudaSuccess && error->empty()) *error = std::string("graph: ") + cudaGetErrorString(e);
  double us = -1;
  if (error->empty()) {
    us = MedianUs([&](int) { return CudaError(cudaGraphLaunch(exec, stream)); }, 1, stream, error) /
         calls;
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return us;
}

// Plans `impl` for the pool's batch, checks its output on copy 0, and (if `time`) times it.
// Prints one PEER line; returns false on any failure.
bool RunPath(Impl impl, const PeerKvPool& pool, int len_label, bool time, cudaStream_t stream) {
  const PeerBatch& b = pool.batch();
  const bool pdl = Pdl();
  std::printf("PEER kernel=decode impl=%s B=%d L=%d page=%d group=%d", ImplName(impl), b.batch,
              len_label, b.page_size, b.num_q_heads / b.num_kv_heads);
  std::string error;
  auto path = impl == Impl::kTensorCore ? PlanFlashInferTensorCore(b, stream, &error)
                                        : PlanFlashInferCudaCore(b, stream, &error);
  auto run = [&](int i) {
    return path->Run(pool.q(), pool.out(), pool.table(i % pool.sets()), pdl, stream);
  };
  if (path != nullptr) error = run(0);
  if (error.empty()) error = CudaError(cudaStreamSynchronize(stream));
  double err = 0, ratio = 0;
  const bool ok = error.empty() && pool.Check(pool.out(), &err, &ratio, &error);
  if (!error.empty()) {
    std::printf(" error=\"%s\"\n", error.c_str());
    return false;
  }
  std::printf(" %s pdl=%d max_abs_err=%.2e err_ratio=%.3f check=%s", path->PlanSummary().c_str(),
              int{pdl}, err, ratio, ok ? "ok" : "FAIL");
  if (time && ok) {
    const int calls = std::max(pool.sets(), 10);
    const double us = MedianUs(run, calls, stream, &error);
    const double graph_us = error.empty() ? GraphUs(run, calls, stream, &error) : -1;
    if (!error.empty()) {
      std::printf(" error=\"%s\"\n", error.c_str());
      return false;
    }
    std::printf(" sets=%d us=%.2f TBps=%.3f graph_us=%.2f graph_TBps=%.3f", pool.sets(), us,
                pool.kv_bytes() / us * 1e-6, graph_us, pool.kv_bytes() / graph_us * 1e-6);
  }
  std::printf("\n");
  std::fflush(stdout);
  return ok;
}

// Both paths on one batch of sequences of lengths `lens`; L printed as len_label (-1: ragged).
bool RunBatch(const std::vector<int>& lens, int len_label, int page, int group, bool time,
              cudaStream_t stream) {
  PeerKvPool pool;
  const std::string error = pool.Build(lens, group * kNumKvHeads, kNumKvHeads, page,
                                       time ? kRotateBytes : 0, /*seed=*/1234 + page + group);
  if (!error.empty()) {
    for (Impl impl : {Impl::kTensorCore, Impl::kCudaCore}) {
      std::printf("PEER kernel=decode impl=%s B=%zu L=%d page=%d group=%d error=\"%s\"\n",
                  ImplName(impl), lens.size(), len_label, page, group, error.c_str());
    }
    return false;
  }
  bool ok = true;
  for (Impl impl : {Impl::kTensorCore, Impl::kCudaCore}) {
    ok = RunPath(impl, pool, len_label, time, stream) && ok;
  }
  return ok;
}

// Correctness only: awkward lengths (one key, partial last pages, one short page of 64),
// odd batch sizes, and ragged batches, both groups and both page sizes.
bool CheckAll(cudaStream_t stream) {
  bool ok = true;
  std::mt19937 rng(7);
  for (int page : kPageSizes) {
    for (int group : {4, 8}) {
      for (const auto& [batch, len] :
           {std::pair{1, 1}, {1, 63}, {7, 1000}, {19, 111}, {3, 16385}}) {
        ok = RunBatch(std::vector<int>(batch, len), len, page, group, false, stream) && ok;
      }
      for (int batch : {5, 77}) {
        std::vector<int> lens(batch);
        for (int& l : lens) l = std::uniform_int_distribution<int>(1, 5000)(rng);
        ok = RunBatch(lens, -1, page, group, false, stream) && ok;
      }
    }
  }
  return ok;
}

}  // namespace
}  // namespace tandem::peer

int main(int argc, char** argv) {
  using namespace tandem::peer;
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (!(mode.empty() && argc == 1) && !(mode == "check" && argc == 2) &&
      !(mode == "one" && argc == 6)) {
    std::fprintf(stderr, "usage: flashinfer_peer [check | one B L page group]\n");
    return 2;
  }
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "flashinfer_peer: no CUDA device, skipped\n");
    return kSkipped;
  }
  bool ok = true;
  if (mode == "check") {
    ok = CheckAll(stream);
  } else if (mode == "one") {
    const int batch = std::atoi(argv[2]), len = std::atoi(argv[3]);
    ok = batch > 0 && RunBatch(std::vector<int>(batch, len), len, std::atoi(argv[4]),
                               std::atoi(argv[5]), true, stream);
  } else {
    for (const Shape& s : kShapes) {
      for (int page : kPageSizes) {
        ok = RunBatch(std::vector<int>(s.batch, s.len), s.len, page, s.group, true, stream) && ok;
      }
    }
  }
  std::printf("PEER kernel=summary status=%s\n", ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
