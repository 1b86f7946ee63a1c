// A small byte-pair-encoding trainer for the generated checkpoints' tokenizers: repeatedly
// merges the most frequent adjacent symbol pair (ties: the lexicographically smallest pair of
// strings, so the result is deterministic) until the vocabulary reaches the requested size or
// no pair is left.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct BpeTrainingWord {
  std::vector<int> symbols;  // ids into BpeTrainingInput::vocab
  int64_t count = 0;
};

struct BpeTrainingInput {
  std::vector<std::string> vocab;  // initial symbols; id = index; strings are unique
  std::vector<bool> mergeable;     // per initial symbol: may it take part in a merge?
  std::vector<BpeTrainingWord> words;
  int vocab_size = 0;  // stop when the vocabulary has this many entries
};

struct BpeTrainingResult {
  std::vector<std::string> vocab;           // initial symbols then merged tokens, by id
  std::vector<std::pair<int, int>> merges;  // in rank order; result = vocab[a] + vocab[b]
};

BpeTrainingResult TrainBpe(BpeTrainingInput input);

}  // namespace tandem
