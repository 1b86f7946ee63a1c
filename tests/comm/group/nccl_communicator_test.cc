// The NCCL group communicator (comm/group/nccl_communicator.h) on the CPU, through the in-process
// fake NCCL (tests/comm/fake_nccl.h: one "process" with one fake GPU per rank, every rank a
// thread of this test):
//   - values: all-reduce (f32, and bf16 as NCCL sums it), all-gather (and in place) and
//     send / recv along a pipeline of ranks, for groups of 1, 2 and 4 ranks and 1, 7 and
//     1000003 elements, on every rank, against references computed here;
//   - the enqueue-only calls: they return while the stream still waits for its compute event (no
//     host wait), the values land once it fires and Synchronize returns;
//   - failures, each ending every rank's call with a status and every later call at once: a rank
//     that never arrives (DeadlineExceeded on every other rank, on a FakeClock), Abort from
//     another thread mid-collective, a hung comm, an async NCCL error, an async call's error at
//     the next Synchronize, failing and hanging inits; the comms are aborted each time.
// Nothing here may hang: every wait ends at an abort or at a deadline the test moves past.
#include "comm/group/nccl_communicator.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/check.h"
#include "gtest/gtest.h"
#include "tests/base/fake_clock.h"
#include "tests/comm/fake_nccl.h"

namespace tandem {
namespace {

using ::tandem::testing::FakeClock;

constexpr absl::Duration kTimeout = absl::Seconds(30);

// One process with `n` fake GPUs and its group of `n` ranks (rank r on GPU r).
struct Group {
  FakeNcclWorld world;
  std::shared_ptr<FakeNccl> api;
  std::shared_ptr<NcclCommGroup> group;
  std::vector<std::unique_ptr<NcclCommunicator>> comms;

  explicit Group(int n, NcclGroupOptions options = {}) {
    api = std::make_shared<FakeNccl>(&world, "GPU-fake", 0, n);
    std::vector<NcclRank> ranks(n);
    for (int r = 0; r < n; ++r) ranks[r].device = r;
    absl::StatusOr<std::shared_ptr<NcclCommGroup>> g = MakeNcclGroup(api, ranks, options);
    CHECK_OK(g.status());
    group = *g;
    for (int r = 0; r < n; ++r) comms.push_back(group->ForRank(r));
  }
  int size() const { return static_cast<int>(comms.size()); }
};

// Runs fn(rank) on one thread per rank (those in `ranks`, default all) and joins them.
void RunRanks(int n, const std::function<void(int)>& fn, std::vector<int> ranks = {}) {
  if (ranks.empty()) {
    for (int r = 0; r < n; ++r) ranks.push_back(r);
  }
  std::vector<std::thread> threads;
  for (int r : ranks) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

// Moves `clock` past every deadline set so far, again and again, until `done` holds: a rank
// whose deadline was taken after one move is passed by the next.
void AdvanceUntil(FakeClock& clock, const std::function<bool()>& done) {
  while (!done()) {
    clock.Advance(kTimeout + absl::Seconds(1));
    Clock::Real()->SleepFor(absl::Milliseconds(1));
  }
}

// Values whose sums over up to 4 ranks are exact in f32 (and, for the small ones, in bf16), so
// every element has one right answer whatever the order of the additions.
float Exact(int rank, int64_t i) {
  return static_cast<float>(((i * 37 + rank * 11) % 101) - 50) * 0.5f;
}
float SmallInt(int rank, int64_t i) { return static_cast<float>(((i * 13 + rank * 7) % 31) - 15); }

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F32ToBf16(v[i]);
  return out;
}

TEST(NcclCommunicatorTest, AllReduceF32SumsEveryRanksValues) {
  for (int n : {1, 2, 4}) {
    for (int64_t count : {1, 7, 1000003}) {
      Group g(n);
      std::vector<std::vector<float>> data(n);
      RunRanks(n, [&](int r) {
        data[r].resize(count);
        for (int64_t i = 0; i < count; ++i) data[r][i] = Exact(r, i);
        absl::Status s = g.comms[r]->AllReduceSum(data[r].data(), count, DType::kF32);
        EXPECT_TRUE(s.ok()) << s;
      });
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < count; ++i) {
          float want = 0.0f;
          for (int q = 0; q < n; ++q) want += Exact(q, i);
          ASSERT_EQ(data[r][i], want)
              << n << " ranks, count " << count << ", rank " << r << ", element " << i;
        }
      }
      EXPECT_EQ(g.api->all_reduces.load(), n);
    }
  }
}

TEST(NcclCommunicatorTest, AllReduceBf16ExactWhereTheSumsAreAndWithinNcclsRoundingElsewhere) {
  for (int n : {2, 4}) {
    for (int64_t count : {1, 7, 1000003}) {
      // (a) Small integers: every partial sum is exact in bf16, so the answer is unique.
      Group g(n);
      std::vector<std::vector<uint16_t>> data(n);
      RunRanks(n, [&](int r) {
        std::vector<float> v(count);
        for (int64_t i = 0; i < count; ++i) v[i] = SmallInt(r, i);
        data[r] = ToBf16(v);
        absl::Status s = g.comms[r]->AllReduceSum(data[r].data(), count, DType::kBF16);
        EXPECT_TRUE(s.ok()) << s;
      });
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < count; ++i) {
          float want = 0.0f;
          for (int q = 0; q < n; ++q) want += SmallInt(q, i);
          ASSERT_EQ(Bf16ToF32(data[r][i]), want) << n << " ranks, rank " << r << ", element " << i;
        }
      }
      // (b) Random values: at 2 ranks exactly the sum rounded once (the interface's result); at
      // 4 within one bf16 rounding per addition of it; the same bits on every rank.
      std::vector<std::vector<uint16_t>> in(n), out(n);
      for (int r = 0; r < n; ++r) {
        std::mt19937 rng(7 * r + static_cast<int>(count));
        std::uniform_real_distribution<float> u(-3.0f, 3.0f);
        std::vector<float> v(count);
        for (float& x : v) x = u(rng);
        in[r] = ToBf16(v);
        out[r] = in[r];
      }
      RunRanks(n, [&](int r) {
        absl::Status s = g.comms[r]->AllReduceSum(out[r].data(), count, DType::kBF16);
        EXPECT_TRUE(s.ok()) << s;
      });
      for (int64_t i = 0; i < count; ++i) {
        double exact = 0.0, magnitude = 0.0;
        for (int q = 0; q < n; ++q) {
          exact += Bf16ToF32(in[q][i]);
          magnitude += std::fabs(Bf16ToF32(in[q][i]));
        }
        for (int r = 0; r < n; ++r) ASSERT_EQ(out[r][i], out[0][i]) << "rank " << r << " " << i;
        if (n == 2) {
          ASSERT_EQ(out[0][i], F32ToBf16(static_cast<float>(exact))) << "element " << i;
        } else {
          // Each of the n - 1 roundings errs by at most half a bf16 ulp of a partial sum (8
          // significant bits: 2^-8 of it), itself at most the sum of the magnitudes.
          ASSERT_LE(std::fabs(Bf16ToF32(out[0][i]) - exact), (n - 1) * magnitude / 256.0)
              << "element " << i;
        }
      }
    }
  }
}

TEST(NcclCommunicatorTest, AllGatherConcatenatesInRankOrderAlsoInPlace) {
  for (int n : {1, 2, 4}) {
    for (int64_t bytes : {1, 7, 1000003}) {
      Group g(n);
      auto byte = [](int r, int64_t i) {
        return static_cast<uint8_t>((r * 31 + i * 7 + 3) & 0xff);
      };
      std::vector<std::vector<uint8_t>> recv(n), in_place(n);
      RunRanks(n, [&](int r) {
        std::vector<uint8_t> send(bytes);
        for (int64_t i = 0; i < bytes; ++i) send[i] = byte(r, i);
        recv[r].assign(bytes * n, 0xee);
        absl::Status s = g.comms[r]->AllGather(send.data(), recv[r].data(), bytes);
        EXPECT_TRUE(s.ok()) << s;
        // In place: this rank's part already sits at its offset of the receive buffer.
        in_place[r].assign(bytes * n, 0xee);
        std::memcpy(in_place[r].data() + r * bytes, send.data(), bytes);
        s = g.comms[r]->AllGather(in_place[r].data() + r * bytes, in_place[r].data(), bytes);
        EXPECT_TRUE(s.ok()) << s;
      });
      for (int r = 0; r < n; ++r) {
        for (int q = 0; q < n; ++q) {
          for (int64_t i = 0; i < bytes; ++i) {
            ASSERT_EQ(recv[r][q * bytes + i], byte(q, i)) << "rank " << r << " part " << q;
            ASSERT_EQ(in_place[r][q * bytes + i], byte(q, i)) << "rank " << r << " part " << q;
          }
        }
      }
    }
  }
}

TEST(NcclCommunicatorTest, SendRecvAlongAPipelineKeepsEachPairsOrder) {
  for (int n : {2, 4}) {
    for (int64_t bytes : {1, 7, 1000003}) {
      Group g(n);
      // Rank 0 sends two messages down the pipeline; each later rank receives both from its
      // predecessor in order, checks them, adds its rank to every byte and passes them on.
      auto byte = [](int m, int hop, int64_t i) {
        return static_cast<uint8_t>((m * 101 + i * 13 + hop) & 0xff);
      };
      std::atomic<int> wrong{0};
      RunRanks(n, [&](int r) {
        std::vector<std::vector<uint8_t>> msgs(2, std::vector<uint8_t>(bytes));
        for (int m = 0; m < 2; ++m) {
          if (r == 0) {
            for (int64_t i = 0; i < bytes; ++i) msgs[m][i] = byte(m, 0, i);
          } else {
            absl::Status s = g.comms[r]->Recv(msgs[m].data(), bytes, r - 1);
            EXPECT_TRUE(s.ok()) << s;
            for (int64_t i = 0; i < bytes; ++i) {
              // Bytes that came through ranks 1..r-1, each adding its rank.
              if (msgs[m][i] != static_cast<uint8_t>(byte(m, 0, i) + (r - 1) * r / 2)) ++wrong;
            }
            for (uint8_t& b : msgs[m]) b = static_cast<uint8_t>(b + r);
          }
          if (r + 1 < n) {
            absl::Status s = g.comms[r]->Send(msgs[m].data(), bytes, r + 1);
            EXPECT_TRUE(s.ok()) << s;
          }
        }
      });
      EXPECT_EQ(wrong.load(), 0) << n << " ranks, " << bytes << " bytes";
      EXPECT_EQ(g.api->sends.load(), 2 * (n - 1));
      EXPECT_EQ(g.api->recvs.load(), 2 * (n - 1));
    }
  }
}

TEST(NcclCommunicatorTest, EmptyCallsMoveNothingAndBadArgumentsKeepTheGroup) {
  Group g(2);
  float x = 1.0f;
  EXPECT_TRUE(g.comms[0]->AllReduceSum(&x, 0, DType::kF32).ok());
  EXPECT_TRUE(g.comms[0]->AllGather(&x, &x, 0).ok());
  EXPECT_TRUE(g.comms[0]->Send(&x, 0, 1).ok());
  EXPECT_EQ(g.api->all_reduces.load() + g.api->all_gathers.load() + g.api->sends.load(), 0);
  EXPECT_EQ(g.comms[0]->AllReduceSum(&x, 1, DType::kI32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.comms[0]->AllReduceSum(&x, -1, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.comms[0]->Send(&x, 4, 0).code(), absl::StatusCode::kInvalidArgument);  // itself
  EXPECT_EQ(g.comms[0]->Recv(&x, 4, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.comms[1]->AllGather(&x, &x, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(g.group->status().ok()) << g.group->status();
  EXPECT_EQ(g.api->aborts.load(), 0);
}

TEST(NcclCommunicatorTest, RefusesRepeatedGpusAndBadOptions) {
  FakeNcclWorld world;
  auto api = std::make_shared<FakeNccl>(&world, "GPU-fake", 0, 4);
  EXPECT_EQ(MakeNcclGroup(api, {{.device = 0}, {.device = 1}, {.device = 0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeNcclGroup(api, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeNcclGroup(nullptr, {{.device = 0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeNcclGroup(api, {{.device = 0}}, {.timeout = absl::ZeroDuration()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(api->inits.load(), 0);
}

TEST(NcclCommunicatorTest, AsyncCallsEnqueueWithoutWaitingAndLandAtSynchronize) {
  for (int n : {2, 4}) {
    const int64_t count = 1000003;
    Group g(n);
    // Rank r's "compute" event: its stream's collectives run only once it fired.
    std::vector<FakeEvent> computed(n);
    std::vector<std::vector<float>> data(n);
    std::vector<std::vector<float>> gathered(n);
    RunRanks(n, [&](int r) {
      data[r].resize(count);
      for (int64_t i = 0; i < count; ++i) data[r][i] = Exact(r, i);
      gathered[r].assign(2 * n, -1.0f);
      NcclCommunicator& c = *g.comms[r];
      ASSERT_TRUE(g.api->StreamWaitEvent(c.stream(), &computed[r]).ok());
      absl::Status s = c.AllReduceSumAsync(data[r].data(), count, DType::kF32, c.stream());
      EXPECT_TRUE(s.ok()) << s;
      // All-gather the first two reduced elements after the all-reduce, on the same stream.
      s = c.AllGatherAsync(data[r].data(), gathered[r].data(), 2 * sizeof(float), nullptr);
      EXPECT_TRUE(s.ok()) << s;
    });
    // Every call returned with nothing moved: no host wait on a stream.
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(data[r][3], Exact(r, 3));
      EXPECT_EQ(gathered[r][0], -1.0f);
    }
    for (FakeEvent& e : computed) e.fired.Notify();
    RunRanks(n, [&](int r) {
      absl::Status s = g.comms[r]->Synchronize();
      EXPECT_TRUE(s.ok()) << s;
    });
    for (int r = 0; r < n; ++r) {
      for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{6}, count - 1}) {
        float want = 0.0f;
        for (int q = 0; q < n; ++q) want += Exact(q, i);
        ASSERT_EQ(data[r][i], want) << "rank " << r << " element " << i;
        if (i < 2) {
          for (int q = 0; q < n; ++q) ASSERT_EQ(gathered[r][2 * q + i], want);
        }
      }
    }
  }
}

// The CUDA-graph face of the interface (communicator.h) that LlamaModel captures through:
// EnqueueAllReduceSum is the enqueue-only call (nothing moves before the stream runs), and
// EndGraphReplay is where it lands (Synchronize).
TEST(NcclCommunicatorTest, TheGraphCallsEnqueueAndLandAtEndGraphReplay) {
  const int n = 2;
  Group g(n);
  std::vector<FakeEvent> computed(n);
  std::vector<std::vector<float>> data(n, std::vector<float>(7));
  RunRanks(n, [&](int r) {
    Communicator& c = *g.comms[r];
    EXPECT_TRUE(c.SupportsGraphCapture());
    for (int i = 0; i < 7; ++i) data[r][i] = Exact(r, i);
    ASSERT_TRUE(g.api->StreamWaitEvent(g.comms[r]->stream(), &computed[r]).ok());
    EXPECT_TRUE(c.BeginGraphReplay(1).ok());
    EXPECT_TRUE(c.EnqueueAllReduceSum(data[r].data(), 7, DType::kF32).ok());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(data[r][3], Exact(r, 3)) << "it waited for the stream";
  for (FakeEvent& e : computed) e.fired.Notify();
  RunRanks(n, [&](int r) { EXPECT_TRUE(g.comms[r]->EndGraphReplay().ok()); });
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 7; ++i) EXPECT_EQ(data[r][i], Exact(0, i) + Exact(1, i));
  }
}

TEST(NcclCommunicatorTest, BlockingCallsWaitUntilTheirStreamCompletedThem) {
  const int n = 2;
  Group g(n);
  // Each rank's stream first waits for its "compute" event: the collective cannot run before.
  std::vector<FakeEvent> computed(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(g.api->StreamWaitEvent(g.comms[r]->stream(), &computed[r]).ok());
  }
  std::vector<std::vector<float>> data(n, std::vector<float>(7, 2.0f));
  std::atomic<int> returned{0};
  std::thread ranks([&] {
    RunRanks(n, [&](int r) {
      EXPECT_TRUE(g.comms[r]->AllReduceSum(data[r].data(), 7, DType::kF32).ok());
      ++returned;
    });
  });
  while (g.api->all_reduces.load() < n) Clock::Real()->SleepFor(absl::Milliseconds(1));
  // Enqueued on both ranks; a call that returned now would not have waited for its stream.
  Clock::Real()->SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(returned.load(), 0);
  EXPECT_EQ(data[0][0], 2.0f);
  for (FakeEvent& e : computed) e.fired.Notify();
  ranks.join();
  EXPECT_EQ(data[0][6], 4.0f);
  EXPECT_EQ(data[1][0], 4.0f);
}

TEST(NcclCommunicatorTest, CallersStreamsAreUsedAndLeftToTheCaller) {
  FakeNcclWorld world;
  auto api = std::make_shared<FakeNccl>(&world, "GPU-fake", 0, 2);
  std::vector<NcclRank> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].device = r;
    ranks[r].stream = *api->CreateStream(r);
  }
  {
    absl::StatusOr<std::shared_ptr<NcclCommGroup>> g = MakeNcclGroup(api, ranks);
    ASSERT_TRUE(g.ok()) << g.status();
    std::vector<std::unique_ptr<NcclCommunicator>> comms;
    for (int r = 0; r < 2; ++r) comms.push_back((*g)->ForRank(r));
    EXPECT_EQ(comms[1]->stream(), ranks[1].stream);
    EXPECT_EQ(comms[1]->device(), 1);
    std::vector<float> v[2] = {{1.5f}, {2.0f}};
    RunRanks(2,
             [&](int r) { EXPECT_TRUE(comms[r]->AllReduceSum(v[r].data(), 1, DType::kF32).ok()); });
    EXPECT_EQ(v[0][0], 3.5f);
    EXPECT_EQ(v[1][0], 3.5f);
  }
  EXPECT_EQ(api->streams_created.load(), 2);  // the test's own
  EXPECT_EQ(api->streams_destroyed.load(), 0);
  EXPECT_EQ(api->aborts.load(), 2);  // the group's end aborts its idle comms (never waits)
}

TEST(NcclCommunicatorTest, GroupsEndAbortsEveryCommAndDestroysItsStreams) {
  FakeNcclWorld world;
  auto api = std::make_shared<FakeNccl>(&world, "GPU-fake", 0, 4);
  {
    absl::StatusOr<std::shared_ptr<NcclCommGroup>> g =
        MakeNcclGroup(api, {{.device = 0}, {.device = 1}, {.device = 2}, {.device = 3}});
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(api->inits.load(), 4);
    EXPECT_EQ(api->streams_created.load(), 4);
    std::unique_ptr<NcclCommunicator> c = (*g)->ForRank(3);
    g->reset();
    EXPECT_EQ(api->aborts.load(), 0);  // the communicator keeps the group
    EXPECT_EQ(c->size(), 4);
    EXPECT_EQ(c->rank(), 3);
  }
  EXPECT_EQ(api->aborts.load(), 4);
  EXPECT_EQ(api->destroys.load(), 0);
  EXPECT_EQ(api->streams_destroyed.load(), 4);
}

TEST(NcclCommunicatorTest, ARankThatNeverArrivesFailsEveryOtherRankAtTheDeadline) {
  for (int n : {2, 4}) {
    FakeClock clock;
    Group g(n, {.timeout = kTimeout, .clock = &clock});
    const int missing = n - 1;
    std::vector<std::vector<float>> data(n, std::vector<float>(7, 1.0f));
    std::vector<absl::Status> got(n);
    std::atomic<int> returned{0};
    std::thread ranks([&] {
      std::vector<int> present;
      for (int r = 0; r < n; ++r) {
        if (r != missing) present.push_back(r);
      }
      RunRanks(
          n,
          [&](int r) {
            got[r] = g.comms[r]->AllReduceSum(data[r].data(), 7, DType::kF32);
            ++returned;
          },
          present);
    });
    // Once every present rank enqueued (its deadline is set), time passes the deadline.
    while (g.api->all_reduces.load() < n - 1) Clock::Real()->SleepFor(absl::Milliseconds(1));
    AdvanceUntil(clock, [&] { return returned.load() == n - 1; });
    ranks.join();
    for (int r = 0; r < n; ++r) {
      if (r == missing) continue;
      EXPECT_EQ(got[r].code(), absl::StatusCode::kDeadlineExceeded) << "rank " << r << got[r];
      EXPECT_EQ(data[r][0], 1.0f);  // nothing moved
    }
    EXPECT_EQ(g.group->status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(g.api->aborts.load(), n);  // every comm, the missing rank's too
    // The missing rank arrives late: it fails at once, with the same status.
    absl::Status late = g.comms[missing]->AllReduceSum(data[missing].data(), 7, DType::kF32);
    EXPECT_EQ(late, g.group->status());
    EXPECT_EQ(g.api->all_reduces.load(), n - 1);
  }
}

TEST(NcclCommunicatorTest, AbortFromAnotherThreadEndsACollectiveOnEveryRank) {
  for (int n : {2, 4}) {
    Group g(n, {.timeout = absl::Hours(1)});  // only the abort can end the wait
    g.api->hang = true;                       // the GPUs never complete the collective
    std::vector<std::vector<float>> data(n, std::vector<float>(1000003, 1.0f));
    std::vector<absl::Status> got(n);
    std::thread ranks([&] {
      RunRanks(n, [&](int r) {
        got[r] = g.comms[r]->AllReduceSum(data[r].data(), 1000003, DType::kF32);
      });
    });
    while (g.api->all_reduces.load() < n) Clock::Real()->SleepFor(absl::Milliseconds(1));
    std::thread aborter([&] { g.group->Abort(absl::CancelledError("operator stop")); });
    aborter.join();
    ranks.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(got[r], absl::CancelledError("operator stop")) << "rank " << r;
      EXPECT_EQ(data[r][0], 1.0f);
    }
    EXPECT_EQ(g.api->aborts.load(), n);
    // Every later call fails at once with the reason, the blocking and the async ones alike,
    // and a second abort changes nothing.
    g.comms[0]->Abort(absl::InternalError("later"));
    float x = 0.0f;
    EXPECT_EQ(g.comms[0]->AllReduceSum(&x, 1, DType::kF32), absl::CancelledError("operator stop"));
    EXPECT_EQ(g.comms[1]->AllGather(&x, &x, 4), absl::CancelledError("operator stop"));
    EXPECT_EQ(g.comms[1]->Send(&x, 4, 0), absl::CancelledError("operator stop"));
    EXPECT_EQ(g.comms[0]->Recv(&x, 4, 1), absl::CancelledError("operator stop"));
    EXPECT_EQ(g.comms[0]->AllReduceSumAsync(&x, 1, DType::kF32, nullptr),
              absl::CancelledError("operator stop"));
    EXPECT_EQ(g.comms[1]->Synchronize(), absl::CancelledError("operator stop"));
    EXPECT_EQ(g.comms[1]->status(), absl::CancelledError("operator stop"));
    EXPECT_EQ(g.api->aborts.load(), n);
    g.api->hang = false;
  }
}

TEST(NcclCommunicatorTest, AbortEndsARecvWhoseSenderNeverComes) {
  Group g(2, {.timeout = absl::Hours(1)});
  std::vector<uint8_t> buf(7, 0);
  absl::Status got;
  std::thread receiver([&] { got = g.comms[1]->Recv(buf.data(), 7, 0); });
  while (g.api->recvs.load() < 1) Clock::Real()->SleepFor(absl::Milliseconds(1));
  g.comms[0]->Abort(absl::UnavailableError("rank 0's thread failed"));
  receiver.join();
  EXPECT_EQ(got, absl::UnavailableError("rank 0's thread failed"));
  EXPECT_EQ(g.api->aborts.load(), 2);
}

TEST(NcclCommunicatorTest, AHungCommIsAbortedAtTheDeadline) {
  for (int n : {2, 4}) {
    FakeClock clock;
    Group g(n, {.timeout = kTimeout, .clock = &clock});
    g.api->hang = true;
    std::vector<std::vector<uint8_t>> recv(n, std::vector<uint8_t>(7 * n, 0));
    std::vector<absl::Status> got(n);
    std::atomic<int> returned{0};
    std::thread ranks([&] {
      RunRanks(n, [&](int r) {
        const std::vector<uint8_t> send(7, static_cast<uint8_t>(r + 1));
        got[r] = g.comms[r]->AllGather(send.data(), recv[r].data(), 7);
        ++returned;
      });
    });
    while (g.api->all_gathers.load() < n) Clock::Real()->SleepFor(absl::Milliseconds(1));
    AdvanceUntil(clock, [&] { return returned.load() == n; });
    ranks.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(got[r].code(), absl::StatusCode::kDeadlineExceeded) << got[r];
      EXPECT_EQ(recv[r][0], 0);
    }
    EXPECT_EQ(g.api->aborts.load(), n);
    // Un-hanging the GPU moves nothing any more: the comms are gone.
    g.api->hang = false;
    for (int r = 0; r < n; ++r) EXPECT_FALSE(g.comms[r]->Synchronize().ok());
    EXPECT_EQ(recv[0][0], 0);
  }
}

TEST(NcclCommunicatorTest, AnAsyncErrorFailsEveryRanksNextCall) {
  const int n = 4;
  Group g(n);
  // One all-reduce completes on the n ranks of this process, then its comms fail.
  g.api->fail_after_ops = n;
  std::vector<std::vector<float>> data(n, std::vector<float>(7, 1.0f));
  std::vector<absl::Status> first(n), second(n);
  RunRanks(n, [&](int r) {
    first[r] = g.comms[r]->AllReduceSum(data[r].data(), 7, DType::kF32);
    if (first[r].ok()) second[r] = g.comms[r]->AllReduceSum(data[r].data(), 7, DType::kF32);
  });
  for (int r = 0; r < n; ++r) {
    // A rank may see the error as it polls for the first call's completion, or at the second.
    const absl::Status& s = first[r].ok() ? second[r] : first[r];
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << "rank " << r << ": " << s;
    EXPECT_NE(s.message().find("remote process exited"), std::string::npos) << s;
  }
  EXPECT_EQ(g.group->status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(g.api->aborts.load(), n);
}

TEST(NcclCommunicatorTest, AnAsyncCallsHangSurfacesAtSynchronize) {
  const int n = 2;
  FakeClock clock;
  Group g(n, {.timeout = kTimeout, .clock = &clock});
  g.api->hang = true;
  std::vector<std::vector<float>> data(n, std::vector<float>(7, 1.0f));
  std::vector<absl::Status> enqueued(n), synced(n);
  std::atomic<int> enqueues{0}, returned{0};
  absl::Notification all_enqueued;
  std::thread ranks([&] {
    RunRanks(n, [&](int r) {
      enqueued[r] = g.comms[r]->AllReduceSumAsync(data[r].data(), 7, DType::kF32, nullptr);
      ++enqueues;
      all_enqueued.WaitForNotification();
      synced[r] = g.comms[r]->Synchronize();
      ++returned;
    });
  });
  while (enqueues.load() < n) Clock::Real()->SleepFor(absl::Milliseconds(1));
  all_enqueued.Notify();
  AdvanceUntil(clock, [&] { return returned.load() == n; });
  ranks.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(enqueued[r].ok()) << enqueued[r];  // the enqueue itself is fine
    EXPECT_EQ(synced[r].code(), absl::StatusCode::kDeadlineExceeded) << synced[r];
    EXPECT_NE(synced[r].message().find("synchronize"), std::string::npos) << synced[r];
  }
  EXPECT_EQ(g.api->aborts.load(), n);
}

TEST(NcclCommunicatorTest, AnInitThatFailsAbortsEveryCommMade) {
  for (bool async : {false, true}) {
    FakeNcclWorld world;
    auto api = std::make_shared<FakeNccl>(&world, "GPU-fake", 0, 4);
    (async ? api->fail_next_inits_async : api->fail_next_inits) = 1;
    absl::StatusOr<std::shared_ptr<NcclCommGroup>> g =
        MakeNcclGroup(api, {{.device = 0}, {.device = 1}, {.device = 2}, {.device = 3}});
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInternal) << g.status();
    EXPECT_NE(g.status().message().find("rank 0"), std::string::npos) << g.status();
    // At once: the first init failed and no comm was made; async: all four were made.
    EXPECT_EQ(api->inits.load(), async ? 4 : 1);
    EXPECT_EQ(api->aborts.load(), async ? 4 : 0);
    EXPECT_EQ(api->streams_destroyed.load(), api->streams_created.load());
  }
}

TEST(NcclCommunicatorTest, AnInitThatNeverCompletesEndsAtTheDeadline) {
  FakeNcclWorld world;
  auto api = std::make_shared<FakeNccl>(&world, "GPU-fake", 0, 2);
  api->hang_inits = true;
  FakeClock clock;
  std::atomic<bool> done{false};
  absl::Status got;
  std::thread maker([&] {
    got = MakeNcclGroup(api, {{.device = 0}, {.device = 1}}, {.timeout = kTimeout, .clock = &clock})
              .status();
    done = true;
  });
  while (api->inits.load() < 2) Clock::Real()->SleepFor(absl::Milliseconds(1));
  AdvanceUntil(clock, [&] { return done.load(); });
  maker.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
  EXPECT_NE(got.message().find("rank(s) 0, 1"), std::string::npos) << got;
  EXPECT_EQ(api->aborts.load(), 2);
}

}  // namespace
}  // namespace tandem
