// Helpers for the engine/model tests: scratch folders, file I/O, and a tiny generation loop over
// Model::Forward with a paged KV cache.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model.h"

namespace tandem::testing_util {

// A fresh empty folder under the test temp dir, unique per call.
std::string NewTempDir(const std::string& tag);
std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, const std::string& text);

struct SeqResult {
  std::vector<float> prompt_logits;  // logits at the last prompt position
  std::vector<int32_t> tokens;       // greedy continuation
  std::vector<float> token_logits;   // logit of each chosen token when it was chosen
  std::vector<float> margins;        // its lead over the runner-up at that step
};

// Runs every prompt to completion at once, continuous-batching style: each step, each sequence
// feeds up to `chunk` of its pending tokens (prompt chunks, then one generated token at a time),
// with logits only for sequences that finish their pending tokens. Pages are handed out in a
// scrambled order so block tables are not the identity. Greedy (argmax, lowest id on ties).
// On a CUDA model the KV pool is device memory and the step buffers are reserved here: call it
// once per CUDA model.
std::vector<SeqResult> GenerateGreedy(Model& model,
                                      const std::vector<std::vector<int32_t>>& prompts,
                                      int new_tokens, int page_size, int chunk, DType kv_dtype);

}  // namespace tandem::testing_util
