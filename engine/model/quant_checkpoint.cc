// Unpacking each checkpoint format's tensors into QuantizedWeight (layouts in quant_checkpoint.h).
#include "engine/model/quant_checkpoint.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

using Format = QuantConfig::Format;

std::string ShapeStr(const std::vector<int64_t>& s) { return "[" + absl::StrJoin(s, ", ") + "]"; }

// The tensor `name`, checked against the allowed dtypes and the expected shape.
absl::StatusOr<SafetensorsCheckpoint::Entry> Fetch(
    const SafetensorsCheckpoint& ckpt, const std::string& name, std::vector<DType> dtypes,
    const std::vector<std::vector<int64_t>>& shapes) {
  const SafetensorsCheckpoint::Entry e = ckpt.Find(name);
  if (e.file == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": missing from the checkpoint (expected ",
                                                   ShapeStr(shapes.front()), ")"));
  }
  bool dtype_ok = false;
  std::vector<std::string> names;
  for (DType t : dtypes) {
    dtype_ok |= e.info->dtype == t;
    names.emplace_back(DTypeName(t));
  }
  if (!dtype_ok) {
    return absl::InvalidArgumentError(absl::StrCat(name, " in ", e.file->path(), ": dtype ",
                                                   std::string(DTypeName(e.info->dtype)),
                                                   ", expected ", absl::StrJoin(names, " or ")));
  }
  for (const auto& s : shapes) {
    if (e.info->shape == s) return e;
  }
  return absl::InvalidArgumentError(absl::StrCat(name, ": expected ", ShapeStr(shapes.front()),
                                                 ", found ", e.info->ShapeString(), " in ",
                                                 e.file->path()));
}

absl::Status RefuseIfPresent(const SafetensorsCheckpoint& ckpt, const std::string& name,
                             const std::string& why) {
  if (ckpt.Find(name).file == nullptr) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(name, ": ", why, " is not supported"));
}

std::vector<float> Floats(const SafetensorsCheckpoint::Entry& e) {
  const int64_t n = e.info->NumElements();
  std::vector<float> out(n);
  const uint8_t* p = e.file->Data(*e.info);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    switch (e.info->dtype) {
      case DType::kF32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
      case DType::kBF16:
        std::memcpy(&bits, p + 2 * i, 2);
        out[i] = Bf16ToF32(bits);
        break;
      default:  // kF16 (Fetch admits nothing else)
        std::memcpy(&bits, p + 2 * i, 2);
        out[i] = F16ToF32(bits);
        break;
    }
  }
  return out;
}

std::vector<uint32_t> Words(const SafetensorsCheckpoint::Entry& e) {
  std::vector<uint32_t> out(e.info->NumElements());
  std::memcpy(out.data(), e.file->Data(*e.info), out.size() * 4);
  return out;
}

const std::vector<DType> kScaleDTypes = {DType::kF32, DType::kBF16, DType::kF16};

absl::StatusOr<QuantizedWeight> ReadEightBit(const SafetensorsCheckpoint& ckpt,
                                             const QuantConfig& q, const std::string& m, int64_t n,
                                             int64_t k) {
  const bool fp8 = q.format != Format::kCompressedInt8;
  QuantizedWeight w;
  w.code = fp8 ? QuantCode::kFp8E4M3 : QuantCode::kInt8;
  w.n = n;
  w.k = k;
  w.act_quant = q.act_quant;
  w.act_group_size = q.act_group_size;
  ASSIGN_OR_RETURN(auto codes,
                   Fetch(ckpt, m + ".weight", {fp8 ? DType::kF8E4M3 : DType::kI8}, {{n, k}}));
  w.codes.assign(codes.file->Data(*codes.info), codes.file->Data(*codes.info) + n * k);
  RETURN_IF_ERROR(RefuseIfPresent(ckpt, m + ".input_scale", "a static activation scale"));
  RETURN_IF_ERROR(RefuseIfPresent(ckpt, m + ".weight_zero_point", "an asymmetric weight"));
  if (q.format == Format::kFp8Block) {
    const int64_t rows = (n + q.block_n - 1) / q.block_n, cols = (k + q.block_k - 1) / q.block_k;
    ASSIGN_OR_RETURN(auto s, Fetch(ckpt, m + ".weight_scale_inv", kScaleDTypes, {{rows, cols}}));
    const std::vector<float> block = Floats(s);
    w.group_size = q.block_k;
    w.scales.resize(n * cols);
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(&w.scales[j * cols], &block[(j / q.block_n) * cols], cols * sizeof(float));
    }
    return w;
  }
  w.group_size = k;
  std::vector<std::vector<int64_t>> shapes = {{n, 1}};
  if (q.format == Format::kFp8PerTensor || q.per_tensor) shapes = {{1}, {}};
  ASSIGN_OR_RETURN(auto s, Fetch(ckpt, m + ".weight_scale", kScaleDTypes, shapes));
  const std::vector<float> scale = Floats(s);
  w.scales.resize(n);
  for (int64_t j = 0; j < n; ++j) w.scales[j] = scale.size() == 1 ? scale[0] : scale[j];
  return w;
}

absl::Status CheckMultiple(const std::string& m, const char* what, int64_t v, int64_t of,
                           const char* why) {
  if (v % of == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(m, ": ", what, " = ", v, " is not a multiple of ", of, " (", why, ")"));
}

// Sets codes (packed two per byte along k) from q(j, kk).
template <typename Code>
void PackUint4(QuantizedWeight& w, Code code) {
  const int64_t row_bytes = QuantRowBytes(QuantCode::kUint4, w.k);
  w.codes.assign(w.n * row_bytes, 0);
  for (int64_t j = 0; j < w.n; ++j) {
    for (int64_t kk = 0; kk < w.k; ++kk) {
      const uint8_t v = code(j, kk);
      w.codes[j * row_bytes + kk / 2] |= kk % 2 == 0 ? v : static_cast<uint8_t>(v << 4);
    }
  }
}

absl::StatusOr<QuantizedWeight> ReadInt4(const SafetensorsCheckpoint& ckpt, const QuantConfig& q,
                                         const std::string& m, int64_t n, int64_t k) {
  const bool awq = q.format == Format::kAwq;
  QuantizedWeight w;
  w.code = QuantCode::kUint4;
  w.n = n;
  w.k = k;
  w.group_size = q.group_size == -1 ? k : q.group_size;
  RETURN_IF_ERROR(CheckMultiple(m, "out_features", n, 8, "eight 4-bit values per int32"));
  if (!awq) RETURN_IF_ERROR(CheckMultiple(m, "in_features", k, 8, "GPTQ packs along k"));
  RETURN_IF_ERROR(CheckMultiple(m, "in_features", k, w.group_size, "the quantization group"));
  const int64_t groups = k / w.group_size;
  ASSIGN_OR_RETURN(auto qweight,
                   Fetch(ckpt, m + ".qweight", {DType::kI32},
                         {awq ? std::vector<int64_t>{k, n / 8} : std::vector<int64_t>{k / 8, n}}));
  ASSIGN_OR_RETURN(auto qzeros, Fetch(ckpt, m + ".qzeros", {DType::kI32}, {{groups, n / 8}}));
  ASSIGN_OR_RETURN(auto scales, Fetch(ckpt, m + ".scales", {DType::kF16, DType::kBF16, DType::kF32},
                                      {{groups, n}}));
  const std::vector<uint32_t> qw = Words(qweight), qz = Words(qzeros);
  const std::vector<float> s = Floats(scales);
  // Nibble of column j within its int32 (AWQ interleaves; GPTQ's zeros are sequential).
  int nibble_of_col[8];
  for (int i = 0; i < 8; ++i) nibble_of_col[awq ? kAwqOrder[i] : i] = i;
  auto nibble = [](uint32_t word, int i) { return static_cast<uint8_t>((word >> (4 * i)) & 0xf); };
  if (awq) {
    PackUint4(w, [&](int64_t j, int64_t kk) {
      return nibble(qw[kk * (n / 8) + j / 8], nibble_of_col[j % 8]);
    });
  } else {
    PackUint4(w, [&](int64_t j, int64_t kk) { return nibble(qw[(kk / 8) * n + j], kk % 8); });
    if (const auto g_idx = ckpt.Find(m + ".g_idx"); g_idx.file != nullptr) {
      ASSIGN_OR_RETURN(auto e, Fetch(ckpt, m + ".g_idx", {DType::kI32}, {{k}}));
      const std::vector<uint32_t> idx = Words(e);
      for (int64_t kk = 0; kk < k; ++kk) {
        if (static_cast<int64_t>(idx[kk]) != kk / w.group_size) {
          return absl::UnimplementedError(
              absl::StrCat(m, ".g_idx[", kk, "] = ", static_cast<int32_t>(idx[kk]), ", not ",
                           kk / w.group_size, ": act-order group indices are not supported"));
        }
      }
    }
  }
  const int zero_offset = awq || q.gptq_v2 ? 0 : 1;
  w.scales.resize(n * groups);
  w.zeros.resize(n * groups);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t g = 0; g < groups; ++g) {
      w.scales[j * groups + g] = s[g * n + j];
      w.zeros[j * groups + g] =
          static_cast<uint8_t>(nibble(qz[g * (n / 8) + j / 8], nibble_of_col[j % 8]) + zero_offset);
    }
  }
  return w;
}

}  // namespace

absl::StatusOr<QuantizedWeight> ReadQuantizedLinear(const SafetensorsCheckpoint& checkpoint,
                                                    const QuantConfig& quant,
                                                    const std::string& module, int64_t n,
                                                    int64_t k) {
  switch (quant.format) {
    case Format::kFp8Block:
    case Format::kFp8PerTensor:
    case Format::kCompressedFp8:
    case Format::kCompressedInt8:
      return ReadEightBit(checkpoint, quant, module, n, k);
    case Format::kAwq:
    case Format::kGptq:
      return ReadInt4(checkpoint, quant, module, n, k);
    default:
      return absl::InternalError(
          absl::StrCat(module, ": not a pre-quantized format: ", quant.Describe()));
  }
}

}  // namespace tandem
