// TextStream: stop strings cut the text where they start and nothing of them (or after them) is
// emitted; text that may start a stop string is held back exactly as long as it may; deltas are
// whole code points; the text of every token (stop tokens included, skipped specials excluded)
// reaches the client. Over ByteTokenizer (one byte per token, for exact deltas) and over the
// generated tokenizer families with random token streams (real detokenization, byte pieces,
// special tokens).
#include "tokenizer/text_stream.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tokenizer/byte_tokenizer.h"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

using testing::ByteTokenizer;

constexpr int32_t kEos = ByteTokenizer::kEos;

// Feeds `text`'s bytes one token at a time; returns everything emitted (Finish included when
// no stop string completed) and how many tokens the stream took.
struct Fed {
  std::string text;
  bool stopped = false;
  int consumed = 0;
};
Fed FeedOneByOne(TextStream& stream, const std::vector<int32_t>& tokens) {
  Fed run;
  for (int32_t t : tokens) {
    TextStream::Delta d = stream.Add({t});
    run.text += d.text;
    run.consumed += d.num_tokens;
    if (d.stopped) {
      run.stopped = true;
      return run;
    }
  }
  TextStream::Delta tail = stream.Finish();
  run.text += tail.text;
  run.stopped = tail.stopped;
  return run;
}

class TextStreamTest : public ::testing::Test {
 protected:
  TextStream Make(std::vector<std::string> stop, bool skip_special_tokens = true) {
    return TextStream(&tokenizer_, skip_special_tokens, std::move(stop));
  }
  static std::vector<int32_t> Ids(const std::string& text) { return ByteTokenizer::Ids(text); }
  std::string Add(TextStream& s, const std::string& bytes) { return s.Add(Ids(bytes)).text; }

  ByteTokenizer tokenizer_;
};

TEST_F(TextStreamTest, StopStringAndWhatFollowsAreNotEmitted) {
  TextStream s = Make({"cde"});
  Fed run = FeedOneByOne(s, Ids("abcdefg"));
  EXPECT_EQ(run.text, "ab");
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.consumed, 5);
  EXPECT_TRUE(s.stopped());
}

TEST_F(TextStreamTest, TextThatMayStartAStopStringIsHeldBackThenReleased) {
  TextStream s = Make({"xyz"});
  EXPECT_EQ(Add(s, "a"), "a");
  EXPECT_EQ(Add(s, "x"), "");     // could be "xyz"
  EXPECT_EQ(Add(s, "y"), "");     // still could
  EXPECT_EQ(Add(s, "b"), "xyb");  // no longer
}

TEST_F(TextStreamTest, HoldsBackOnlyWhatMayStartAStopString) {
  TextStream s = Make({"STOP"});
  TextStream::Delta d = s.Add(Ids("hello S"));
  EXPECT_EQ(d.text, "hello ");  // only "S" could start "STOP"
  EXPECT_EQ(d.num_tokens, 7);
  EXPECT_FALSE(d.stopped);
  EXPECT_EQ(Add(s, "T"), "");  // "ST" still could
  d = s.Add(Ids("OP and more"));
  EXPECT_EQ(d.text, "");
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.num_tokens, 2);  // "O" "P": the rest is past the end of the output
}

// The disaggregated path: the first token comes from the prefill worker, the rest from the
// decode worker, in separate calls; a stop string across that boundary is found all the same.
TEST_F(TextStreamTest, StopStringAcrossTheFirstTokenIsFound) {
  TextStream s = Make({"bq"});
  EXPECT_EQ(Add(s, "a"), "a");
  EXPECT_EQ(Add(s, "b"), "");  // held: may start "bq"
  TextStream::Delta d = s.Add(Ids("qrs"));
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(d.num_tokens, 1);

  TextStream t = Make({"bq"});
  EXPECT_EQ(Add(t, "ab"), "a");
  EXPECT_EQ(Add(t, "c"), "bc");  // the held "b" is not lost when the stop is ruled out
}

TEST_F(TextStreamTest, HeldTextIsFlushedWhenTheRequestEndsOtherwise) {
  TextStream s = Make({"cz"});
  EXPECT_EQ(Add(s, "abc"), "ab");
  TextStream::Delta tail = s.Finish();
  EXPECT_EQ(tail.text, "c");
  EXPECT_FALSE(tail.stopped);

  TextStream t = Make({"xyz"});
  std::string out = Add(t, "abcx");
  out += Add(t, "y");
  EXPECT_EQ(out, "abc");
  out += t.Finish().text;
  EXPECT_EQ(out, "abcxy");
}

TEST_F(TextStreamTest, EarliestOfSeveralStopStringsWins) {
  TextStream s = Make({"fg", "bcd", "c"});
  Fed run = FeedOneByOne(s, Ids("abcdefg"));
  EXPECT_EQ(run.text, "ab");  // "c" completes at token 3, before "bcd" could
  EXPECT_EQ(run.consumed, 3);

  TextStream t = Make({"cd", "b"});
  TextStream::Delta d = t.Add(Ids("abcd"));
  EXPECT_EQ(d.text, "a");
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.num_tokens, 2);
}

TEST_F(TextStreamTest, MatchedStopIsNamedAndIncludeStopKeepsIt) {
  TextStream s = Make({"zz", "cd", "c"});
  EXPECT_EQ(s.matched_stop(), "");
  Fed run = FeedOneByOne(s, Ids("abcdef"));
  EXPECT_EQ(run.text, "ab");
  EXPECT_EQ(s.matched_stop(), "c");  // "c" completes before "cd"

  TextStream kept(&tokenizer_, /*skip_special_tokens=*/true, {"cde", "x"},
                  /*include_stop=*/true);
  run = FeedOneByOne(kept, Ids("abcdefg"));
  EXPECT_EQ(run.text, "abcde");  // the stop string stays; what follows does not
  EXPECT_EQ(run.consumed, 5);
  EXPECT_EQ(kept.matched_stop(), "cde");

  // Completed over held-back text.
  TextStream tail(&tokenizer_, true, {"ef"}, /*include_stop=*/true);
  EXPECT_EQ(Add(tail, "abe"), "ab");  // "e" is held back
  EXPECT_EQ(Add(tail, "f"), "ef");
  EXPECT_TRUE(tail.stopped());
  EXPECT_EQ(tail.matched_stop(), "ef");
  // No stop: nothing named.
  TextStream none = Make({"q"});
  FeedOneByOne(none, Ids("abc"));
  EXPECT_EQ(none.matched_stop(), "");
}

TEST_F(TextStreamTest, NothingAfterTheStop) {
  TextStream s = Make({"XY"});
  TextStream::Delta d = s.Add(Ids("abXYcd"));
  EXPECT_EQ(d.text, "ab");
  EXPECT_EQ(d.num_tokens, 4);
  d = s.Add(Ids("more"));
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(d.num_tokens, 0);
  EXPECT_EQ(s.Finish().text, "");
}

// The engine ends a request with a stop token or EOS and passes that token on: a non-special
// stop token's text is part of the output, a skipped special token (EOS) has none.
TEST_F(TextStreamTest, StopTokensKeepTheirTextSkippedSpecialsHaveNone) {
  TextStream s = Make({});
  EXPECT_EQ(FeedOneByOne(s, Ids("abcd")).text, "abcd");  // 'd' was a stop token id

  TextStream eos = Make({});
  Fed run = FeedOneByOne(eos, {'a', 'b', kEos});
  EXPECT_EQ(run.text, "ab");
  EXPECT_FALSE(run.stopped);  // a stop string did not end it

  TextStream ignored = Make({});  // ignore_eos: EOS in the middle of the text
  EXPECT_EQ(FeedOneByOne(ignored, {'a', kEos, 'b', 'c'}).text, "abc");

  TextStream shown = Make({}, /*skip_special_tokens=*/false);
  EXPECT_EQ(FeedOneByOne(shown, {'a', kEos, 'b'}).text, "a</s>b");
}

TEST_F(TextStreamTest, NoStopStringsMeansNoHoldBack) {
  TextStream s = Make({"", ""});  // empty stop strings are ignored
  EXPECT_EQ(Add(s, "a"), "a");
  EXPECT_EQ(Add(s, "b"), "b");
  EXPECT_FALSE(s.Finish().stopped);
}

TEST_F(TextStreamTest, NeverSplitsACodePoint) {
  const std::string zhong = "\xE4\xB8\xAD";  // U+4E2D, three byte tokens
  TextStream s = Make({"ab"});
  std::string out;
  for (int32_t id : Ids(zhong)) {
    const std::string delta = s.Add({id}).text;
    EXPECT_TRUE(utf8::IsValid(delta));
    out += delta;
  }
  EXPECT_EQ(out, zhong);  // complete, and not held: it cannot start "ab"
  EXPECT_EQ(s.Finish().text, "");

  // A stop string starting with that character: held while it may complete, cut before it.
  TextStream t = Make({zhong + "x"});
  EXPECT_EQ(Add(t, zhong), "");
  EXPECT_EQ(Add(t, zhong), zhong);
  TextStream::Delta d = t.Add(Ids("x tail"));
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
}

TEST_F(TextStreamTest, StopStringInTheFlushedTailStillStops) {
  // An incomplete character at the end becomes U+FFFD when flushed; a stop string on it ends
  // the request with "stop" (what a client asked for, however odd).
  TextStream s = Make({"a" + std::string(utf8::kReplacementChar)});
  EXPECT_EQ(s.Add({'x', 'a', 0xF0, 0x9F}).text, "x");
  TextStream::Delta tail = s.Finish();
  EXPECT_TRUE(tail.stopped);
  EXPECT_EQ(tail.text, "");
}

// Real detokenization on random token streams of every generated tokenizer family (byte
// pieces, special tokens, SentencePiece spaces): with a stop string taken from the middle of
// the free-running text, the output is exactly the text before its first occurrence, and the
// stream takes the tokens up to the one completing it.
TEST(TextStreamRealTokenizerTest, StopStringCutsTheStreamedText) {
  for (const auto& f : testing::AllFamilies()) {
    auto tok = Tokenizer::Load(testing::WriteFamily(f));
    ASSERT_TRUE(tok.ok()) << tok.status();
    std::mt19937 rng(7);
    int cut = 0;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int32_t> ids(40);
      for (int32_t& id : ids) id = static_cast<int32_t>(rng() % (*tok)->vocab_size());
      // seen[k]: the text of the first k tokens, whatever an incomplete character holds back.
      TextStream free_running(tok->get(), /*skip_special_tokens=*/true, {});
      std::vector<std::string> seen = {""};
      for (int32_t id : ids) seen.push_back(seen.back() + free_running.Add({id}).text);
      const std::string text = seen.back() + free_running.Finish().text;
      ASSERT_TRUE(utf8::IsValid(text));
      // A stop string of up to 3 code points from the middle of the text.
      const std::vector<std::string_view> chars = utf8::SplitChars(text);
      if (chars.size() < 6) continue;
      std::string stop;
      for (size_t i = chars.size() / 2; i < chars.size() / 2 + 3; ++i) stop += chars[i];
      SCOPED_TRACE(::testing::Message() << f.name << " trial " << trial << " stop \"" << stop
                                        << "\" in \"" << text << "\"");
      TextStream stopped(tok->get(), true, {stop});
      std::string out;
      int consumed = 0;
      for (int32_t id : ids) {
        TextStream::Delta d = stopped.Add({id});
        EXPECT_TRUE(utf8::IsValid(d.text));
        out += d.text;
        consumed += d.num_tokens;
        if (d.stopped) break;
      }
      if (!stopped.stopped()) {
        // Only where the stop lies in the detokenizer's final flush (an incomplete character).
        TextStream::Delta tail = stopped.Finish();
        out += tail.text;
        EXPECT_TRUE(tail.stopped);
        EXPECT_EQ(seen.back().find(stop), std::string::npos);
      } else {
        ++cut;
        EXPECT_NE(seen[consumed].find(stop), std::string::npos);
        EXPECT_EQ(seen[consumed - 1].find(stop), std::string::npos);
      }
      EXPECT_EQ(out, text.substr(0, text.find(stop)));
    }
    EXPECT_GT(cut, 10) << f.name;
  }
}

}  // namespace
}  // namespace tandem
