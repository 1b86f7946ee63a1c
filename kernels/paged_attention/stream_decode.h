// The decode kernel's stream variant (stream_decode.cu, WORKLOG.md steps 16-17), bf16 cache or
// fused FP8: for plans that do not split key ranges to fill the GPU (large batches; balanced
// plans, cut only to even out the CTAs' work, included), each CTA runs one continuous
// pipeline over all of its work items (cp.async or TMA copies: DecodeCopies), so the next item's
// first tiles are in flight while the current item's last tiles compute and its warps merge.
// Internal to kernels/paged_attention.
#pragma once

#include "absl/status/status.h"
#include "kernels/common/stream.h"
#include "kernels/paged_attention/attention_plan.h"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem::attention {

// Launches the stream kernel for `a` (a bf16 cache or an fp8 one read with the fused tile,
// head_dim 64 or 128, checked by the caller; its stages filled as a.decode_copies says, kDefault
// taking TANDEM_DECODE_COPIES) over `plan`. Correct for any plan (a CUDA graph captured with an
// unsplit plan may replay with a split one), but built for unsplit and balanced ones: on split
// plans the split variant of paged_attention.cu is the faster one.
absl::Status LaunchStreamDecode(const PagedAttentionArgs& a, const AttentionPlan& plan,
                                cudaStream_t stream);

}  // namespace tandem::attention
