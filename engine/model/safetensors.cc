#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using json = nlohmann::json;

// A header larger than this is certainly corrupt (real ones are well under 10 MB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::StatusOr<TensorInfo> ParseTensor(const std::string& name, const json& v, int64_t data_size) {
  TensorInfo t;
  t.name = name;
  auto dt = v.find("dtype");
  auto shape = v.find("shape");
  auto offsets = v.find("data_offsets");
  if (!v.is_object() || dt == v.end() || !dt->is_string() || shape == v.end() ||
      !shape->is_array() || offsets == v.end() || !offsets->is_array() || offsets->size() != 2) {
    return absl::InvalidArgumentError("needs dtype, shape and data_offsets [begin, end]");
  }
  ASSIGN_OR_RETURN(t.dtype, ParseSafetensorsDType(dt->get<std::string>()));
  for (const json& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return absl::InvalidArgumentError("shape must hold non-negative integers");
    }
    t.shape.push_back(d.get<int64_t>());
  }
  for (const json& o : *offsets) {
    if (!o.is_number_unsigned()) {
      return absl::InvalidArgumentError("data_offsets must be non-negative integers");
    }
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
  if (begin > end || end > static_cast<uint64_t>(data_size)) {
    return absl::InvalidArgumentError(absl::StrCat("data_offsets [", begin, ", ", end,
                                                   ") past the end of the data (", data_size,
                                                   " bytes): file truncated?"));
  }
  t.begin = static_cast<int64_t>(begin);
  t.end = static_cast<int64_t>(end);
  // numel can overflow for hostile shapes; the byte count check below then fails anyway.
  const int64_t expected = t.NumElements() * DTypeSize(t.dtype);
  if (expected != t.end - t.begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", t.ShapeString(), " of ", std::string(DTypeName(t.dtype)), " needs ",
                     expected, " bytes, data_offsets give ", t.end - t.begin));
  }
  return t;
}

}  // namespace

absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI8, DType::kI32,
                  DType::kI64, DType::kU8}) {
    if (DTypeName(t) == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype \"", std::string(name), "\""));
}

int64_t TensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::ShapeString() const { return "[" + absl::StrJoin(shape, ", ") + "]"; }

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Bad(path, std::strerror(errno));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_size_ = st.st_size;
  if (st.st_size < 8) {
    ::close(fd);
    return Bad(path, absl::StrCat("file of ", st.st_size, " bytes is too short (truncated?)"));
  }
  void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Bad(path, absl::StrCat("mmap: ", std::strerror(errno)));
  file->map_ = map;
  const uint8_t* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxHeaderBytes || header_size > static_cast<uint64_t>(st.st_size) - 8) {
    return Bad(path, absl::StrCat("header size ", header_size, " exceeds the file (", st.st_size,
                                  " bytes): truncated or not safetensors"));
  }
  file->data_ = bytes + 8 + header_size;
  const int64_t data_size = st.st_size - 8 - static_cast<int64_t>(header_size);
  RETURN_IF_ERROR(file->ParseHeader(
      std::string_view(reinterpret_cast<const char*>(bytes + 8), header_size), data_size));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

absl::Status SafetensorsFile::ParseHeader(std::string_view header, int64_t data_size) {
  const json j = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(path_, "header is not a JSON object");
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Bad(path_, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<TensorInfo> t = ParseTensor(name, value, data_size);
    if (!t.ok()) return Bad(path_, absl::StrCat("tensor ", name, ": ", t.status().message()));
    auto [it, inserted] = tensors_.emplace(name, *std::move(t));
    by_offset.push_back(&it->second);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.begin < prev.end && cur.end > cur.begin) {
      return Bad(path_, absl::StrCat("tensor ", cur.name, " overlaps tensor ", prev.name,
                                     " (bytes [", cur.begin, ", ", cur.end, ") vs [", prev.begin,
                                     ", ", prev.end, "))"));
    }
  }
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

namespace {

// Shard file names from DIR/model.safetensors.index.json, or every *.safetensors in DIR.
absl::StatusOr<std::vector<std::string>> ShardNames(const std::string& dir,
                                                    std::map<std::string, std::string>* map) {
  namespace fs = std::filesystem;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> names;
  std::ifstream in(index_path);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    const json j = json::parse(ss.str(), nullptr, false);
    auto wm = j.is_object() ? j.find("weight_map") : j.end();
    if (j.is_discarded() || wm == j.end() || !wm->is_object()) {
      return Bad(index_path, "needs a \"weight_map\" object");
    }
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string()) return Bad(index_path, absl::StrCat("bad entry for ", tensor));
      const std::string shard = file.get<std::string>();
      (*map)[tensor] = shard;
      if (std::find(names.begin(), names.end(), shard) == names.end()) names.push_back(shard);
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") names.push_back(e.path().filename().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(names.begin(), names.end());
  if (names.empty()) return absl::NotFoundError(absl::StrCat("no *.safetensors files in ", dir));
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  std::map<std::string, std::string> weight_map;
  ASSIGN_OR_RETURN(std::vector<std::string> names, ShardNames(dir, &weight_map));
  auto ckpt = std::make_unique<SafetensorsCheckpoint>();
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open(dir + "/" + name));
    for (const auto& [tensor, info] : file->tensors()) {
      auto [it, inserted] = ckpt->tensors_.emplace(tensor, Entry{file.get(), &info});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, " appears in both ",
                                                       it->second.file->path(), " and ",
                                                       file->path()));
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  for (const auto& [tensor, file] : weight_map) {
    const Entry e = ckpt->Find(tensor);
    if (e.file == nullptr || e.file->path() != dir + "/" + file) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/model.safetensors.index.json maps ",
                                                     tensor, " to ", file,
                                                     ", which does not hold it"));
    }
  }
  return ckpt;
}

SafetensorsCheckpoint::Entry SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? Entry{} : it->second;
}

}  // namespace tandem
