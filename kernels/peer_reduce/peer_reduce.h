// PeerReduceSum: one rank's share of an in-process all-reduce over buffers that the rank's
// device can address (ranks sharing a GPU, or NVLink peers with peer access enabled):
//   for i in [begin, end): s = Σ_{r = 0..num_buffers-1} buffers[r][i], in rank order, in fp32;
//                          buffers[r][i] = s (bf16: rounded once) for every r.
// Every buffer ends with bitwise the same values, and the ranks' shares are disjoint, so the
// ranks may run their shares concurrently, in place (comm/group/peer_communicator.h).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"

namespace tandem {

inline constexpr int kMaxPeerReduceBuffers = 8;

struct PeerReduceArgs {
  void* buffers[kMaxPeerReduceBuffers] = {};  // [num_buffers] each >= end elements of dtype
  int num_buffers = 0;                        // 1..kMaxPeerReduceBuffers
  int64_t begin = 0;
  int64_t end = 0;
  DType dtype = DType::kBF16;  // kF32 or kBF16
};

// InvalidArgument on a bad dtype, count or range.
absl::Status CheckPeerReduce(const PeerReduceArgs& args);
void PeerReduceSumRef(const PeerReduceArgs& args);
absl::Status PeerReduceSum(const PeerReduceArgs& args, cudaStream_t stream);

}  // namespace tandem
