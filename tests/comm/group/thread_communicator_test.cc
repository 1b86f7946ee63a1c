// The in-process communicator (comm/group/thread_communicator.h): all-reduce and all-gather on
// awkward sizes and group sizes give exactly the rank-order sums on every rank; point-to-point
// messages keep their order; and every failure — an injected fault in the middle of a run of
// collectives, an abort while peers wait, a peer that never comes (a FakeClock deadline), a size
// mismatch — ends every rank's call with a status and leaves the group refusing further calls.
// Nothing here may hang: each failure test is bounded by the peers' wake-up, never a timeout.
#include "comm/group/thread_communicator.h"

#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "base/check.h"
#include "gtest/gtest.h"
#include "tests/base/fake_clock.h"

namespace tandem {
namespace {

// Runs fn(rank, communicator) on one thread per rank and joins them.
void RunRanks(ThreadCommGroup& group, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < group.size(); ++r) comms.push_back(group.ForRank(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] { fn(r, *comms[r]); });
  }
  for (std::thread& t : threads) t.join();
}

std::shared_ptr<ThreadCommGroup> MakeGroup(int size, ThreadCommOptions options = {}) {
  absl::StatusOr<std::shared_ptr<ThreadCommGroup>> g = ThreadCommGroup::Create(size, options);
  CHECK_OK(g.status());
  return *g;
}

std::vector<float> RankData(int rank, int64_t count) {
  std::mt19937 rng(1000 + rank);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> v(count);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(ThreadCommunicatorTest, AllReduceF32IsTheRankOrderSumOnEveryRank) {
  for (int size : {1, 2, 3, 4, 7}) {
    for (int64_t count : {0, 1, 3, 7, 19, 1000, 1001}) {
      std::vector<float> want(count, 0.0f);
      for (int r = 0; r < size; ++r) {
        const std::vector<float> d = RankData(r, count);
        for (int64_t i = 0; i < count; ++i) want[i] += d[i];
      }
      std::shared_ptr<ThreadCommGroup> group = MakeGroup(size);
      std::vector<std::vector<float>> got(size);
      RunRanks(*group, [&](int r, Communicator& c) {
        got[r] = RankData(r, count);
        ASSERT_TRUE(c.AllReduceSum(got[r].data(), count, DType::kF32).ok());
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(got[r].size(), want.size());
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(got[r][i], want[i])
              << "size " << size << " count " << count << " rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST(ThreadCommunicatorTest, RepeatedAllReducesStayInStep) {
  const int size = 4;
  const int64_t count = 37;
  std::shared_ptr<ThreadCommGroup> group = MakeGroup(size);
  std::vector<std::vector<float>> got(size);
  RunRanks(*group, [&](int r, Communicator& c) {
    got[r].assign(count, static_cast<float>(r + 1));
    for (int i = 0; i < 50; ++i) {
      // Each round: x <- Σ x / size over ranks, with a rank-dependent nudge before it.
      for (float& x : got[r]) x = x / size + static_cast<float>(r);
      ASSERT_TRUE(c.AllReduceSum(got[r].data(), count, DType::kF32).ok());
    }
  });
  float want = 0.0f;  // the same recurrence, every rank starting at r + 1
  std::vector<float> x = {1, 2, 3, 4};
  for (int i = 0; i < 50; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < size; ++r) sum += x[r] / size + static_cast<float>(r);
    for (float& v : x) v = sum;
    want = sum;
  }
  for (int r = 0; r < size; ++r) {
    for (float v : got[r]) ASSERT_EQ(v, want);
  }
}

TEST(ThreadCommunicatorTest, AllReduceBf16SumsInFp32AndRoundsOnce) {
  const int size = 3;
  const int64_t count = 19;
  std::shared_ptr<ThreadCommGroup> group = MakeGroup(size);
  std::vector<std::vector<uint16_t>> got(size);
  std::vector<float> want(count, 0.0f);
  for (int r = 0; r < size; ++r) {
    const std::vector<float> d = RankData(r, count);
    for (int64_t i = 0; i < count; ++i) want[i] += RoundToBf16(d[i]);
  }
  RunRanks(*group, [&](int r, Communicator& c) {
    for (float v : RankData(r, count)) got[r].push_back(F32ToBf16(v));
    ASSERT_TRUE(c.AllReduceSum(got[r].data(), count, DType::kBF16).ok());
  });
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[r][i], F32ToBf16(want[i]));
  }
}

TEST(ThreadCommunicatorTest, AllReduceRefusesOtherDtypes) {
  std::shared_ptr<ThreadCommGroup> group = MakeGroup(1);
  std::unique_ptr<Communicator> c = group->ForRank(0);
  int8_t x[4] = {};
  EXPECT_EQ(c->AllReduceSum(x, 4, DType::kI8).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ThreadCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  for (int size : {1, 2, 3, 4}) {
    for (int64_t bytes : {0, 1, 5, 64, 333}) {
      std::shared_ptr<ThreadCommGroup> group = MakeGroup(size);
      std::vector<std::vector<uint8_t>> got(size);
      RunRanks(*group, [&](int r, Communicator& c) {
        std::vector<uint8_t> send(bytes);
        for (int64_t i = 0; i < bytes; ++i) send[i] = static_cast<uint8_t>(r * 31 + i);
        got[r].assign(size * bytes, 0xEE);
        ASSERT_TRUE(c.AllGather(send.data(), got[r].data(), bytes).ok());
      });
      for (int r = 0; r < size; ++r) {
        for (int src = 0; src < size; ++src) {
          for (int64_t i = 0; i < bytes; ++i) {
            ASSERT_EQ(got[r][src * bytes + i], static_cast<uint8_t>(src * 31 + i));
          }
        }
      }
    }
  }
}

TEST(ThreadCommunicatorTest, SendRecvKeepsOrderPerPair) {
  std::shared_ptr<ThreadCommGroup> group = MakeGroup(3);
  std::vector<std::vector<int32_t>> got(3);
  RunRanks(*group, [&](int r, Communicator& c) {
    if (r == 0) {
      for (int32_t i = 0; i < 20; ++i) {
        const std::vector<int32_t> m(i + 1, i);  // messages of growing size
        ASSERT_TRUE(c.Send(m.data(), m.size() * 4, 2).ok());
      }
    } else if (r == 1) {
      const int32_t m[3] = {-1, -2, -3};
      ASSERT_TRUE(c.Send(m, sizeof(m), 2).ok());
    } else {
      for (int32_t i = 0; i < 20; ++i) {
        std::vector<int32_t> m(i + 1, 99);
        ASSERT_TRUE(c.Recv(m.data(), m.size() * 4, 0).ok());
        for (int32_t v : m) ASSERT_EQ(v, i);
      }
      int32_t m[3] = {};
      ASSERT_TRUE(c.Recv(m, sizeof(m), 1).ok());
      EXPECT_EQ(m[2], -3);
    }
  });
  EXPECT_TRUE(group->status().ok());
}

TEST(ThreadCommunicatorTest, RecvOfTheWrongSizeAbortsTheGroup) {
  std::shared_ptr<ThreadCommGroup> group = MakeGroup(2);
  std::unique_ptr<Communicator> a = group->ForRank(0);
  std::unique_ptr<Communicator> b = group->ForRank(1);
  const float m[4] = {1, 2, 3, 4};
  ASSERT_TRUE(a->Send(m, sizeof(m), 1).ok());
  float out[3];
  EXPECT_EQ(b->Recv(out, sizeof(out), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Send(m, sizeof(m), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Send(m, sizeof(m), 0).code(), absl::StatusCode::kInvalidArgument);  // to itself
}

TEST(ThreadCommunicatorTest, MismatchedCollectivesFailEveryRank) {
  std::shared_ptr<ThreadCommGroup> group = MakeGroup(3);
  std::vector<absl::Status> got(3);
  RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<float> x(8, 1.0f);
    got[r] = c.AllReduceSum(x.data(), r == 1 ? 7 : 8, DType::kF32);
  });
  for (const absl::Status& s : got) EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// A fault in rank 2's fourth collective, while the others are in it: every rank's fourth call
// fails with the fault's code (the three before succeeded with the right sums), and every call
// after it fails at once.
TEST(ThreadCommunicatorTest, FaultDuringACollectiveFailsEveryRank) {
  const int size = 4;
  std::shared_ptr<ThreadCommGroup> group = MakeGroup(size);
  group->InjectFault(2, 3, absl::InternalError("injected device loss"));
  std::vector<int> ok_calls(size, 0);
  std::vector<absl::Status> first_error(size), later(size);
  RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<float> x(101);
    for (int i = 0; i < 10; ++i) {
      for (float& v : x) v = 1.0f;
      const absl::Status s = c.AllReduceSum(x.data(), x.size(), DType::kF32);
      if (!s.ok()) {
        first_error[r] = s;
        break;
      }
      for (float v : x) ASSERT_EQ(v, static_cast<float>(size));
      ++ok_calls[r];
    }
    std::vector<uint8_t> recv(size * 4);
    later[r] = c.AllGather(x.data(), recv.data(), 4);
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(ok_calls[r], 3) << "rank " << r;
    EXPECT_EQ(first_error[r].code(), absl::StatusCode::kInternal) << first_error[r];
    EXPECT_NE(first_error[r].message().find("injected device loss"), std::string::npos);
    EXPECT_EQ(later[r].code(), absl::StatusCode::kInternal);
  }
  EXPECT_EQ(group->status().code(), absl::StatusCode::kInternal);
}

// Three ranks wait in an all-reduce the fourth never joins; time does not move (FakeClock), so
// only the abort can wake them.
TEST(ThreadCommunicatorTest, AbortWakesPeersWaitingInACollective) {
  testing::FakeClock clock;
  std::shared_ptr<ThreadCommGroup> group =
      MakeGroup(4, ThreadCommOptions{.timeout = absl::Seconds(30), .clock = &clock});
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 4; ++r) comms.push_back(group->ForRank(r));
  std::vector<absl::Status> got(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      float x[5] = {};
      got[r] = comms[r]->AllReduceSum(x, 5, DType::kF32);
    });
  }
  ASSERT_TRUE(clock.AwaitWaiters(3));
  comms[3]->Abort(absl::CancelledError("rank 3's request was cancelled"));
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : got) EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  float x[5] = {};
  EXPECT_EQ(comms[3]->AllReduceSum(x, 5, DType::kF32).code(), absl::StatusCode::kCancelled);
}

TEST(ThreadCommunicatorTest, AbortWakesARecv) {
  testing::FakeClock clock;
  std::shared_ptr<ThreadCommGroup> group =
      MakeGroup(2, ThreadCommOptions{.timeout = absl::Seconds(30), .clock = &clock});
  std::unique_ptr<Communicator> a = group->ForRank(0);
  absl::Status got;
  std::thread t([&] {
    float x[2];
    got = a->Recv(x, sizeof(x), 1);
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  group->Abort(absl::UnavailableError("stage 1 is gone"));
  t.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
}

// A peer that never arrives: the waiting ranks give up exactly at the deadline.
TEST(ThreadCommunicatorTest, MissingPeerEndsInDeadlineExceeded) {
  testing::FakeClock clock;
  const absl::Duration timeout = absl::Seconds(30);
  std::shared_ptr<ThreadCommGroup> group =
      MakeGroup(3, ThreadCommOptions{.timeout = timeout, .clock = &clock});
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 3; ++r) comms.push_back(group->ForRank(r));
  std::vector<absl::Status> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<uint8_t> recv(3 * 8);
      const uint8_t send[8] = {};
      got[r] = comms[r]->AllGather(send, recv.data(), 8);
    });
  }
  ASSERT_TRUE(clock.AwaitWaiters(2));
  clock.Advance(timeout - absl::Seconds(1));
  EXPECT_TRUE(group->status().ok());  // not yet
  clock.Advance(absl::Seconds(1));
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : got) EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  const uint8_t send[8] = {};
  std::vector<uint8_t> recv(3 * 8);
  EXPECT_EQ(comms[2]->AllGather(send, recv.data(), 8).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ThreadCommunicatorTest, CreateRefusesBadGroups) {
  EXPECT_EQ(ThreadCommGroup::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ThreadCommGroup::Create(2, ThreadCommOptions{.timeout = absl::ZeroDuration()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
