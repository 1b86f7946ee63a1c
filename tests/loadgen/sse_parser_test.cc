#include "loadgen/sse_parser.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::loadgen {
namespace {

std::vector<std::string> FeedAll(SseParser& p, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& piece : pieces) {
    for (std::string_view e : p.Feed(piece)) out.emplace_back(e);
  }
  return out;
}

TEST(SseParserTest, EventsSplitAtEveryByteBoundaryStillParse) {
  const std::string stream = "data: {\"a\":1}\n\n: keep-alive\n\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseParser p;
    auto events = FeedAll(p, {stream.substr(0, cut), stream.substr(cut)});
    ASSERT_EQ(events.size(), 2u) << "cut at " << cut;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "[DONE]");
  }
}

TEST(SseParserTest, CrLfAndCrLineEndingsAndMultiLineData) {
  SseParser p;
  auto events = FeedAll(p, {"data: x\r", "\ndata:y\r\n\r", "\nevent: e\rdata: z\r\r"});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "x\ny");
  EXPECT_EQ(events[1], "z");
}

TEST(SseParserTest, AnEmptyReadBetweenCrAndLfKeepsThemOneLineEnd) {
  // "data: x\r" "" "\n" "\n": the CR and the LF after the empty read end one line, and only
  // the second LF dispatches (an empty read once forgot the CR: a fuzzer find).
  SseParser p;
  std::vector<std::string> events = FeedAll(p, {"data: x\r", "", "\n", "data: y\n\n"});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "x\ny");
  SseParser whole;
  EXPECT_EQ(FeedAll(whole, {"data: x\r\ndata: y\n\n"}), events);
}

TEST(SseParserTest, CommentsAndOtherFieldsAreNotEvents) {
  SseParser p;
  auto events = FeedAll(p, {": ping\n\nid: 3\nretry: 10\n\n"});
  EXPECT_TRUE(events.empty());
}

TEST(SseParserTest, UnterminatedFinalDataLineIsReturnedByFinish) {
  SseParser p;
  auto events = FeedAll(p, {"data: a\n\ndata: {\"b\":2}"});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(p.Finish(), "{\"b\":2}");
  EXPECT_EQ(p.Finish(), "");
}

}  // namespace
}  // namespace tandem::loadgen
