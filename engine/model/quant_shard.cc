// The cuts each quantized format admits (quant_shard.h).
#include "engine/model/quant_shard.h"

#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using Format = QuantConfig::Format;

// The granularity a cut along `slice.dim` must respect, and why; 0: any cut. `ends_partial`:
// the last slice may end at the tensor's edge off the granularity (a partial block or group).
struct Granule {
  int64_t step = 0;
  bool ends_partial = false;
  std::string why;
};

Granule ColumnGranule(const QuantConfig& q) {
  if (q.format == Format::kAwq || q.format == Format::kGptq) {
    return {8, false, "eight output columns are packed per int32 of qzeros (and of AWQ's qweight)"};
  }
  return {};
}

Granule RowGranule(const QuantConfig& q) {
  switch (q.format) {
    case Format::kFp8Block:
      return {q.block_k, true, absl::StrCat("a ", q.block_n, "x", q.block_k, " scale block")};
    case Format::kAwq:
      return {q.group_size, false, absl::StrCat("a quantization group of ", q.group_size)};
    case Format::kGptq:
      if (q.group_size == -1) return {8, false, "eight rows of k are packed per int32 of qweight"};
      return {std::lcm(q.group_size, int64_t{8}), false,
              absl::StrCat("a quantization group of ", q.group_size,
                           " (or the eight rows of k packed per int32 of qweight)")};
    case Format::kLoadTimeInt4:
      return {q.group_size, true, absl::StrCat("a quantization group of ", q.group_size)};
    default:  // per-channel or per-tensor scales: replicated
      return {};
  }
}

}  // namespace

absl::Status CheckQuantSlice(const QuantConfig& quant, const std::string& tensor, int64_t n,
                             int64_t k, const TensorSlice& slice, int tp) {
  if (slice.whole() || !quant.quantized()) return absl::OkStatus();
  const bool rows = slice.dim == 1;
  const Granule g = rows ? RowGranule(quant) : ColumnGranule(quant);
  if (g.step <= 1) return absl::OkStatus();
  const int64_t extent = rows ? k : n;
  const int64_t end = slice.begin + slice.count;
  const bool begin_ok = slice.begin % g.step == 0;
  const bool end_ok = end % g.step == 0 || (g.ends_partial && end == extent);
  if (begin_ok && end_ok) return absl::OkStatus();
  const int64_t cut = begin_ok ? end : slice.begin;
  return absl::InvalidArgumentError(absl::StrCat(
      tensor, ": tensor_parallel ", tp, " splits its [", n, ", ", k, "] weight along ",
      rows ? "in_features" : "out_features", " into slices of ", slice.count, ", cutting at ", cut,
      " through ", g.why, " (", quant.Describe(), "); each rank's slice must start and end ",
      "on a multiple of ", g.step, g.ends_partial ? " (the last may end at the edge)" : "",
      ": use another tensor_parallel"));
}

}  // namespace tandem
