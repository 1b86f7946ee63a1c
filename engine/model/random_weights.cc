#include "engine/model/random_weights.h"

#include <cmath>
#include <cstring>
#include <map>

#include "base/thread_pool.h"

namespace tandem {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

constexpr float kResidualGain = 4.0f;

// Uniform in [-1, 1) from the top 24 bits (exact in float).
float Uniform(uint64_t key, int64_t index) {
  const uint64_t r = SplitMix64(key + static_cast<uint64_t>(index) * 0xd1b54a32d192ed03ull);
  return static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Returns (center, half_width) of the uniform distribution of a tensor's elements.
std::pair<float, float> Range(const HfTensor& t) {
  const float sqrt3 = std::sqrt(3.0f);
  const auto& shape = t.spec.shape;
  switch (t.role) {
    case TensorRole::kEmbedding:
    case TensorRole::kLmHead:
      return {0.0f, sqrt3 * 3.0f / std::sqrt(static_cast<float>(shape[1]))};
    case TensorRole::kProjection:
      return {0.0f, sqrt3 / std::sqrt(static_cast<float>(shape[1]))};
    case TensorRole::kResidualProjection:
      // Larger, so the layers outweigh the token's own embedding in the residual stream: with
      // tied embeddings that term favours repeating the input token over and over.
      return {0.0f, kResidualGain * sqrt3 / std::sqrt(static_cast<float>(shape[1]))};
    case TensorRole::kBias:
      return {0.0f, 0.5f};
    case TensorRole::kNorm:
      return {1.0f, 0.25f};
  }
  return {0.0f, 0.0f};
}

}  // namespace

float RandomWeight(uint64_t seed, const HfTensor& tensor, int64_t index) {
  const uint64_t key = SplitMix64(seed) ^ Fnv1a(tensor.spec.name);
  const auto [center, half_width] = Range(tensor);
  return center + half_width * Uniform(key, index);
}

void FillRandomWeights(uint64_t seed, const HfTensor& t, DType dtype, int64_t first, int64_t count,
                       uint8_t* out) {
  ParallelFor(count, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = RandomWeight(seed, t, first + i);
      if (dtype == DType::kF32) {
        std::memcpy(out + 4 * i, &v, 4);
      } else {
        const uint16_t bits = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
        std::memcpy(out + 2 * i, &bits, 2);
      }
    }
  });
}

absl::Status WriteRandomWeights(const ModelConfig& config, uint64_t seed, const std::string& dir,
                                const CheckpointWriteOptions& options) {
  const std::vector<HfTensor> tensors = HfTensors(config);
  std::map<std::string, const HfTensor*> by_name;
  std::vector<TensorSpec> specs;
  for (const HfTensor& t : tensors) {
    by_name[t.spec.name] = &t;
    specs.push_back(t.spec);
  }
  const TensorFiller fill = [&](const TensorSpec& spec, int64_t first, int64_t count,
                                uint8_t* out) {
    FillRandomWeights(seed, *by_name.at(spec.name), spec.dtype, first, count, out);
  };
  return WriteSafetensorsCheckpoint(dir, specs, fill, options);
}

}  // namespace tandem
