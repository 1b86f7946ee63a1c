// FP8 e4m3 ("float8_e4m3fn": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no
// infinities, S.1111.111 is NaN, largest finite 448) <-> f32 on the host.
#pragma once

#include <cmath>
#include <cstdint>

namespace tandem {

inline constexpr float kFp8E4M3Max = 448.0f;

inline float Fp8E4M3ToF32(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float v;
  if (exponent == 0xf && mantissa == 0x7) {
    v = NAN;
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m / 8 * 2^-6
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return (bits & 0x80) ? -v : v;
}

// Round to nearest, ties to even; saturates to +-448 (the quantizers' clamp); NaN -> 0x7f.
inline uint8_t F32ToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;
  int code;
  if (a < 0.015625f) {  // below the smallest normal, 2^-6: steps of 2^-9
    code = static_cast<int>(std::nearbyint(std::ldexp(a, 9)));
  } else {
    int e = 0;
    const float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
    // a = (1 + m / 8) * 2^(e - 1); a mantissa that rounds up to 8 carries into the exponent.
    const int m = static_cast<int>(std::nearbyint((frac * 2.0f - 1.0f) * 8.0f));
    code = ((e - 1 + 7) << 3) + m;
  }
  if (code > 0x7e) code = 0x7e;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace tandem
