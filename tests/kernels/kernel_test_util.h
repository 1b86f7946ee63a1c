// Helpers shared by the kernel tests: seeded random tensors and bf16/f32 buffers as float.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/common/host_elem.h"

namespace tandem::testing {

// A host buffer of n elements of dtype t (kF32 or kBF16), filled with uniform values in
// [lo, hi) drawn from rng. Never zeros: a kernel that writes nothing cannot pass.
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<uint8_t> bytes;

  HostTensor(DType t, int64_t n) : dtype(t), bytes(n * DTypeSize(t)) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  int64_t size() const { return static_cast<int64_t>(bytes.size()) / DTypeSize(dtype); }
  float at(int64_t i) const { return LoadElem(bytes.data(), dtype, i); }
  void set(int64_t i, float v) { StoreElem(bytes.data(), dtype, i, v); }
};

inline HostTensor RandomTensor(DType t, int64_t n, std::mt19937_64& rng, float lo = -1.0f,
                               float hi = 1.0f) {
  HostTensor out(t, n);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < n; ++i) out.set(i, dist(rng));
  return out;
}

// One unit in the last place of a bf16 value of magnitude |v| (relative 2^-7 at worst).
inline double Bf16Ulp(double v) {
  const double a = std::max(std::abs(v), 1e-30);
  return std::ldexp(1.0, std::ilogb(a) - 7);
}

}  // namespace tandem::testing
