// Evening out the decode CTAs' work: the partition decode_plan.h's balanced plans are cut by
// (WORKLOG.md step 18). Units of work (there: a sequence's row group, on every KV head) are laid
// end to end as one stream of key tiles, and the stream is cut into `slots` contiguous ranges
// whose lengths differ by at most one tile; a unit cut between two ranges becomes two pieces
// (there: split items whose partial results merge). StridedMakespan is what the plain strided
// layout (unit u on slot u % slots) gives its busiest slot, the measure of whether to balance.
// Host-side only, tested without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// Tiles [tile_begin, tile_end) of unit `unit`, computed by CTA `slot`.
struct DecodeUnitPiece {
  int32_t unit = 0;
  int32_t tile_begin = 0;
  int32_t tile_end = 0;
  int32_t slot = 0;
};

// The most tiles any CTA computes when unit u runs on CTA u % slots (the plain strided layout).
int64_t StridedMakespan(std::span<const int32_t> tiles, int slots);

// Cuts the tile stream of units with tiles[u] >= 0 tiles each into `slots` contiguous ranges,
// CTA c taking stream tiles [c T / slots, (c + 1) T / slots) of the T in all, and writes the
// pieces to `out` (cleared first) in stream order: units in order, each unit's pieces in tile
// order on consecutive CTAs, no piece empty (a unit of zero tiles has none). slots >= 1.
void BalanceDecodeTiles(std::span<const int32_t> tiles, int slots,
                        std::vector<DecodeUnitPiece>& out);

}  // namespace tandem
