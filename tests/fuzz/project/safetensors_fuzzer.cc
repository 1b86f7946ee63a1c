// Fuzzes safetensors loading (engine/model/safetensors.h, SafetensorsFile::Open): the input is
// a whole file (held in a memfd, opened by its /proc path as any checkpoint file is). A file
// that opens must have every tensor's bytes inside it: each is read end to end (ASan catches
// a read past the mapping).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/check.h"
#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  CHECK_GE(fd, 0);
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    CHECK_GT(n, 0);
    written += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  absl::StatusOr<std::unique_ptr<tandem::SafetensorsFile>> file =
      tandem::SafetensorsFile::Open(path);
  if (file.ok()) {
    uint8_t sum = 0;
    for (const auto& [name, info] : (*file)->tensors()) {
      CHECK_LE(info.begin, info.end);
      CHECK_EQ(info.end - info.begin, info.NumElements() * tandem::DTypeSize(info.dtype));
      const uint8_t* bytes = (*file)->Data(info);
      for (int64_t i = 0; i < info.end - info.begin; ++i) sum ^= bytes[i];
      CHECK((*file)->Find(name) == &info);
    }
    (void)sum;
  }
  close(fd);
  return 0;
}
