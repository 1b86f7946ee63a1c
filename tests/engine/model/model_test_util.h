// Helpers for the engine/model tests: scratch folders, file I/O, a tiny generation loop over
// Model::Forward with a paged KV cache, and the comparisons of two models' outputs (random
// prompts, relative logit error, greedy tokens identical up to a near tie).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/weights.h"

namespace tandem::testing_util {

// A fresh empty folder under the test temp dir, unique per call.
std::string NewTempDir(const std::string& tag);
// make-model's `preset` checkpoint from `seed`, quantized with `scheme` ("" for bf16), written
// once per process and shared by the tests that only read it.
std::string CachedCheckpoint(const std::string& preset, uint64_t seed,
                             const std::string& scheme = "");
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

// The quantized checkpoint in `dir` (or `flag`, --quantization at load) as TP 1 weights whose
// o_proj and down_proj quantize their activations per token and group of k / tp: what tp ranks
// with per-token FP8 scales compute on their row-parallel layers (CHECK-fails on other formats).
ModelWeights RankActGroupWeights(const std::string& dir, const std::string& flag, int tp,
                                 DType dtype);

// Prompts of the given lengths, token ids uniform over the vocabulary (mt19937_64 from `seed`).
std::vector<std::vector<int32_t>> RandomPrompts(const std::vector<int>& lengths, int vocab,
                                                uint64_t seed);

double MaxAbs(const std::vector<float>& v);

// max |got - want| over the logits (each must be finite: an EXPECT per bad one) divided by
// max(1, max |want|).
double RelativeLogitError(const std::vector<float>& want, const std::vector<float>& got,
                          const std::string& what);

// Compares `got` with the reference `want` token by token; a first difference is allowed only
// where want's top-2 margin was <= `near_tie` (an EXPECT otherwise). Returns the number of tokens
// that agreed.
int ExpectSameUpToNearTie(const std::vector<int32_t>& want, const std::vector<float>& margins,
                          const std::vector<int32_t>& got, double near_tie,
                          const std::string& what);

// Per prompt (named `what` + its length): the last prompt position's logits within
// `logit_tolerance` (RelativeLogitError) and the greedy tokens the same up to a near tie of
// 2 x logit_tolerance x max(1, max |logit|); prints each prompt's error. Returns the tokens that
// agreed. `prompts` gives the lengths for the names.
int ExpectSameGenerations(const std::vector<SeqResult>& want, const std::vector<SeqResult>& got,
                          const std::vector<std::vector<int32_t>>& prompts, double logit_tolerance,
                          const std::string& what);

// `candidate` against `reference` (the same checkpoint on another layout: TP, PP, other GPUs):
// greedy generation of `new_tokens` on prompts of 1, 13, 45 and 300 tokens (RandomPrompts from
// `seed`; pages of 16, chunks of 64, bf16 KV), compared with ExpectSameGenerations; prints how
// many tokens agreed as `what`. Call once per CUDA model (GenerateGreedy's rule).
int ExpectSameGreedyGenerations(Model& reference, Model& candidate, int new_tokens,
                                double logit_tolerance, uint64_t seed, const std::string& what);

}  // namespace tandem::testing_util
