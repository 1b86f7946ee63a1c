// The host side of a decode launch's plan (decode_plan.h).
#include <algorithm>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/paged_attention/decode_plan.h"

namespace tandem {
namespace {

constexpr int kMinSplitKeys = 256;  // a split shorter than this costs more to merge than it saves

// A balanced plan replaces the strided one when the strided plan's longest CTA has at least
// kMinBalanceRatioNum / kMinBalanceRatioDen (1.5) times the even share of tiles. Measured (H200,
// WORKLOG.md step 18, CTAs balanced one by one): at 1.6-1.95 (ragged lengths, 2k-4k keys on
// average) the balanced plans took 15-32% off the strided ones; at 1.39-1.45 (ragged, 640-1k keys)
// the strided ones were level or up to 8% faster (DRAM stays saturated until few CTAs are left,
// and the cuts' merges cost), and so at the 1.02-1.03 of uniform lengths.
constexpr int64_t kMinBalanceRatioNum = 3;
constexpr int64_t kMinBalanceRatioDen = 2;

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The chunk one key range is split by: about `chunk` (at most kMaxDecodeSplits splits), evened
// out so the splits of one range have equal length up to one tile.
int SplitChunk(int key_end, int chunk) {
  // Rounded, not ceiled: a range 1.2 chunks long stays one split (no merge, one item).
  const int splits =
      std::clamp(static_cast<int>((key_end + chunk / 2) / chunk), 1, kMaxDecodeSplits);
  return CeilDiv(CeilDiv(key_end, splits), kDecodeTileKeys) * kDecodeTileKeys;
}

// The chunk a split plan cuts key ranges by: the batch's keys over slots x items_per_slot
// (at least kMinSplitKeys, whole tiles), doubled until the splits' partial results fit.
int SplitChunkOf(const AttentionBatchShape& b, int64_t total_keys, const DecodePlanOptions& o,
                 const DecodePlanLimits& limits) {
  const int tile_rows = kDecodeRows;
  const int64_t target = int64_t{std::max(1, o.items_per_slot)} * std::max(1, o.slots);
  int chunk = std::max<int>(kMinSplitKeys, CeilDiv(total_keys, std::max<int64_t>(target, 1)));
  chunk = CeilDiv(chunk, kDecodeTileKeys) * kDecodeTileKeys;
  // Grow the chunk until the partial results fit the workspace.
  for (;;) {
    int64_t partials = 0;
    for (int s = 0; s < b.num_seqs; ++s) {
      const int rows = PackedRows(b, s);
      for (int r = 0; r < rows; r += tile_rows) {
        const int key_end = RowsKeyEnd(b, s, std::min(rows, r + tile_rows));
        const int splits = CeilDiv(key_end, SplitChunk(key_end, chunk));
        if (splits > 1) partials += int64_t{splits} * b.num_kv_heads;
      }
    }
    if (partials <= limits.max_partials) break;
    chunk *= 2;
  }
  return chunk;
}

}  // namespace

absl::StatusOr<DecodeBalance> ParseDecodeBalance(const char* value) {
  const std::string_view v = value != nullptr ? value : "";
  if (v.empty() || v == "auto") return DecodeBalance::kAuto;
  if (v == "off") return DecodeBalance::kOff;
  if (v == "force") return DecodeBalance::kForce;
  return absl::InvalidArgumentError(absl::StrCat(
      "TANDEM_DECODE_BALANCE must be auto, off or force, not \"", std::string(v), "\""));
}

absl::StatusOr<DecodeOrder> ParseDecodeOrder(const char* value) {
  const std::string_view v = value != nullptr ? value : "";
  if (v.empty() || v == "seq") return DecodeOrder::kSequenceMajor;
  if (v == "head") return DecodeOrder::kHeadMajor;
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_DECODE_ORDER must be seq or head, not \"", std::string(v), "\""));
}

int PackedRows(const AttentionBatchShape& b, int s) {
  return (b.query_start[s + 1] - b.query_start[s]) * (b.num_q_heads / b.num_kv_heads);
}

int RowsKeyEnd(const AttentionBatchShape& b, int s, int row_end) {
  const int group = b.num_q_heads / b.num_kv_heads;
  const int q_len = b.query_start[s + 1] - b.query_start[s];
  return b.seq_lens[s] - q_len + (row_end - 1) / group + 1;
}

absl::StatusOr<DecodePlanCounts> DecodePlanner::Plan(const AttentionBatchShape& b,
                                                     const DecodePlanOptions& o,
                                                     const DecodePlanLimits& limits,
                                                     AttentionWorkItem* items,
                                                     AttentionMergeItem* merges) {
  if (b.num_kv_heads <= 0 || b.num_q_heads <= 0 || b.num_q_heads % b.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode plan: ", b.num_q_heads, " query heads over ", b.num_kv_heads, " KV heads"));
  }
  const int tile_rows = kDecodeRows;
  int64_t total_keys = 0;
  for (int s = 0; s < b.num_seqs; ++s) {
    const int q_len = b.query_start[s + 1] - b.query_start[s];
    if (q_len < 0 || b.seq_lens[s] < q_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decode plan: sequence ", s, " has ", b.seq_lens[s], " keys and ", q_len, " new tokens"));
    }
    total_keys += int64_t{b.num_kv_heads} * CeilDiv(PackedRows(b, s), tile_rows) * b.seq_lens[s];
  }
  const int chunk = SplitChunkOf(b, total_keys, o, limits);
  int n = 0, m = 0, p = 0;
  for (int s = 0; s < b.num_seqs; ++s) {
    const int rows = PackedRows(b, s);
    for (int h = 0; h < b.num_kv_heads; ++h) {
      for (int r = 0; r < rows; r += tile_rows) {
        const int num_rows = std::min(tile_rows, rows - r);
        const int key_end = RowsKeyEnd(b, s, r + num_rows);
        const int group_chunk = SplitChunk(key_end, chunk);
        const int splits = CeilDiv(key_end, group_chunk);
        if (n + splits > limits.max_items || m + (splits > 1) > limits.max_merges) {
          return absl::ResourceExhaustedError(
              absl::StrCat("attention plan capacity exceeded at seq ", s));
        }
        const int merge = splits > 1 ? m : -1;
        const int q0 = b.query_start[s];
        const int first_pos = b.seq_lens[s] - (b.query_start[s + 1] - q0);
        if (splits > 1) merges[m++] = {s, h, r, num_rows, p, splits, q0};
        for (int k = 0; k < splits; ++k) {
          items[n++] = {s,
                        h,
                        r,
                        num_rows,
                        k * group_chunk,
                        std::min(key_end, (k + 1) * group_chunk),
                        splits > 1 ? p++ : -1,
                        merge,
                        q0,
                        first_pos};
        }
      }
    }
  }
  DecodePlanCounts counts{n, m, p, m > 0};
  if (!counts.split_kv && o.balance != DecodeBalance::kOff) {
    Balance(o, limits, b.num_kv_heads, items, merges, counts);
  }
  const bool balanced = !counts.split_kv && counts.merges > 0;
  if (o.order == DecodeOrder::kHeadMajor && !balanced) {
    // Items refer to their merges and partial slots by index, so any order computes the same.
    std::stable_sort(items, items + counts.items,
                     [](const AttentionWorkItem& x, const AttentionWorkItem& y) {
                       return x.kv_head < y.kv_head;
                     });
  }
  return counts;
}

// The strided plan's items (one per unit, whole key ranges, in (sequence, KV head, rows) order)
// become the balanced plan's when the strided plan's longest CTA has kMinBalanceRatio times the
// even share or more (kForce: always). The balance keeps what the strided layout gets from a grid
// of num_kv_heads x groups CTAs: CTAs g H .. g H + H - 1 read the H heads of the same sequences at
// the same time (adjacent in a page: WORKLOG.md step 18 measured 5.7% lost at page 16 when one
// CTA read a sequence's heads one after another). So the row groups (sequence, rows) are balanced
// over the `groups` CTA groups (BalanceDecodeTiles) and each piece runs on all H CTAs of its
// group, head h on CTA g H + h; group g's j-th piece is item j * slots + g H + h (the stride the
// kernels walk; empty items fill the gaps: no rows, no keys), with a merge for each head of a row
// group cut in pieces. Left as it is if slots is not a multiple of H or the pieces exceed the
// capacity.
void DecodePlanner::Balance(const DecodePlanOptions& o, const DecodePlanLimits& limits,
                            int num_kv_heads, AttentionWorkItem* items, AttentionMergeItem* merges,
                            DecodePlanCounts& counts) {
  const int heads = num_kv_heads, slots = o.slots;
  if (heads <= 0 || slots % heads != 0) return;
  // The decision first (every step of a large batch pays it): the units' tiles, straight from
  // the strided items.
  unit_tiles_.resize(counts.items);
  int64_t total = 0;
  for (int u = 0; u < counts.items; ++u) {
    unit_tiles_[u] = CeilDiv(items[u].key_end - items[u].key_begin, kDecodeTileKeys);
    total += unit_tiles_[u];
  }
  const int64_t ideal = (total + slots - 1) / slots;
  if (o.balance != DecodeBalance::kForce &&
      StridedMakespan(unit_tiles_, slots) * kMinBalanceRatioDen < ideal * kMinBalanceRatioNum) {
    return;
  }
  units_.assign(items, items + counts.items);
  CollectRowGroups();
  BalanceDecodeTiles(row_tiles_, slots / heads, pieces_);
  WriteBalanced(slots, heads, limits, items, merges, counts);
}

void DecodePlanner::CollectRowGroups() {
  row_units_.clear();
  row_tiles_.clear();
  row_head_stride_.clear();
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].kv_head != 0) continue;
    const bool new_seq = row_units_.empty() || units_[row_units_.back()].seq != units_[u].seq;
    row_units_.push_back(static_cast<int32_t>(u));
    row_tiles_.push_back(unit_tiles_[u]);
    row_head_stride_.push_back(new_seq ? 1 : row_head_stride_.back() + 1);
  }
  // A row group's head stride is its sequence's row-group count (counted up above: give the
  // earlier row groups of each sequence the last one's count).
  for (size_t i = row_units_.size(); i-- > 1;) {
    if (units_[row_units_[i - 1]].seq == units_[row_units_[i]].seq) {
      row_head_stride_[i - 1] = row_head_stride_[i];
    }
  }
}

void DecodePlanner::WriteBalanced(int slots, int heads, const DecodePlanLimits& limits,
                                  AttentionWorkItem* items, AttentionMergeItem* merges,
                                  DecodePlanCounts& counts) {
  const int groups = slots / heads;
  // The item count, and the merges and partials the cuts need.
  group_pieces_.assign(groups, 0);
  int n = 0, m = 0, p = 0;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const int g = pieces_[k].slot;
    n = std::max(n, group_pieces_[g]++ * slots + (g + 1) * heads);
    const bool first = k == 0 || pieces_[k - 1].unit != pieces_[k].unit;
    const bool cut = !first || (k + 1 < pieces_.size() && pieces_[k + 1].unit == pieces_[k].unit);
    if (cut) p += heads;
    if (cut && first) m += heads;
  }
  if (n > limits.max_items || m > limits.max_merges || p > limits.max_partials) return;
  std::fill(items, items + n, AttentionWorkItem{});  // num_rows 0, keys [0, 0): nothing to do
  group_pieces_.assign(groups, 0);
  m = 0, p = 0;
  int splits = 1, split = 0;  // the current row group's pieces, and this piece's index
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const DecodeUnitPiece& piece = pieces_[k];
    const bool first = k == 0 || pieces_[k - 1].unit != piece.unit;
    if (first) {
      splits = 1, split = 0;
      while (k + splits < pieces_.size() && pieces_[k + splits].unit == piece.unit) ++splits;
    }
    const int j = group_pieces_[piece.slot]++;
    for (int h = 0; h < heads; ++h) {
      const AttentionWorkItem& unit =
          units_[row_units_[piece.unit] + h * row_head_stride_[piece.unit]];
      AttentionWorkItem& it = items[j * slots + piece.slot * heads + h];
      it = unit;
      it.key_begin = unit.key_begin + piece.tile_begin * kDecodeTileKeys;
      it.key_end = std::min(unit.key_end, unit.key_begin + piece.tile_end * kDecodeTileKeys);
      if (splits == 1) continue;  // the whole row group on one CTA group: writes the output
      // Head h's splits: merge m + h, partial slots [p + h splits, + splits).
      if (first) {
        merges[m + h] = {unit.seq,       unit.kv_head, unit.row_begin,  unit.num_rows,
                         p + h * splits, splits,       unit.token_begin};
      }
      it.partial = p + h * splits + split;
      it.merge = m + h;
    }
    if (splits > 1 && ++split == splits) m += heads, p += heads * splits;
  }
  counts = {n, m, p, false};
}

}  // namespace tandem
