// Candidate cuBLASLt algorithm configurations beyond the heuristic's (kernels/quant_gemm/
// WORKLOG.md step 6): on an H200 with CUDA 13 the heuristic offers a single algorithm for the FP8
// GEMMs with outer-vector or block scales (run 36), so the tuner (cublaslt_autotune.h) had
// nothing to time. cuBLASLt also lets a caller build configurations itself: every algorithm id
// of the type combination (cublasLtMatmulAlgoGetIds) reports what it can do
// (cublasLtMatmulAlgoCapGetAttribute: split-k, reduction schemes, tiles, stages, CTA swizzling),
// a configuration is set field by field and cublasLtMatmulAlgoCheck says whether it runs on the
// plan's descriptors. This file is the host-side half, without CUDA headers so that a CPU test
// checks it: from the capabilities, the candidate configurations in the order they are to be
// checked, bounded, without the heuristic's own. The cuBLASLt half is cublaslt_extra_cuda.cc.
//
// Why this order. The GEMMs to speed up (O and down at a decode batch of 256: n = 4096 gives 64
// output tiles of 128x128 for 132 SMs) gain most from split-k or a smaller tile, and a bound of
// a few hundred checks must not spend itself on one kind of change. Configurations are grouped by
// (split-k, reduction scheme) and the groups are taken in turn, one configuration from each, so
// any prefix of the list holds every split the capabilities allow. Within a group the heuristic's
// own algorithms with only the split, reduction or swizzle changed come first (the same kernel
// family, with the heuristic's cluster shape and inner shape kept), then fresh configurations of
// every algorithm id: swizzle off before on, the preferred stages before the others, and tiles
// interleaved across algorithm ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// cuBLASLt's cublasLtReductionScheme_t values (cublaslt_extra_cuda.cc asserts they match).
inline constexpr uint32_t kLtReductionNone = 0;
inline constexpr uint32_t kLtReductionInplace = 1;
inline constexpr uint32_t kLtReductionComputeType = 2;
inline constexpr uint32_t kLtReductionOutputType = 4;

// One configuration of a cuBLASLt algorithm: the fields of cublasLtMatmulAlgoConfigAttributes_t.
struct LtAlgoConfig {
  int32_t algo_id = 0;
  uint32_t tile = 0;    // cublasLtMatmulTile_t; 0: undefined
  uint32_t stages = 0;  // cublasLtMatmulStages_t; 0: undefined
  int32_t splitk = 1;
  uint32_t reduction = kLtReductionNone;
  uint32_t swizzle = 0;
  uint32_t custom = 0;
  uint16_t inner_shape = 0;    // 0: undefined
  uint16_t cluster_shape = 0;  // 0: auto
  // The heuristic candidate this configuration varies (its algorithm copied, then split-k,
  // reduction and swizzle set), or -1: a fresh cublasLtMatmulAlgoInit of algo_id with tile,
  // stages, split-k, reduction and swizzle set. Not part of equality.
  int seed = -1;

  bool SameAs(const LtAlgoConfig& o) const {
    return algo_id == o.algo_id && tile == o.tile && stages == o.stages && splitk == o.splitk &&
           reduction == o.reduction && swizzle == o.swizzle && custom == o.custom &&
           inner_shape == o.inner_shape && cluster_shape == o.cluster_shape;
  }
};

// What one algorithm id can do (cublasLtMatmulAlgoCapGetAttribute on its fresh initialisation).
struct LtAlgoCaps {
  int32_t algo_id = 0;
  bool splitk = false;          // CUBLASLT_ALGO_CAP_SPLITK_SUPPORT
  uint32_t reduction_mask = 0;  // CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK
  bool swizzle = false;         // CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT
  std::vector<uint32_t> tiles;  // CUBLASLT_ALGO_CAP_TILE_IDS
  // CUBLASLT_ALGO_CAP_STAGES_IDS, preferred first (cublaslt_extra_cuda.cc puts the "xAUTO"
  // stages, which let the kernel choose its pipeline depth, before the fixed ones).
  std::vector<uint32_t> stages;
};

struct LtEnumLimits {
  int max_configs = 256;  // the configurations returned (cuBLASLt checks them in this order)
  int max_stages_per_tile = 2;
  // Split-k values beyond 1, each kept only when every part gets at least min_k_per_split of k
  // (4 FP8 k-blocks of 128: fewer leaves a part mostly prologue and epilogue).
  std::vector<int32_t> splits = {2, 3, 4, 6, 8};
  int64_t min_k_per_split = 512;
  // Reduction schemes tried for split-k, in this order, where the algorithm's mask allows them.
  // Compute type only by default: its partial sums stay fp32 in the workspace and the output is
  // rounded once, the numerics of an unsplit GEMM; in-place and output-type reductions round
  // every partial sum to the output type (bf16 here), an error that grows with the split.
  std::vector<uint32_t> reductions = {kLtReductionComputeType};
};

// The candidate configurations for a problem of depth k: variations of the heuristic's
// configurations (`heuristic`, in its order; their caps found by algo_id in `caps`, none when
// absent) and fresh configurations of every entry of `caps`, in the order above, without any
// configuration equal to one of `heuristic` or to an earlier one, at most limits.max_configs.
std::vector<LtAlgoConfig> EnumerateLtConfigs(const std::vector<LtAlgoConfig>& heuristic,
                                             const std::vector<LtAlgoCaps>& caps, int64_t k,
                                             const LtEnumLimits& limits = {});

// A configuration as one log or benchmark field: "algo 66 tile 18 stages 36 splitk 2 red 2
// swz 0" (cluster, inner shape and custom option only when set).
std::string LtConfigName(const LtAlgoConfig& c);

// The capabilities as one line ("algo 66: splitk yes, reductions 0x7, swizzle no, 12 tiles,
// 8 stages").
std::string LtCapsName(const LtAlgoCaps& c);

}  // namespace tandem
