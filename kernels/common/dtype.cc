#include "kernels/common/dtype.h"

#include <cmath>

namespace tandem {

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to inf
  if (a < 6.103515625e-05f) {                // subnormal half: scale and round
    const float scaled = a * 16777216.0f;    // 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t exp = ((u >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  uint32_t half = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

}  // namespace tandem
