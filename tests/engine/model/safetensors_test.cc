#include "engine/model/safetensors.h"

#include <cstring>
#include <filesystem>

#include "engine/model/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using testing_util::NewTempDir;
using testing_util::ReadFileOrDie;
using testing_util::WriteFileOrDie;

// Element i of every tensor is (its first shape dim * 16 + i), exact in every dtype used here.
void Fill(const TensorSpec& s, int64_t first, int64_t count, uint8_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = static_cast<float>(s.shape[0] * 16 + first + i);
    if (s.dtype == DType::kF32) {
      std::memcpy(out + 4 * i, &v, 4);
    } else {
      const uint16_t b = s.dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
      std::memcpy(out + 2 * i, &b, 2);
    }
  }
}

std::vector<TensorSpec> Specs() {
  return {{"a.weight", DType::kBF16, {3, 5}},
          {"b.weight", DType::kF32, {7}},
          {"c.weight", DType::kF16, {2, 2, 2}},
          {"d.bias", DType::kBF16, {1}}};
}

// Builds a raw safetensors file from a header text and `data_bytes` zero bytes.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, WriteThenReadRoundTrips) {
  const std::string dir = NewTempDir("st");
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir, Specs(), Fill, {}).ok());
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const TensorInfo* a = (*f)->Find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kBF16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a->begin % 8, 0);
  uint16_t bits;
  std::memcpy(&bits, (*f)->Data(*a) + 2 * 4, 2);
  EXPECT_EQ(Bf16ToF32(bits), 52.0f);
  const TensorInfo* c = (*f)->Find("c.weight");
  std::memcpy(&bits, (*f)->Data(*c) + 2 * 7, 2);
  EXPECT_EQ(F16ToF32(bits), 39.0f);
}

TEST(SafetensorsTest, ShardedCheckpointUsesIndex) {
  const std::string dir = NewTempDir("sharded");
  CheckpointWriteOptions options;
  options.num_shards = 3;
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir, Specs(), Fill, options).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00001-of-00003.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00003-of-00003.safetensors"));
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->files().size(), 3u);
  EXPECT_EQ((*ck)->tensors().size(), 4u);
  const auto e = (*ck)->Find("d.bias");
  ASSERT_NE(e.file, nullptr);
  uint16_t bits;
  std::memcpy(&bits, e.file->Data(*e.info), 2);
  EXPECT_EQ(Bf16ToF32(bits), 16.0f);
  // An index naming a shard that does not exist is an error, not a silent skip.
  std::filesystem::remove(dir + "/model-00002-of-00003.safetensors");
  ck = SafetensorsCheckpoint::Open(dir);
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kNotFound) << ck.status();
  EXPECT_NE(ck.status().message().find("model-00002-of-00003"), std::string::npos);
}

TEST(SafetensorsTest, MissingFilesAreNotFound) {
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent/x.safetensors").status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> ck =
      SafetensorsCheckpoint::Open(NewTempDir("none"));
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ck.status().message().find("safetensors"), std::string::npos);
}

TEST(SafetensorsTest, TruncatedFileNamesFileAndTensor) {
  const std::string dir = NewTempDir("trunc");
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir, Specs(), Fill, {}).ok());
  const std::string path = dir + "/model.safetensors";
  const std::string full = ReadFileOrDie(path);
  WriteFileOrDie(path, full.substr(0, full.size() - 1));  // cuts into d.bias, the last tensor
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("d.bias"), std::string::npos) << f.status();
  WriteFileOrDie(path, full.substr(0, 20));  // cuts into the header
  f = SafetensorsFile::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  WriteFileOrDie(path, "abc");
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, RejectsBadRanges) {
  const std::string path = NewTempDir("bad") + "/x.safetensors";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       "overlaps"},
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "needs 12 bytes"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", "past the end"},
      {R"({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}})", "Q4"},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", "data_offsets"},
      {R"([1, 2])", "not a JSON object"},
  };
  for (const auto& [header, expected] : cases) {
    WriteFileOrDie(path, RawFile(header, 12));
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << header;
    EXPECT_NE(f.status().message().find(expected), std::string::npos) << f.status();
  }
}

TEST(SafetensorsTest, RecognisesQuantizedDtypes) {
  EXPECT_EQ(*ParseSafetensorsDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(*ParseSafetensorsDType("I8"), DType::kI8);
  EXPECT_EQ(*ParseSafetensorsDType("BF16"), DType::kBF16);
  EXPECT_FALSE(ParseSafetensorsDType("F64").ok());
}

}  // namespace
}  // namespace tandem
