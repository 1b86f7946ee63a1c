// The Hopper (wgmma + TMA) prefill path, internal to kernels/paged_attention: which shapes it
// takes and its launcher. PagedAttentionPrefill (paged_attention_prefill.cu) dispatches here
// when Sm90PrefillSupported(args) holds and TANDEM_PREFILL_KERNEL is not "fa2".
#pragma once

#include "absl/status/status.h"
#include "kernels/paged_attention/attention_plan.h"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem::attention {

// bf16, head_dim 128, a power-of-two page size >= 8, 16-byte aligned q / cache, q_stride a
// multiple of 8 elements. Prefill plans only (items start at key 0).
bool Sm90PrefillSupported(const PagedAttentionArgs& args);

absl::Status LaunchPrefillSm90(const PagedAttentionArgs& args, const AttentionPlan& plan,
                               cudaStream_t stream);

}  // namespace tandem::attention
