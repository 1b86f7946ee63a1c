// The engine flags every worker and `tandem generate` / `bench` share: prefix caching is on by
// default and turned off by either spelling; --quantization takes fp8, int8 or int4 only.
#include "worker/engine_flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Parses `args` (after the program name); false if CLI11 refused them.
bool Parse(std::vector<std::string> args, EngineFlags* flags) {
  CLI::App app;
  AddEngineFlags(app, flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError&) {
    return false;
  }
  return ResolveEngineFlags(flags).ok();
}

TEST(EngineFlagsTest, PrefixCachingIsOnByDefaultAndOffByFlag) {
  EngineFlags f;
  ASSERT_TRUE(Parse({}, &f));
  EXPECT_TRUE(f.engine.enable_prefix_caching);
  for (const std::vector<std::string>& off :
       {std::vector<std::string>{"--no-enable-prefix-caching"},
        std::vector<std::string>{"--enable-prefix-caching=false"}}) {
    EngineFlags g;
    ASSERT_TRUE(Parse(off, &g)) << off[0];
    EXPECT_FALSE(g.engine.enable_prefix_caching) << off[0];
  }
  EngineFlags h;
  ASSERT_TRUE(Parse({"--no-enable-prefix-caching", "--enable-prefix-caching"}, &h));
  EXPECT_TRUE(h.engine.enable_prefix_caching);  // the last one wins
  EngineFlags bad;
  EXPECT_FALSE(Parse({"--enable-prefix-caching=maybe"}, &bad));
}

TEST(EngineFlagsTest, QuantizationIsOffByDefaultAndTakesVllmsChoices) {
  EngineFlags f;
  ASSERT_TRUE(Parse({}, &f));
  EXPECT_EQ(f.engine.quantization, "");
  for (const std::string v : {"fp8", "int8", "int4"}) {
    EngineFlags g;
    ASSERT_TRUE(Parse({"--quantization", v}, &g)) << v;
    EXPECT_EQ(g.engine.quantization, v);
  }
  EngineFlags bad;
  EXPECT_FALSE(Parse({"--quantization", "nf4"}, &bad));
}

TEST(EngineFlagsTest, KvCacheDtypeIsAutoByDefaultAndTakesBf16OrFp8) {
  EngineFlags f;
  ASSERT_TRUE(Parse({}, &f));
  EXPECT_EQ(f.engine.kv_cache_dtype, "auto");
  for (const std::string v : {"auto", "bf16", "fp8"}) {
    EngineFlags g;
    ASSERT_TRUE(Parse({"--kv-cache-dtype", v}, &g)) << v;
    EXPECT_EQ(g.engine.kv_cache_dtype, v);
  }
  for (const std::string v : {"fp8_e5m2", "fp16", ""}) {
    EngineFlags bad;
    EXPECT_FALSE(Parse({"--kv-cache-dtype", v}, &bad)) << v;
  }
}

}  // namespace
}  // namespace tandem
