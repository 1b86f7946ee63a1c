// Quantizing make-model's random weights into each format's tensors (quant_make_model.h).
#include "engine/model/quant_make_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/quant_checkpoint.h"
#include "engine/model/random_weights.h"
#include "kernels/quant_gemm/fp8_e4m3.h"

namespace tandem {
namespace {

constexpr int64_t kFp8Block = 128;
const char* const kSchemes[] = {"fp8-block", "fp8-channel", "int8", "awq", "gptq"};

bool IsLinearWeight(const HfTensor& t) {
  return (t.role == TensorRole::kProjection || t.role == TensorRole::kResidualProjection) &&
         t.spec.name.size() > 7 && t.spec.name.ends_with(".weight");
}
std::string ModuleOf(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - 7);
}

// A module's tensors, in writing order, with their bytes.
struct Packed {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<uint8_t>> data;

  template <typename T>
  void Add(std::string name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
    std::vector<uint8_t> bytes(v.size() * sizeof(T));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    specs.push_back({std::move(name), dtype, std::move(shape)});
    data.push_back(std::move(bytes));
  }
};

// w [n, k] fp32 (already rounded to the checkpoint dtype).
void PackFp8Block(const std::string& m, const std::vector<float>& w, int64_t n, int64_t k,
                  Packed* out) {
  const int64_t rows = (n + kFp8Block - 1) / kFp8Block, cols = (k + kFp8Block - 1) / kFp8Block;
  std::vector<float> scale(rows * cols);
  std::vector<uint8_t> codes(n * k);
  for (int64_t br = 0; br < rows; ++br) {
    for (int64_t bc = 0; bc < cols; ++bc) {
      const int64_t j1 = std::min(n, (br + 1) * kFp8Block), k1 = std::min(k, (bc + 1) * kFp8Block);
      float amax = 0.0f;
      for (int64_t j = br * kFp8Block; j < j1; ++j) {
        for (int64_t kk = bc * kFp8Block; kk < k1; ++kk)
          amax = std::max(amax, std::fabs(w[j * k + kk]));
      }
      const float s = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
      scale[br * cols + bc] = s;
      for (int64_t j = br * kFp8Block; j < j1; ++j) {
        for (int64_t kk = bc * kFp8Block; kk < k1; ++kk)
          codes[j * k + kk] = F32ToFp8E4M3(w[j * k + kk] / s);
      }
    }
  }
  out->Add(m + ".weight", DType::kF8E4M3, {n, k}, codes);
  out->Add(m + ".weight_scale_inv", DType::kF32, {rows, cols}, scale);
}

// compressed-tensors per-channel 8-bit: scale rounded to bf16 first, codes at that scale.
void PackChannel(const std::string& m, const std::vector<float>& w, int64_t n, int64_t k, bool fp8,
                 Packed* out) {
  std::vector<uint16_t> scale(n);
  std::vector<uint8_t> codes(n * k);
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0.0f;
    for (int64_t kk = 0; kk < k; ++kk) amax = std::max(amax, std::fabs(w[j * k + kk]));
    scale[j] = F32ToBf16(amax > 0 ? amax / (fp8 ? kFp8E4M3Max : 127.0f) : 1.0f);
    const float s = Bf16ToF32(scale[j]);
    for (int64_t kk = 0; kk < k; ++kk) {
      const float x = w[j * k + kk] / s;
      codes[j * k + kk] = fp8 ? F32ToFp8E4M3(x)
                              : static_cast<uint8_t>(static_cast<int8_t>(
                                    std::clamp(std::nearbyint(x), -127.0f, 127.0f)));
    }
  }
  out->Add(m + ".weight", fp8 ? DType::kF8E4M3 : DType::kI8, {n, k}, codes);
  out->Add(m + ".weight_scale", DType::kBF16, {n, 1}, scale);
}

// AWQ (asymmetric) or GPTQ (symmetric) 4-bit groups along k, scales rounded to f16 first.
absl::Status PackInt4(const std::string& m, const std::vector<float>& w, int64_t n, int64_t k,
                      int64_t g, bool awq, Packed* out) {
  if (n % 8 != 0 || k % 8 != 0 || k % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        m, ": [", n, ", ", k, "] does not fit ", awq ? "AWQ" : "GPTQ", " with group_size ", g,
        " (in_features must be a multiple of the group and of 8, out_features of 8)"));
  }
  const int64_t groups = k / g;
  std::vector<uint8_t> q(n * k), z(n * groups);
  std::vector<uint16_t> s16(groups * n);  // [groups, n]
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      const float* x = &w[j * k + gi * g];
      float lo = 0.0f, hi = 0.0f, amax = 0.0f;
      for (int64_t i = 0; i < g; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
        amax = std::max(amax, std::fabs(x[i]));
      }
      float raw = awq ? (hi - lo) / 15.0f : 2.0f * amax / 15.0f;
      if (raw <= 0) raw = 1.0f;
      s16[gi * n + j] = F32ToF16(raw);
      const float s = F16ToF32(s16[gi * n + j]);
      const float zero = awq ? std::clamp(std::nearbyint(-lo / s), 0.0f, 15.0f) : 8.0f;
      z[j * groups + gi] = static_cast<uint8_t>(zero);
      for (int64_t i = 0; i < g; ++i) {
        q[j * k + gi * g + i] =
            static_cast<uint8_t>(std::clamp(std::nearbyint(x[i] / s) + zero, 0.0f, 15.0f));
      }
    }
  }
  // Packing: AWQ along n with the interleaved order, GPTQ's qweight along k, qzeros along n.
  std::vector<int32_t> qzeros(groups * (n / 8), 0);
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int64_t j = 0; j < n; ++j) {
      const int nib = awq ? static_cast<int>(std::find(kAwqOrder, kAwqOrder + 8, j % 8) - kAwqOrder)
                          : static_cast<int>(j % 8);
      const uint32_t stored = awq ? z[j * groups + gi] : z[j * groups + gi] - 1u;
      qzeros[gi * (n / 8) + j / 8] |= static_cast<int32_t>(stored << (4 * nib));
    }
  }
  if (awq) {
    std::vector<int32_t> qweight(k * (n / 8), 0);
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t j = 0; j < n; ++j) {
        const int nib = static_cast<int>(std::find(kAwqOrder, kAwqOrder + 8, j % 8) - kAwqOrder);
        qweight[kk * (n / 8) + j / 8] |= static_cast<int32_t>(uint32_t{q[j * k + kk]} << (4 * nib));
      }
    }
    out->Add(m + ".qweight", DType::kI32, {k, n / 8}, qweight);
    out->Add(m + ".qzeros", DType::kI32, {groups, n / 8}, qzeros);
    out->Add(m + ".scales", DType::kF16, {groups, n}, s16);
    return absl::OkStatus();
  }
  std::vector<int32_t> qweight((k / 8) * n, 0), g_idx(k);
  for (int64_t kk = 0; kk < k; ++kk) {
    g_idx[kk] = static_cast<int32_t>(kk / g);
    for (int64_t j = 0; j < n; ++j) {
      qweight[(kk / 8) * n + j] |= static_cast<int32_t>(uint32_t{q[j * k + kk]} << (4 * (kk % 8)));
    }
  }
  out->Add(m + ".qweight", DType::kI32, {k / 8, n}, qweight);
  out->Add(m + ".qzeros", DType::kI32, {groups, n / 8}, qzeros);
  out->Add(m + ".scales", DType::kF16, {groups, n}, s16);
  out->Add(m + ".g_idx", DType::kI32, {k}, g_idx);
  return absl::OkStatus();
}

absl::StatusOr<Packed> PackModule(const HfTensor& t, uint64_t seed, const std::string& scheme,
                                  int64_t group_size) {
  const int64_t n = t.spec.shape[0], k = t.spec.shape[1];
  std::vector<float> w(n * k);
  ParallelFor(n * k, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = RandomWeight(seed, t, i);
      w[i] = t.spec.dtype == DType::kBF16  ? RoundToBf16(v)
             : t.spec.dtype == DType::kF16 ? F16ToF32(F32ToF16(v))
                                           : v;
    }
  });
  const std::string m = ModuleOf(t.spec.name);
  Packed p;
  if (scheme == "fp8-block") {
    PackFp8Block(m, w, n, k, &p);
  } else if (scheme == "fp8-channel" || scheme == "int8") {
    PackChannel(m, w, n, k, scheme == "fp8-channel", &p);
  } else {
    // GPTQ's group_size -1: one group of the whole row.
    RETURN_IF_ERROR(PackInt4(m, w, n, k, group_size == -1 ? k : group_size, scheme == "awq", &p));
  }
  return p;
}

}  // namespace

absl::StatusOr<std::string> QuantizationConfigJson(const std::string& scheme, int64_t g) {
  const std::string ct_weights =
      R"("weights": {"num_bits": 8, "type": "%s", "strategy": "channel", "symmetric": true, )"
      R"("dynamic": false, "group_size": null})";
  auto compressed = [&](const char* type, const char* format, const char* input) {
    std::string w = ct_weights;
    w.replace(w.find("%s"), 2, type);
    return absl::StrCat(R"({"quant_method": "compressed-tensors", "format": ")", format,
                        R"(", "quantization_status": "compressed", "config_groups": {"group_0": )",
                        R"({"targets": ["Linear"], )", w, R"(, "input_activations": )", input,
                        R"(, "output_activations": null}}, "ignore": ["lm_head"], )",
                        R"("kv_cache_scheme": null})");
  };
  if (scheme == "fp8-block") {
    return std::string(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", )"
                       R"("weight_block_size": [128, 128]})");
  }
  if (scheme == "fp8-channel") {
    return compressed("float", "float-quantized",
                      R"({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true, )"
                      R"("symmetric": true})");
  }
  if (scheme == "int8") return compressed("int", "int-quantized", "null");
  if (scheme == "awq") {
    return absl::StrCat(
        R"({"quant_method": "awq", "bits": 4, "group_size": )", g,
        R"(, "zero_point": true, "version": "gemm", "modules_to_not_convert": null})");
  }
  if (scheme == "gptq") {
    return absl::StrCat(R"({"quant_method": "gptq", "bits": 4, "group_size": )", g,
                        R"(, "desc_act": false, "sym": true, "checkpoint_format": "gptq"})");
  }
  return absl::InvalidArgumentError(absl::StrCat("make-model: unknown quantization \"", scheme,
                                                 "\"; known: ", absl::StrJoin(kSchemes, ", ")));
}

absl::Status WriteQuantizedRandomWeights(const ModelConfig& config, uint64_t seed,
                                         const std::string& dir,
                                         const CheckpointWriteOptions& options,
                                         const std::string& scheme, int64_t group_size) {
  RETURN_IF_ERROR(QuantizationConfigJson(scheme, group_size).status());
  if (group_size < 1 && !(scheme == "gptq" && group_size == -1)) {
    return absl::InvalidArgumentError("make-model: group size must be >= 1 (or -1 for gptq)");
  }
  const std::vector<HfTensor> tensors = HfTensors(config);
  std::map<std::string, const HfTensor*> dense;                  // name -> tensor
  std::map<std::string, std::pair<std::string, int>> quantized;  // name -> (module, index)
  std::map<std::string, Packed> packed;                          // module -> its tensors
  std::vector<TensorSpec> specs;
  // Every module is packed once up front: the specs need the shapes, and a checkpoint of the
  // presets this is for (tiny and small) fits in memory many times over.
  for (const HfTensor& t : tensors) {
    if (!IsLinearWeight(t)) {
      dense[t.spec.name] = &t;
      specs.push_back(t.spec);
      continue;
    }
    ASSIGN_OR_RETURN(Packed p, PackModule(t, seed, scheme, group_size));
    const std::string m = ModuleOf(t.spec.name);
    for (size_t i = 0; i < p.specs.size(); ++i) {
      quantized[p.specs[i].name] = {m, static_cast<int>(i)};
      specs.push_back(p.specs[i]);
    }
    packed[m] = std::move(p);
  }
  const TensorFiller fill = [&](const TensorSpec& spec, int64_t first, int64_t count,
                                uint8_t* out) {
    if (auto q = quantized.find(spec.name); q != quantized.end()) {
      const std::vector<uint8_t>& bytes = packed.at(q->second.first).data[q->second.second];
      const int64_t elem = DTypeSize(spec.dtype);
      std::memcpy(out, bytes.data() + first * elem, count * elem);
      return;
    }
    FillRandomWeights(seed, *dense.at(spec.name), spec.dtype, first, count, out);
  };
  return WriteSafetensorsCheckpoint(dir, specs, fill, options);
}

}  // namespace tandem
