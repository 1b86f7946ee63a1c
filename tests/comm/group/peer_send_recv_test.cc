// Send / Recv of the in-process device communicator (comm/group/peer_communicator.h: the
// residual stream between pipeline stages of CUDA ranks) over the host fake of its device API
// (tests/comm/group/fake_peer_api.h):
//   * consecutive micro-batches of awkward sizes (0, 1, 7, 4099, 100003 bytes) arrive in order,
//     each pair on its own FIFO, whether the sender runs ahead of the receiver (Send does not
//     wait for it) or both interleave; the sender may overwrite its buffer once Send returns;
//   * each stream sees the protocol's order: the sender waits for a reused slot's `received`
//     before its copy in and records `sent` after it, the receiver waits for `sent` before its
//     copy out and records `received` after it; a slot is reused once received, an outgrown one
//     gets a new buffer (the old one kept: its copy out may still run), all freed at the end;
//   * a size mismatch, an injected fault in a send or a receive, an abort while a receive waits,
//     a receive nobody sends to, a failed staging allocation or copy: every rank's call ends
//     with a status, none hangs, and the group refuses later calls; bad arguments are refused
//     without aborting.
#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "base/check.h"
#include "comm/group/peer_communicator.h"
#include "gtest/gtest.h"
#include "tests/comm/group/fake_peer_api.h"

namespace tandem {
namespace {

const std::vector<int64_t> kSizes = {0, 1, 7, 4099, 100003};

std::vector<uint8_t> Message(int tag, int64_t bytes) {
  std::mt19937 rng(1000 + tag);
  std::vector<uint8_t> m(bytes);
  for (uint8_t& b : m) b = static_cast<uint8_t>(rng());
  return m;
}

struct Comms {
  std::shared_ptr<FakePeerApi> api = std::make_shared<FakePeerApi>();
  std::shared_ptr<PeerCommGroup> group;
  std::vector<std::unique_ptr<Communicator>> ranks;

  explicit Comms(int size, PeerCommOptions options = {}) {
    group = MakeFakePeerGroup(api, size, options);
    for (int r = 0; r < size; ++r) ranks.push_back(group->ForRank(r));
  }
};

TEST(PeerSendRecvTest, ASenderRunsAheadAndMessagesArriveInOrder) {
  // TP 2 x PP 2's world group: rank r of stage 0 (rank r) sends to rank r of stage 1 (2 + r).
  Comms c(4);
  for (int r = 0; r < 2; ++r) {
    std::vector<uint8_t> buffer;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      buffer = Message(10 * r + k, kSizes[k]);
      ASSERT_TRUE(c.ranks[r]->Send(buffer.data(), kSizes[k], 2 + r).ok()) << k;
      std::fill(buffer.begin(), buffer.end(), 0);  // Send copied it out: free to overwrite
    }
  }
  for (int r = 0; r < 2; ++r) {
    for (size_t k = 0; k < kSizes.size(); ++k) {
      std::vector<uint8_t> got(kSizes[k], 0x55);
      ASSERT_TRUE(c.ranks[2 + r]->Recv(got.data(), kSizes[k], r).ok()) << k;
      EXPECT_EQ(got, Message(10 * r + k, kSizes[k])) << "rank " << 2 + r << " message " << k;
    }
  }
  // Five messages in flight at once on each pair: five slots each (the empty one has no buffer).
  EXPECT_EQ(c.api->allocations(), 2 * 4);
  EXPECT_TRUE(c.group->status().ok());
}

TEST(PeerSendRecvTest, InterleavedMicroBatchesOnEveryPairStayInOrder) {
  // A three-stage chain 0 -> 1 -> 2, 60 micro-batches of random sizes, each stage's thread
  // receiving, checking and forwarding while the others run.
  Comms c(3);
  const int kBatches = 60;
  std::vector<int64_t> sizes;
  std::mt19937 rng(3);
  for (int k = 0; k < kBatches; ++k) sizes.push_back(kSizes[rng() % kSizes.size()] + rng() % 3);
  std::vector<int> bad(3, 0);
  std::vector<std::thread> stages;
  for (int s = 0; s < 3; ++s) {
    stages.emplace_back([&, s] {
      for (int k = 0; k < kBatches; ++k) {
        std::vector<uint8_t> m(sizes[k]);
        if (s == 0) {
          m = Message(k, sizes[k]);
        } else {
          CHECK_OK(c.ranks[s]->Recv(m.data(), sizes[k], s - 1));
          if (m != Message(k, sizes[k])) ++bad[s];
        }
        if (s < 2) CHECK_OK(c.ranks[s]->Send(m.data(), sizes[k], s + 1));
      }
    });
  }
  for (std::thread& t : stages) t.join();
  EXPECT_EQ(bad, std::vector<int>(3, 0));
  EXPECT_TRUE(c.group->status().ok());
}

TEST(PeerSendRecvTest, EachStreamOrdersItsCopiesByTheSlotsEvents) {
  Comms c(2);
  // The group makes no events of its own (its collectives use device barriers): the first
  // slot's are 0 (sent, on the sender's device) and 1 (received), a second slot's 2 and 3.
  std::vector<uint8_t> a = Message(1, 100), b = Message(2, 100), got(100);
  ASSERT_TRUE(c.ranks[0]->Send(a.data(), 100, 1).ok());
  ASSERT_TRUE(c.ranks[1]->Recv(got.data(), 100, 0).ok());
  ASSERT_TRUE(c.ranks[0]->Send(b.data(), 100, 1).ok());  // reuses slot 0
  ASSERT_TRUE(c.ranks[0]->Send(a.data(), 100, 1).ok());  // slot 0 is queued: slot 1
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(c.ranks[1]->Recv(got.data(), 100, 0).ok());
  EXPECT_EQ(got, a);
  EXPECT_EQ(c.api->LogOf(0), (std::vector<std::string>{"copy 100", "record 0", "wait 1", "copy 100",
                                                       "record 0", "copy 100", "record 2"}));
  EXPECT_EQ(c.api->LogOf(1),
            (std::vector<std::string>{"wait 0", "copy 100", "record 1", "wait 0", "copy 100",
                                      "record 1", "wait 2", "copy 100", "record 3"}));
  EXPECT_EQ(c.api->NumEvents(), 4);
  EXPECT_EQ(c.api->allocations(), 2);
}

TEST(PeerSendRecvTest, AnOutgrownSlotGetsANewBufferAndTheGroupFreesAllAtItsEnd) {
  Comms c(2);
  std::vector<uint8_t> small = Message(1, 10), big = Message(2, 50000), got(50000);
  ASSERT_TRUE(c.ranks[0]->Send(small.data(), 10, 1).ok());
  ASSERT_TRUE(c.ranks[1]->Recv(got.data(), 10, 0).ok());
  // The slot's 4 KiB are too small: a 64 KiB buffer; the old one may still be read by the
  // receiver's copy on the device, so it stays allocated.
  ASSERT_TRUE(c.ranks[0]->Send(big.data(), 50000, 1).ok());
  ASSERT_TRUE(c.ranks[1]->Recv(got.data(), 50000, 0).ok());
  EXPECT_EQ(got, big);
  ASSERT_TRUE(c.ranks[0]->Send(small.data(), 10, 1).ok());  // fits: no allocation
  ASSERT_TRUE(c.ranks[1]->Recv(got.data(), 10, 0).ok());
  EXPECT_TRUE(std::equal(small.begin(), small.end(), got.begin()));
  EXPECT_EQ(c.api->allocations(), 2);
  EXPECT_EQ(c.api->live_allocations(), 2);
  std::shared_ptr<FakePeerApi> api = c.api;
  c.ranks.clear();
  c.group.reset();
  EXPECT_EQ(api->live_allocations(), 0);
}

// `fail` makes the group fail; every later call on every rank returns `code` at once.
void ExpectRefusedAfter(Comms& c, absl::StatusCode code) {
  EXPECT_EQ(c.group->status().code(), code) << c.group->status();
  std::vector<uint8_t> m(8);
  for (int r = 0; r < static_cast<int>(c.ranks.size()); ++r) {
    const int peer = (r + 1) % static_cast<int>(c.ranks.size());
    EXPECT_EQ(c.ranks[r]->Send(m.data(), 8, peer).code(), code) << "rank " << r;
    EXPECT_EQ(c.ranks[r]->Recv(m.data(), 8, peer).code(), code) << "rank " << r;
  }
}

TEST(PeerSendRecvTest, ASizeMismatchFailsTheGroup) {
  Comms c(2);
  std::vector<uint8_t> m = Message(1, 64);
  ASSERT_TRUE(c.ranks[0]->Send(m.data(), 64, 1).ok());
  const absl::Status s = c.ranks[1]->Recv(m.data(), 32, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("expected 32 bytes from rank 0, got 64"), std::string::npos) << s;
  ExpectRefusedAfter(c, absl::StatusCode::kInvalidArgument);
}

TEST(PeerSendRecvTest, AnInjectedFaultInASendWakesItsWaitingReceiver) {
  Comms c(2);
  c.group->InjectFault(0, 2, absl::UnavailableError("stage 0 died (injected)"));
  absl::Status received;
  std::thread receiver([&] {
    std::vector<uint8_t> m(16);
    for (int k = 0; k < 3 && received.ok(); ++k) received = c.ranks[1]->Recv(m.data(), 16, 0);
  });
  std::vector<uint8_t> m = Message(1, 16);
  absl::Status sent;
  for (int k = 0; k < 3 && sent.ok(); ++k) sent = c.ranks[0]->Send(m.data(), 16, 1);
  receiver.join();
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.code(), absl::StatusCode::kUnavailable) << received;
  EXPECT_NE(received.message().find("rank 0 in send: stage 0 died"), std::string::npos) << received;
  ExpectRefusedAfter(c, absl::StatusCode::kUnavailable);
}

TEST(PeerSendRecvTest, AnInjectedFaultInAReceiveFailsTheGroup) {
  Comms c(2);
  c.group->InjectFault(1, 0, absl::InternalError("stage 1 lost its device (injected)"));
  std::vector<uint8_t> m(4);
  ASSERT_TRUE(c.ranks[0]->Send(m.data(), 4, 1).ok());
  EXPECT_EQ(c.ranks[1]->Recv(m.data(), 4, 0).code(), absl::StatusCode::kInternal);
  ExpectRefusedAfter(c, absl::StatusCode::kInternal);
}

TEST(PeerSendRecvTest, AnAbortWakesAWaitingReceiveAndNoSenderIsADeadline) {
  Comms c(3);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> waiting;
  for (int r = 1; r < 3; ++r) {
    waiting.emplace_back([&, r] {
      std::vector<uint8_t> m(8);
      results[r - 1] = c.ranks[r]->Recv(m.data(), 8, 0);
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  c.ranks[0]->Abort(absl::CancelledError("engine stopping"));
  for (std::thread& t : waiting) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const absl::Status& s : results) EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  ExpectRefusedAfter(c, absl::StatusCode::kCancelled);

  Comms lonely(2, PeerCommOptions{.timeout = absl::Milliseconds(200)});
  std::vector<uint8_t> m(8);
  const absl::Status s = lonely.ranks[1]->Recv(m.data(), 8, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("for a message from rank 0"), std::string::npos) << s;
  ExpectRefusedAfter(lonely, absl::StatusCode::kDeadlineExceeded);
}

TEST(PeerSendRecvTest, DeviceErrorsFailTheGroup) {
  Comms full(2);
  full.api->set_fail_allocate(true);
  std::vector<uint8_t> m(8);
  EXPECT_EQ(full.ranks[0]->Send(m.data(), 8, 1).code(), absl::StatusCode::kResourceExhausted);
  ExpectRefusedAfter(full, absl::StatusCode::kResourceExhausted);

  Comms broken(2);
  broken.api->FailCopyOn(1);
  ASSERT_TRUE(broken.ranks[0]->Send(m.data(), 8, 1).ok());
  const absl::Status s = broken.ranks[1]->Recv(m.data(), 8, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("rank 1 of 2 in recv: fake copy failure"), std::string::npos) << s;
  ExpectRefusedAfter(broken, absl::StatusCode::kInternal);
}

TEST(PeerSendRecvTest, BadArgumentsAreRefusedWithoutAborting) {
  Comms c(2);
  std::vector<uint8_t> m(8);
  EXPECT_EQ(c.ranks[0]->Send(m.data(), 8, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ranks[0]->Send(m.data(), 8, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ranks[0]->Send(m.data(), -1, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ranks[1]->Recv(m.data(), 8, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.group->status().ok());
  ASSERT_TRUE(c.ranks[0]->Send(m.data(), 8, 1).ok());
  EXPECT_TRUE(c.ranks[1]->Recv(m.data(), 8, 0).ok());
}

}  // namespace
}  // namespace tandem
