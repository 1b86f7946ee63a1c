#include "tests/engine/model/model_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "engine/model/make_model.h"
#include "engine/model/quant_config.h"
#include "engine/model/quant_weight.h"
#include "engine/model/safetensors.h"
#include "gtest/gtest.h"

namespace tandem::testing_util {

std::string NewTempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  const std::string dir = ::testing::TempDir() + "/tandem_model_" + std::to_string(::getpid()) +
                          "_" + tag + "_" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CHECK(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFileOrDie(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  CHECK(out) << "cannot write " << path;
}

namespace {

struct Seq {
  std::vector<int32_t> tokens;  // prompt, then generated
  size_t fed = 0;               // tokens whose K/V are in the cache
  std::vector<int32_t> pages;
  bool done = false;
};

// One step's inputs over the sequences that still have pending tokens; `logit_seqs` gets the
// sequence of each logits row.
StepInputs BuildStep(std::vector<Seq>& seqs, int chunk, int page_size,
                     std::vector<int32_t>& free_pages, std::vector<int>* logit_seqs) {
  StepInputs in;
  std::vector<const Seq*> stepping;
  in.query_start.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    Seq& q = seqs[s];
    if (q.done) continue;
    const size_t n = std::min<size_t>(chunk, q.tokens.size() - q.fed);
    while (q.pages.size() * page_size < q.fed + n) {
      q.pages.push_back(free_pages.back());
      free_pages.pop_back();
    }
    for (size_t pos = q.fed; pos < q.fed + n; ++pos) {
      in.token_ids.push_back(q.tokens[pos]);
      in.positions.push_back(static_cast<int32_t>(pos));
      in.slot_mapping.push_back(q.pages[pos / page_size] * page_size + pos % page_size);
    }
    q.fed += n;
    in.seq_lens.push_back(static_cast<int32_t>(q.fed));
    in.query_start.push_back(in.query_start.back() + static_cast<int32_t>(n));
    if (q.fed == q.tokens.size()) {
      in.logits_rows.push_back(in.query_start.back() - 1);
      logit_seqs->push_back(static_cast<int>(s));
    }
    stepping.push_back(&q);
    in.max_pages_per_seq = std::max<int>(in.max_pages_per_seq, q.pages.size());
  }
  in.num_seqs = static_cast<int>(stepping.size());
  in.num_tokens = static_cast<int64_t>(in.token_ids.size());
  in.block_tables.assign(in.num_seqs * in.max_pages_per_seq, 0);
  for (int i = 0; i < in.num_seqs; ++i) {
    std::copy(stepping[i]->pages.begin(), stepping[i]->pages.end(),
              in.block_tables.begin() + i * in.max_pages_per_seq);
  }
  return in;
}

}  // namespace

std::vector<SeqResult> GenerateGreedy(Model& model,
                                      const std::vector<std::vector<int32_t>>& prompts,
                                      int new_tokens, int page_size, int chunk, DType kv_dtype) {
  const ModelConfig& c = model.config();
  std::vector<Seq> seqs(prompts.size());
  int total_pages = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    seqs[s].tokens = prompts[s];
    total_pages += (prompts[s].size() + new_tokens + page_size - 1) / page_size;
  }
  // The model's own pool layout (a tensor-parallel group stacks its ranks' pools).
  KvLayout layout = model.KvPoolLayout(page_size);
  layout.num_pages = total_pages + 2;
  layout.dtype = kv_dtype;
  // The pool where the backend computes: host memory, or device memory (CUDA), whose step
  // buffers are then reserved for the largest step this loop makes.
  std::vector<uint8_t> host_pool;
  std::unique_ptr<DeviceAllocation> device_pool;
  void* pool = nullptr;
  if (model.backend() == Backend::kCpu) {
    host_pool.resize(layout.PoolBytes());
    pool = host_pool.data();
  } else {
    const int n = static_cast<int>(prompts.size());
    StepCapacity cap;
    cap.max_seqs = n;
    cap.max_tokens = std::max<int64_t>(int64_t{chunk} * n, n);
    cap.max_pages_per_seq = layout.num_pages;
    cap.num_q_heads = c.num_q_heads;
    cap.num_kv_heads = c.num_kv_heads;
    CHECK_OK(model.ReserveStep(cap));
    absl::StatusOr<std::unique_ptr<DeviceAllocation>> a = model.AllocateKvPool(layout.PoolBytes());
    CHECK_OK(a.status());
    device_pool = *std::move(a);
    pool = device_pool->data();
  }
  std::vector<int32_t> free_pages(layout.num_pages);
  for (int i = 0; i < layout.num_pages; ++i) free_pages[i] = i;
  std::shuffle(free_pages.begin(), free_pages.end(), std::mt19937(42));
  std::vector<SeqResult> results(prompts.size());
  for (;;) {
    std::vector<int> logit_seqs;
    const StepInputs in = BuildStep(seqs, chunk, page_size, free_pages, &logit_seqs);
    if (in.num_seqs == 0) break;
    std::vector<float> logits(in.logits_rows.size() * c.vocab_size);
    CHECK_OK(model.ComputeLogits(in, layout, pool, logits.data()));
    for (size_t r = 0; r < logit_seqs.size(); ++r) {
      SeqResult& res = results[logit_seqs[r]];
      const float* row = logits.data() + r * c.vocab_size;
      if (res.prompt_logits.empty()) res.prompt_logits.assign(row, row + c.vocab_size);
      const auto tok = static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
      float second = -INFINITY;
      for (int v = 0; v < c.vocab_size; ++v) {
        if (v != tok) second = std::max(second, row[v]);
      }
      res.tokens.push_back(tok);
      res.token_logits.push_back(row[tok]);
      res.margins.push_back(row[tok] - second);
      Seq& q = seqs[logit_seqs[r]];
      q.done = static_cast<int>(res.tokens.size()) == new_tokens;
      if (!q.done) q.tokens.push_back(tok);
    }
  }
  return results;
}

std::string CachedCheckpoint(const std::string& preset, uint64_t seed, const std::string& scheme) {
  static absl::Mutex mu;
  static auto* made = new std::map<std::string, std::string>;
  const std::string key = absl::StrCat(preset, "/", seed, "/", scheme);
  absl::MutexLock lock(&mu);
  if (auto it = made->find(key); it != made->end()) return it->second;
  const std::string dir = NewTempDir(absl::StrCat("ckpt_", preset, "_", seed, "_", scheme));
  CHECK_OK(
      MakeModel({.preset = preset, .out_dir = dir, .seed = seed, .quantization = scheme}).status());
  (*made)[key] = dir;
  return dir;
}

ModelWeights RankActGroupWeights(const std::string& dir, const std::string& flag, int tp,
                                 DType dtype) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(dir);
  CHECK_OK(config.status());
  absl::StatusOr<QuantConfig> quant = QuantConfig::Resolve(dir, flag);
  CHECK_OK(quant.status());
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> ckpt = SafetensorsCheckpoint::Open(dir);
  CHECK_OK(ckpt.status());
  absl::StatusOr<ModelWeights> weights = LoadWeights(**ckpt, *config, dtype, *quant);
  CHECK_OK(weights.status());
  for (LayerWeights& l : weights->layers) {
    for (HostTensor* t : {&l.o_proj, &l.down_proj}) {
      auto q = std::make_shared<QuantizedWeight>(*t->quant);
      CHECK(q->act_quant == ActQuant::kFp8PerToken);
      q->act_quant = ActQuant::kFp8PerTokenGroup;
      q->act_group_size = q->k / tp;
      t->quant = std::move(q);
    }
  }
  return *std::move(weights);
}

std::vector<std::vector<int32_t>> RandomPrompts(const std::vector<int>& lengths, int vocab,
                                                uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : lengths) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = id(rng);
    prompts.push_back(p);
  }
  return prompts;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double{x}));
  return m;
}

double RelativeLogitError(const std::vector<float>& want, const std::vector<float>& got,
                          const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double err = 0.0;
  for (size_t v = 0; v < std::min(want.size(), got.size()); ++v) {
    EXPECT_TRUE(std::isfinite(got[v])) << what << " logit " << v;
    err = std::max(err, std::fabs(double{got[v]} - want[v]));
  }
  return err / std::max(1.0, MaxAbs(want));
}

int ExpectSameUpToNearTie(const std::vector<int32_t>& want, const std::vector<float>& margins,
                          const std::vector<int32_t>& got, double near_tie,
                          const std::string& what) {
  EXPECT_EQ(want.size(), got.size()) << what;
  const size_t n = std::min(want.size(), got.size());
  for (size_t i = 0; i < n; ++i) {
    if (want[i] == got[i]) continue;
    EXPECT_LE(margins[i], near_tie) << what << ": token " << i << " differs (" << want[i] << " vs "
                                    << got[i] << ") with a top-2 margin of " << margins[i];
    return static_cast<int>(i);
  }
  return static_cast<int>(n);
}

int ExpectSameGenerations(const std::vector<SeqResult>& want, const std::vector<SeqResult>& got,
                          const std::vector<std::vector<int32_t>>& prompts, double logit_tolerance,
                          const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int agreed = 0;
  for (size_t i = 0; i < std::min({want.size(), got.size(), prompts.size()}); ++i) {
    const std::string name = what + " prompt " + std::to_string(prompts[i].size());
    const double err = RelativeLogitError(want[i].prompt_logits, got[i].prompt_logits, name);
    std::cout << name << ": max logit difference " << err << " of max |logit|\n";
    EXPECT_LE(err, logit_tolerance) << name;
    agreed += ExpectSameUpToNearTie(
        want[i].tokens, want[i].margins, got[i].tokens,
        2 * logit_tolerance * std::max(1.0, MaxAbs(want[i].prompt_logits)), name);
  }
  return agreed;
}

int ExpectSameGreedyGenerations(Model& reference, Model& candidate, int new_tokens,
                                double logit_tolerance, uint64_t seed, const std::string& what) {
  const auto prompts = RandomPrompts({1, 13, 45, 300}, reference.config().vocab_size, seed);
  const std::vector<SeqResult> want =
      GenerateGreedy(reference, prompts, new_tokens, 16, 64, DType::kBF16);
  const std::vector<SeqResult> got =
      GenerateGreedy(candidate, prompts, new_tokens, 16, 64, DType::kBF16);
  const int agreed = ExpectSameGenerations(want, got, prompts, logit_tolerance, what);
  std::cout << what << ": greedy tokens agreed " << agreed << " of " << prompts.size() * new_tokens
            << "\n";
  return agreed;
}

}  // namespace tandem::testing_util
