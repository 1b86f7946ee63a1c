// The CPU reference of PeerReduceSum (peer_reduce.h): the same fp32 sums in rank order.
#include "absl/strings/str_cat.h"
#include "kernels/peer_reduce/peer_reduce.h"

namespace tandem {

absl::Status CheckPeerReduce(const PeerReduceArgs& a) {
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("PeerReduceSum of ", std::string(DTypeName(a.dtype)), ": F32 or BF16 only"));
  }
  if (a.num_buffers < 1 || a.num_buffers > kMaxPeerReduceBuffers) {
    return absl::InvalidArgumentError(absl::StrCat("PeerReduceSum over ", a.num_buffers,
                                                   " buffers (1 to ", kMaxPeerReduceBuffers, ")"));
  }
  if (a.begin < 0 || a.end < a.begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("PeerReduceSum of elements [", a.begin, ", ", a.end, ")"));
  }
  for (int r = 0; r < a.num_buffers; ++r) {
    if (a.buffers[r] == nullptr && a.end > a.begin) {
      return absl::InvalidArgumentError(absl::StrCat("PeerReduceSum: buffer ", r, " is null"));
    }
  }
  return absl::OkStatus();
}

void PeerReduceSumRef(const PeerReduceArgs& a) {
  const bool f32 = a.dtype == DType::kF32;
  for (int64_t i = a.begin; i < a.end; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < a.num_buffers; ++r) {
      sum += f32 ? static_cast<const float*>(a.buffers[r])[i]
                 : Bf16ToF32(static_cast<const uint16_t*>(a.buffers[r])[i]);
    }
    for (int r = 0; r < a.num_buffers; ++r) {
      if (f32) {
        static_cast<float*>(a.buffers[r])[i] = sum;
      } else {
        static_cast<uint16_t*>(a.buffers[r])[i] = F32ToBf16(sum);
      }
    }
  }
}

}  // namespace tandem
