// Element types shared by kernels, weights and the KV cache, with host-side conversions.
// CPU-safe: no CUDA headers. bf16/f16 are stored as raw uint16_t bits on the host.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI8, kI32, kI64, kU8 };

constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI8:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  return 0;
}

constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI8:
      return "I8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

// bf16 <-> f32, round-to-nearest-even (NaN stays NaN), as PyTorch does.
inline float Bf16ToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// Rounds an f32 to the nearest bf16 and back: what storing to a bf16 tensor does.
inline float RoundToBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

// IEEE half <-> f32 (round-to-nearest-even).
float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float f);

}  // namespace tandem
