// The in-process device communicator (comm/group/peer_communicator.h) over a host fake of its
// device API (tests/comm/group/fake_peer_api.h): all-reduce and all-gather give the rank-order
// fp32 sums (bitwise ThreadCommGroup's) on every rank for awkward sizes; each
// rank's stream sees its ops in the order the protocol needs (a device barrier, its share, a
// device barrier); and every failure — an injected
// fault, a device error on one rank, a mismatched call, an abort while peers wait, a peer that
// never comes — ends every rank's call with a status and leaves the group refusing further calls.
#include "comm/group/peer_communicator.h"

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "comm/group/thread_communicator.h"
#include "gtest/gtest.h"
#include "kernels/peer_reduce/peer_reduce.h"
#include "tests/comm/group/fake_peer_api.h"

namespace tandem {
namespace {

void RunRanks(PeerCommGroup& group, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < group.size(); ++r) comms.push_back(group.ForRank(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) threads.emplace_back([&, r] { fn(r, *comms[r]); });
  for (std::thread& t : threads) t.join();
}

std::vector<float> RankData(int rank, int64_t count) {
  std::mt19937 rng(77 + rank);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(count);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(F32ToBf16(x));
  return out;
}

TEST(PeerCommunicatorTest, AllReduceIsTheThreadGroupsRankOrderSumOnEveryRank) {
  for (int size : {1, 2, 3, 4, 8}) {
    for (int64_t count : {0, 1, 3, 7, 1000, 1001}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE("size " + std::to_string(size) + " count " + std::to_string(count) +
                     (dtype == DType::kF32 ? " f32" : " bf16"));
        // The oracle: ThreadCommGroup on the same inputs.
        absl::StatusOr<std::shared_ptr<ThreadCommGroup>> oracle = ThreadCommGroup::Create(size);
        ASSERT_TRUE(oracle.ok());
        std::vector<std::vector<float>> want_f(size), got_f(size);
        std::vector<std::vector<uint16_t>> want_b(size), got_b(size);
        auto fill = [&](int r, std::vector<float>& f, std::vector<uint16_t>& b) {
          f = RankData(r, count);
          b = ToBf16(f);
          return dtype == DType::kF32 ? static_cast<void*>(f.data()) : b.data();
        };
        std::vector<std::unique_ptr<Communicator>> oc;
        for (int r = 0; r < size; ++r) oc.push_back((*oracle)->ForRank(r));
        std::vector<std::thread> threads;
        for (int r = 0; r < size; ++r) {
          threads.emplace_back([&, r] {
            CHECK_OK(oc[r]->AllReduceSum(fill(r, want_f[r], want_b[r]), count, dtype));
          });
        }
        for (std::thread& t : threads) t.join();
        auto api = std::make_shared<FakePeerApi>();
        std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, size);
        RunRanks(*group, [&](int r, Communicator& c) {
          ASSERT_TRUE(c.AllReduceSum(fill(r, got_f[r], got_b[r]), count, dtype).ok());
        });
        for (int r = 0; r < size; ++r) {
          if (dtype == DType::kF32) {
            EXPECT_EQ(got_f[r], want_f[0]) << "rank " << r;
          } else {
            EXPECT_EQ(got_b[r], want_b[0]) << "rank " << r;
          }
        }
      }
    }
  }
}

TEST(PeerCommunicatorTest, EachStreamHasItsShareBetweenTwoDeviceBarriers) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 3);
  RunRanks(*group, [&](int r, Communicator& c) {
    std::vector<float> v(10, 1.0f);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(c.AllReduceSum(v.data(), 10, DType::kF32).ok());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(api->LogOf(r), (std::vector<std::string>{"barrier", "reduce", "barrier", "barrier",
                                                       "reduce", "barrier"}))
        << "rank " << r;
  }
  EXPECT_EQ(api->NumEvents(), 0);  // no cross-stream events: what makes it capturable
}

TEST(PeerCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  for (int size : {1, 2, 4}) {
    for (int64_t bytes : {0, 1, 13}) {
      auto api = std::make_shared<FakePeerApi>();
      std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, size);
      std::vector<std::vector<uint8_t>> got(size);
      RunRanks(*group, [&](int r, Communicator& c) {
        std::vector<uint8_t> send(bytes);
        for (int64_t i = 0; i < bytes; ++i) send[i] = static_cast<uint8_t>(r * 31 + i);
        got[r].assign(size * bytes, 0);
        ASSERT_TRUE(c.AllGather(send.data(), got[r].data(), bytes).ok());
      });
      for (int r = 0; r < size; ++r) {
        for (int q = 0; q < size; ++q) {
          for (int64_t i = 0; i < bytes; ++i) {
            ASSERT_EQ(got[r][q * bytes + i], static_cast<uint8_t>(q * 31 + i));
          }
        }
      }
    }
  }
}

// Every rank's call of the run fails, and so does every later one, at once.
void ExpectGroupFailed(PeerCommGroup& group,
                       const std::function<absl::Status(int, Communicator&)>& fn,
                       absl::StatusCode code, const std::string& needle) {
  std::vector<absl::Status> results(group.size());
  RunRanks(group, [&](int r, Communicator& c) {
    results[r] = fn(r, c);
    float x = 1.0f;
    EXPECT_EQ(c.AllReduceSum(&x, 1, DType::kF32).code(), code) << "a later call, rank " << r;
  });
  for (int r = 0; r < group.size(); ++r) {
    EXPECT_EQ(results[r].code(), code) << "rank " << r << ": " << results[r];
    EXPECT_NE(results[r].message().find(needle), std::string::npos) << results[r];
  }
  EXPECT_EQ(group.status().code(), code);
}

TEST(PeerCommunicatorTest, AnInjectedFaultFailsEveryRank) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 3);
  group->InjectFault(1, 2, absl::UnavailableError("rank thread died"));
  ExpectGroupFailed(
      *group,
      [](int r, Communicator& c) -> absl::Status {
        std::vector<float> v(5, 1.0f);
        for (int i = 0; i < 5; ++i) RETURN_IF_ERROR(c.AllReduceSum(v.data(), 5, DType::kF32));
        return absl::OkStatus();
      },
      absl::StatusCode::kUnavailable, "rank thread died");
}

TEST(PeerCommunicatorTest, ADeviceErrorOnOneRankFailsEveryRank) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 2);
  api->FailReduceOn(1);
  ExpectGroupFailed(
      *group,
      [](int r, Communicator& c) {
        std::vector<uint16_t> v(9, F32ToBf16(1.0f));
        return c.AllReduceSum(v.data(), 9, DType::kBF16);
      },
      absl::StatusCode::kInternal, "fake launch failure");
}

TEST(PeerCommunicatorTest, MismatchedCallsAreRefusedOnEveryRank) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 2);
  ExpectGroupFailed(
      *group,
      [](int r, Communicator& c) {
        std::vector<float> v(8, 1.0f);
        return c.AllReduceSum(v.data(), r == 0 ? 8 : 7, DType::kF32);
      },
      absl::StatusCode::kInvalidArgument, "called all-reduce of");
}

TEST(PeerCommunicatorTest, AMissingPeerIsADeadlineAndAnAbortWakesWaiters) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> late =
      MakeFakePeerGroup(api, 2, PeerCommOptions{.timeout = absl::Milliseconds(200)});
  std::unique_ptr<Communicator> c0 = late->ForRank(0);
  float x = 1.0f;
  const absl::Status s = c0->AllReduceSum(&x, 1, DType::kF32);  // rank 1 never comes
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("1 of 2 missing"), std::string::npos) << s;

  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 3);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 3; ++r) comms.push_back(group->ForRank(r));
  std::vector<absl::Status> results(2);
  std::vector<std::thread> waiting;
  for (int r = 0; r < 2; ++r) {
    waiting.emplace_back([&, r] {
      float y = 1.0f;
      results[r] = comms[r]->AllReduceSum(&y, 1, DType::kF32);
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  comms[2]->Abort(absl::CancelledError("engine stopping"));
  for (std::thread& t : waiting) t.join();
  for (const absl::Status& r : results) EXPECT_EQ(r.code(), absl::StatusCode::kCancelled) << r;
}

TEST(PeerCommunicatorTest, BadInputAndNoPeerAccessAreRefused) {
  auto api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group = MakeFakePeerGroup(api, 1);
  std::unique_ptr<Communicator> c = group->ForRank(0);
  float x = 1.0f;
  EXPECT_EQ(c->AllReduceSum(&x, 1, DType::kI32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->AllReduceSum(&x, -1, DType::kF32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Send(&x, 4, 0).code(), absl::StatusCode::kInvalidArgument);  // to itself
  EXPECT_TRUE(c->AllReduceSum(&x, 1, DType::kF32).ok());  // bad input did not abort the group
  EXPECT_EQ(x, 1.0f);
  EXPECT_FALSE(PeerCommGroup::Create(api, {}).ok());
  EXPECT_FALSE(
      PeerCommGroup::Create(api, std::vector<PeerRank>(9, {0, FakePeerApi::StreamOf(0)})).ok());
  EXPECT_FALSE(PeerCommGroup::Create(api, {PeerRank{0, nullptr}}).ok());
  api->set_refuse_peers(true);
  EXPECT_EQ(
      PeerCommGroup::Create(api, {{0, FakePeerApi::StreamOf(0)}, {1, FakePeerApi::StreamOf(1)}})
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem
