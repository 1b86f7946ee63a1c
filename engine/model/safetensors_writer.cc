#include "engine/model/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using json = nlohmann::json;

// Elements produced per fill call: bounds the writer's memory whatever the tensor size.
constexpr int64_t kChunkElems = int64_t{1} << 20;

struct FileCloser {
  void operator()(FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};

std::string Header(const std::vector<TensorSpec>& specs, const std::string& format_metadata) {
  // nlohmann::ordered_json keeps insertion order, so the header lists tensors in file order.
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", format_metadata}};
  int64_t offset = 0;
  for (const TensorSpec& s : specs) {
    h[s.name] = {{"dtype", std::string(DTypeName(s.dtype))},
                 {"shape", s.shape},
                 {"data_offsets", {offset, offset + s.NumBytes()}}};
    offset += s.NumBytes();
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

absl::Status WriteAll(FILE* f, const void* data, size_t n, const std::string& path) {
  if (std::fwrite(data, 1, n, f) != n) {
    return absl::InternalError(absl::StrCat(path, ": write failed (disk full?)"));
  }
  return absl::OkStatus();
}

// Groups consecutive specs into shards: by count when num_shards > 0, else by byte cap.
std::vector<std::vector<TensorSpec>> Split(const std::vector<TensorSpec>& specs,
                                           const CheckpointWriteOptions& options) {
  int64_t total = 0;
  for (const TensorSpec& s : specs) total += s.NumBytes();
  const int64_t cap = options.num_shards > 0 ? (total + options.num_shards - 1) / options.num_shards
                                             : options.max_shard_bytes;
  std::vector<std::vector<TensorSpec>> shards(1);
  int64_t in_shard = 0;
  for (const TensorSpec& s : specs) {
    const bool room_for_more =
        options.num_shards <= 0 || static_cast<int>(shards.size()) < options.num_shards;
    if (!shards.back().empty() && in_shard + s.NumBytes() > cap && room_for_more) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(s);
    in_shard += s.NumBytes();
  }
  return shards;
}

}  // namespace

int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status WriteSafetensorsFile(const std::string& path, const std::vector<TensorSpec>& specs,
                                  const TensorFiller& fill, const std::string& format_metadata) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot create ", path));
  const std::string header = Header(specs, format_metadata);
  uint8_t size_bytes[8];
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  RETURN_IF_ERROR(WriteAll(f.get(), size_bytes, 8, path));
  RETURN_IF_ERROR(WriteAll(f.get(), header.data(), header.size(), path));
  std::vector<uint8_t> buf;
  for (const TensorSpec& s : specs) {
    const int64_t n = s.NumElements();
    for (int64_t first = 0; first < n; first += kChunkElems) {
      const int64_t count = std::min(kChunkElems, n - first);
      buf.resize(count * DTypeSize(s.dtype));
      fill(s, first, count, buf.data());
      RETURN_IF_ERROR(WriteAll(f.get(), buf.data(), buf.size(), path));
    }
  }
  if (std::fclose(f.release()) != 0) {
    return absl::InternalError(absl::StrCat(path, ": close failed"));
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensorsCheckpoint(const std::string& dir,
                                        const std::vector<TensorSpec>& specs,
                                        const TensorFiller& fill,
                                        const CheckpointWriteOptions& options) {
  const std::vector<std::vector<TensorSpec>> shards = Split(specs, options);
  if (shards.size() == 1) {
    return WriteSafetensorsFile(dir + "/model.safetensors", specs, fill, options.format_metadata);
  }
  nlohmann::ordered_json index;
  int64_t total = 0;
  for (const TensorSpec& s : specs) total += s.NumBytes();
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  const int n = static_cast<int>(shards.size());
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
    RETURN_IF_ERROR(
        WriteSafetensorsFile(dir + "/" + name, shards[i], fill, options.format_metadata));
    for (const TensorSpec& s : shards[i]) index["weight_map"][s.name] = name;
  }
  const std::string path = dir + "/model.safetensors.index.json";
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot create ", path));
  const std::string text = index.dump(2) + "\n";
  return WriteAll(f.get(), text.data(), text.size(), path);
}

}  // namespace tandem
