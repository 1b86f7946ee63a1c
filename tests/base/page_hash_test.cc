#include "base/page_hash.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(PageHashTest, FullPagesOnlyAndChained) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<uint64_t> h = PageHashes(tokens, 4);
  ASSERT_EQ(h.size(), 2u);  // tokens 8, 9 are a partial page
  EXPECT_EQ(h[0], ChainPageHash(kPageHashSeed, {1, 2, 3, 4}));
  EXPECT_EQ(h[1], ChainPageHash(h[0], {5, 6, 7, 8}));
  EXPECT_TRUE(PageHashes({1, 2, 3}, 4).empty());
  EXPECT_EQ(PageHashes(tokens, 1).size(), tokens.size());
}

TEST(PageHashTest, APageHashCoversEveryEarlierToken) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> b = a;
  b[0] = 99;  // first page differs: so does the second page's hash, though its tokens are equal
  const std::vector<uint64_t> ha = PageHashes(a, 4);
  const std::vector<uint64_t> hb = PageHashes(b, 4);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  std::vector<int32_t> c = a;
  c[7] = 0;  // only the last page differs
  EXPECT_EQ(PageHashes(c, 4)[0], ha[0]);
  EXPECT_NE(PageHashes(c, 4)[1], ha[1]);
  // Same tokens, different page size: different hashes.
  EXPECT_NE(PageHashes(a, 8)[0], ha[1]);
  // Order within a page matters.
  EXPECT_NE(ChainPageHash(kPageHashSeed, {1, 2}), ChainPageHash(kPageHashSeed, {2, 1}));
}

// The values are part of the wire contract between workers and the router (they may be
// different builds): fixed for all time, whatever the process, build or machine.
TEST(PageHashTest, ValuesAreStable) {
  const std::vector<uint64_t> h = PageHashes({1, 2, 3, 4, 5, 6, 7, 8}, 4);
  EXPECT_EQ(h[0], 15456823622756830096ull);
  EXPECT_EQ(h[1], 15947924473999997542ull);
}

}  // namespace
}  // namespace tandem
