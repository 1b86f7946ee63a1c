// The device barrier of the peer communicator (kernels/peer_barrier/peer_barrier.h) through its
// CPU reference, which the fake device API (fake_peer_api.h) runs on the rank threads, and the
// group's use of it (comm/group/peer_communicator.h):
//   * no rank passes a barrier before every rank has reached it, over thousands of epochs with
//     ranks at uneven speeds (the test fails if the epoch / flag protocol is broken: a rank
//     passing early reads a peer's value of the previous round);
//   * the abort word releases a rank spinning for a peer that never comes, and the deadline
//     ends the wait without one, each recorded in the rank's error word and setting the abort
//     word for the peers;
//   * in a group: a rank whose barriers never run (a dead rank, a kernel that never started)
//     fails the group from the device barrier's deadline, an abort releases the ranks waiting in
//     their barriers, and a graph replay counts its collectives as calls (an injected fault due
//     among them fires before the replay) and refuses to replay on a failed group.
#include "kernels/peer_barrier/peer_barrier.h"

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "comm/group/peer_communicator.h"
#include "gtest/gtest.h"
#include "tests/comm/group/fake_peer_api.h"

namespace tandem {
namespace {

// The barrier memory of `n` ranks in host memory, laid out as PeerCommGroup lays it out.
struct Words {
  explicit Words(int n) : n(n), device(n), host(1 + n) {
    for (auto& w : device) w.fill(0);
  }
  PeerBarrierArgs For(int rank, absl::Duration timeout = absl::Seconds(20)) {
    PeerBarrierArgs a;
    a.epoch = &device[rank][0];
    for (int q = 0; q < n; ++q) a.slots[q] = &device[q][1];
    a.rank = rank;
    a.num_ranks = n;
    a.abort = &host[0];
    a.error = &host[1 + rank];
    a.timeout_ns = absl::ToInt64Nanoseconds(timeout);
    return a;
  }
  int n;
  std::vector<std::array<uint32_t, 1 + kMaxPeerBarrierRanks>> device;  // [rank]: epoch | slots
  std::vector<int32_t> host;                                           // abort | errors
};

TEST(PeerBarrierTest, NoRankPassesABarrierBeforeEveryRankReachedIt) {
  for (int n : {1, 2, 3, 8}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    constexpr int kRounds = 3000;
    Words words(n);
    // values[r]: the round rank r is in, written before its first barrier of the round; after
    // it every rank must see every peer in the same round, and the second barrier keeps a fast
    // rank from moving on before the slow ones have looked.
    std::vector<std::atomic<int>> values(n);
    for (auto& v : values) v.store(-1);
    std::atomic<int> stale{0};
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        std::mt19937 rng(9 + r);
        const PeerBarrierArgs args = words.For(r);
        for (int k = 0; k < kRounds; ++k) {
          if (rng() % 16 == 0) std::this_thread::yield();  // uneven speeds
          values[r].store(k, std::memory_order_relaxed);
          PeerBarrierRef(args);
          for (int q = 0; q < n; ++q) {
            if (values[q].load(std::memory_order_relaxed) != k) stale.fetch_add(1);
          }
          PeerBarrierRef(args);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(stale.load(), 0) << "a rank passed a barrier before a peer reached it";
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(words.device[r][0], uint32_t{2 * kRounds}) << "rank " << r << "'s epoch";
      EXPECT_EQ(words.host[1 + r], kPeerBarrierOk);
    }
    EXPECT_EQ(words.host[0], 0);
  }
}

TEST(PeerBarrierTest, TheAbortWordReleasesASpinningRank) {
  Words words(3);
  const auto start = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::atomic_ref<int32_t>(words.host[0]).store(1);
  });
  PeerBarrierRef(words.For(0));  // ranks 1 and 2 never come; the deadline is 20 s away
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(words.host[1], kPeerBarrierAborted);
  EXPECT_EQ(words.host[2], kPeerBarrierOk);
}

TEST(PeerBarrierTest, TheDeadlineEndsTheWaitAndAbortsThePeers) {
  Words words(3);
  const auto start = std::chrono::steady_clock::now();
  PeerBarrierRef(words.For(1, absl::Milliseconds(100)));  // ranks 0 and 2 do not come in time
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_EQ(words.host[2], kPeerBarrierTimedOut);
  EXPECT_EQ(words.host[0], 1) << "the peers must stop waiting too";
  // Rank 0 arriving late finds rank 1's flag but waits for rank 2 in vain: the abort word
  // releases it at once, long before its own 20 s deadline.
  PeerBarrierRef(words.For(0));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(words.host[1], kPeerBarrierAborted);
  // A later barrier of rank 1 keeps its first reason.
  PeerBarrierRef(words.For(1));
  EXPECT_EQ(words.host[2], kPeerBarrierTimedOut);
}

TEST(PeerBarrierTest, BadArgumentsAreRefused) {
  Words words(2);
  PeerBarrierArgs a = words.For(0);
  EXPECT_TRUE(CheckPeerBarrier(a).ok());
  a.rank = 2;
  EXPECT_FALSE(CheckPeerBarrier(a).ok());
  a = words.For(0);
  a.slots[1] = nullptr;
  EXPECT_FALSE(CheckPeerBarrier(a).ok());
  a = words.For(0);
  a.timeout_ns = 0;
  EXPECT_FALSE(CheckPeerBarrier(a).ok());
}

void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

TEST(PeerBarrierGroupTest, ARankWhoseBarriersNeverRunFailsTheGroupAtTheDeadline) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group =
      MakeFakePeerGroup(api, 2, PeerCommOptions{.timeout = absl::Milliseconds(200)});
  api->StallBarriersOn(1);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 2; ++r) comms.push_back(group->ForRank(r));
  std::vector<absl::Status> results(2);
  const absl::Time start = absl::Now();
  OnRanks(2, [&](int r) {
    std::vector<float> v(6, 1.0f);
    results[r] = comms[r]->AllReduceSum(v.data(), 6, DType::kF32);
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Rank 0 (whose barrier ran, on the host, to its deadline) reports it; the group is down.
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_NE(results[0].message().find("device barrier"), std::string::npos) << results[0];
  EXPECT_EQ(group->status().code(), absl::StatusCode::kDeadlineExceeded);
  float x = 1.0f;
  EXPECT_EQ(comms[1]->AllReduceSum(&x, 1, DType::kF32).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(comms[1]->BeginGraphReplay(2).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(PeerBarrierGroupTest, AnAbortReleasesRanksWaitingInTheirDeviceBarriers) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 3);  // a 60 s deadline
  api->StallBarriersOn(2);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 3; ++r) comms.push_back(group->ForRank(r));
  std::vector<absl::Status> results(3);
  const absl::Time start = absl::Now();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));  // ranks 0 and 1 spin for rank 2 by then
    group->Abort(absl::CancelledError("engine stopping"));
  });
  OnRanks(3, [&](int r) {
    std::vector<uint16_t> v(9, F32ToBf16(1.0f));
    results[r] = comms[r]->AllReduceSum(v.data(), 9, DType::kBF16);
  });
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kCancelled) << "rank " << r << results[r];
  }
  EXPECT_EQ(group->status().code(), absl::StatusCode::kCancelled);
}

TEST(PeerBarrierGroupTest, AGraphReplayCountsItsCollectivesAsCalls) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 2);
  std::unique_ptr<Communicator> c0 = group->ForRank(0), c1 = group->ForRank(1);
  EXPECT_TRUE(c0->SupportsGraphCapture());
  // Rank 1's calls: one eager all-reduce (call 0), then graphs of 4 collectives (1-4, 5-8).
  group->InjectFault(1, 6, absl::UnavailableError("rank 1 lost its device (injected)"));
  OnRanks(2, [&](int r) {
    float x = 1.0f;
    EXPECT_TRUE((r == 0 ? c0 : c1)->EnqueueAllReduceSum(&x, 1, DType::kF32).ok());
    EXPECT_EQ(x, 2.0f);
  });
  EXPECT_TRUE(c1->BeginGraphReplay(4).ok());
  EXPECT_TRUE(c1->EndGraphReplay().ok());
  const absl::Status fired = c1->BeginGraphReplay(4);
  EXPECT_EQ(fired.code(), absl::StatusCode::kUnavailable) << fired;
  EXPECT_NE(fired.message().find("graph"), std::string::npos) << fired;
  EXPECT_EQ(c0->BeginGraphReplay(4).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c0->EndGraphReplay().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem
