// DecodePlanner (kernels/paged_attention/decode_plan.h) without a GPU: every plan it writes
// covers each (sequence, KV head, row group)'s keys exactly once, its splits and merges agree,
// and it picks the split, strided or balanced layout where decode_plan.h says; balanced plans
// give every CTA an even share of the tiles and keep head h of a piece on CTA g H + h.
#include "kernels/paged_attention/decode_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int kSlots = 264;  // an H200's decode CTAs (132 SMs x 2)

enum class Layout { kSplit, kStrided, kBalanced };

// A decode batch: sequence s has lens[s] keys and q_lens[s] new tokens.
struct Batch {
  std::vector<int32_t> lens, query_start;
  int nq = 32, nkv = 8;
  AttentionBatchShape shape() const {
    return {lens.data(), query_start.data(), static_cast<int>(lens.size()), nq, nkv};
  }
};

Batch MakeBatch(std::vector<int32_t> lens, int q_len = 1, int nq = 32, int nkv = 8) {
  Batch b{std::move(lens), {0}, nq, nkv};
  for (size_t s = 0; s < b.lens.size(); ++s) b.query_start.push_back(b.query_start.back() + q_len);
  return b;
}

std::vector<int32_t> Ragged(int n, int mean, uint32_t seed) {  // uniform in [1, 2 mean - 1]
  std::mt19937 rng(seed);
  std::vector<int32_t> lens(n);
  for (int32_t& l : lens) l = 1 + static_cast<int32_t>(rng() % (2 * mean - 1));
  return lens;
}

std::vector<int32_t> LongAndShort(int n, int long_len, int short_len) {
  std::vector<int32_t> lens(n, short_len);
  lens[0] = long_len;
  return lens;
}

struct Planned {
  DecodePlanCounts counts;
  std::vector<AttentionWorkItem> items;
  std::vector<AttentionMergeItem> merges;
};

constexpr DecodePlanLimits kLimits{1 << 16, 1 << 14, 4096};  // AttentionPlan::Capacity's

Planned PlanOf(const Batch& b, DecodeBalance balance, int slots = kSlots,
               DecodePlanLimits limits = kLimits, DecodeOrder order = DecodeOrder::kSequenceMajor) {
  DecodePlanner planner;
  Planned p;
  p.items.resize(limits.max_items);
  p.merges.resize(limits.max_merges);
  auto counts =
      planner.Plan(b.shape(), {slots, 1, balance, order}, limits, p.items.data(), p.merges.data());
  EXPECT_TRUE(counts.ok()) << counts.status();
  if (counts.ok()) p.counts = *counts;
  p.items.resize(p.counts.items);
  p.merges.resize(p.counts.merges);
  return p;
}

Layout LayoutOf(const Planned& p) {
  if (p.counts.split_kv) return Layout::kSplit;
  return p.counts.merges > 0 ? Layout::kBalanced : Layout::kStrided;
}

// The contract every decode plan keeps, whatever its layout.
void ExpectValid(const Batch& b, const Planned& p) {
  const AttentionBatchShape shape = b.shape();
  // Keys covered per (seq, kv_head, row_begin), and the items of each merge.
  struct Covered {
    std::vector<std::pair<int, int>> ranges;
    std::set<int> merges;
  };
  std::map<std::tuple<int, int, int>, Covered> covered;
  std::map<int, std::vector<int>> merge_items;
  std::set<int> partials;
  for (int i = 0; i < p.counts.items; ++i) {
    const AttentionWorkItem& it = p.items[i];
    if (it.num_rows == 0) {  // an empty item: nothing to do
      EXPECT_EQ(it.key_begin, it.key_end) << "item " << i;
      EXPECT_EQ(it.partial, -1) << "item " << i;
      EXPECT_EQ(it.merge, -1) << "item " << i;
      continue;
    }
    ASSERT_GE(it.seq, 0);
    ASSERT_LT(it.seq, shape.num_seqs);
    ASSERT_GE(it.kv_head, 0);
    ASSERT_LT(it.kv_head, b.nkv);
    const int rows = PackedRows(shape, it.seq);
    EXPECT_EQ(it.row_begin % kDecodeRows, 0);
    EXPECT_EQ(it.num_rows, std::min(kDecodeRows, rows - it.row_begin));
    EXPECT_EQ(it.token_begin, b.query_start[it.seq]);
    EXPECT_EQ(it.first_pos, b.lens[it.seq] - (b.query_start[it.seq + 1] - b.query_start[it.seq]));
    EXPECT_LT(it.key_begin, it.key_end) << "item " << i << " has rows but no keys";
    EXPECT_EQ(it.key_begin % kDecodeTileKeys, 0) << "item " << i;
    Covered& c = covered[{it.seq, it.kv_head, it.row_begin}];
    c.ranges.push_back({it.key_begin, it.key_end});
    c.merges.insert(it.merge);
    EXPECT_EQ(it.partial < 0, it.merge < 0) << "item " << i;
    if (it.merge >= 0) {
      ASSERT_LT(it.merge, p.counts.merges);
      ASSERT_LT(it.partial, p.counts.partials);
      EXPECT_TRUE(partials.insert(it.partial).second) << "partial " << it.partial << " twice";
      merge_items[it.merge].push_back(i);
    }
  }
  // Every row group of every head, its keys [0, RowsKeyEnd) exactly once.
  size_t units = 0;
  for (int s = 0; s < shape.num_seqs; ++s) {
    const int rows = PackedRows(shape, s);
    for (int h = 0; h < b.nkv; ++h) {
      for (int r = 0; r < rows; r += kDecodeRows) {
        const int key_end = RowsKeyEnd(shape, s, std::min(rows, r + kDecodeRows));
        auto it = covered.find({s, h, r});
        if (key_end <= 0) {
          EXPECT_TRUE(it == covered.end()) << "keyless rows planned";
          continue;
        }
        ++units;
        ASSERT_TRUE(it != covered.end()) << "seq " << s << " head " << h << " rows " << r;
        std::vector<std::pair<int, int>> ranges = it->second.ranges;
        std::sort(ranges.begin(), ranges.end());
        int next = 0;
        for (const auto& [kb, ke] : ranges) {
          EXPECT_EQ(kb, next) << "seq " << s << " head " << h << ": gap or overlap";
          next = ke;
        }
        EXPECT_EQ(next, key_end) << "seq " << s << " head " << h;
        // One range writes the output; several are one merge's splits.
        const std::set<int>& m = it->second.merges;
        EXPECT_EQ(m.size(), 1u) << "seq " << s << " head " << h << ": several merges";
        EXPECT_EQ(*m.begin() >= 0, ranges.size() > 1) << "seq " << s << " head " << h;
      }
    }
  }
  EXPECT_EQ(covered.size(), units) << "items for rows that do not exist";
  // Each merge: its unit, its splits' count, partial slots [first_partial, + num_splits).
  EXPECT_EQ(merge_items.size(), static_cast<size_t>(p.counts.merges)) << "unused merges";
  for (const auto& [m, its] : merge_items) {
    const AttentionMergeItem& mi = p.merges[m];
    EXPECT_EQ(mi.num_splits, static_cast<int>(its.size())) << "merge " << m;
    for (int i : its) {
      const AttentionWorkItem& it = p.items[i];
      EXPECT_EQ(std::tie(mi.seq, mi.kv_head, mi.row_begin, mi.num_rows, mi.token_begin),
                std::tie(it.seq, it.kv_head, it.row_begin, it.num_rows, it.token_begin));
      EXPECT_GE(it.partial, mi.first_partial);
      EXPECT_LT(it.partial, mi.first_partial + mi.num_splits);
    }
  }
  EXPECT_EQ(partials.size(), static_cast<size_t>(p.counts.partials)) << "unused partials";
}

// Tiles each CTA computes (items c, c + slots, ... on CTA c).
std::vector<int64_t> CtaTiles(const Planned& p, int slots) {
  std::vector<int64_t> tiles(slots, 0);
  for (int i = 0; i < p.counts.items; ++i) {
    const AttentionWorkItem& it = p.items[i];
    tiles[i % slots] += (it.key_end - it.key_begin + kDecodeTileKeys - 1) / kDecodeTileKeys;
  }
  return tiles;
}

// A balanced plan: head h of every piece on CTA g H + h, the CTA groups' shares of the row
// groups' tiles within one tile of each other.
void ExpectBalanced(const Batch& b, const Planned& p, int slots = kSlots) {
  ASSERT_EQ(LayoutOf(p), Layout::kBalanced);
  for (int i = 0; i < p.counts.items; ++i) {
    if (p.items[i].num_rows > 0) {
      EXPECT_EQ(p.items[i].kv_head, (i % slots) % b.nkv) << "item " << i;
    }
  }
  const std::vector<int64_t> tiles = CtaTiles(p, slots);
  const auto [lo, hi] = std::minmax_element(tiles.begin(), tiles.end());
  EXPECT_LE(*hi - *lo, 1) << "CTA shares " << *lo << " .. " << *hi;
}

TEST(DecodePlanTest, SmallBatchesSplitKeyRanges) {
  for (const Batch& b : {MakeBatch({8192}), MakeBatch({32768}, 1, 32, 8),
                         MakeBatch({1, 77, 1000, 4097}), MakeBatch({2500, 63}, 3, 16, 2)}) {
    for (DecodeBalance balance : {DecodeBalance::kAuto, DecodeBalance::kForce}) {
      const Planned p = PlanOf(b, balance);
      EXPECT_EQ(LayoutOf(p), Layout::kSplit);  // balance never touches a split plan
      ExpectValid(b, p);
    }
  }
}

TEST(DecodePlanTest, UniformLargeBatchesStayStrided) {
  // 128 x 4k at Llama-3-8B's heads: the strided layout's busiest CTA has 256 tiles against an
  // even 249 (1.03x): strided unless forced; forced, every CTA gets 248 or 249.
  const Batch b = MakeBatch(std::vector<int32_t>(128, 4096));
  const Planned strided = PlanOf(b, DecodeBalance::kAuto);
  EXPECT_EQ(LayoutOf(strided), Layout::kStrided);
  EXPECT_EQ(strided.counts.items, 128 * 8);
  ExpectValid(b, strided);
  const std::vector<int64_t> tiles = CtaTiles(strided, kSlots);
  EXPECT_EQ(*std::max_element(tiles.begin(), tiles.end()), 256);
  const Planned forced = PlanOf(b, DecodeBalance::kForce);
  ExpectValid(b, forced);
  ExpectBalanced(b, forced);
  const std::vector<int64_t> even = CtaTiles(forced, kSlots);
  EXPECT_EQ(*std::max_element(even.begin(), even.end()), 249);
  EXPECT_EQ(LayoutOf(PlanOf(b, DecodeBalance::kOff)), Layout::kStrided);
}

TEST(DecodePlanTest, RaggedLongContextsAreBalanced) {
  // attention_bench's ragged shapes (TANDEM_BENCH_RAGGED: lengths in [1, 2 L - 1]), where the
  // strided layout's busiest CTA has 1.6x the even share and more.
  for (const auto& [n, mean] : {std::pair{256, 2048}, {128, 4096}, {64, 4096}}) {
    SCOPED_TRACE(::testing::Message() << n << " x " << mean << " ragged");
    const Batch b = MakeBatch(Ragged(n, mean, 7));
    const Planned p = PlanOf(b, DecodeBalance::kAuto);
    ExpectValid(b, p);
    ExpectBalanced(b, p);
    EXPECT_EQ(LayoutOf(PlanOf(b, DecodeBalance::kOff)), Layout::kStrided);
  }
}

TEST(DecodePlanTest, RaggedShortContextsStayStrided) {
  // 1.39x and 1.45x: measured no faster balanced (decode_plan_host.cc's kMinBalanceRatio).
  for (const auto& [n, mean] : {std::pair{256, 640}, {256, 1024}}) {
    const Batch b = MakeBatch(Ragged(n, mean, 7));
    const Planned p = PlanOf(b, DecodeBalance::kAuto);
    EXPECT_EQ(LayoutOf(p), Layout::kStrided) << n << " x " << mean;
    ExpectValid(b, p);
    const Planned forced = PlanOf(b, DecodeBalance::kForce);
    ExpectValid(b, forced);
    ExpectBalanced(b, forced);
  }
}

TEST(DecodePlanTest, SeveralRowGroupsAndHeadCounts) {
  // The GPU tests' balanced cases: 12 and 24 packed rows a sequence (one and two row groups),
  // GQA 8 of 64 heads, one KV head, and a random sweep of shapes, forced and not.
  const std::vector<Batch> batches = {MakeBatch(LongAndShort(100, 3000, 640)),
                                      MakeBatch(LongAndShort(120, 2000, 600), 3),
                                      MakeBatch(LongAndShort(120, 3000, 600), 3, 64, 8),
                                      MakeBatch(LongAndShort(1057, 384, 64), 1, 4, 1)};
  for (const Batch& b : batches) {
    const Planned p = PlanOf(b, DecodeBalance::kAuto);
    ExpectValid(b, p);
    ExpectBalanced(b, p);
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int nkv = std::vector<int>{1, 2, 4, 8}[rng() % 4];
    const int group = std::vector<int>{1, 4, 8}[rng() % 3];
    const int q_len = 1 + static_cast<int>(rng() % 5);
    const int n = 1 + static_cast<int>(rng() % 300);
    std::vector<int32_t> lens = Ragged(n, 1 + static_cast<int>(rng() % 3000), rng());
    for (int32_t& l : lens) l = std::max(l, q_len);  // a sequence holds its new tokens
    const Batch b = MakeBatch(lens, q_len, nkv * group, nkv);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << n << " seqs, nkv " << nkv
                                      << " group " << group << " q_len " << q_len);
    for (DecodeBalance balance : {DecodeBalance::kAuto, DecodeBalance::kForce}) {
      const Planned p = PlanOf(b, balance);
      ExpectValid(b, p);
      if (LayoutOf(p) == Layout::kBalanced) ExpectBalanced(b, p);
    }
  }
}

TEST(DecodePlanTest, BalanceNeedsWholeCtaGroupsAndCapacity) {
  const Batch b = MakeBatch(Ragged(128, 4096, 7));
  // 100 CTAs are not groups of 8 heads: strided even when forced.
  const Planned odd = PlanOf(b, DecodeBalance::kForce, 100);
  EXPECT_EQ(LayoutOf(odd), Layout::kStrided);
  ExpectValid(b, odd);
  // Too few merge items for the cuts: the strided plan stands.
  const Planned small = PlanOf(b, DecodeBalance::kForce, kSlots, {1 << 16, 16, 4096});
  EXPECT_EQ(LayoutOf(small), Layout::kStrided);
  ExpectValid(b, small);
}

TEST(DecodePlanTest, EmptyBatchCapacityAndBadInput) {
  const Batch empty = MakeBatch({});
  EXPECT_EQ(PlanOf(empty, DecodeBalance::kAuto).counts.items, 0);
  DecodePlanner planner;
  std::vector<AttentionWorkItem> items(4);
  std::vector<AttentionMergeItem> merges(4);
  const Batch b = MakeBatch(std::vector<int32_t>(8, 100));  // 64 items
  const auto counts = planner.Plan(b.shape(), {kSlots, 1, DecodeBalance::kAuto}, {4, 4, 4096},
                                   items.data(), merges.data());
  EXPECT_EQ(counts.status().code(), absl::StatusCode::kResourceExhausted);
  // Bad batches, with arrays of the full capacity (a plan written in error stays in bounds).
  std::vector<AttentionWorkItem> all_items(kLimits.max_items);
  std::vector<AttentionMergeItem> all_merges(kLimits.max_merges);
  for (const Batch& bad : {MakeBatch({10, 2}, 3),             // 2 keys, 3 new tokens
                           MakeBatch({10, 20}, 1, 12, 8)}) {  // 12 query heads over 8 KV heads
    const auto refused = planner.Plan(bad.shape(), {kSlots, 1, DecodeBalance::kAuto}, kLimits,
                                      all_items.data(), all_merges.data());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  }
}

// TANDEM_DECODE_ORDER=head: split and strided plans list the same items (and merges, partial
// slots) KV head by KV head, sequence order kept within a head; balanced plans are positional
// (head h on CTA g H + h) and stay as they are.
TEST(DecodePlanTest, HeadMajorOrderPermutesSplitAndStridedPlans) {
  const auto key = [](const AttentionWorkItem& it) {
    return std::tie(it.seq, it.kv_head, it.row_begin, it.key_begin, it.key_end, it.partial,
                    it.merge);
  };
  for (const Batch& b :
       {MakeBatch({1, 77, 1000, 4097}), MakeBatch(std::vector<int32_t>(128, 4096)),
        MakeBatch(std::vector<int32_t>(160, 2000), 3), MakeBatch(Ragged(300, 900, 4), 1, 28, 4)}) {
    const Planned seq = PlanOf(b, DecodeBalance::kOff);
    const Planned head = PlanOf(b, DecodeBalance::kOff, kSlots, kLimits, DecodeOrder::kHeadMajor);
    ASSERT_NE(LayoutOf(seq), Layout::kBalanced);  // off: split or strided
    EXPECT_EQ(LayoutOf(head), LayoutOf(seq));
    ExpectValid(b, head);
    ASSERT_EQ(head.items.size(), seq.items.size());
    for (size_t i = 0; i + 1 < head.items.size(); ++i) {
      const AttentionWorkItem &x = head.items[i], &y = head.items[i + 1];
      EXPECT_TRUE(x.kv_head < y.kv_head || (x.kv_head == y.kv_head && key(x) < key(y)))
          << "item " << i << " out of (head, sequence) order";
    }
    std::vector<AttentionWorkItem> sorted = seq.items;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& x, const auto& y) { return x.kv_head < y.kv_head; });
    for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(key(head.items[i]), key(sorted[i]));
    EXPECT_EQ(head.counts.merges, seq.counts.merges);
    EXPECT_EQ(head.counts.partials, seq.counts.partials);
  }
  const Batch ragged = MakeBatch(Ragged(128, 4096, 7));
  const Planned balanced =
      PlanOf(ragged, DecodeBalance::kAuto, kSlots, kLimits, DecodeOrder::kHeadMajor);
  ExpectValid(ragged, balanced);
  ExpectBalanced(ragged, balanced);
}

TEST(DecodePlanTest, ParsesTheOrderSetting) {
  EXPECT_EQ(*ParseDecodeOrder(nullptr), DecodeOrder::kSequenceMajor);
  EXPECT_EQ(*ParseDecodeOrder(""), DecodeOrder::kSequenceMajor);
  EXPECT_EQ(*ParseDecodeOrder("seq"), DecodeOrder::kSequenceMajor);
  EXPECT_EQ(*ParseDecodeOrder("head"), DecodeOrder::kHeadMajor);
  for (const char* bad : {"heads", "Head", "1", "sequence"}) {
    const auto order = ParseDecodeOrder(bad);
    EXPECT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(order.status().message().find("TANDEM_DECODE_ORDER"), std::string_view::npos);
  }
}

TEST(DecodePlanTest, ParsesTheBalanceSetting) {
  EXPECT_EQ(*ParseDecodeBalance(nullptr), DecodeBalance::kAuto);
  EXPECT_EQ(*ParseDecodeBalance(""), DecodeBalance::kAuto);
  EXPECT_EQ(*ParseDecodeBalance("auto"), DecodeBalance::kAuto);
  EXPECT_EQ(*ParseDecodeBalance("off"), DecodeBalance::kOff);
  EXPECT_EQ(*ParseDecodeBalance("force"), DecodeBalance::kForce);
  EXPECT_EQ(ParseDecodeBalance("0").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
