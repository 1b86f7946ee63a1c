// Unpacking each checkpoint format's tensors into QuantizedWeight (layouts in quant_checkpoint.h).
#include "engine/model/quant_checkpoint.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "engine/model/quant_shard.h"

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

// Element i of a float tensor (F32, BF16 or F16: Fetch admits nothing else), read from the
// mapped file: a rank touches only the elements of its slice.
float FloatAt(const SafetensorsCheckpoint::Entry& e, int64_t i) {
  const uint8_t* p = e.file->Data(*e.info);
  if (e.info->dtype == DType::kF32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, p + 2 * i, 2);
  return e.info->dtype == DType::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
}

uint32_t WordAt(const SafetensorsCheckpoint::Entry& e, int64_t i) {
  uint32_t v;
  std::memcpy(&v, e.file->Data(*e.info) + 4 * i, 4);
  return v;
}

// The part of the [n, k] weight a rank reads: rows [r0, r0 + n) and columns [c0, c0 + k).
struct Window {
  int64_t r0 = 0, n = 0, c0 = 0, k = 0;
};

Window WindowOf(int64_t n, int64_t k, const TensorSlice& slice) {
  if (slice.dim == 0) return {slice.begin, slice.count, 0, k};
  if (slice.dim == 1) return {0, n, slice.begin, slice.count};
  return {0, n, 0, k};
}

const std::vector<DType> kScaleDTypes = {DType::kF32, DType::kBF16, DType::kF16};

absl::StatusOr<QuantizedWeight> ReadEightBit(const SafetensorsCheckpoint& ckpt,
                                             const QuantConfig& q, const std::string& m, int64_t n,
                                             int64_t k, const Window& win) {
  const bool fp8 = q.format != Format::kCompressedInt8;
  QuantizedWeight w;
  w.code = fp8 ? QuantCode::kFp8E4M3 : QuantCode::kInt8;
  w.n = win.n;
  w.k = win.k;
  w.act_quant = q.act_quant;
  w.act_group_size = q.act_group_size;
  ASSIGN_OR_RETURN(auto codes,
                   Fetch(ckpt, m + ".weight", {fp8 ? DType::kF8E4M3 : DType::kI8}, {{n, k}}));
  const uint8_t* src = codes.file->Data(*codes.info);
  w.codes.resize(win.n * win.k);
  for (int64_t j = 0; j < win.n; ++j) {
    std::memcpy(&w.codes[j * win.k], src + (win.r0 + j) * k + win.c0, win.k);
  }
  RETURN_IF_ERROR(RefuseIfPresent(ckpt, m + ".input_scale", "a static activation scale"));
  RETURN_IF_ERROR(RefuseIfPresent(ckpt, m + ".weight_zero_point", "an asymmetric weight"));
  if (q.format == Format::kFp8Block) {
    const int64_t rows = (n + q.block_n - 1) / q.block_n, cols = (k + q.block_k - 1) / q.block_k;
    ASSIGN_OR_RETURN(auto s, Fetch(ckpt, m + ".weight_scale_inv", kScaleDTypes, {{rows, cols}}));
    // Each row takes its block row's scales; the window starts on a block column (quant_shard.h).
    const int64_t first_col = win.c0 / q.block_k, local_cols = (win.k + q.block_k - 1) / q.block_k;
    w.group_size = q.block_k;
    w.scales.resize(win.n * local_cols);
    for (int64_t j = 0; j < win.n; ++j) {
      for (int64_t c = 0; c < local_cols; ++c) {
        w.scales[j * local_cols + c] =
            FloatAt(s, ((win.r0 + j) / q.block_n) * cols + first_col + c);
      }
    }
    return w;
  }
  w.group_size = win.k;  // per channel or per tensor: the whole (local) row
  std::vector<std::vector<int64_t>> shapes = {{n, 1}};
  if (q.format == Format::kFp8PerTensor || q.per_tensor) shapes = {{1}, {}};
  ASSIGN_OR_RETURN(auto s, Fetch(ckpt, m + ".weight_scale", kScaleDTypes, shapes));
  const bool one = s.info->NumElements() == 1;
  w.scales.resize(win.n);
  for (int64_t j = 0; j < win.n; ++j) w.scales[j] = FloatAt(s, one ? 0 : win.r0 + j);
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
                                         const std::string& m, int64_t n, int64_t k,
                                         const Window& win) {
  const bool awq = q.format == Format::kAwq;
  const int64_t group = q.group_size == -1 ? k : q.group_size;  // along the whole k
  RETURN_IF_ERROR(CheckMultiple(m, "out_features", n, 8, "eight 4-bit values per int32"));
  if (!awq) RETURN_IF_ERROR(CheckMultiple(m, "in_features", k, 8, "GPTQ packs along k"));
  RETURN_IF_ERROR(CheckMultiple(m, "in_features", k, group, "the quantization group"));
  const int64_t groups = k / group;
  QuantizedWeight w;
  w.code = QuantCode::kUint4;
  w.n = win.n;
  w.k = win.k;
  // One group per row (GPTQ's -1) stays one group of the rank's part of the row.
  w.group_size = q.group_size == -1 ? win.k : group;
  const int64_t local_groups = win.k / w.group_size, first_group = win.c0 / group;
  ASSIGN_OR_RETURN(auto qweight,
                   Fetch(ckpt, m + ".qweight", {DType::kI32},
                         {awq ? std::vector<int64_t>{k, n / 8} : std::vector<int64_t>{k / 8, n}}));
  ASSIGN_OR_RETURN(auto qzeros, Fetch(ckpt, m + ".qzeros", {DType::kI32}, {{groups, n / 8}}));
  ASSIGN_OR_RETURN(auto scales, Fetch(ckpt, m + ".scales", {DType::kF16, DType::kBF16, DType::kF32},
                                      {{groups, n}}));
  // Nibble of column j within its int32 (AWQ interleaves; GPTQ's zeros are sequential).
  int nibble_of_col[8];
  for (int i = 0; i < 8; ++i) nibble_of_col[awq ? kAwqOrder[i] : i] = i;
  auto nibble = [](uint32_t word, int i) { return static_cast<uint8_t>((word >> (4 * i)) & 0xf); };
  // (j, kk) index the window; (col, row) the whole weight.
  if (awq) {
    PackUint4(w, [&](int64_t j, int64_t kk) {
      const int64_t col = win.r0 + j, row = win.c0 + kk;
      return nibble(WordAt(qweight, row * (n / 8) + col / 8), nibble_of_col[col % 8]);
    });
  } else {
    PackUint4(w, [&](int64_t j, int64_t kk) {
      const int64_t col = win.r0 + j, row = win.c0 + kk;
      return nibble(WordAt(qweight, (row / 8) * n + col), static_cast<int>(row % 8));
    });
    if (const auto g_idx = ckpt.Find(m + ".g_idx"); g_idx.file != nullptr) {
      ASSIGN_OR_RETURN(auto e, Fetch(ckpt, m + ".g_idx", {DType::kI32}, {{k}}));
      for (int64_t row = win.c0; row < win.c0 + win.k; ++row) {
        const auto idx = static_cast<int32_t>(WordAt(e, row));
        if (idx != row / group) {
          return absl::UnimplementedError(
              absl::StrCat(m, ".g_idx[", row, "] = ", idx, ", not ", row / group,
                           ": act-order group indices are not supported"));
        }
      }
    }
  }
  const int zero_offset = awq || q.gptq_v2 ? 0 : 1;
  w.scales.resize(win.n * local_groups);
  w.zeros.resize(win.n * local_groups);
  for (int64_t j = 0; j < win.n; ++j) {
    const int64_t col = win.r0 + j;
    for (int64_t g = 0; g < local_groups; ++g) {
      const int64_t gg = first_group + g;
      w.scales[j * local_groups + g] = FloatAt(scales, gg * n + col);
      w.zeros[j * local_groups + g] = static_cast<uint8_t>(
          nibble(WordAt(qzeros, gg * (n / 8) + col / 8), nibble_of_col[col % 8]) + zero_offset);
    }
  }
  return w;
}

}  // namespace

absl::StatusOr<QuantizedWeight> ReadQuantizedLinear(const SafetensorsCheckpoint& checkpoint,
                                                    const QuantConfig& quant,
                                                    const std::string& module, int64_t n, int64_t k,
                                                    const TensorSlice& slice, int tp) {
  RETURN_IF_ERROR(CheckQuantSlice(quant, module, n, k, slice, tp));
  const Window win = WindowOf(n, k, slice);
  switch (quant.format) {
    case Format::kFp8Block:
    case Format::kFp8PerTensor:
    case Format::kCompressedFp8:
    case Format::kCompressedInt8:
      return ReadEightBit(checkpoint, quant, module, n, k, win);
    case Format::kAwq:
    case Format::kGptq:
      return ReadInt4(checkpoint, quant, module, n, k, win);
    default:
      return absl::InternalError(
          absl::StrCat(module, ": not a pre-quantized format: ", quant.Describe()));
  }
}

}  // namespace tandem
