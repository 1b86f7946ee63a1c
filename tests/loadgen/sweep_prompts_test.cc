// Which prompts the points of a sweep send (--sweep-prompts): fresh seed-drawn prompts per point,
// point 0 a plain run's, disjoint file slices, and the shared case said out loud.
#include "loadgen/sweep_prompts.h"

#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem::loadgen {
namespace {

std::string TempFile(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::vector<std::string> Prompts(const std::vector<RequestSpec>& specs) {
  std::vector<std::string> out;
  for (const RequestSpec& s : specs) out.push_back(s.prompt);
  return out;
}

std::vector<std::string> PointPromptsOf(const SweepPrompts& sweep, int point) {
  absl::StatusOr<PointPrompts> p = sweep.Point(point);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? Prompts(p->specs) : std::vector<std::string>{};
}

// No prompt of one list equals a prompt of the other.
void ExpectDisjoint(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::set<std::string> in_a(a.begin(), a.end());
  for (const std::string& p : b) EXPECT_FALSE(in_a.contains(p)) << p;
}

std::unique_ptr<SweepPrompts> Make(const Config& c, int points) {
  auto sweep = SweepPrompts::Create(c, points, MakeWordPromptSource());
  EXPECT_TRUE(sweep.ok()) << sweep.status();
  return sweep.ok() ? std::move(*sweep) : nullptr;
}

Config RandomConfig() {
  Config c;
  c.num_prompts = 12;
  c.random_input_len = 24;
  c.random_output_len = 5;
  c.random_range_ratio = 0.5;  // lengths are drawn too
  c.random_prefix_len = 6;     // one prefix shared by every request of a point
  c.seed = 42;
  return c;
}

TEST(SweepPromptsTest, PointSeedIsTheBaseThenSplitMix64) {
  EXPECT_EQ(SweepPointSeed(42, 0), 42u);
  EXPECT_EQ(SweepPointSeed(0, 0), 0u);
  // The first two outputs of SplitMix64 seeded with 0 (the generator's published sequence).
  EXPECT_EQ(SweepPointSeed(0, 1), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(SweepPointSeed(0, 2), 0x6E789E6AA1B965F4ULL);
  std::set<uint64_t> seen;
  for (uint64_t base : {0ULL, 1ULL, 2ULL, ~0ULL}) {
    for (int i = 0; i < 50; ++i) seen.insert(SweepPointSeed(base, i));
  }
  EXPECT_EQ(seen.size(), 200u);  // no collision between nearby bases and points
}

TEST(SweepPromptsTest, FreshRandomPointsDrawNewPromptsAndPointZeroIsAPlainRun) {
  Config c = RandomConfig();
  auto sweep = Make(c, 4);
  ASSERT_NE(sweep, nullptr);
  EXPECT_FALSE(sweep->shared());
  EXPECT_EQ(sweep->warning(), "");
  auto source = MakeWordPromptSource();
  auto plain = MakeDataset(c, *source);
  ASSERT_TRUE(plain.ok());
  std::vector<std::vector<std::string>> points;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<PointPrompts> p = sweep->Point(i);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->seed, SweepPointSeed(42, i));
    ASSERT_EQ(p->specs.size(), 12u);
    // Point i is exactly a plain run with --seed <its seed>: prompts and lengths.
    Config alone = c;
    alone.seed = p->seed;
    auto expected = MakeDataset(alone, *source);
    ASSERT_TRUE(expected.ok());
    for (size_t k = 0; k < p->specs.size(); ++k) {
      EXPECT_EQ(p->specs[k].prompt, (*expected)[k].prompt) << i << " " << k;
      EXPECT_EQ(p->specs[k].prompt_len, (*expected)[k].prompt_len);
      EXPECT_EQ(p->specs[k].output_len, (*expected)[k].output_len);
    }
    points.push_back(Prompts(p->specs));
  }
  EXPECT_EQ(points[0], Prompts(*plain));
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < i; ++j) ExpectDisjoint(points[j], points[i]);
  }
  // Even the prefix every request of a point shares differs between points.
  auto first_words = [](const std::string& s) { return s.substr(0, s.find(' ', 20)); };
  EXPECT_NE(first_words(points[0][0]), first_words(points[1][0]));
  // Deterministic: a second sweep (and a second call) gives the same prompts per point.
  auto again = Make(c, 4);
  ASSERT_NE(again, nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(PointPromptsOf(*again, i), points[i]) << i;
  EXPECT_EQ(PointPromptsOf(*sweep, 2), points[2]);
  EXPECT_EQ(sweep->Point(4).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(sweep->Point(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(SweepPromptsTest, OnePointIsAPlainRunInEitherMode) {
  Config c = RandomConfig();
  auto source = MakeWordPromptSource();
  auto plain = MakeDataset(c, *source);
  ASSERT_TRUE(plain.ok());
  for (const char* mode : {"fresh", "same"}) {
    c.sweep_prompts = mode;
    auto sweep = Make(c, 1);
    ASSERT_NE(sweep, nullptr);
    EXPECT_FALSE(sweep->shared()) << mode;
    EXPECT_EQ(sweep->Point(0)->seed, 42u);
    EXPECT_EQ(PointPromptsOf(*sweep, 0), Prompts(*plain)) << mode;
  }
}

TEST(SweepPromptsTest, SameSendsPointZerosPromptsEverywhereAndSaysSo) {
  Config c = RandomConfig();
  c.sweep_prompts = "same";
  auto sweep = Make(c, 3);
  ASSERT_NE(sweep, nullptr);
  EXPECT_TRUE(sweep->shared());
  EXPECT_NE(sweep->warning().find("prefix cache"), std::string::npos) << sweep->warning();
  std::vector<std::string> first = PointPromptsOf(*sweep, 0);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(PointPromptsOf(*sweep, i), first);
    EXPECT_EQ(sweep->Point(i)->seed, 42u);
  }
}

TEST(SweepPromptsTest, BadModeIsRejected) {
  for (const char* bad : {"", "Fresh", "random", "same "}) {
    absl::StatusOr<SweepPromptMode> mode = ParseSweepPromptMode(bad);
    EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(mode.status().message().find("--sweep-prompts must be fresh or same"),
              std::string::npos);
  }
  Config c = RandomConfig();
  c.sweep_prompts = "bogus";
  EXPECT_EQ(SweepPrompts::Create(c, 2, MakeWordPromptSource()).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.sweep_prompts = "fresh";
  EXPECT_FALSE(SweepPrompts::Create(c, 0, MakeWordPromptSource()).ok());
  c.random_range_ratio = 2;  // the dataset's own errors come through
  EXPECT_FALSE(SweepPrompts::Create(c, 2, MakeWordPromptSource()).ok());
}

// Multi-turn and trace prompts are generated from the seed too: fresh per point, while the
// trace's lengths and arrivals (the file's) stay those of every point.
TEST(SweepPromptsTest, MultiTurnAndTracePromptsAreFreshPerPoint) {
  Config c;
  c.dataset_name = "multi-turn";
  c.num_prompts = 8;
  c.multi_turn_turns = 2;
  c.multi_turn_system_len = 10;
  c.random_input_len = 6;
  c.random_output_len = 3;
  auto multi = Make(c, 2);
  ASSERT_NE(multi, nullptr);
  EXPECT_FALSE(multi->shared());
  ExpectDisjoint(PointPromptsOf(*multi, 0), PointPromptsOf(*multi, 1));

  c = Config();
  c.dataset_name = "trace";
  c.dataset_path = TempFile("sweep_trace.jsonl",
                            "{\"timestamp\": 0, \"input_length\": 9, \"output_length\": 3, "
                            "\"hash_ids\": [1, 2]}\n"
                            "{\"timestamp\": 500, \"input_length\": 8, \"output_length\": 2, "
                            "\"hash_ids\": [1, 3]}\n");
  c.trace_block_size = 4;
  auto trace = Make(c, 3);
  ASSERT_NE(trace, nullptr);
  EXPECT_FALSE(trace->shared());
  absl::StatusOr<PointPrompts> p0 = trace->Point(0), p2 = trace->Point(2);
  ASSERT_TRUE(p0.ok() && p2.ok());
  ExpectDisjoint(Prompts(p0->specs), Prompts(p2->specs));
  ASSERT_EQ(p0->specs.size(), p2->specs.size());
  for (size_t k = 0; k < p0->specs.size(); ++k) {
    EXPECT_EQ(p0->specs[k].prompt_len, p2->specs[k].prompt_len);
    EXPECT_EQ(p0->specs[k].output_len, p2->specs[k].output_len);
    EXPECT_DOUBLE_EQ(p0->specs[k].arrival_s, p2->specs[k].arrival_s);
  }
  // Within a point the trace's shared hash id 1 still yields one shared block.
  auto block = [](const std::string& s) { return s.substr(0, s.find(' ', s.find(' ') + 1)); };
  EXPECT_EQ(block(p2->specs[0].prompt), block(p2->specs[1].prompt));
}

// A ShareGPT file of `n` distinct usable entries ("entry K is ...") plus `dups` copies of the
// first one's conversation.
std::string ShareGptFile(const std::string& name, int n, int dups) {
  std::string text = "[";
  for (int k = 0; k < n + dups; ++k) {
    int id = k < n ? k : 0;
    absl::StrAppend(&text, k ? "," : "", R"({"conversations":[{"from":"human","value":"entry )", id,
                    R"( is a prompt"},{"from":"gpt","value":"an answer of five words"}]})");
  }
  return TempFile(name, text + "]");
}

TEST(SweepPromptsTest, ShareGptPointsTakeDisjointSlicesOfTheShuffledFile) {
  Config c;
  c.dataset_name = "sharegpt";
  c.dataset_path = ShareGptFile("sweep_sharegpt.json", 10, 0);
  c.num_prompts = 3;
  c.seed = 5;
  auto sweep = Make(c, 3);
  ASSERT_NE(sweep, nullptr);
  EXPECT_FALSE(sweep->shared());
  EXPECT_EQ(sweep->warning(), "");
  // The rule: the usable entries in --seed's shuffled order, point i takes entries 3i .. 3i+2.
  auto source = MakeWordPromptSource();
  auto all = ShareGptDataset(c.dataset_path, 1000, -1, 5, *source);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 10u);
  auto plain = MakeDataset(c, *source);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(PointPromptsOf(*sweep, 0), Prompts(*plain));
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> want;
    for (int k = 3 * i; k < 3 * i + 3; ++k) want.push_back((*all)[k].prompt);
    EXPECT_EQ(PointPromptsOf(*sweep, i), want) << i;
    EXPECT_EQ(sweep->Point(i)->seed, 5u);  // one shuffle: the slices share its seed
  }
}

TEST(SweepPromptsTest, ShareGptSlicesSkipPromptsAnEarlierPointSent) {
  // 3 distinct prompts, entry 0 four times over: one prompt per point gives three points.
  Config c;
  c.dataset_name = "sharegpt";
  c.dataset_path = ShareGptFile("sweep_sharegpt_dups.json", 3, 3);
  c.num_prompts = 1;
  auto sweep = Make(c, 3);
  ASSERT_NE(sweep, nullptr);
  EXPECT_FALSE(sweep->shared()) << sweep->warning();
  std::set<std::string> sent;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> p = PointPromptsOf(*sweep, i);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_TRUE(sent.insert(p[0]).second) << "point " << i << " repeats " << p[0];
  }
  // A fourth point would need a fourth distinct prompt: the points share, and say so.
  sweep = Make(c, 4);
  ASSERT_NE(sweep, nullptr);
  EXPECT_TRUE(sweep->shared());
}

TEST(SweepPromptsTest, ShareGptTooSmallForEveryPointSharesPointZerosPromptsAndWarns) {
  Config c;
  c.dataset_name = "sharegpt";
  c.dataset_path = ShareGptFile("sweep_sharegpt_small.json", 7, 0);
  c.num_prompts = 3;  // 3 points x 3 prompts = 9 > 7 entries
  auto sweep = Make(c, 3);
  ASSERT_NE(sweep, nullptr);
  EXPECT_TRUE(sweep->shared());
  const std::string& w = sweep->warning();
  EXPECT_NE(w.find("holds 7 usable entries"), std::string::npos) << w;
  EXPECT_NE(w.find("3 sweep points x 3 prompts"), std::string::npos) << w;
  EXPECT_NE(w.find("prefix cache"), std::string::npos) << w;
  auto source = MakeWordPromptSource();
  auto plain = MakeDataset(c, *source);
  ASSERT_TRUE(plain.ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(PointPromptsOf(*sweep, i), Prompts(*plain)) << i;
  // Two points fit (6 <= 7): disjoint again.
  sweep = Make(c, 2);
  ASSERT_NE(sweep, nullptr);
  EXPECT_FALSE(sweep->shared());
  ExpectDisjoint(PointPromptsOf(*sweep, 0), PointPromptsOf(*sweep, 1));
  // More prompts than the file holds: point 0 is the plain run's (the whole file), shared.
  c.num_prompts = 50;
  sweep = Make(c, 2);
  ASSERT_NE(sweep, nullptr);
  EXPECT_TRUE(sweep->shared());
  EXPECT_EQ(PointPromptsOf(*sweep, 1).size(), 7u);
}

}  // namespace
}  // namespace tandem::loadgen
