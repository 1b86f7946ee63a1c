// Long random runs of BlockAllocator calls, valid and not, against a reference model of its
// contract (block_allocator_model.h): after every call the O(1) counts, each page's state,
// references and hash, and the allocator's own recount (CheckConsistency) must agree with the
// model. A transition that forgot to move a counter fails here within a few calls.
#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "gtest/gtest.h"
#include "tests/engine/kv/block_allocator_model.h"

namespace tandem {
namespace {

using Code = absl::StatusCode;

// One random transition, or a query, on the allocator and the model; the results must agree.
class RandomRun {
 public:
  RandomRun(int num_pages, uint32_t seed) : a_(num_pages), m_(num_pages), rng_(seed) {}

  // One random call on both, its results compared.
  void Step();
  // The allocator's counts, states, references and hashes equal the model's, and its own
  // recount agrees.
  void ExpectSameAsModel() const;
  // How often each call succeeded ("Free ok") or was refused ("Free refused"), and how often a
  // Take evicted, a Free cached or ClearCache freed pages: a run that missed a transition proves
  // nothing about it.
  const std::map<std::string, int>& seen() const { return seen_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  // 1 to 3 page ids, mostly of pages in `want` (when any is), sometimes any id, outside the
  // pool included.
  std::vector<int32_t> Pick(PageState want);
  int PickCount();
  uint64_t PickHash() { return static_cast<uint64_t>(Uniform(0, 2 * m_.num_pages() + 2)); }
  void Saw(const std::string& op, Code code) {
    ++seen_[op + (code == Code::kOk ? " ok" : " refused")];
  }

  void Take(bool allocate);
  void Free();
  void Register();
  void LookupAndAcquire();
  void ClearCacheOrHashes();

  BlockAllocator a_;
  BlockAllocatorModel m_;
  std::mt19937 rng_;
  std::map<std::string, int> seen_;
};

std::vector<int32_t> RandomRun::Pick(PageState want) {
  std::vector<int32_t> candidates;
  for (int32_t p = 0; p < m_.num_pages(); ++p) {
    if (m_.page(p).state == want) candidates.push_back(p);
  }
  std::vector<int32_t> out(Uniform(1, 3));
  for (int32_t& p : out) {
    if (candidates.empty() || Uniform(0, 7) == 0) {
      p = Uniform(-1, m_.num_pages());
    } else {
      p = candidates[Uniform(0, static_cast<int>(candidates.size()) - 1)];
    }
  }
  return out;
}

int RandomRun::PickCount() {
  const int available = m_.Count(PageState::kFree) + m_.Count(PageState::kCached);
  switch (Uniform(0, 9)) {
    case 0:
      return -1;
    case 1:
      return available + 1;  // exhaustion
    case 2:
      return available;  // everything, evicting every cached page
    default:
      return Uniform(0, std::min(available, 4));
  }
}

void RandomRun::Take(bool allocate) {
  const PageState to = allocate ? PageState::kOwned : PageState::kReserved;
  const int n = PickCount();
  const Code code = m_.TakeCode(n);
  absl::StatusOr<std::vector<int32_t>> taken = allocate ? a_.Allocate(n) : a_.Reserve(n);
  ASSERT_EQ(taken.status().code(), code) << taken.status();
  Saw(allocate ? "Allocate" : "Reserve", code);
  const int cached = m_.Count(PageState::kCached);
  if (taken.ok()) {
    ASSERT_TRUE(m_.ApplyTake(*taken, n, to)) << "Take(" << n << ") took the wrong pages";
  }
  if (m_.Count(PageState::kCached) < cached) ++seen_["evicted"];
}

void RandomRun::Free() {
  const PageState kinds[] = {PageState::kOwned, PageState::kReserved, PageState::kReceiving};
  const std::vector<int32_t> pages = Pick(kinds[Uniform(0, 2)]);
  const int cached = m_.Count(PageState::kCached);
  const Code code = m_.Free(pages);
  ASSERT_EQ(a_.Free(pages).code(), code);
  Saw("Free", code);
  if (m_.Count(PageState::kCached) > cached) ++seen_["cached"];
}

void RandomRun::Register() {
  const int32_t page = Pick(PageState::kOwned)[0];
  const uint64_t hash = PickHash();
  bool expected = false;
  const Code code = m_.Register(page, hash, &expected);
  absl::StatusOr<bool> got = a_.Register(page, hash);
  ASSERT_EQ(got.status().code(), code);
  Saw("Register", code);
  if (got.ok()) {
    ASSERT_EQ(*got, expected);
  }
}

void RandomRun::LookupAndAcquire() {
  std::vector<uint64_t> hashes(Uniform(1, 3));
  for (uint64_t& h : hashes) h = PickHash();
  const std::vector<int32_t> hit = a_.Lookup(hashes);
  ASSERT_EQ(hit, m_.Lookup(hashes));
  const std::vector<int32_t> pages =
      hit.empty() || Uniform(0, 3) == 0 ? Pick(PageState::kCached) : hit;
  const Code code = m_.Acquire(pages);
  ASSERT_EQ(a_.Acquire(pages).code(), code);
  Saw("Acquire", code);
}

void RandomRun::ClearCacheOrHashes() {
  if (Uniform(0, 3) == 0) {
    const int cleared = m_.ClearCache();
    ASSERT_EQ(a_.ClearCache(), cleared);
    if (cleared > 0) ++seen_["cleared"];
    return;
  }
  std::vector<uint64_t> hashes = a_.Hashes();
  std::vector<uint64_t> expected;
  for (const auto& [hash, page] : m_.index()) expected.push_back(hash);
  std::sort(hashes.begin(), hashes.end());
  std::sort(expected.begin(), expected.end());
  ASSERT_EQ(hashes, expected);
}

void RandomRun::Step() {
  // Frees outweigh AddRef and Acquire, so references do not pile up and pages keep cycling.
  enum Op {
    kAllocate,
    kReserve,
    kBeginReceive,
    kCommit,
    kAddRef,
    kFree,
    kRegister,
    kAcquire,
    kClear
  };
  std::discrete_distribution<int> pick_op({12, 12, 10, 10, 4, 30, 10, 8, 4});
  const int op = pick_op(rng_);
  switch (op) {
    case kAllocate:
    case kReserve:
      return Take(/*allocate=*/op == kAllocate);
    case kBeginReceive: {
      const std::vector<int32_t> pages = Pick(PageState::kReserved);
      const Code code = m_.BeginReceive(pages);
      ASSERT_EQ(a_.BeginReceive(pages).code(), code);
      return Saw("BeginReceive", code);
    }
    case kCommit: {
      const std::vector<int32_t> pages =
          Pick(Uniform(0, 1) == 0 ? PageState::kReserved : PageState::kReceiving);
      const Code code = m_.Commit(pages);
      ASSERT_EQ(a_.Commit(pages).code(), code);
      return Saw("Commit", code);
    }
    case kAddRef: {
      const std::vector<int32_t> pages = Pick(PageState::kOwned);
      const Code code = m_.AddRef(pages);
      ASSERT_EQ(a_.AddRef(pages).code(), code);
      return Saw("AddRef", code);
    }
    case kFree:
      return Free();
    case kRegister:
      return Register();
    case kAcquire:
      return LookupAndAcquire();
    default:
      return ClearCacheOrHashes();
  }
}

void RandomRun::ExpectSameAsModel() const {
  ASSERT_EQ(Counts(a_), m_.Counts());
  ASSERT_EQ(a_.num_free(), m_.Count(PageState::kFree));
  ASSERT_EQ(a_.num_cached(), m_.Count(PageState::kCached));
  for (int32_t p = 0; p < m_.num_pages(); ++p) {
    ASSERT_EQ(a_.state(p), m_.page(p).state) << "page " << p;
    ASSERT_EQ(a_.ref_count(p), m_.page(p).refs) << "page " << p;
    ASSERT_EQ(a_.hashed(p), m_.page(p).hashed) << "page " << p;
  }
  const absl::Status s = a_.CheckConsistency();
  ASSERT_TRUE(s.ok()) << s;
}

// Every transition, and every kind of refusal, at least once in a run of this length.
void ExpectEverythingSeen(const std::map<std::string, int>& seen) {
  for (const char* op :
       {"Allocate", "Reserve", "BeginReceive", "Commit", "AddRef", "Free", "Register", "Acquire"}) {
    EXPECT_GT(seen.count(std::string(op) + " ok"), 0u) << op;
    EXPECT_GT(seen.count(std::string(op) + " refused"), 0u) << op;
  }
  for (const char* event : {"evicted", "cached", "cleared"}) {
    EXPECT_GT(seen.count(event), 0u) << event;
  }
}

void RunRandom(int num_pages, uint32_t seed, int steps) {
  SCOPED_TRACE(testing::Message() << num_pages << " pages, seed " << seed);
  RandomRun run(num_pages, seed);
  for (int i = 0; i < steps; ++i) {
    SCOPED_TRACE(testing::Message() << "step " << i);
    ASSERT_NO_FATAL_FAILURE(run.Step());
    ASSERT_NO_FATAL_FAILURE(run.ExpectSameAsModel());
  }
  ExpectEverythingSeen(run.seen());
}

TEST(BlockAllocatorRandomTest, RandomTransitionsKeepTheCountsExact) {
  for (int num_pages : {1, 2, 7, 19, 111}) {
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      ASSERT_NO_FATAL_FAILURE(RunRandom(num_pages, seed, 3000));
    }
  }
}

TEST(BlockAllocatorRandomTest, RandomTransitionsWithAFreshSeed) {
  const uint32_t seed = std::random_device{}();
  ASSERT_NO_FATAL_FAILURE(RunRandom(37, seed, 5000));
}

}  // namespace
}  // namespace tandem
