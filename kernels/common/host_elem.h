// Host-side element access for the CPU references: read/write element i of a kF32 or kBF16
// buffer as float. Storing to bf16 rounds to nearest-even, as a bf16 tensor store does.
#pragma once

#include <cstdint>

#include "base/check.h"
#include "kernels/common/dtype.h"

namespace tandem {

inline float LoadElem(const void* p, DType t, int64_t i) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  DCHECK(t == DType::kBF16);
  return Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
}

inline void StoreElem(void* p, DType t, int64_t i, float v) {
  if (t == DType::kF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    DCHECK(t == DType::kBF16);
    static_cast<uint16_t*>(p)[i] = F32ToBf16(v);
  }
}

// Rounds v to what a tensor of dtype t would hold.
inline float RoundTo(DType t, float v) { return t == DType::kBF16 ? RoundToBf16(v) : v; }

// True for the float dtypes the elementwise references accept.
inline bool IsF32OrBf16(DType t) { return t == DType::kF32 || t == DType::kBF16; }

}  // namespace tandem
