// Where a tensor-parallel rank's slice (tensor_shard.h) may cut a quantized linear weight.
// A rank reads only its slice of the checkpoint's tensors (quant_checkpoint.h) and gets the
// canonical QuantizedWeight of that slice, which must equal the same slice of the whole weight
// read at tensor_parallel 1 (bitwise: codes, scales and zero points). Per format, an [n, k]
// weight sliced along
//
//   dim 0 (column-parallel: out_features; q/k/v, gate/up):
//     8-bit formats (fp8 block, per channel, per tensor; int8; load-time fp8 / int8): any cut.
//       Scales travel with their rows; a 128x128 block scale is shared by the rows of its
//       block, and the canonical layout holds one scale per row, so a cut inside a block gives
//       each rank the block's scale for each of its rows (exact).
//     awq, gptq: begin and count multiples of 8 (qzeros, and AWQ's qweight, pack eight output
//       columns per int32).
//     load-time int4: any cut (groups run along k).
//   dim 1 (row-parallel: in_features; o_proj, down_proj):
//     per-channel and per-tensor scales (and GPTQ with group_size -1, one group per row):
//       replicated on every rank, any cut;
//     fp8 block: begin a multiple of block_k, count one too unless the slice ends at k (the last,
//       partial block);
//     awq, gptq: begin and count multiples of the group (GPTQ: and of 8, qweight packs eight
//       rows of k per int32);
//     load-time int4: begin a multiple of its group (128), count one too unless it ends at k.
//
// A cut the format cannot take is InvalidArgument naming the tensor, its shape, the cut and the
// tensor-parallel size: never a silent misread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/model/quant_config.h"
#include "engine/model/tensor_shard.h"

namespace tandem {

// OK when `slice` of the [n, k] weight `tensor` (quantized as `quant`) is one a rank of `tp`
// can read exactly (the rules above); a whole tensor always is.
absl::Status CheckQuantSlice(const QuantConfig& quant, const std::string& tensor, int64_t n,
                             int64_t k, const TensorSlice& slice, int tp);

}  // namespace tandem
