// Reading safetensors checkpoints: one file (SafetensorsFile, memory-mapped) or a whole Hugging
// Face folder, sharded through model.safetensors.index.json or not (SafetensorsCheckpoint).
//
// File format: [u64 little-endian N][N bytes of JSON header][data]. The header maps each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end)}, offsets relative to the start of the
// data; an optional "__metadata__" entry holds string pairs. Every tensor's byte range is
// validated at open (size = numel * dtype size, inside the file, no two ranges overlapping), so
// later reads of Data() cannot go out of bounds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/dtype.h"

namespace tandem {

// Parses a safetensors dtype name ("BF16", "F16", "F32", "F8_E4M3", "I8", "I32", "I64", "U8").
absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte offset from the start of the data section
  int64_t end = 0;

  int64_t NumElements() const;
  std::string ShapeString() const;  // "[1024, 256]"
};

// One memory-mapped .safetensors file. Immutable after Open: thread-safe.
class SafetensorsFile {
 public:
  // NotFound if the file is missing; InvalidArgument naming the file (and tensor) if the header
  // is malformed or a tensor's byte range is wrong, past the end of the file or overlapping.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* Find(std::string_view name) const;
  // The tensor's bytes (little-endian, row-major), valid while this file is open.
  const uint8_t* Data(const TensorInfo& info) const { return data_ + info.begin; }

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader(std::string_view header, int64_t data_size);

  std::string path_;
  void* map_ = nullptr;
  int64_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a Hugging Face model folder. Immutable after Open: thread-safe.
class SafetensorsCheckpoint {
 public:
  // Uses DIR/model.safetensors.index.json when present (every shard it names must exist and
  // hold the tensors mapped to it), else every DIR/*.safetensors. NotFound if there are none;
  // InvalidArgument if a tensor name appears in two files.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  struct Entry {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* info = nullptr;
  };
  // nullptr-file Entry if absent.
  Entry Find(std::string_view name) const;
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> tensors_;
};

}  // namespace tandem
