// How QuantGemmTc cuts k across blocks (split-K, WORKLOG.md step 8): the launcher's choice as a
// pure function of the shape and the device's size, so it is tested without a device
// (quant_gemm_tc_split_test, cpu). Plain C++, host only.
//
// A block owns kQuantTcBlockRows rows of w (one "row tile" of the grid) and, split, a range of k:
// split s takes chunks [s * chunks_per_split, min(num_chunks, (s + 1) * chunks_per_split)), so
// every split but the last has chunks_per_split chunks and the last has the rest (at least one).
// chunks_per_split is a multiple of unit_chunks (a scale group's chunks), so a split boundary is
// a chunk and a group boundary; with one scale per row (group_size = k) any chunk boundary will
// do (every split scales its own part by the row's scale).
//
// The automatic plan (forced = 0) splits only where the row tiles alone give fewer than
// kQuantTcSplitBelowBlocksPerSm blocks per SM (the n = 4096-6144 shapes of an 8B model: 128-192
// tiles for 132 SMs), and then takes the split count whose modelled time is least:
//   waves(S) * (chunks of the longest split / num_chunks)          the codes, in waves of
//                                                                   sms * blocks_per_sm blocks
//   + 8 * S * tiles * m_tile / (sms * blocks_per_sm * row_bytes)   the fp32 partials written and
//                                                                   read back, per block slot,
// in units of one unsplit block's code bytes; it splits only when that beats the unsplit time by
// kQuantTcSplitMinGain. chunks_per_split is rounded up to a multiple of the block's 8 warps (one
// chunk per warp at a time) and to at least kQuantTcMinSplitChunks: four chunks a warp, since a
// block's fixed cost (ramp, block reduction, the last block's read-back) is not in the model and
// dominates shorter splits (measured on an H100, WORKLOG.md step 8: QKV 4096 -> 6144 in four
// splits of 16 chunks was 24-32% slower than unsplit, two splits of 32+ chunks 6-15% faster).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace tandem {

inline constexpr int kQuantTcMaxSplits = 8;
inline constexpr int64_t kQuantTcBlockRows = 32;       // rows of w per block (two 16-row mma tiles)
inline constexpr int64_t kQuantTcBlockWarps = 8;       // warps per block, chunk c to warp c % 8
inline constexpr int64_t kQuantTcMinSplitChunks = 32;  // automatic plans: 4 chunks a warp
inline constexpr int kQuantTcSplitBelowBlocksPerSm = 2;
inline constexpr double kQuantTcSplitMinGain = 0.9;  // split when modelled time < 0.9 x unsplit

struct QuantTcSplitShape {
  int64_t n = 0;
  int64_t m_tile = 8;       // tokens of the kernel's token tile: 8, 16, 32 or 64
  int64_t num_chunks = 1;   // k / chunk
  int64_t unit_chunks = 1;  // chunks a split boundary must be a multiple of (group / chunk, or 1)
  int64_t row_bytes = 1;    // code bytes of a row of w
  int sms = 1;              // the device's SMs
  int blocks_per_sm = 1;    // blocks of this kernel instantiation resident on one SM
};

struct QuantTcSplitPlan {
  int splits = 1;
  int64_t chunks_per_split = 0;  // num_chunks when unsplit
};

inline int64_t QuantTcRowTiles(int64_t n) {
  return (n + kQuantTcBlockRows - 1) / kQuantTcBlockRows;
}

// The plan whose splits hold chunks_per_split chunks each (the last the rest).
inline QuantTcSplitPlan QuantTcPlanOfChunks(const QuantTcSplitShape& s, int64_t chunks_per_split) {
  const int64_t per = std::clamp<int64_t>(chunks_per_split, 1, s.num_chunks);
  return {static_cast<int>((s.num_chunks + per - 1) / per), per};
}

// Modelled time of a plan in units of one unsplit block's code reads (the header comment).
inline double QuantTcPlanCost(const QuantTcSplitShape& s, const QuantTcSplitPlan& p) {
  const int64_t slots = static_cast<int64_t>(s.sms) * std::max(s.blocks_per_sm, 1);
  const int64_t tiles = QuantTcRowTiles(s.n);
  const int64_t waves = (tiles * p.splits + slots - 1) / slots;
  double cost = static_cast<double>(waves) * static_cast<double>(p.chunks_per_split) /
                static_cast<double>(s.num_chunks);
  if (p.splits > 1) {
    cost += 8.0 * p.splits * static_cast<double>(tiles) * static_cast<double>(s.m_tile) /
            (static_cast<double>(slots) * static_cast<double>(s.row_bytes));
  }
  return cost;
}

// forced >= 1: that many splits, as near as whole units allow (never more than k has units, so
// a forced plan may come out with fewer); 0: the automatic plan above.
inline QuantTcSplitPlan PlanQuantTcSplit(const QuantTcSplitShape& s, int forced) {
  const int64_t unit = std::max<int64_t>(s.unit_chunks, 1);
  const int64_t units = (s.num_chunks + unit - 1) / unit;
  const QuantTcSplitPlan unsplit{1, s.num_chunks};
  if (forced >= 1) {
    const int64_t parts = std::min<int64_t>(forced, units);
    return QuantTcPlanOfChunks(s, (units + parts - 1) / parts * unit);
  }
  if (QuantTcRowTiles(s.n) >= int64_t{kQuantTcSplitBelowBlocksPerSm} * s.sms) return unsplit;
  const int64_t step = std::lcm(unit, kQuantTcBlockWarps);
  QuantTcSplitPlan best = unsplit;
  double best_cost = kQuantTcSplitMinGain * QuantTcPlanCost(s, unsplit);
  for (int splits = 2; splits <= kQuantTcMaxSplits; ++splits) {
    int64_t per = (units + splits - 1) / splits * unit;
    per = std::max((per + step - 1) / step * step, kQuantTcMinSplitChunks);
    const QuantTcSplitPlan p = QuantTcPlanOfChunks(s, per);
    if (p.splits < 2) continue;
    if (const double cost = QuantTcPlanCost(s, p); cost < best_cost) best = p, best_cost = cost;
  }
  return best;
}

// fp32 partials a plan needs: splits x tiles x (32 rows x m_tile tokens), each block's in its
// lanes' accumulator order (quant_gemm_tc.cu); none when unsplit.
inline int64_t QuantTcPartialFloats(const QuantTcSplitShape& s, const QuantTcSplitPlan& p) {
  return p.splits > 1 ? p.splits * QuantTcRowTiles(s.n) * kQuantTcBlockRows * s.m_tile : 0;
}

}  // namespace tandem
