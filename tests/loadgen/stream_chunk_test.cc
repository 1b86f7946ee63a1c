#include "loadgen/stream_chunk.h"

#include "gtest/gtest.h"

namespace tandem::loadgen {
namespace {

TEST(StreamChunkTest, CompletionTextChunkIsATokenEvenWhenEmpty) {
  ChunkInfo c = ParseChunk(
      R"({"object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":null}]})",
      true);
  EXPECT_TRUE(c.is_token);
  EXPECT_EQ(c.text, "hi");
  // A token that ended mid UTF-8 character streams as "" and still counts.
  EXPECT_TRUE(ParseChunk(R"({"choices":[{"text":"","finish_reason":null}]})", false).is_token);
}

TEST(StreamChunkTest, BareFinishAndUsageChunksAreNotTokens) {
  EXPECT_FALSE(ParseChunk(R"({"choices":[{"text":"","finish_reason":"length"}]})", false).is_token);
  ChunkInfo usage = ParseChunk(
      R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}})",
      false);
  EXPECT_FALSE(usage.is_token);
  EXPECT_EQ(usage.prompt_tokens, 7);
  EXPECT_EQ(usage.completion_tokens, 5);
  // A token chunk that also says "finished" is still a token.
  EXPECT_TRUE(ParseChunk(R"({"choices":[{"text":"x","finish_reason":"stop"}]})", false).is_token);
}

TEST(StreamChunkTest, ChatRolePreambleIsNotATokenButContentIs) {
  EXPECT_FALSE(
      ParseChunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})", false).is_token);
  EXPECT_FALSE(ParseChunk(R"({"choices":[{"delta":{"role":"assistant"}}]})", false).is_token);
  ChunkInfo c = ParseChunk(
      R"({"choices":[{"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]})", true);
  EXPECT_TRUE(c.is_token);
  EXPECT_EQ(c.text, "Hel");
  EXPECT_TRUE(ParseChunk(R"({"choices":[{"delta":{"reasoning_content":"r"}}]})", false).is_token);
}

TEST(StreamChunkTest, InStreamErrorsAndGarbageAreErrors) {
  ChunkInfo e =
      ParseChunk(R"({"error":{"message":"TimeoutError","type":"GatewayTimeout"}})", false);
  ASSERT_TRUE(e.error.has_value());
  EXPECT_EQ(*e.error, "TimeoutError");
  ChunkInfo old_style = ParseChunk(R"({"object":"error","message":"bad"})", false);
  ASSERT_TRUE(old_style.error.has_value());
  EXPECT_EQ(*old_style.error, "bad");
  EXPECT_TRUE(ParseChunk("{not json", false).error.has_value());
  EXPECT_TRUE(ParseChunk("[DONE]", false).done);
}

TEST(StreamChunkTest, ServerTimingIsRead) {
  ChunkInfo c =
      ParseChunk(R"({"choices":[],"usage":{"completion_tokens":3},)"
                 R"("server_timing":{"queue_ms":1.5,"prefill_ms":20,"kv_transfer_ms":3.25}})",
                 false);
  ASSERT_TRUE(c.server_timing.has_value());
  EXPECT_DOUBLE_EQ(*c.server_timing->queue_ms, 1.5);
  EXPECT_DOUBLE_EQ(*c.server_timing->prefill_ms, 20);
  EXPECT_DOUBLE_EQ(*c.server_timing->kv_transfer_ms, 3.25);
  EXPECT_FALSE(c.server_timing->first_decode_ms.has_value());
}

TEST(StreamChunkTest, ProtoShapedTimingsInSecondsAreConvertedAndQueuesAdded) {
  ChunkInfo c = ParseChunk(
      R"({"choices":[],"timings":{"queue_s":0.002,"prefill_queue_s":0.001,"prefill_s":0.05,)"
      R"("kv_transfer_s":0.004,"first_decode_step_s":0.01,"ttft_s":0.06}})",
      false);
  ASSERT_TRUE(c.server_timing.has_value());
  EXPECT_NEAR(*c.server_timing->queue_ms, 3.0, 1e-9);
  EXPECT_NEAR(*c.server_timing->prefill_ms, 50.0, 1e-9);
  EXPECT_NEAR(*c.server_timing->kv_transfer_ms, 4.0, 1e-9);
  EXPECT_NEAR(*c.server_timing->first_decode_ms, 10.0, 1e-9);
  // llama.cpp's unrelated "timings" object carries none of these keys: no phases.
  EXPECT_FALSE(
      ParseChunk(R"({"choices":[],"timings":{"prompt_ms":3.0}})", false).server_timing.has_value());
}

TEST(StreamChunkTest, FastPathAgreesWithTheFullParser) {
  // want_text = true always takes the full JSON parser; false takes the fast path when it can.
  const char* kPayloads[] = {
      R"({"choices":[{"index":0,"text":"a","finish_reason":null}],"usage":null})",
      R"({"choices": [{"index": 0, "text": "", "finish_reason": null}], "usage": null})",
      R"({"choices":[{"text":"","finish_reason":"length"}]})",
      R"({"choices":[{"text":"x\"text\":\"\"","finish_reason":"stop"}]})",
      R"({"choices":[]})",
      R"({"choices":[ ],"usage":null})",
      R"({"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]})",
      R"({"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]})",
      R"({"choices":[{"delta":{"content":null,"reasoning_content":"hm"}}]})",
      R"({"choices":[{"delta":{"content":""},"finish_reason":null}]})",
      R"({"choices":[{"delta":{"content":""},"finish_reason":"stop"}]})",
      R"({"choices":[{"delta":{"content":"Hi \"role\": x"},"finish_reason":null}]})",
      R"({"choices":[{"delta":{"content":"x"},"logprobs":{"content":[]}}]})",
  };
  for (const char* p : kPayloads) {
    EXPECT_EQ(ParseChunk(p, false).is_token, ParseChunk(p, true).is_token) << p;
  }
}

}  // namespace
}  // namespace tandem::loadgen
