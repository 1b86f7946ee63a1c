// Unpack: scatters one packed buffer, built on the host and uploaded with a single host-to-device
// copy, into the fixed device arrays it describes. This is how a step's inputs reach the GPU
// (plan once per step): token ids, positions, slot mapping, sampling parameters, attention work
// items... all travel in one copy, and their device homes keep fixed addresses, so a CUDA graph
// captured over them replays with the next step's values.
//
// Packed buffer layout (16-byte aligned throughout):
//
//   [UnpackHeader][payload ...]
//
// The header lists flat copies (`bytes` from payload offset `src_offset` to `dst`) and row sets:
// `num_rows` int32 rows of varying width, row r being [row_start[r], row_start[r + 1]) of an
// int32 array at `src_offset` (row_start itself is an int32 array at `row_start_offset`), written
// to dst + r * dst_stride (int32 elements). Row sets expand compact block tables into a table
// with a fixed stride; entries past a row's width are left as they were.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/stream.h"

namespace tandem {

inline constexpr int kUnpackMaxCopies = 32;
inline constexpr int kUnpackMaxRowSets = 2;
inline constexpr int64_t kUnpackAlign = 16;

struct UnpackCopy {
  uint64_t dst = 0;         // device address, 16-byte aligned
  uint32_t src_offset = 0;  // from the start of the packed buffer, 16-byte aligned
  uint32_t bytes = 0;       // a multiple of 16 (the builder pads; dst has room for the padding)
};

struct UnpackRows {
  uint64_t dst = 0;               // device int32 [num_rows, dst_stride]
  uint32_t src_offset = 0;        // int32 values, rows back to back
  uint32_t row_start_offset = 0;  // int32 [num_rows + 1], row_start[0] == 0
  int32_t num_rows = 0;
  int32_t dst_stride = 0;  // int32 elements between rows of dst; >= every row's width
};

struct UnpackHeader {
  uint32_t num_copies = 0;
  uint32_t num_row_sets = 0;
  uint32_t total_bytes = 0;     // header + payload
  uint32_t max_copy_bytes = 0;  // the largest copy (sizes the grid)
  UnpackCopy copies[kUnpackMaxCopies];
  UnpackRows rows[kUnpackMaxRowSets];
};
static_assert(sizeof(UnpackHeader) % kUnpackAlign == 0);

// Builds a packed buffer in host memory. Not thread-safe; reuse it step after step (Reset keeps
// the capacity, so a steady state allocates nothing).
class UnpackBuilder {
 public:
  UnpackBuilder() { Reset(); }
  void Reset();

  // Queues `bytes` of `src` for device address `dst` (16-byte aligned, with room for `bytes`
  // rounded up to 16). At most kUnpackMaxCopies per buffer; bytes == 0 queues nothing.
  absl::Status AddCopy(void* dst, const void* src, int64_t bytes);
  template <typename T>
  absl::Status AddCopy(T* dst, const std::vector<T>& src) {
    return AddCopy(static_cast<void*>(dst), src.data(), int64_t(src.size() * sizeof(T)));
  }
  // Queues rows: values [row_start[r], row_start[r + 1]) of `values` go to dst + r * dst_stride.
  // InvalidArgument when a row is wider than dst_stride or row_start is not a prefix sum.
  absl::Status AddRows(int32_t* dst, int dst_stride, const std::vector<int32_t>& values,
                       const std::vector<int32_t>& row_start);

  // The finished buffer (header filled in): upload data()[0, size()) and run Unpack on it.
  const uint8_t* data() const { return buffer_.data(); }
  int64_t size() const { return static_cast<int64_t>(buffer_.size()); }
  const UnpackHeader& header() const;

 private:
  uint32_t Append(const void* src, int64_t bytes);  // returns the payload offset
  UnpackHeader* mutable_header();

  std::vector<uint8_t> buffer_;
};

// CPU reference: performs the copies of a packed buffer in host memory (dst are host addresses).
void UnpackRef(const void* packed);

// CUDA: `packed_device` holds the uploaded buffer (already on `stream`'s timeline); `header` is
// the host copy of its header (from the builder), used only to size the launch.
absl::Status Unpack(const void* packed_device, const UnpackHeader& header, cudaStream_t stream);

}  // namespace tandem
