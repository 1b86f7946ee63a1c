// The tuner's extra candidates (cublaslt_autotune.h: AppendLtExtraCandidates): every algorithm id
// of the plan's type combination, its capabilities, the configurations cublaslt_configs.h
// enumerates from them, built with cublasLtMatmulAlgoInit + cublasLtMatmulAlgoConfigSetAttribute
// and kept when cublasLtMatmulAlgoCheck accepts them for the plan's descriptors (scale modes,
// epilogue and beta included) within the workspace. Host calls only: nothing is launched here.
// The check costs host time only (microseconds each; a plan checks at most kLtExtraMaxChecked),
// and each problem is enumerated once per process.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/common/cublaslt_configs.h"

namespace tandem {
namespace {

static_assert(kLtReductionNone == CUBLASLT_REDUCTION_SCHEME_NONE);
static_assert(kLtReductionInplace == CUBLASLT_REDUCTION_SCHEME_INPLACE);
static_assert(kLtReductionComputeType == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
static_assert(kLtReductionOutputType == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE);

// The most algorithm ids asked of cublasLtMatmulAlgoGetIds (CUDA 13 lists a few dozen at most for
// one type combination).
constexpr int kMaxAlgoIds = 128;

std::mutex g_mu;
LtPlanCandidates g_last;  // guarded by g_mu
// The accepted extras and the record of each problem enumerated before, by its label, its
// heuristic count and the bounds (guarded by g_mu). Forced plans (one per candidate index: the
// tests and the benchmark make dozens of one problem) and later tunings of a problem reuse the
// list instead of checking every configuration again. The FP8 plans' labels name every field of
// their descriptors (rows, n, k, scale modes, output type, accumulate, bias), so an equal label
// is an equal problem; the scale and bias pointers differ between plans but no check reads them.
struct Enumerated {
  std::vector<cublasLtMatmulHeuristicResult_t> extras;
  LtPlanCandidates record;
};
std::map<std::string, Enumerated> g_enumerated;

template <typename T>
void GetConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr,
               T& out) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) ==
          CUBLAS_STATUS_SUCCESS &&
      written == sizeof(v)) {
    out = v;
  }
}

template <typename T>
bool SetConfig(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr, T v) {
  return cublasLtMatmulAlgoConfigSetAttribute(&algo, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
}

template <typename T>
T GetCap(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return v;
}

// An array capability (tile or stages ids): its size first (sizeInBytes 0), then its values.
std::vector<uint32_t> GetCapIds(const cublasLtMatmulAlgo_t& algo,
                                cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t need = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS ||
      need < sizeof(uint32_t)) {
    return {};
  }
  std::vector<uint32_t> ids(need / sizeof(uint32_t));
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), ids.size() * sizeof(uint32_t),
                                        &written) != CUBLAS_STATUS_SUCCESS) {
    return {};
  }
  ids.resize(written / sizeof(uint32_t));
  return ids;
}

// The "xAUTO" stages (the kernel picks its pipeline depth for the shape) before the fixed ones,
// each group in cuBLASLt's order.
std::vector<uint32_t> PreferAutoStages(std::vector<uint32_t> stages) {
  std::stable_partition(stages.begin(), stages.end(), [](uint32_t s) {
    return s >= CUBLASLT_MATMUL_STAGES_8xAUTO && s <= CUBLASLT_MATMUL_STAGES_768xAUTO;
  });
  return stages;
}

// The problem's type combination, read back from its descriptors.
struct Types {
  cublasComputeType_t compute;
  cudaDataType_t scale, a, b, d;
};

bool TypesOf(const LtTuneProblem& p, Types& t) {
  int32_t compute = 0, scale = 0;
  uint32_t a = 0, b = 0, d = 0;
  size_t w = 0;
  const bool ok = cublasLtMatmulDescGetAttribute(p.op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute,
                                                 sizeof(compute), &w) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatmulDescGetAttribute(p.op, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &scale,
                                                 sizeof(scale), &w) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutGetAttribute(p.a_layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &a,
                                                   sizeof(a), &w) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutGetAttribute(p.b_layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &b,
                                                   sizeof(b), &w) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutGetAttribute(p.d_layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &d,
                                                   sizeof(d), &w) == CUBLAS_STATUS_SUCCESS;
  t = Types{static_cast<cublasComputeType_t>(compute), static_cast<cudaDataType_t>(scale),
            static_cast<cudaDataType_t>(a), static_cast<cudaDataType_t>(b),
            static_cast<cudaDataType_t>(d)};
  return ok;
}

// k of the problem: the rows of cuBLASLt's A as the plans lay it out (A = [k, n] transposed).
int64_t DepthOf(const LtTuneProblem& p) {
  uint64_t rows = 0;
  size_t w = 0;
  cublasLtMatrixLayoutGetAttribute(p.a_layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows),
                                   &w);
  return static_cast<int64_t>(rows);
}

std::vector<LtAlgoCaps> CapsOfTypes(const LtTuneProblem& p, const Types& t) {
  std::vector<int> ids(kMaxAlgoIds);
  int found = 0;
  if (cublasLtMatmulAlgoGetIds(p.handle, t.compute, t.scale, t.a, t.b, t.d, t.d, kMaxAlgoIds,
                               ids.data(), &found) != CUBLAS_STATUS_SUCCESS) {
    return {};
  }
  std::vector<LtAlgoCaps> caps;
  for (int i = 0; i < found; ++i) {
    cublasLtMatmulAlgo_t algo{};
    if (cublasLtMatmulAlgoInit(p.handle, t.compute, t.scale, t.a, t.b, t.d, t.d, ids[i], &algo) !=
        CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    LtAlgoCaps c;
    c.algo_id = ids[i];
    c.splitk = GetCap<int32_t>(algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0;
    c.reduction_mask = GetCap<uint32_t>(algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
    c.swizzle = GetCap<uint32_t>(algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0;
    c.tiles = GetCapIds(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
    c.stages = PreferAutoStages(GetCapIds(algo, CUBLASLT_ALGO_CAP_STAGES_IDS));
    caps.push_back(std::move(c));
  }
  return caps;
}

// The algorithm of configuration `c`: a copy of its seed (the heuristic's candidate) with the
// split, reduction and swizzle set, or a fresh initialisation with tile and stages set too.
bool Build(const LtTuneProblem& p, const Types& t, const LtAlgoConfig& c,
           const std::vector<cublasLtMatmulHeuristicResult_t>& heuristic,
           cublasLtMatmulAlgo_t& algo) {
  if (c.seed >= 0) {
    algo = heuristic[c.seed].algo;
  } else {
    if (cublasLtMatmulAlgoInit(p.handle, t.compute, t.scale, t.a, t.b, t.d, t.d, c.algo_id,
                               &algo) != CUBLAS_STATUS_SUCCESS ||
        !SetConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile) ||
        !SetConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, c.stages)) {
      return false;
    }
  }
  return SetConfig<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, c.splitk) &&
         SetConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, c.reduction) &&
         SetConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c.swizzle);
}

LtPlanCandidates Record(const LtTuneProblem& p, int heuristic,
                        const std::vector<cublasLtMatmulHeuristicResult_t>& all,
                        const std::vector<LtAlgoCaps>& caps, int checked) {
  LtPlanCandidates r;
  r.label = p.label;
  r.heuristic = heuristic;
  for (const auto& c : all) r.names.push_back(LtAlgoName(c.algo));
  for (const LtAlgoCaps& c : caps) r.caps.push_back(LtCapsName(c));
  r.extra_checked = checked;
  return r;
}

}  // namespace

LtAlgoConfig LtConfigOfAlgo(const cublasLtMatmulAlgo_t& algo) {
  LtAlgoConfig c;
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_ID, c.algo_id);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, c.stages);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, c.splitk);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, c.reduction);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c.swizzle);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c.custom);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, c.inner_shape);
  GetConfig(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, c.cluster_shape);
  return c;
}

std::string LtAlgoName(const cublasLtMatmulAlgo_t& algo) {
  return LtConfigName(LtConfigOfAlgo(algo));
}

LtPlanCandidates LastLtPlanCandidates() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_last;
}

void AppendLtExtraCandidates(const LtTuneProblem& p,
                             std::vector<cublasLtMatmulHeuristicResult_t>& candidates) {
  const int heuristic = static_cast<int>(candidates.size());
  const int max_checked = LtExtraMaxChecked(), max_timed = LtExtraMaxTimed();
  const std::string key = absl::StrCat(p.label, "|", heuristic, "|", max_checked, "|", max_timed);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_enumerated.find(key); it != g_enumerated.end()) {
      candidates.insert(candidates.end(), it->second.extras.begin(), it->second.extras.end());
      g_last = it->second.record;
      return;
    }
  }
  Types t{};
  if (!TypesOf(p, t)) {
    LOG(INFO) << "cuBLASLt " << p.label << ": no extra candidates (types unreadable)";
    return;
  }
  const std::vector<LtAlgoCaps> caps = CapsOfTypes(p, t);
  std::vector<LtAlgoConfig> seeds;
  for (const auto& c : candidates) seeds.push_back(LtConfigOfAlgo(c.algo));
  LtEnumLimits limits;
  limits.max_configs = max_checked;
  const std::vector<LtAlgoConfig> configs = EnumerateLtConfigs(seeds, caps, DepthOf(p), limits);
  int checked = 0, accepted = 0;
  for (const LtAlgoConfig& c : configs) {
    if (accepted >= max_timed) break;
    cublasLtMatmulAlgo_t algo{};
    if (!Build(p, t, c, candidates, algo)) continue;
    ++checked;
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(p.handle, p.op, p.a_layout, p.b_layout, p.d_layout, p.d_layout,
                                &algo, &r) != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > p.workspace_bytes) {
      continue;
    }
    r.algo = algo;  // the check never writes it
    r.state = CUBLAS_STATUS_SUCCESS;
    candidates.push_back(r);
    ++accepted;
  }
  CountLtExtras(checked, accepted);
  Enumerated e{.extras = std::vector<cublasLtMatmulHeuristicResult_t>(
                   candidates.begin() + heuristic, candidates.end()),
               .record = Record(p, heuristic, candidates, caps, checked)};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_last = e.record;
    g_enumerated.emplace(key, std::move(e));
  }
  LOG(INFO) << "cuBLASLt " << p.label << ": " << caps.size() << " algorithm ids, " << configs.size()
            << " extra configurations enumerated, " << checked << " checked, " << accepted
            << " accepted";
}

}  // namespace tandem
