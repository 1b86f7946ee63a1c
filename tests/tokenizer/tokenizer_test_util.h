// Helpers shared by the tokenizer tests: generated tokenizer directories, file reading, and
// the committed golden files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tokenizer/tokenizer.h"

namespace tandem::testing {

struct NamedFamily {
  const char* name;  // as in make_golden.py
  TokenizerFamily family;
};
inline const std::vector<NamedFamily>& AllFamilies() {
  static const std::vector<NamedFamily> kFamilies = {{"llama3", TokenizerFamily::kLlama3},
                                                     {"qwen2", TokenizerFamily::kQwen2},
                                                     {"llama2", TokenizerFamily::kLlama2},
                                                     {"mistral", TokenizerFamily::kMistral}};
  return kFamilies;
}

// The configurations make_golden.py's CONFIGS lists (same names and sizes).
struct GoldenConfig {
  std::string name;
  NamedFamily family;
  int vocab_size;
};
inline std::vector<GoldenConfig> GoldenConfigs() {
  std::vector<GoldenConfig> configs;
  for (const auto& f : AllFamilies()) configs.push_back({f.name, f, 512});
  for (const auto& f : AllFamilies()) configs.push_back({std::string(f.name) + "_8k", f, 8192});
  return configs;
}

inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

inline void WriteFileOrDie(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  ASSERT_TRUE(file.good()) << "cannot write " << path;
}

// A fresh directory under $TMPDIR (or /tmp), left for the OS to clean.
inline std::string MakeTempDir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/tandem_tok_" + tag + "_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const char* dir = mkdtemp(buf.data());
  EXPECT_NE(dir, nullptr);
  return dir != nullptr ? std::string(dir) : std::string("/tmp");
}

// Writes the generated tokenizer of `family` (vocab 512, as make_golden.py uses) into a new
// temporary directory and returns it.
inline std::string WriteFamily(const NamedFamily& f, int vocab_size = 512) {
  const std::string dir = MakeTempDir(f.name);
  TokenizerSpec spec;
  spec.vocab_size = vocab_size;
  const absl::Status status = WriteTokenizerFiles(dir, f.family, spec);
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

inline std::string SourceDir() {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

inline std::string TestDataPath(const std::string& name) {
  return SourceDir() + "/tests/tokenizer/" + name;
}

// FNV-1a 64 as hex, the fingerprint make_golden.py records for tokenizer.json.
inline std::string Fnv1a64(const std::string& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001B3ull;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace tandem::testing
