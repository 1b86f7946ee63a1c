// Benchmark of the GEMM, elementwise and sampling kernels on H200-sized shapes (Qwen3-8B /
// Llama-3-8B: hidden 4096, intermediate 12288, vocab 152064; the sampler also at Gemma 3's
// 262144). Prints one row per kernel and shape: median time, achieved TB/s or TFLOP/s, and the
// fraction of the ceiling measured in the same run.
// Usage: kb_bench [results.jsonl|-] [all|gemm|elementwise|sampling|logits|quant|fp8|lttune|
//                                    lttune_extra|lttune_dump SHAPE M LAYOUT|fp8split|
//                                    quantone CODE KERNEL M K N [DEPTH]]
// (logits: LogitsProcess and Logprobs, kernels/bench/logits_bench.cc; fp8: the large-m FP8
// W8A8 GEMM paths, kernels/bench/fp8_bench.cc; lttune: the cuBLASLt plans untuned against
// tuned; lttune_extra / lttune_dump: the candidates beyond cuBLASLt's heuristic on the FP8
// decode shapes, and one shape's whole landscape; fp8split: the FP8 GEMM's own split-k,
// kernels/bench/lt_tune_bench.cc; quantone: one quantized GEMM launched 40 times, for ncu,
// kernels/bench/quant_bench.cc; fp8 and these sections not in "all")
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/bench/bench_util.h"
#include "kernels/bench/fp8_bench.h"
#include "kernels/bench/logits_bench.h"
#include "kernels/bench/lt_tune_bench.h"
#include "kernels/bench/quant_bench.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_variants.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_variants.h"
#include "kernels/silu_mul/silu_mul.h"

namespace tandem::bench {
namespace {

void Ok(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::abort();
  }
}

void* Alloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

// Time of one launch of the read-ceiling kernel over `bytes` at buffer(i) (rotated by the caller),
// per event pair like the kernel rows: what one isolated launch that only reads its input takes.
double ReadOnceMicros(const Ceilings& c, const std::function<const void*(int)>& buffer,
                      size_t bytes) {
  auto* sink = static_cast<uint32_t*>(Alloc(4096 * sizeof(uint32_t)));
  const double us = MedianMicros([&](int it) { ReadOnce(c.read_shape, buffer(it), bytes, sink); },
                                 nullptr, 5, 50);
  cudaFree(sink);
  return us;
}

// GEMMs per CUDA graph in the chain rows (a decode step of Llama-3-8B has 4 per layer).
constexpr int kChainLength = 32;

// Time per launch(i, stream) call (GEMM i, or a pair of kernels) of kChainLength calls captured
// once into a CUDA graph and replayed (median over replays, each bracketed by events, divided by
// kChainLength). A launch or capture that fails (e.g. a driver refusing PDL in capture) is
// printed and returns a negative time instead of aborting the benchmark: the rows after it (and
// the other sections of the same single GPU call) still run.
double ChainMicrosPerLaunch(const std::function<absl::Status(int, cudaStream_t)>& launch,
                            cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status st;
  for (int i = 0; i < kChainLength && st.ok(); ++i) st = launch(i, stream);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  cudaError_t inst = cudaErrorUnknown;
  if (st.ok() && end == cudaSuccess) inst = cudaGraphInstantiate(&exec, graph, 0);
  if (!st.ok() || end != cudaSuccess || inst != cudaSuccess) {
    std::fprintf(stderr, "chain capture failed: %s / %s / %s\n", std::string(st.message()).c_str(),
                 cudaGetErrorString(end), cudaGetErrorString(inst));
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // capture errors are not sticky; clear the last-error state
    return -1;
  }
  const double us =
      MedianMicros([&](int) { BENCH_CUDA(cudaGraphLaunch(exec, stream)); }, stream, 5, 30);
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  return us / kChainLength;
}

// The launches a chain row times: the skinny kernel plain and with PDL (GemmArgs::overlap_launch),
// and cuBLASLt.
struct ChainKind {
  const char* name;
  absl::Status (*fn)(const GemmArgs&, cudaStream_t);
  bool pdl;
};
constexpr ChainKind kChainKinds[] = {{"skinny", &GemmSkinny, false},
                                     {"skinny_pdl", &GemmSkinny, true},
                                     {"cublaslt", &GemmCublasLt, false}};

// One M = 1 GEMM of a chain, launched as `kind` says.
absl::Status ChainGemm(const ChainKind& kind, const void* a, const void* w, void* c, int64_t n,
                       int64_t k, cudaStream_t s) {
  return kind.fn({.a = a, .w = w, .c = c, .m = 1, .n = n, .k = k, .overlap_launch = kind.pdl}, s);
}

// Times every ChainKind twice, interleaved (so the two rows of a kind show the run-to-run
// spread), in a graph of kChainLength launch(i, kind, stream) calls; rows "<prefix>.<kind>",
// time per launch() call, TB/s of one weight copy.
void TimeChainKinds(
    const Ceilings& c, const std::string& prefix, const std::string& shape, size_t w_bytes,
    const std::function<absl::Status(int, const ChainKind&, cudaStream_t)>& launch) {
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int round = 0; round < 2; ++round) {
    for (const ChainKind& kind : kChainKinds) {
      const double us =
          ChainMicrosPerLaunch([&](int i, cudaStream_t s) { return launch(i, kind, s); }, stream);
      if (us < 0) {
        std::printf("%s.%s %s: not timed (capture failed, see stderr)\n", prefix.c_str(), kind.name,
                    shape.c_str());
        continue;
      }
      Report(absl::StrCat(prefix, ".", kind.name), shape, us, "TB/s",
             static_cast<double>(w_bytes) * 1e-6 / us, c.read_tbps);
    }
  }
  BENCH_CUDA(cudaStreamDestroy(stream));
}

// The decode-step view of the M=1 GEMMs: kChainLength back-to-back GEMMs in one graph, GEMM i
// reading weight copy i % ws.size() (ws.size() >= 2 and >= 3x L2), the same a and c. Rows
// gemm.chain.{skinny, skinny_pdl, cublaslt}. The peer (peer_kb.py) times torch.matmul in the same
// chain through torch.cuda.CUDAGraph (row gemm.chain).
void BenchGemmChain(const Ceilings& c, int64_t k, int64_t n, const std::vector<void*>& ws, void* a,
                    void* out) {
  TimeChainKinds(c, "gemm.chain", absl::StrCat("M=1 K=", k, " N=", n), n * k * 2,
                 [&](int i, const ChainKind& kind, cudaStream_t s) {
                   return ChainGemm(kind, a, ws[i % ws.size()], out, n, k, s);
                 });
}

// The GEMMs as a decode step runs them: a small kernel writing the GEMM's input, then the GEMM
// reading it, kChainLength pairs per graph, time per pair. The producer calls
// AllowDependentLaunch() at its start (kernels/common/pdl.cuh), so a PDL GEMM can stream its
// first weights while the producer runs and wait only for its completion; the next producer
// (a plain launch) waits for the whole GEMM.
//   gemm.silu_chain.*: SiluMul (T = 1) then the 12288 -> 4096 down projection;
//   gemm.norm_chain.*: fused residual-add RMSNorm (T = 1, hidden 4096) then a 4096 -> n GEMM
//   (the QKV and gate-up projections).
void BenchSiluGemmChain(const Ceilings& c, const std::vector<void*>& ws) {
  const int64_t k = 12288, n = 4096;
  void* gate_up = Alloc(2 * k * 2);
  void* act = Alloc(k * 2);
  void* out = Alloc(n * 2);
  FillUniformBf16(gate_up, 2 * k, 11, -4, 4);
  TimeChainKinds(c, "gemm.silu_chain", absl::StrCat("M=1 K=", k, " N=", n), n * k * 2,
                 [&](int i, const ChainKind& kind, cudaStream_t s) {
                   const absl::Status st = SiluMul(
                       {.gate_up = gate_up, .out = act, .num_tokens = 1, .intermediate = k}, s);
                   if (!st.ok()) return st;
                   return ChainGemm(kind, act, ws[i % ws.size()], out, n, k, s);
                 });
  cudaFree(gate_up), cudaFree(act), cudaFree(out);
}

void BenchNormGemmChain(const Ceilings& c, int64_t n, const std::vector<void*>& ws) {
  const int64_t k = 4096;
  void* input = Alloc(k * 2);
  void* residual = Alloc(k * 2);
  void* weight = Alloc(k * 2);
  void* normed = Alloc(k * 2);
  void* out = Alloc(n * 2);
  FillUniformBf16(input, k, 12, -1, 1);
  FillUniformBf16(residual, k, 13, -1, 1);
  FillUniformBf16(weight, k, 14, 0.5f, 1.5f);
  TimeChainKinds(c, "gemm.norm_chain", absl::StrCat("M=1 K=", k, " N=", n), n * k * 2,
                 [&](int i, const ChainKind& kind, cudaStream_t s) {
                   const absl::Status st = RmsNorm({.input = input,
                                                    .residual = residual,
                                                    .weight = weight,
                                                    .out = normed,
                                                    .num_rows = 1,
                                                    .hidden = k},
                                                   s);
                   if (!st.ok()) return st;
                   return ChainGemm(kind, normed, ws[i % ws.size()], out, n, k, s);
                 });
  cudaFree(input), cudaFree(residual), cudaFree(weight), cudaFree(normed), cudaFree(out);
}

// Weight-bandwidth of the decode GEMMs: tandem's dispatch, the skinny kernel (plain and PDL
// launch) and cuBLASLt, one launch per event pair; then the graph chains (BenchGemmChain).
void BenchGemm(const Ceilings& c) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 24576}, {12288, 4096}, {4096, 6144}, {4096, 4096}};
  for (auto [k, n] : shapes) {
    const size_t w_bytes = n * k * 2;
    const int copies = RotationCopies(w_bytes);
    // One extra copy where a single one already exceeds 3x L2: the chain never reads the same
    // weights twice in a row.
    std::vector<void*> ws(std::max(copies, 2));
    for (int i = 0; i < static_cast<int>(ws.size()); ++i) {
      ws[i] = Alloc(w_bytes);
      FillUniformBf16(ws[i], n * k, 10 + i, -0.05f, 0.05f);
    }
    void* a = Alloc(32 * k * 2);
    void* out = Alloc(32 * n * 4);
    FillUniformBf16(a, 32 * k, 5, -1, 1);
    // Pre-warm the weight buffers (first touches, TLB): later measurements ran up to 10% faster
    // than the first ones without this (WORKLOG.md, step 3).
    MedianMicros(
        [&](int it) {
          GemmArgs x{.a = a, .w = ws[it % copies], .c = out, .m = 1, .n = n, .k = k};
          Ok(GemmCublasLt(x, nullptr));
        },
        nullptr, 20, 20);
    // What one launch between two events allows at all: reading these weights once.
    const double read_us = ReadOnceMicros(
        c, [&](int it) { return ws[it % copies]; }, w_bytes);
    Report("gemm.read_weights_once", absl::StrCat("M=1 K=", k, " N=", n), read_us, "TB/s",
           static_cast<double>(w_bytes) * 1e-6 / read_us, c.read_tbps);
    for (int64_t m : {1, 4, 8, 16, 32}) {
      GemmArgs args{.a = a, .c = out, .m = m, .n = n, .k = k};
      const std::string shape = absl::StrCat("M=", m, " K=", k, " N=", n);
      auto run = [&](absl::Status (*fn)(const GemmArgs&, cudaStream_t), bool pdl = false) {
        return MedianMicros(
            [&](int it) {
              GemmArgs x = args;
              x.w = ws[it % copies];
              x.overlap_launch = pdl;
              Ok(fn(x, nullptr));
            },
            nullptr, 5, 50);
      };
      const double tb = static_cast<double>(w_bytes) * 1e-6;
      double us = run(&Gemm);
      Report("gemm", shape, us, "TB/s", tb / us, c.read_tbps);
      if (m <= 16) {
        us = run(&GemmSkinny);
        Report("gemm.skinny", shape, us, "TB/s", tb / us, c.read_tbps);
        // The PDL launch alone (an event between launches: nothing to overlap): its cost. One
        // probe launch first, so that a refused PDL launch skips the row instead of aborting.
        GemmArgs probe = args;
        probe.w = ws[0];
        probe.overlap_launch = true;
        if (const absl::Status st = GemmSkinny(probe, nullptr); st.ok()) {
          us = run(&GemmSkinny, true);
          Report("gemm.skinny_pdl", shape, us, "TB/s", tb / us, c.read_tbps);
        } else {
          std::printf("gemm.skinny_pdl %s: not timed: %s\n", shape.c_str(),
                      std::string(st.message()).c_str());
        }
      }
      us = run(&GemmCublasLt);
      Report("gemm.cublaslt", shape, us, "TB/s", tb / us, c.read_tbps);
    }
    BenchGemmChain(c, k, n, ws, a, out);
    if (k == 12288 && n == 4096) BenchSiluGemmChain(c, ws);
    if (k == 4096 && (n == 6144 || n == 24576)) BenchNormGemmChain(c, n, ws);
    for (int64_t m : {1, 4}) {  // the skinny kernel's variants side by side
      for (int v = 0; v < kNumSkinnyVariants; ++v) {
        GemmArgs args{.a = a, .c = out, .m = m, .n = n, .k = k, .overlap_launch = false};
        const double us = MedianMicros(
            [&](int it) {
              GemmArgs x = args;
              x.w = ws[it % copies];
              Ok(GemmSkinnyVariant(x, v, nullptr));
            },
            nullptr, 5, 50);
        Report(absl::StrCat("gemm.skinny.v", v), absl::StrCat("M=", m, " K=", k, " N=", n), us,
               "TB/s", static_cast<double>(w_bytes) * 1e-6 / us, c.read_tbps);
      }
    }
    for (void* w : ws) cudaFree(w);
    cudaFree(a), cudaFree(out);
  }
}

void BenchElementwise(const Ceilings& c) {
  const int64_t hidden = 4096, inter = 12288, vocab = 152064;
  for (int64_t t : {1, 32, 16384}) {
    const std::string shape = absl::StrCat("T=", t, " H=", hidden);
    void* in = Alloc(t * hidden * 2);
    void* res = Alloc(t * hidden * 2);
    void* out = Alloc(t * hidden * 2);
    void* w = Alloc(hidden * 2);
    FillUniformBf16(in, t * hidden, 1, -1, 1);
    FillUniformBf16(res, t * hidden, 2, -1, 1);
    FillUniformBf16(w, hidden, 3, 0.5f, 1.5f);
    RmsNormArgs args{
        .input = in, .residual = res, .weight = w, .out = out, .num_rows = t, .hidden = hidden};
    double us = MedianMicros([&](int) { Ok(RmsNorm(args, nullptr)); }, nullptr);
    double bytes = 4.0 * t * hidden * 2;
    Report("rmsnorm.fused_residual", shape, us, "TB/s", bytes / us * 1e-6, c.copy_tbps);
    cudaFree(in), cudaFree(res), cudaFree(out), cudaFree(w);

    void* gu = Alloc(t * 2 * inter * 2);
    void* act = Alloc(t * inter * 2);
    FillUniformBf16(gu, t * 2 * inter, 4, -4, 4);
    SiluMulArgs sargs{.gate_up = gu, .out = act, .num_tokens = t, .intermediate = inter};
    us = MedianMicros([&](int) { Ok(SiluMul(sargs, nullptr)); }, nullptr);
    bytes = 3.0 * t * inter * 2;
    Report("silu_mul", absl::StrCat("T=", t, " I=", inter), us, "TB/s", bytes / us * 1e-6,
           c.copy_tbps);
    cudaFree(gu), cudaFree(act);

    void* table = Alloc(vocab * hidden * 2);
    void* emb = Alloc(t * hidden * 2);
    FillUniformBf16(table, vocab * hidden, 6, -1, 1);
    std::vector<int32_t> ids(t);
    for (int64_t i = 0; i < t; ++i) ids[i] = static_cast<int32_t>((i * 7919) % vocab);
    int32_t* dids = static_cast<int32_t*>(Alloc(t * 4));
    BENCH_CUDA(cudaMemcpy(dids, ids.data(), t * 4, cudaMemcpyHostToDevice));
    EmbeddingArgs eargs{.token_ids = dids,
                        .table = table,
                        .out = emb,
                        .num_tokens = t,
                        .vocab_size = vocab,
                        .hidden = hidden};
    us = MedianMicros([&](int) { Ok(Embedding(eargs, nullptr)); }, nullptr);
    bytes = 2.0 * t * hidden * 2;
    Report("embedding", shape, us, "TB/s", bytes / us * 1e-6, c.copy_tbps);
    cudaFree(table), cudaFree(emb), cudaFree(dids);
  }
}

// GEMMs that stand in for the kernel an engine runs before the sampler (its LM head): the skinny
// kernel at M = 1 and cuBLASLt at M = 256, 4096 -> 4096 (bf16, weights allocated once). Their
// output is not the sampler's input: only which kernel runs before the sampler is measured.
const GemmArgs& PredecessorGemm(bool cublaslt) {
  static const std::array<GemmArgs, 2> args = [] {
    constexpr int64_t k = 4096, n = 4096, m_max = 256;
    void* w = Alloc(n * k * 2);
    void* a = Alloc(m_max * k * 2);
    void* out = Alloc(m_max * n * 2);
    FillUniformBf16(w, n * k, 11, -1, 1);
    FillUniformBf16(a, m_max * k, 12, -1, 1);
    return std::array<GemmArgs, 2>{GemmArgs{.a = a, .w = w, .c = out, .m = 1, .n = n, .k = k},
                                   GemmArgs{.a = a, .w = w, .c = out, .m = m_max, .n = n, .k = k}};
  }();
  return args[cublaslt ? 1 : 0];
}

struct SamplingMode {
  const char* name;
  float temperature;
  int32_t top_k;
  float top_p;
  bool peaked = false;  // LLM-like logits (FillPeakedF32) instead of N(0, 3^2)
};
const SamplingMode kSamplingModes[] = {{"greedy", 0, 0, 1},
                                       {"temp0.7", 0.7f, 0, 1},
                                       {"topk50_topp0.9", 0.7f, 50, 0.9f},
                                       {"topp0.95", 1.0f, 0, 0.95f},
                                       {"topp0.999", 1.0f, 0, 0.999f},
                                       // A nucleus of a few tokens.
                                       {"topp0.95_peaked", 1.0f, 0, 0.95f, true},
                                       {"topp0.99_peaked", 1.0f, 0, 0.99f, true}};
// Step vectors: each timed call takes the next one, as an engine's steps advance with every
// token (a top-p row's work depends on where its draws land: sampling.h, step 5).
constexpr int kStepSets = 128;
constexpr int kSamplingRuns = 100;  // timed calls per row

// The sampling rows of one (batch, vocab) shape. compare: also the one-block-per-row kernel on
// the same rows (at B = 1 / 32 / 256) and, from 96 rows, Sampling() after a GEMM.
void BenchSamplingShape(const Ceilings& c, int64_t batch, int64_t vocab, bool compare) {
  const char* only_mode = std::getenv("TANDEM_BENCH_SAMPLING_MODE");
  const size_t bytes = batch * vocab * 4;
  const int copies = RotationCopies(bytes);
  std::vector<float*> normal(copies), peaked(copies);
  for (int i = 0; i < copies; ++i) {
    normal[i] = static_cast<float*>(Alloc(bytes));
    FillNormalF32(normal[i], batch * vocab, 100 + i, 3.0f);
    peaked[i] = static_cast<float*>(Alloc(bytes));
    FillPeakedF32(peaked[i], batch, vocab, 200 + i);
  }
  float* temp = static_cast<float*>(Alloc(batch * 4));
  float* top_p = static_cast<float*>(Alloc(batch * 4));
  int32_t* top_k = static_cast<int32_t*>(Alloc(batch * 4));
  uint64_t* seeds = static_cast<uint64_t*>(Alloc(batch * 8));
  uint64_t* steps = static_cast<uint64_t*>(Alloc(batch * 8 * kStepSets));
  int32_t* out = static_cast<int32_t*>(Alloc(batch * 4));
  FillUniformF32(reinterpret_cast<float*>(seeds), batch * 2, 7, 0, 1e6f);
  FillUniformF32(reinterpret_cast<float*>(steps), batch * 2 * kStepSets, 8, 0, 1e6f);
  const bool after_gemm = compare && batch >= 96;
  if (after_gemm) {
    for (bool cublaslt : {false, true}) {
      const double us =
          MedianMicros([&](int) { Ok(Gemm(PredecessorGemm(cublaslt), nullptr)); }, nullptr);
      Report(cublaslt ? "sampling_predecessor.cublaslt_gemm" : "sampling_predecessor.skinny_gemm",
             absl::StrCat("B=", batch, ",M=", cublaslt ? 256 : 1, ",K=N=4096"), us, "us", us,
             1e300);
    }
  }
  const std::string shape = absl::StrCat("B=", batch, " V=", vocab);
  // The literal "time to read the logits once", launch included, like the sampling rows.
  const double once_us = ReadOnceMicros(
      c, [&](int it) { return normal[it % copies]; }, bytes);
  const double read_us = bytes / (c.read_tbps * 1e6);
  Report("sampling.read_logits_once", shape, once_us, "x read", once_us / read_us, 2.0 * 1e300);
  for (const SamplingMode& m : kSamplingModes) {
    if (only_mode != nullptr && std::string(only_mode) != m.name) continue;
    const std::vector<float*>& logits = m.peaked ? peaked : normal;
    std::vector<float> t(batch, m.temperature), p(batch, m.top_p);
    std::vector<int32_t> k(batch, m.top_k);
    BENCH_CUDA(cudaMemcpy(temp, t.data(), batch * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(top_p, p.data(), batch * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(top_k, k.data(), batch * 4, cudaMemcpyHostToDevice));
    const SamplingArgs args{.temperature = temp,
                            .top_k = top_k,
                            .top_p = top_p,
                            .seeds = seeds,
                            .steps = steps,
                            .out_tokens = out,
                            .batch = batch,
                            .vocab_size = vocab};
    // The median of kSamplingRuns calls, each on the next logits copy and step vector, and beside
    // it their mean, 90th percentile and max (top-p rows: the calls where a row's draw needed
    // the exact threshold).
    auto time = [&](const char* prefix, absl::Status (*fn)(const SamplingArgs&, cudaStream_t)) {
      std::vector<float> runs = RunMicros(
          [&](int it) {
            SamplingArgs x = args;
            x.logits = logits[it % copies];
            x.steps = steps + (it % kStepSets) * batch;
            Ok(fn(x, nullptr));
          },
          nullptr, 5, kSamplingRuns);
      std::sort(runs.begin(), runs.end());
      double mean = 0.0;
      for (float us : runs) mean += us / kSamplingRuns;
      const double us = runs[kSamplingRuns / 2];
      const std::string name = absl::StrCat(prefix, m.name);
      Report(name, shape, us, "x read", us / read_us, 2.0 * 1e300);
      std::printf("sampling spread %s %s: median %.1f mean %.1f p90 %.1f max %.1f us\n",
                  name.c_str(), shape.c_str(), us, mean, runs[kSamplingRuns * 9 / 10], runs.back());
    };
    time("sampling.", &Sampling);
    if (compare && (batch == 1 || batch == 32 || batch == 256)) {
      time("sampling_1blk.", &SamplingOneBlockPerRow);
    }
    // Sampling() after a GEMM (an engine's order: LM head, then sampler), to set against the
    // GEMM alone ("sampling_predecessor.*") and Sampling() back to back.
    if (after_gemm) {
      time("sampling_after_skinny_gemm.", [](const SamplingArgs& a, cudaStream_t st) {
        if (absl::Status s = Gemm(PredecessorGemm(false), st); !s.ok()) return s;
        return Sampling(a, st);
      });
      time("sampling_after_cublaslt_gemm.", [](const SamplingArgs& a, cudaStream_t st) {
        if (absl::Status s = Gemm(PredecessorGemm(true), st); !s.ok()) return s;
        return Sampling(a, st);
      });
    }
  }
  for (float* l : normal) cudaFree(l);
  for (float* l : peaked) cudaFree(l);
  cudaFree(temp), cudaFree(top_p), cudaFree(top_k), cudaFree(seeds), cudaFree(steps), cudaFree(out);
}

// Sampling: the ceiling column is the time to read the logits once at the read bandwidth;
// "x read" = time / that. "sampling.*" is Sampling(): at V = 152064 (Qwen) the resident cluster
// kernel, at V = 262144 (Gemma 3) the one-block-per-row kernel; "sampling_1blk.*" is the latter
// on the V = 152064 rows, beside the former (kernels/sampling/README.md).
// TANDEM_BENCH_SAMPLING_BATCH=<b> times only Sampling() at that batch (V = 152064), and
// TANDEM_BENCH_SAMPLING_MODE=<name> only that mode (greedy, temp0.7, ...; for ncu).
void BenchSampling(const Ceilings& c) {
  if (const char* only = std::getenv("TANDEM_BENCH_SAMPLING_BATCH"); only != nullptr) {
    BenchSamplingShape(c, std::atoll(only), 152064, /*compare=*/false);
    return;
  }
  for (int64_t batch : {1, 32, 64, 96, 128, 192, 256}) {
    BenchSamplingShape(c, batch, 152064, /*compare=*/true);
  }
  for (int64_t batch : {1, 32, 256}) BenchSamplingShape(c, batch, 262144, /*compare=*/false);
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  using namespace tandem::bench;  // NOLINT
  if (argc > 1 && std::string(argv[1]) != "-") SetJsonOutput(argv[1]);
  const std::string only = argc > 2 ? argv[2] : "all";  // all | gemm | ... | logits
  const Ceilings c = MeasureCeilings();
  std::printf("ceilings: copy %.3f TB/s, read %.3f TB/s, cuBLAS bf16 %.1f TFLOP/s\n", c.copy_tbps,
              c.read_tbps, c.bf16_gemm_tflops);
  Report("ceiling.copy", "2 GiB d2d", 0, "TB/s", c.copy_tbps, c.copy_tbps);
  Report("ceiling.read", "4 GiB", 0, "TB/s", c.read_tbps, c.read_tbps);
  Report("ceiling.cublas_bf16", "8192^3", 0, "TFLOP/s", c.bf16_gemm_tflops, c.bf16_gemm_tflops);
  if (only == "all" || only == "gemm") BenchGemm(c);
  if (only == "all" || only == "elementwise") BenchElementwise(c);
  if (only == "all" || only == "sampling") BenchSampling(c);
  if (only == "all" || only == "logits") BenchLogits(c);
  if (only == "all" || only == "quant") BenchQuantGemm(c);
  if (only == "fp8") BenchFp8Gemm(c);
  if (only == "fp8norm") BenchFp8NormGemm(c);
  if (only == "lttune") BenchLtTune(c);
  if (only == "lttune_extra") BenchLtExtra(c);
  if (only == "fp8split") BenchFp8Split(c);
  if (only == "quantone" && argc > 7) {
    BenchQuantOne(argv[3], argv[4], std::atoll(argv[5]), std::atoll(argv[6]), std::atoll(argv[7]),
                  argc > 8 ? std::atoi(argv[8]) : 0);
  }
  if (only == "lttune_dump") {
    BenchLtDump(c, argc > 3 ? argv[3] : "o", argc > 4 ? std::atoll(argv[4]) : 256,
                argc > 5 ? argv[5] : "channel");
  }
  return 0;
}
