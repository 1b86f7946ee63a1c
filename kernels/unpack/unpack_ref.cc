// UnpackBuilder and the CPU reference of Unpack (unpack.h).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "kernels/unpack/unpack.h"

namespace tandem {
namespace {

int64_t RoundUp(int64_t n) { return (n + kUnpackAlign - 1) / kUnpackAlign * kUnpackAlign; }

}  // namespace

void UnpackBuilder::Reset() {
  buffer_.assign(sizeof(UnpackHeader), 0);
  *mutable_header() = UnpackHeader{};
  mutable_header()->total_bytes = sizeof(UnpackHeader);
}

UnpackHeader* UnpackBuilder::mutable_header() {
  return reinterpret_cast<UnpackHeader*>(buffer_.data());
}

const UnpackHeader& UnpackBuilder::header() const {
  return *reinterpret_cast<const UnpackHeader*>(buffer_.data());
}

uint32_t UnpackBuilder::Append(const void* src, int64_t bytes) {
  const size_t offset = buffer_.size();
  buffer_.resize(offset + RoundUp(bytes), 0);
  if (bytes > 0) std::memcpy(buffer_.data() + offset, src, bytes);
  mutable_header()->total_bytes = static_cast<uint32_t>(buffer_.size());
  return static_cast<uint32_t>(offset);
}

absl::Status UnpackBuilder::AddCopy(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("UnpackBuilder: negative size");
  if (bytes == 0) return absl::OkStatus();
  if (reinterpret_cast<uintptr_t>(dst) % kUnpackAlign != 0) {
    return absl::InvalidArgumentError("UnpackBuilder: destination not 16-byte aligned");
  }
  if (header().num_copies >= kUnpackMaxCopies) {
    return absl::ResourceExhaustedError(
        absl::StrCat("UnpackBuilder: more than ", kUnpackMaxCopies, " copies"));
  }
  if (size() + RoundUp(bytes) > int64_t{UINT32_MAX}) {
    return absl::ResourceExhaustedError("UnpackBuilder: packed buffer over 4 GiB");
  }
  const uint32_t offset = Append(src, bytes);
  UnpackHeader* h = mutable_header();
  const uint32_t padded = static_cast<uint32_t>(RoundUp(bytes));
  h->copies[h->num_copies++] = {reinterpret_cast<uint64_t>(dst), offset, padded};
  h->max_copy_bytes = std::max(h->max_copy_bytes, padded);
  return absl::OkStatus();
}

absl::Status UnpackBuilder::AddRows(int32_t* dst, int dst_stride,
                                    const std::vector<int32_t>& values,
                                    const std::vector<int32_t>& row_start) {
  if (row_start.empty() || row_start[0] != 0 ||
      row_start.back() != static_cast<int32_t>(values.size())) {
    return absl::InvalidArgumentError("UnpackBuilder: row_start is not a prefix sum of values");
  }
  for (size_t r = 0; r + 1 < row_start.size(); ++r) {
    const int32_t width = row_start[r + 1] - row_start[r];
    if (width < 0 || width > dst_stride) {
      return absl::InvalidArgumentError(
          absl::StrCat("UnpackBuilder: row ", r, " has ", width, " values; stride ", dst_stride));
    }
  }
  if (header().num_row_sets >= kUnpackMaxRowSets) {
    return absl::ResourceExhaustedError("UnpackBuilder: too many row sets");
  }
  const uint32_t src = Append(values.data(), int64_t(values.size() * sizeof(int32_t)));
  const uint32_t starts = Append(row_start.data(), int64_t(row_start.size() * sizeof(int32_t)));
  UnpackHeader* h = mutable_header();
  h->rows[h->num_row_sets++] = {reinterpret_cast<uint64_t>(dst), src, starts,
                                static_cast<int32_t>(row_start.size() - 1), dst_stride};
  return absl::OkStatus();
}

void UnpackRef(const void* packed) {
  const auto* base = static_cast<const uint8_t*>(packed);
  const auto& h = *static_cast<const UnpackHeader*>(packed);
  CHECK_LE(h.num_copies, static_cast<uint32_t>(kUnpackMaxCopies));
  CHECK_LE(h.num_row_sets, static_cast<uint32_t>(kUnpackMaxRowSets));
  for (uint32_t i = 0; i < h.num_copies; ++i) {
    const UnpackCopy& c = h.copies[i];
    std::memcpy(reinterpret_cast<void*>(c.dst), base + c.src_offset, c.bytes);
  }
  for (uint32_t i = 0; i < h.num_row_sets; ++i) {
    const UnpackRows& rs = h.rows[i];
    const auto* values = reinterpret_cast<const int32_t*>(base + rs.src_offset);
    const auto* starts = reinterpret_cast<const int32_t*>(base + rs.row_start_offset);
    auto* dst = reinterpret_cast<int32_t*>(rs.dst);
    for (int32_t r = 0; r < rs.num_rows; ++r) {
      std::memcpy(dst + int64_t{r} * rs.dst_stride, values + starts[r],
                  sizeof(int32_t) * (starts[r + 1] - starts[r]));
    }
  }
}

}  // namespace tandem
