// Layout files: the shipped ones parse, and mistakes are refused with a message that names them.
#include "deploy/launcher/layout.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace tandem::launcher {
namespace {

std::string SourceDir() {
  const char* s = std::getenv("TANDEM_SOURCE_DIR");
  return s ? s : ".";
}

TEST(Layout, ShippedLayoutsParse) {
  for (const char* name : {"default", "2p2d", "mixed", "h200x2"}) {
    absl::StatusOr<Layout> l = LoadLayout(SourceDir() + "/deploy/layouts/" + name + ".yaml");
    EXPECT_TRUE(l.ok()) << name << ": " << l.status();
  }
  absl::StatusOr<Layout> l = LoadLayout(SourceDir() + "/deploy/layouts/2p2d.yaml");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->groups.size(), 2u);
  EXPECT_EQ(l->groups[0].role, "prefill");
  EXPECT_EQ(l->groups[0].count, 2);
  EXPECT_EQ(l->groups[1].count, 2);
  absl::StatusOr<Layout> gpu = LoadLayout(SourceDir() + "/deploy/layouts/h200x2.yaml");
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->backend, "cuda");
  EXPECT_EQ(gpu->groups[1].gpus, std::vector<int>{1});
}

TEST(Layout, DefaultIsOnePrefillOneDecodeOnPort8000) {
  const Layout l = DefaultLayout();
  EXPECT_EQ(l.router_port, 8000);
  EXPECT_EQ(l.backend, "cpu");
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[0].role, "prefill");
  EXPECT_EQ(l.groups[1].role, "decode");
}

TEST(Layout, MistakesAreRefusedWithTheirField) {
  struct Case {
    const char* yaml;
    const char* says;
  };
  const Case cases[] = {
      {"groups: [{role: prefil}]", "role 'prefil'"},
      {"groups: [{role: prefill}]", "both prefill and decode"},
      {"groups: [{role: mixed, count: 0}]", "count"},
      {"groups: [{role: mixed, count: 2, gpus: [0]}]", "one GPU per worker"},
      {"groups: []", "at least one worker"},
      {"backend: tpu\ngroups: [{role: mixed}]", "backend"},
      {"router: {port: eighty}\ngroups: [{role: mixed}]", "layout:"},
      {"groups: [{role: mixed, tensor_parallel: 2}]", "tensor/pipeline"},
      {"groups: [{role: mixed", "layout:"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Layout> l = ParseLayout(c.yaml);
    ASSERT_FALSE(l.ok()) << c.yaml;
    EXPECT_NE(l.status().message().find(c.says), std::string::npos)
        << c.yaml << " -> " << l.status();
  }
  EXPECT_EQ(LoadLayout("/nonexistent.yaml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::launcher
