// worker/kv_group_shape.h against real engines: every TP x PP engine's KV pool is the stacked
// pool its KvGroupShape describes, and the head map (comm/kv_head_map.h) finds each rank's KV
// where the engine stored it: a prompt's pages of a TP 2 x PP 2 (and TP 4, PP 3, ...) engine,
// mapped onto the TP 1 layout, equal the TP 1 engine's pages of the same prompt (fp32 pages;
// the ranks' partial sums round apart by ~1e-6).
#include "worker/kv_group_shape.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/kv_head_map.h"
#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int kPromptTokens = 21;  // two pages of 16, the last partial

const std::string& ModelDir() {
  static const std::string* dir = [] {
    auto* d = new std::string(::testing::TempDir() + "/kv_group_shape_qwen2");
    MakeModelOptions make;
    make.preset = "tiny-qwen2";  // fp32 pages, 3 layers, 2 KV heads
    make.out_dir = *d;
    CHECK_OK(MakeModel(make).status());
    return d;
  }();
  return *dir;
}

struct Prefilled {
  std::unique_ptr<Engine> engine;
  std::vector<int32_t> pages;
};

Prefilled Prefill(int tp, int pp) {
  EngineOptions o;
  o.model_dir = ModelDir();
  o.tensor_parallel = tp;
  o.pipeline_parallel = pp;
  o.page_size = 16;
  o.num_pages = 32;
  o.enable_prefix_caching = false;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  CHECK_OK(e.status());
  EngineRequest req;
  req.id = "p";
  for (int i = 0; i < kPromptTokens; ++i) req.prompt_tokens.push_back(5 + (i * 37) % 900);
  req.sampling.temperature = 0.0f;
  req.sampling.max_tokens = 8;
  req.sampling.ignore_eos = true;
  req.prefill_only = true;
  CHECK_OK((*e)->AddRequest(req));
  while ((*e)->HasWork()) CHECK_OK((*e)->Step().status());
  absl::StatusOr<std::vector<int32_t>> pages = (*e)->KvPages("p");
  CHECK_OK(pages.status());
  return {*std::move(e), *std::move(pages)};
}

TEST(KvGroupShapeTest, EnginePoolsAreTheStackedPoolsTheHeadMapReads) {
  Prefilled one = Prefill(1, 1);
  absl::StatusOr<KvGroupShape> g1 = KvGroupShapeFor(EngineOptions{}, *one.engine);
  ASSERT_TRUE(g1.ok()) << g1.status();
  ASSERT_EQ(g1->dtype, DType::kF32);
  const KvLayout& l1 = one.engine->kv_layout();
  const float* want = static_cast<const float*>(one.engine->kv_pool());
  struct Sizes {
    int tp, pp;
  };
  for (const Sizes s : {Sizes{2, 1}, Sizes{1, 3}, Sizes{2, 2}, Sizes{4, 1}, Sizes{2, 3}}) {
    SCOPED_TRACE(absl::StrCat("TP ", s.tp, " x PP ", s.pp));
    Prefilled other = Prefill(s.tp, s.pp);
    EngineOptions o;
    o.tensor_parallel = s.tp;
    o.pipeline_parallel = s.pp;
    absl::StatusOr<KvGroupShape> g = KvGroupShapeFor(o, *other.engine);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(kv_wire::SamePageShape(g->PoolLayout(0), other.engine->kv_layout()));
    ASSERT_TRUE(CheckMappable(*g, *g1).ok());
    // The other engine's pages through the map onto a TP 1 pool, page ids of the TP 1 engine.
    std::vector<float> mapped(static_cast<size_t>(l1.PoolBytes() / 4), NAN);
    const KvLayout& lo = other.engine->kv_layout();
    const char* pool = static_cast<const char*>(other.engine->kv_pool());
    for (int layer = 0; layer < lo.num_layers; ++layer) {
      absl::StatusOr<std::vector<HeadCopy>> plan = PlanHeadCopies(*g, *g1, layer);
      ASSERT_TRUE(plan.ok());
      for (size_t i = 0; i < other.pages.size(); ++i) {
        ApplyHeadCopies(*g, *g1, *plan, pool + lo.PageOffset(layer, other.pages[i]) * 4, l1,
                        reinterpret_cast<char*>(mapped.data()), one.pages[i]);
      }
    }
    // Every token's K and V of every layer and head: the TP 1 engine's (an element the map
    // left unwritten is NaN and fails too).
    double worst = 0;
    int64_t checked = 0, bad = 0;
    for (int layer = 0; layer < l1.num_layers; ++layer) {
      for (int t = 0; t < kPromptTokens; ++t) {
        const int64_t slot = int64_t{one.pages[t / 16]} * 16 + t % 16;
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < l1.num_kv_heads; ++h) {
            for (int d = 0; d < l1.head_dim; ++d) {
              const int64_t at = l1.PageOffset(layer, 0) + l1.SlotOffset(slot, kv, h) + d;
              const double rel = std::fabs(double{mapped[at]} - want[at]) /
                                 std::max(1.0, std::fabs(double{want[at]}));
              if (!(rel < 1e-4)) ++bad;
              if (rel > worst) worst = rel;
              ++checked;
            }
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << "of " << checked << " elements; worst " << worst;
    EXPECT_GT(checked, 0);
  }
}

// An engine whose options do not describe its pool (the flags said other sizes) is refused.
TEST(KvGroupShapeTest, OptionsThatDoNotDescribeThePoolAreRefused) {
  Prefilled one = Prefill(1, 1);
  EngineOptions o;
  o.tensor_parallel = 2;
  EXPECT_TRUE(absl::IsInternal(KvGroupShapeFor(o, *one.engine).status()));
  o.tensor_parallel = 1;
  o.pipeline_parallel = 3;  // same stacked pool at TP 1 (3 stages of one layer each)
  EXPECT_TRUE(KvGroupShapeFor(o, *one.engine).ok());
  o.pipeline_parallel = 4;  // more stages than layers
  EXPECT_TRUE(absl::IsInvalidArgument(KvGroupShapeFor(o, *one.engine).status()));
}

}  // namespace
}  // namespace tandem
