#include "kernels/bench/lt_tune_bench.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/gemm/gemm.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/fp8_gemm_lt_split.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem::bench {
namespace {

void Must(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "lttune: %s: %s\n", what, std::string(s.message()).c_str());
  std::abort();
}

struct Shape {
  const char* name;
  int64_t k, n;
  bool accumulate;  // the served step adds O and down into the residual
};
constexpr Shape kShapes[] = {{"qkv", 4096, 6144, false},
                             {"o", 4096, 4096, true},
                             {"gate_up", 4096, 28672, false},
                             {"down", 14336, 4096, true},
                             {"lm_head", 4096, 128256, false}};
constexpr int64_t kRows[] = {1, 8, 32, 128, 256, 512, 2048, 8192};

// Device buffers of one run, freed at the end.
struct Buffers {
  std::vector<void*> owned;
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    BENCH_CUDA(cudaMalloc(&p, bytes));
    owned.push_back(p);
    return p;
  }
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }
};

// `run(iteration)` timed with the plan made untuned, then tuned (the first warm-up call makes
// each plan, so the tuning is not timed); one row each and a line with the difference.
void TimeBoth(const Ceilings& c, const std::string& path, const Shape& s, int64_t m,
              const std::function<void(int)>& run) {
  const std::string shape = absl::StrCat(s.name, " M=", m, " K=", s.k, " N=", s.n);
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(s.n) * s.k;
  const int iters = m >= 2048 ? 20 : 50;
  double us[2];
  for (bool tuned : {false, true}) {
    ScopedLtAutotune mode(tuned);
    us[tuned] = MedianMicros(run, nullptr, 5, iters);
    Report(absl::StrCat("lttune.", path, tuned ? ".tuned" : ".heuristic"), shape, us[tuned],
           "TFLOP/s", flop * 1e-6 / us[tuned], c.bf16_gemm_tflops);
  }
  std::printf("  lttune.%s %s: heuristic %.2f us, tuned %.2f us (%+.1f%%)\n", path.c_str(),
              shape.c_str(), us[0], us[1], 100.0 * (us[1] - us[0]) / us[0]);
}

// Host scales in quant_gemm.h's layout: per channel (group == k) or per 128x128 block.
std::vector<float> Scales(int64_t n, int64_t k, int64_t group) {
  std::vector<float> s(n * QuantNumGroups(k, group));
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.001f + 0.0001f * static_cast<float>(i % 50);
  if (group != k) {  // the block's first row's scales on all its rows: BLK128x128
    const int64_t groups = QuantNumGroups(k, group);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t g = 0; g < groups; ++g) s[j * groups + g] = s[j / 128 * 128 * groups + g];
    }
  }
  return s;
}

// One FP8 layout's weight (rotated copies beyond L2) and packed scales for a shape, and the
// matmul on copy `it % copies` (the activations quantized once, before timing).
struct Fp8Setup {
  QuantGemmArgs q;
  const Shape* shape = nullptr;
  std::vector<void*> ws;
  const float* scales = nullptr;
  Fp8LtWeightScales mode = Fp8LtWeightScales::kPerChannel;

  absl::Status TryRun(int it, void* scratch, int64_t scratch_bytes,
                      cudaStream_t stream = nullptr) const {
    const Fp8LtWeight w{.w = static_cast<const uint8_t*>(ws[it % ws.size()]),
                        .scales = scales,
                        .n = shape->n,
                        .k = shape->k,
                        .mode = mode};
    return Fp8LtMatmul(q, w, scratch, scratch_bytes, stream);
  }
  void Run(int it, void* scratch, int64_t scratch_bytes, cudaStream_t stream = nullptr) const {
    Must(TryRun(it, scratch, scratch_bytes, stream), "Fp8LtMatmul");
  }
};

std::vector<void*> Fp8Weights(const Shape& s, Buffers& b) {
  const size_t w_bytes = s.n * s.k;
  std::vector<void*> ws(RotationCopies(w_bytes));
  for (size_t i = 0; i < ws.size(); ++i) {
    ws[i] = b.Alloc(w_bytes);
    FillUniformBf16(ws[i], static_cast<int64_t>(w_bytes / 2), 80 + i, -1, 1);  // any e4m3 bytes
  }
  return ws;
}

// `block`: 128x128 weight blocks with per-token-group activations; else per channel / token.
Fp8Setup MakeFp8Setup(const Shape& s, bool block, const std::vector<void*>& ws, Buffers& b, void* a,
                      void* out) {
  const int64_t group = block ? int64_t{128} : s.k;
  const std::vector<float> host = Scales(s.n, s.k, group);
  Fp8Setup f;
  f.shape = &s;
  f.ws = ws;
  f.q = QuantGemmArgs{.a = a,
                      .c = out,
                      .n = s.n,
                      .k = s.k,
                      .a_dtype = DType::kBF16,
                      .c_dtype = DType::kBF16,
                      .accumulate = s.accumulate,
                      .code = QuantCode::kFp8E4M3,
                      .scales = host.data(),
                      .group_size = group,
                      .act_quant = block ? ActQuant::kFp8PerTokenGroup : ActQuant::kFp8PerToken,
                      .act_group_size = kFp8LtBlock};
  absl::StatusOr<Fp8LtPackedScales> packed = Fp8LtPackWeightScales(f.q);
  Must(packed.status(), "Fp8LtPackWeightScales");
  void* scales = b.Alloc(packed->scales.size() * sizeof(float));
  BENCH_CUDA(cudaMemcpy(scales, packed->scales.data(), packed->scales.size() * sizeof(float),
                        cudaMemcpyHostToDevice));
  f.q.scales = nullptr;
  f.scales = static_cast<const float*>(scales);
  f.mode = packed->mode;
  return f;
}

void BenchFp8Shape(const Ceilings& c, const Shape& s, Buffers& b, void* a, void* out, void* scratch,
                   int64_t scratch_bytes) {
  const std::vector<void*> ws = Fp8Weights(s, b);
  for (bool block : {false, true}) {
    Fp8Setup f = MakeFp8Setup(s, block, ws, b, a, out);
    for (int64_t m : kRows) {
      f.q.m = m;
      Must(Fp8LtQuantizeActivations(f.q, scratch, scratch_bytes, nullptr), "quantize");
      TimeBoth(c, absl::StrCat("fp8.", block ? "block" : "channel"), s, m,
               [&](int it) { f.Run(it, scratch, scratch_bytes); });
    }
  }
}

void BenchBf16Shape(const Ceilings& c, const Shape& s, Buffers& b, void* a, void* out) {
  const size_t w_bytes = s.n * s.k * 2;
  std::vector<void*> ws(RotationCopies(w_bytes));
  for (size_t i = 0; i < ws.size(); ++i) {
    ws[i] = b.Alloc(w_bytes);
    FillUniformBf16(ws[i], static_cast<int64_t>(w_bytes / 2), 90 + i, -0.05f, 0.05f);
  }
  for (int64_t m : kRows) {
    TimeBoth(c, "bf16", s, m, [&](int it) {
      const GemmArgs g{.a = a,
                       .w = ws[it % ws.size()],
                       .c = out,
                       .m = m,
                       .n = s.n,
                       .k = s.k,
                       .accumulate = s.accumulate};
      Must(GemmCublasLt(g, nullptr), "GemmCublasLt");
    });
  }
}

// The four FP8 GEMMs of the served decode step and its batch sizes (kernels/quant_gemm/WORKLOG.md
// step 6); lm_head stays bf16 in the served model.
constexpr int64_t kExtraRows[] = {128, 256, 512};
constexpr int kDecodeShapes = 4;  // kShapes[0 .. 4): qkv, o, gate_up, down

double Tflops(const Shape& s, int64_t m, double us) {
  return us > 0 ? 2.0 * static_cast<double>(m) * static_cast<double>(s.n) * s.k * 1e-6 / us : 0;
}

// Every candidate of the plan for (f, its m), forced in turn (ScopedLtForcedCandidate) and timed
// on the rotated weights: the candidate list (heuristic's first) and each one's median µs, -1
// where its launch failed.
struct Landscape {
  LtPlanCandidates list;
  std::vector<double> us;
};

Landscape TimeEveryCandidate(const Fp8Setup& f, void* scratch, int64_t scratch_bytes) {
  Landscape l;
  for (int i = 0;; ++i) {
    ScopedLtForcedCandidate forced(i);
    const int64_t applied = GetLtTuneStats().forced_applied;
    const absl::Status first = f.TryRun(0, scratch, scratch_bytes);  // makes the forced plan
    if (GetLtTuneStats().forced_applied == applied) break;           // past the list's end
    if (i == 0) l.list = LastLtPlanCandidates();
    if (!first.ok() || cudaDeviceSynchronize() != cudaSuccess) {
      cudaGetLastError();
      l.us.push_back(-1);
      continue;
    }
    l.us.push_back(
        MedianMicros([&](int it) { f.Run(it, scratch, scratch_bytes); }, nullptr, 3, 30));
  }
  return l;
}

// The fastest of l.us[lo, hi) (index -1 when none ran).
std::pair<int, double> Best(const Landscape& l, int lo, int hi) {
  std::pair<int, double> best{-1, 0};
  for (int i = lo; i < hi && i < static_cast<int>(l.us.size()); ++i) {
    if (l.us[i] > 0 && (best.first < 0 || l.us[i] < best.second)) best = {i, l.us[i]};
  }
  return best;
}

struct DeviceState {
  Buffers b;
  void* a = nullptr;
  void* out = nullptr;
  void* scratch = nullptr;
  int64_t scratch_bytes = 0;

  DeviceState(int64_t max_m, int64_t max_k, int64_t max_n) {
    a = b.Alloc(max_m * max_k * 2);
    FillUniformBf16(a, max_m * max_k, 5, -1, 1);
    out = b.Alloc(max_m * max_n * 2);
    FillUniformBf16(out, max_m * max_n, 6, -1, 1);  // what the accumulating GEMMs add to
    scratch_bytes = Fp8LtScratchBytes(max_m, max_k, max_n);
    scratch = b.Alloc(scratch_bytes);
    Must(Fp8LtInitDevice(), "Fp8LtInitDevice");
  }
};

void BenchExtraCase(const Ceilings& c, const Shape& s, Fp8Setup& f, bool block, int64_t m,
                    DeviceState& d) {
  f.q.m = m;
  Must(Fp8LtQuantizeActivations(f.q, d.scratch, d.scratch_bytes, nullptr), "quantize");
  const auto run = [&](int it) { f.Run(it, d.scratch, d.scratch_bytes); };
  double heuristic_us = 0, tuned_us = 0;
  {
    ScopedLtAutotune off(false);
    heuristic_us = MedianMicros(run, nullptr, 5, 50);
  }
  {
    ScopedLtAutotune on(true);
    ScopedLtExtraCandidates extras(true);
    tuned_us = MedianMicros(run, nullptr, 5, 50);  // the first warm-up call tunes the plan
  }
  const Landscape l = TimeEveryCandidate(f, d.scratch, d.scratch_bytes);
  const int h = l.list.heuristic, n = static_cast<int>(l.us.size());
  const auto [bi, bus] = Best(l, h, n);
  const std::string layout = block ? "block" : "channel";
  const std::string shape = absl::StrCat(s.name, " M=", m, " K=", s.k, " N=", s.n);
  const auto report = [&](const char* what, double us) {
    Report(absl::StrCat("lttune_extra.fp8.", layout, ".", what), shape, us, "TFLOP/s",
           Tflops(s, m, us), c.bf16_gemm_tflops);
  };
  report("heuristic", heuristic_us);
  report("tuned", tuned_us);
  if (bi >= 0) report("best_extra", bus);
  std::printf(
      "  lttune_extra.fp8.%s %s: heuristic %.2f us (%.0f TFLOP/s), best extra %s (%.0f TFLOP/s)"
      " [%s], tuned %.2f us (%.0f TFLOP/s); %d heuristic + %d extra candidates\n",
      layout.c_str(), shape.c_str(), heuristic_us, Tflops(s, m, heuristic_us),
      bi >= 0 ? absl::StrFormat("%.2f us", bus).c_str() : "none", Tflops(s, m, bus),
      bi >= 0 && bi < static_cast<int>(l.list.names.size()) ? l.list.names[bi].c_str() : "-",
      tuned_us, Tflops(s, m, tuned_us), h, n - h);
}

}  // namespace

void BenchLtExtra(const Ceilings& c) {
  DeviceState d(512, 14336, 28672);
  for (int si = 0; si < kDecodeShapes; ++si) {
    const Shape& s = kShapes[si];
    Buffers weights;  // one shape's weights at a time
    const std::vector<void*> ws = Fp8Weights(s, weights);
    for (bool block : {false, true}) {
      Fp8Setup f = MakeFp8Setup(s, block, ws, weights, d.a, d.out);
      for (int64_t m : kExtraRows) BenchExtraCase(c, s, f, block, m, d);
    }
  }
}

// Microseconds per call of f on each rotated weight once, captured into one CUDA graph and
// replayed (median of 20 replays, divided by the calls): the served step's conditions, where a
// split call's several launches cost the host nothing between them (timed eagerly, a split
// call's ~4 cuBLASLt enqueues would pace the GPU). An eager pass first makes the plans and the
// split's stream resources, as the engine's eager step before a capture does.
double GraphMicros(const Fp8Setup& f, void* scratch, int64_t scratch_bytes, cudaStream_t stream) {
  const int calls = static_cast<int>(f.ws.size());
  for (int i = 0; i < calls; ++i) f.Run(i, scratch, scratch_bytes, stream);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) f.Run(i, scratch, scratch_bytes, stream);
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double us =
      MedianMicros([&](int) { BENCH_CUDA(cudaGraphLaunch(exec, stream)); }, stream, 3, 20);
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  return us / calls;
}

void BenchFp8Split(const Ceilings& c) {
  DeviceState d(512, 14336, 8192);
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int si : {0, 1, 3}) {  // qkv, o, down: the shapes with n <= kFp8LtSplitMaxN
    const Shape& s = kShapes[si];
    Buffers weights;
    const std::vector<void*> ws = Fp8Weights(s, weights);
    Fp8Setup f = MakeFp8Setup(s, /*block=*/false, ws, weights, d.a, d.out);
    BENCH_CUDA(cudaDeviceSynchronize());  // the fills ran on the legacy default stream
    ScopedLtAutotune off(false);
    for (int64_t m : kExtraRows) {
      f.q.m = m;
      // On the timed stream (non-blocking: it does not wait for the legacy default stream).
      Must(Fp8LtQuantizeActivations(f.q, d.scratch, d.scratch_bytes, stream), "quantize");
      BENCH_CUDA(cudaStreamSynchronize(stream));
      const std::string shape = absl::StrCat(s.name, " M=", m, " K=", s.k, " N=", s.n);
      std::string line = absl::StrCat("  fp8split ", shape, ":");
      for (int splits : {0, 2, 3, 4}) {
        ScopedFp8LtSplitK split(splits);
        const int64_t before = Fp8LtSplitCalls();
        const double us = GraphMicros(f, d.scratch, d.scratch_bytes, stream);
        // A split that did not run (a part plan refused) reports as such, not as a time.
        const bool ran = splits == 0 || Fp8LtSplitCalls() > before;
        Report(absl::StrCat("fp8split.channel.", splits == 0 ? "unsplit" : "split"),
               absl::StrCat(shape, " S=", splits), us, "TFLOP/s", Tflops(s, m, us),
               c.bf16_gemm_tflops);
        absl::StrAppend(&line, splits == 0 ? " unsplit " : absl::StrCat(", S=", splits, " "),
                        ran ? absl::StrFormat("%.2f us (%.0f TFLOP/s)", us, Tflops(s, m, us))
                            : std::string("refused (ran unsplit)"));
      }
      std::printf("%s\n", line.c_str());
    }
  }
  BENCH_CUDA(cudaStreamDestroy(stream));
}

void BenchLtDump(const Ceilings& c, const std::string& name, int64_t m, const std::string& layout) {
  const Shape* s = nullptr;
  for (const Shape& x : kShapes) {
    if (name == x.name) s = &x;
  }
  if (s == nullptr || m <= 0 || m > 8192 || m % 4 != 0 ||
      (layout != "channel" && layout != "block")) {
    std::fprintf(stderr,
                 "lttune_dump: usage: kb_bench - lttune_dump qkv|o|gate_up|down|lm_head M "
                 "channel|block (M a multiple of 4, at most 8192)\n");
    std::abort();
  }
  SetLtExtraLimits(2048, 512);  // the whole landscape, not the tuner's bounds
  DeviceState d(m, s->k, s->n);
  Buffers weights;
  const std::vector<void*> ws = Fp8Weights(*s, weights);
  Fp8Setup f = MakeFp8Setup(*s, layout == "block", ws, weights, d.a, d.out);
  f.q.m = m;
  Must(Fp8LtQuantizeActivations(f.q, d.scratch, d.scratch_bytes, nullptr), "quantize");
  const Landscape l = TimeEveryCandidate(f, d.scratch, d.scratch_bytes);
  SetLtExtraLimits(0, 0);
  const std::string shape = absl::StrCat(s->name, " M=", m, " K=", s->k, " N=", s->n);
  std::printf(
      "lttune_dump %s %s: %s; %d heuristic + %d extra candidates, %d configurations "
      "checked\n",
      layout.c_str(), shape.c_str(), l.list.label.c_str(), l.list.heuristic,
      static_cast<int>(l.us.size()) - l.list.heuristic, l.list.extra_checked);
  for (const std::string& caps : l.list.caps) std::printf("  caps %s\n", caps.c_str());
  for (size_t i = 0; i < l.us.size(); ++i) {
    const bool extra = static_cast<int>(i) >= l.list.heuristic;
    const char* config = i < l.list.names.size() ? l.list.names[i].c_str() : "-";
    std::printf("  lttune_dump.%zu %s %s: %.2f us, %.0f TFLOP/s\n", i,
                extra ? "extra" : "heuristic", config, l.us[i], Tflops(*s, m, l.us[i]));
    Report(absl::StrCat("lttune_dump.fp8.", layout, extra ? ".extra" : ".heuristic"),
           absl::StrCat(shape, " ", config), l.us[i], "TFLOP/s", Tflops(*s, m, l.us[i]),
           c.bf16_gemm_tflops);
  }
}

void BenchLtTune(const Ceilings& c) {
  constexpr int64_t kMaxM = 8192, kMaxK = 14336, kMaxN = 128256;
  Buffers b;
  void* a = b.Alloc(kMaxM * kMaxK * 2);
  FillUniformBf16(a, kMaxM * kMaxK, 5, -1, 1);
  void* out = b.Alloc(kMaxM * kMaxN * 2);
  FillUniformBf16(out, kMaxM * kMaxN, 6, -1, 1);  // what the accumulating GEMMs add to
  const int64_t scratch_bytes = Fp8LtScratchBytes(kMaxM, kMaxK, kMaxN);
  void* scratch = b.Alloc(scratch_bytes);
  Must(Fp8LtInitDevice(), "Fp8LtInitDevice");
  Must(GemmInitDevice(), "GemmInitDevice");
  for (const Shape& s : kShapes) {
    Buffers weights;  // one shape's weights at a time
    BenchFp8Shape(c, s, weights, a, out, scratch, scratch_bytes);
    BenchBf16Shape(c, s, weights, a, out);
  }
}

}  // namespace tandem::bench
