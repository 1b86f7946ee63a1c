#include "base/cluster_token.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::string> LoadClusterToken(const std::string& file) {
  std::string token;
  if (!file.empty()) {
    struct stat st;
    if (stat(file.c_str(), &st) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read cluster token file ", file));
    }
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster token file ", file, " may be read by others (chmod 600 it)"));
    }
    std::ifstream in(file);
    std::stringstream s;
    s << in.rdbuf();
    if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", file));
    token = std::string(absl::StripTrailingAsciiWhitespace(s.str()));
  } else if (const char* env = std::getenv(kClusterTokenEnv); env != nullptr) {
    token = env;
  }
  if (!token.empty() && token.size() < kMinClusterTokenChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster token is shorter than ", kMinClusterTokenChars, " characters"));
  }
  return token;
}

bool TokenMatches(std::string_view secret, std::string_view candidate) {
  if (secret.empty()) return false;
  // Loops over the candidate (the caller's input) and reads the secret cyclically, so neither
  // its length nor its bytes shape the time taken.
  unsigned char diff = secret.size() == candidate.size() ? 0 : 1;
  for (size_t i = 0; i < candidate.size(); ++i) {
    diff |= static_cast<unsigned char>(candidate[i] ^ secret[i % secret.size()]);
  }
  // Keep the compiler from short-cutting the loop.
  volatile unsigned char result = diff;
  return result == 0;
}

}  // namespace tandem
