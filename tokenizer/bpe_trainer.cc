#include "tokenizer/bpe_trainer.h"

#include <queue>

#include "absl/container/flat_hash_set.h"
#include "base/check.h"
#include "tokenizer/string_map.h"

namespace tandem {
namespace {

using PairKey = uint64_t;
PairKey Key(int a, int b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
int First(PairKey k) { return static_cast<int>(k >> 32); }
int Second(PairKey k) { return static_cast<int>(k & 0xFFFFFFFFu); }

// Pair statistics with a lazily invalidated max-heap: an entry is current iff its count equals
// the pair's count now.
class PairStats {
 public:
  explicit PairStats(const std::vector<std::string>* vocab) : vocab_(vocab), heap_(Order{vocab}) {}

  void Add(PairKey k, int64_t delta, int word) {
    int64_t& c = counts_[k];
    c += delta;
    if (delta > 0) where_[k].insert(word);
    if (c > 0) heap_.push({c, k});
  }
  // Pops the most frequent pair; false when none is left.
  bool PopBest(PairKey* best) {
    while (!heap_.empty()) {
      const Entry e = heap_.top();
      heap_.pop();
      auto it = counts_.find(e.key);
      if (it != counts_.end() && it->second == e.count && e.count > 0) {
        *best = e.key;
        return true;
      }
    }
    return false;
  }
  std::vector<int> TakeWords(PairKey k) {
    auto node = where_.extract(k);
    if (node.empty()) return {};
    return std::vector<int>(node.mapped().begin(), node.mapped().end());
  }

 private:
  struct Entry {
    int64_t count;
    PairKey key;
  };
  struct Order {
    const std::vector<std::string>* vocab;
    // "less" for a max-heap: lower count, or equal count and larger strings, ranks lower.
    bool operator()(const Entry& x, const Entry& y) const {
      if (x.count != y.count) return x.count < y.count;
      const auto& v = *vocab;
      const int cmp = v[First(x.key)].compare(v[First(y.key)]);
      if (cmp != 0) return cmp > 0;
      return v[Second(x.key)] > v[Second(y.key)];
    }
  };
  const std::vector<std::string>* vocab_;
  absl::flat_hash_map<PairKey, int64_t> counts_;
  absl::flat_hash_map<PairKey, absl::flat_hash_set<int>> where_;
  std::priority_queue<Entry, std::vector<Entry>, Order> heap_;
};

}  // namespace

BpeTrainingResult TrainBpe(BpeTrainingInput input) {
  CHECK_EQ(input.vocab.size(), input.mergeable.size());
  BpeTrainingResult result;
  result.vocab = std::move(input.vocab);
  std::vector<bool> mergeable = std::move(input.mergeable);
  StringMap<int> ids;
  for (size_t i = 0; i < result.vocab.size(); ++i) ids[result.vocab[i]] = static_cast<int>(i);

  std::vector<BpeTrainingWord>& words = input.words;
  PairStats stats(&result.vocab);
  auto for_each_pair = [&](int w, auto fn) {
    const std::vector<int>& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      if (mergeable[s[i]] && mergeable[s[i + 1]]) fn(Key(s[i], s[i + 1]));
    }
  };
  for (int w = 0; w < static_cast<int>(words.size()); ++w) {
    for_each_pair(w, [&](PairKey k) { stats.Add(k, words[w].count, w); });
  }

  PairKey best;
  while (static_cast<int>(result.vocab.size()) < input.vocab_size && stats.PopBest(&best)) {
    const int a = First(best), b = Second(best);
    const std::string merged = result.vocab[a] + result.vocab[b];
    int c;
    if (auto it = ids.find(merged); it != ids.end()) {
      c = it->second;  // the same string reached through another split
    } else {
      c = static_cast<int>(result.vocab.size());
      result.vocab.push_back(merged);
      mergeable.push_back(true);
      ids[merged] = c;
    }
    result.merges.emplace_back(a, b);
    for (int w : stats.TakeWords(best)) {
      for_each_pair(w, [&](PairKey k) { stats.Add(k, -words[w].count, w); });
      std::vector<int>& s = words[w].symbols;
      std::vector<int> out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(c);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s = std::move(out);
      for_each_pair(w, [&](PairKey k) { stats.Add(k, words[w].count, w); });
    }
  }
  return result;
}

}  // namespace tandem
