// Internal to kernels/gemm: skinny-GEMM kernels that keep the weight stream in flight without
// gaps (gemm_stream.cu), for long rows where the register-batch kernel of gemm.cu drains its
// loads before each batch of FMAs (kernels/gemm/WORKLOG.md, step 4).
#pragma once

#include "absl/status/status.h"
#include "kernels/common/stream.h"
#include "kernels/gemm/gemm.h"

namespace tandem::gemm_internal {

enum class SkinnyStream {
  // Registers, double-buffered: the next 4 x 16-byte loads of each thread are issued before the
  // current ones are used. 4 rows per 256-thread block, 4 blocks per SM.
  kPipelined4,
  // Bulk copies (cp.async.bulk, completed on an mbarrier) of 8 rows x 2 KB per stage into a
  // 3-stage shared-memory ring, refilled by one thread as soon as a stage is consumed.
  kBulk8,
};

// Requirements (checked by the caller, GemmSkinny's): 1 <= m <= 4, bf16 a and w, c bf16 or f32,
// k % 8 == 0, 16-byte aligned a and w.
absl::Status LaunchSkinnyStream(const GemmArgs& args, SkinnyStream kind, cudaStream_t stream);

}  // namespace tandem::gemm_internal
