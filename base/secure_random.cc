#include "base/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <vector>

#include "base/check.h"

namespace tandem {

std::string RandomHex(int num_bytes) {
  CHECK_GT(num_bytes, 0);
  std::vector<unsigned char> bytes(static_cast<size_t>(num_bytes));
  size_t filled = 0;
  while (filled < bytes.size()) {
    const ssize_t n = getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    CHECK(n > 0) << "getrandom failed: errno " << errno;
    filled += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace tandem
