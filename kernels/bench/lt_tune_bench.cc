#include "kernels/bench/lt_tune_bench.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/gemm/gemm.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
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

void BenchFp8Shape(const Ceilings& c, const Shape& s, Buffers& b, void* a, void* out, void* scratch,
                   int64_t scratch_bytes) {
  const size_t w_bytes = s.n * s.k;
  std::vector<void*> ws(RotationCopies(w_bytes));
  for (size_t i = 0; i < ws.size(); ++i) {
    ws[i] = b.Alloc(w_bytes);
    FillUniformBf16(ws[i], static_cast<int64_t>(w_bytes / 2), 80 + i, -1, 1);  // any e4m3 bytes
  }
  for (auto [layout, act, group] :
       {std::tuple{"channel", ActQuant::kFp8PerToken, s.k},
        std::tuple{"block", ActQuant::kFp8PerTokenGroup, int64_t{128}}}) {
    const std::vector<float> host = Scales(s.n, s.k, group);
    QuantGemmArgs q{.a = a,
                    .c = out,
                    .n = s.n,
                    .k = s.k,
                    .a_dtype = DType::kBF16,
                    .c_dtype = DType::kBF16,
                    .accumulate = s.accumulate,
                    .code = QuantCode::kFp8E4M3,
                    .scales = host.data(),
                    .group_size = group,
                    .act_quant = act,
                    .act_group_size = kFp8LtBlock};
    absl::StatusOr<Fp8LtPackedScales> packed = Fp8LtPackWeightScales(q);
    Must(packed.status(), "Fp8LtPackWeightScales");
    void* scales = b.Alloc(packed->scales.size() * sizeof(float));
    BENCH_CUDA(cudaMemcpy(scales, packed->scales.data(), packed->scales.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    q.scales = nullptr;
    for (int64_t m : kRows) {
      q.m = m;
      Must(Fp8LtQuantizeActivations(q, scratch, scratch_bytes, nullptr), "quantize");
      TimeBoth(c, absl::StrCat("fp8.", layout), s, m, [&](int it) {
        const Fp8LtWeight w{.w = static_cast<const uint8_t*>(ws[it % ws.size()]),
                            .scales = static_cast<const float*>(scales),
                            .n = s.n,
                            .k = s.k,
                            .mode = packed->mode};
        Must(Fp8LtMatmul(q, w, scratch, scratch_bytes, nullptr), "Fp8LtMatmul");
      });
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

}  // namespace

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
