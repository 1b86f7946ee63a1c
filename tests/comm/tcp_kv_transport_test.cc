// The host KV transport over loopback TCP: a correct transfer lands every byte in the right
// pages, and every failure (sender dies, aborts, goes silent; receiver cancels, dies, never
// hears from a sender; mismatched layouts) ends in a terminal status on both sides, quickly,
// with no byte written after a cancel or the deadline.
//
// The receiver runs on a FakeClock: its transfer deadlines pass exactly when a test advances
// time, and never otherwise. The sender's deadlines bound socket I/O and are real time.
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/cluster_token.h"
#include "base/secure_random.h"
#include "comm/kv_wire.h"
#include "comm/socket_io.h"
#include "comm/tcp_kv_receiver.h"
#include "comm/tcp_kv_sender.h"
#include "gtest/gtest.h"
#include "tests/base/fake_clock.h"

namespace tandem {
namespace {

KvLayout MakeLayout(int num_pages) {
  KvLayout l;
  l.num_layers = 3;
  l.num_pages = num_pages;
  l.page_size = 4;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.dtype = DType::kBF16;
  return l;
}

// Collects done() callbacks.
struct Outcomes {
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::Status>> done ABSL_GUARDED_BY(mu);
  KvTransferStats last_stats ABSL_GUARDED_BY(mu);

  KvReceiver::DoneCallback Callback() {
    return [this](const std::string& id, absl::Status st, KvTransferStats stats) {
      absl::MutexLock l(&mu);
      done.emplace_back(id, st);
      last_stats = stats;
    };
  }
  // Waits for the n-th outcome; returns it (or a sentinel after `timeout`).
  absl::Status WaitFor(size_t n, absl::Duration timeout = absl::Seconds(5)) {
    absl::MutexLock l(&mu);
    auto has = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return done.size() >= n; };
    if (!mu.AwaitWithTimeout(absl::Condition(&has), timeout)) {
      return absl::UnknownError("no outcome");
    }
    return done[n - 1].second;
  }
  size_t Count() {
    absl::MutexLock l(&mu);
    return done.size();
  }
};

class TcpKvTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_layout_ = MakeLayout(8);
    dst_layout_ = MakeLayout(16);
    src_pool_.resize(src_layout_.PoolBytes());
    std::mt19937 rng(7);
    for (auto& b : src_pool_) b = static_cast<char>(rng());
    dst_pool_.assign(dst_layout_.PoolBytes(), 0);
    auto r = TcpKvReceiver::Create("127.0.0.1", 0, dst_pool_.data(), dst_layout_,
                                   outcomes_.Callback(), &clock_);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }

  bool PageEquals(int layer, int src_page, int dst_page) const {
    const int64_t bytes = src_layout_.PageBytes();
    return std::memcmp(src_pool_.data() + src_layout_.PageOffset(layer, src_page) * 2,
                       dst_pool_.data() + dst_layout_.PageOffset(layer, dst_page) * 2, bytes) == 0;
  }
  bool DstAllZero() const {
    for (char c : dst_pool_) {
      if (c != 0) return false;
    }
    return true;
  }

  testing::FakeClock clock_;  // first: outlives the receiver
  KvLayout src_layout_, dst_layout_;
  std::vector<char> src_pool_, dst_pool_;
  Outcomes outcomes_;
  std::unique_ptr<TcpKvReceiver> receiver_;
  TcpKvSender sender_;
};

TEST_F(TcpKvTransportTest, PagesLandInReservedPagesLayerByLayer) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2, 9, 11}, clock_.Now() + absl::Seconds(5)).ok());
  const std::vector<int32_t> src = {1, 3, 0};  // 3 prompt pages; decode reserved one extra
  auto op = sender_.Begin(receiver_->address(), "r1", src_layout_, 3, absl::Seconds(5));
  ASSERT_TRUE(op.ok()) << op.status();
  for (int layer = 0; layer < 3; ++layer) {
    // Split each layer into two ranges, last range first: order must not matter.
    ASSERT_TRUE((*op)->SendLayer(layer, src_pool_.data(), {src.data() + 1, 2}, 1).ok());
    ASSERT_TRUE((*op)->SendLayer(layer, src_pool_.data(), {src.data(), 1}, 0).ok());
    clock_.Advance(absl::Milliseconds(40));
  }
  auto stats = (*op)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->bytes, 3 * 3 * src_layout_.PageBytes());
  ASSERT_TRUE(outcomes_.WaitFor(1).ok());
  {
    absl::MutexLock l(&outcomes_.mu);
    EXPECT_EQ(outcomes_.last_stats.bytes, 3 * 3 * src_layout_.PageBytes());
    EXPECT_EQ(outcomes_.last_stats.pages, 9);
    // From the sender's hello to its last page, on the receiver's clock.
    EXPECT_EQ(outcomes_.last_stats.duration, absl::Milliseconds(120));
  }
  const int dst[] = {5, 2, 9};
  for (int layer = 0; layer < 3; ++layer) {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(PageEquals(layer, src[i], dst[i])) << layer << i;
  }
  EXPECT_EQ(receiver_->NumPending(), 0);
}

TEST_F(TcpKvTransportTest, MissingPagesAreDataLossOnBothSides) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  const std::vector<int32_t> src = {1, 3};
  auto op = sender_.Begin(receiver_->address(), "r1", src_layout_, 2, absl::Seconds(5));
  ASSERT_TRUE(op.ok());
  ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), src, 0).ok());  // layers 1, 2 missing
  EXPECT_EQ((*op)->Finish().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(outcomes_.WaitFor(1).code(), absl::StatusCode::kDataLoss);
}

TEST_F(TcpKvTransportTest, SenderAbortIsReportedWithItsReason) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  auto op = sender_.Begin(receiver_->address(), "r1", src_layout_, 2, absl::Seconds(5));
  ASSERT_TRUE(op.ok());
  (*op)->Abort("prefill cancelled");
  absl::Status st = outcomes_.WaitFor(1);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_NE(st.message().find("prefill cancelled"), std::string::npos);
}

TEST_F(TcpKvTransportTest, SenderDroppedMidTransferAborts) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  const std::vector<int32_t> src = {1, 3};
  {
    auto op = sender_.Begin(receiver_->address(), "r1", src_layout_, 2, absl::Seconds(5));
    ASSERT_TRUE(op.ok());
    ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), src, 0).ok());
  }  // destroyed without Finish
  EXPECT_EQ(outcomes_.WaitFor(1).code(), absl::StatusCode::kAborted);
}

TEST_F(TcpKvTransportTest, SenderProcessDeathIsUnavailable) {
  // A raw connection that sends a valid hello and half a page, then vanishes (no abort frame),
  // as a killed prefill process would.
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  {
    auto s = Connect(receiver_->address(), deadline);
    ASSERT_TRUE(s.ok());
    kv_wire::Hello hello;
    hello.layout = src_layout_;
    hello.num_pages = 2;
    hello.transfer_id = "r1";
    hello.group = KvGroupShape::Single(src_layout_);
    ASSERT_TRUE(
        kv_wire::WriteFrame(*s, kv_wire::FrameType::kHello, kv_wire::EncodeHello(hello), deadline)
            .ok());
    ASSERT_TRUE(kv_wire::ReadFrame(*s, deadline).ok());
    ASSERT_TRUE(kv_wire::WriteFrame(*s, kv_wire::FrameType::kPages,
                                    kv_wire::EncodePagesHeader({0, 0, 1}), deadline)
                    .ok());
    ASSERT_TRUE(WriteAll(*s, src_pool_.data(), 16, deadline).ok());
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(outcomes_.WaitFor(1).code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST_F(TcpKvTransportTest, TransferThatNeverStartsHitsItsDeadline) {
  const absl::Time deadline = clock_.Now() + absl::Milliseconds(150);
  ASSERT_TRUE(receiver_->Expect("r2", {7}, clock_.Now() + absl::Seconds(5)).ok());
  ASSERT_TRUE(receiver_->Expect("r1", {5}, deadline).ok());
  // The reaper sleeps until exactly the earliest deadline, and not a moment less.
  ASSERT_TRUE(clock_.AwaitWaiterUntil(deadline));
  clock_.Advance(absl::Milliseconds(149));
  EXPECT_TRUE(clock_.AwaitWaiterUntil(deadline));
  EXPECT_EQ(outcomes_.Count(), 0u);
  EXPECT_EQ(receiver_->NumPending(), 2);
  clock_.Advance(absl::Milliseconds(1));
  absl::Status st = outcomes_.WaitFor(1);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("r1 never started"), std::string::npos) << st;
  // Then it sleeps until the next one.
  ASSERT_TRUE(clock_.AwaitWaiterUntil(clock_.Now() + absl::Milliseconds(4850)));
  EXPECT_EQ(receiver_->NumPending(), 1);
  EXPECT_TRUE(receiver_->Cancel("r2"));
}

TEST_F(TcpKvTransportTest, TransferThatStallsHitsItsDeadlineAndNothingLandsAfterIt) {
  const absl::Time deadline = clock_.Now() + absl::Milliseconds(300);
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, deadline).ok());
  const std::vector<int32_t> src = {1, 3};
  auto op = sender_.Begin(receiver_->address(), "r1", src_layout_, 2, absl::Seconds(5));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), src, 0).ok());
  clock_.Advance(absl::Milliseconds(299));  // the sender goes quiet
  EXPECT_TRUE(clock_.AwaitWaiterUntil(deadline));
  EXPECT_EQ(outcomes_.Count(), 0u);
  clock_.Advance(absl::Milliseconds(1));
  absl::Status st = outcomes_.WaitFor(1);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("r1 did not finish"), std::string::npos) << st;
  EXPECT_EQ(receiver_->NumPending(), 0);
  // The sender wakes up and carries on: it learns the transfer is over, and none of it lands
  // (layer 0 may or may not have landed before the deadline).
  absl::Status sent;
  for (int layer = 1; layer < 3 && sent.ok(); ++layer) {
    sent = (*op)->SendLayer(layer, src_pool_.data(), src, 0);
  }
  if (sent.ok()) sent = (*op)->Finish().status();
  EXPECT_EQ(sent.code(), absl::StatusCode::kCancelled) << sent;
  std::vector<char> zero(static_cast<size_t>(dst_layout_.PageBytes()), 0);
  for (int layer = 1; layer < 3; ++layer) {
    for (int page : {5, 2}) {
      EXPECT_EQ(std::memcmp(dst_pool_.data() + dst_layout_.PageOffset(layer, page) * 2, zero.data(),
                            zero.size()),
                0)
          << "layer " << layer << " page " << page;
    }
  }
}

TEST_F(TcpKvTransportTest, CancelStopsWritesAndSuppressesTheCallback) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  const std::vector<int32_t> src = {1, 3};
  auto op = sender_.Begin(receiver_->address(), "r1", src_layout_, 2, absl::Seconds(5));
  ASSERT_TRUE(op.ok());
  ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), src, 0).ok());
  EXPECT_TRUE(receiver_->Cancel("r1"));
  EXPECT_FALSE(receiver_->Cancel("r1"));
  std::fill(dst_pool_.begin(), dst_pool_.end(), 0);  // the pages may be reused now
  // The sender keeps going; nothing may land, and it must learn it was cancelled.
  absl::Status st;
  for (int layer = 1; layer < 3 && st.ok(); ++layer) {
    st = (*op)->SendLayer(layer, src_pool_.data(), src, 0);
  }
  if (st.ok()) st = (*op)->Finish().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_TRUE(DstAllZero());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(outcomes_.Count(), 0u);
}

TEST_F(TcpKvTransportTest, HandshakeRefusals) {
  EXPECT_EQ(sender_.Begin(receiver_->address(), "nobody", src_layout_, 1, absl::Seconds(2))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(
      sender_.Begin(receiver_->address(), "r1", src_layout_, 3, absl::Seconds(2)).status().code(),
      absl::StatusCode::kFailedPrecondition);  // more pages than reserved
  EXPECT_EQ(outcomes_.WaitFor(1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(receiver_->Expect("r2", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  KvLayout other = src_layout_;
  other.head_dim = 16;
  EXPECT_EQ(sender_.Begin(receiver_->address(), "r2", other, 2, absl::Seconds(2)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(outcomes_.WaitFor(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(receiver_->Expect("r3", {99}, clock_.Now()).code(), absl::StatusCode::kInvalidArgument);
  // An fp8 group (--kv-cache-dtype fp8) and a bf16 one: same shape, different page bytes.
  ASSERT_TRUE(receiver_->Expect("r4", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  KvLayout fp8 = src_layout_;
  fp8.dtype = DType::kF8E4M3;
  const absl::Status refused =
      sender_.Begin(receiver_->address(), "r4", fp8, 2, absl::Seconds(2)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("F8_E4M3"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("BF16"), std::string::npos) << refused;
  EXPECT_EQ(outcomes_.WaitFor(3).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(TcpKvTransportTest, SilentReceiverTimesOutTheSender) {
  auto listener = Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  const std::string address = "127.0.0.1:" + std::to_string(*LocalPort(*listener));
  const absl::Time start = absl::Now();
  // Connects (the kernel accepts into the backlog) but nobody ever answers the hello.
  EXPECT_EQ(sender_.Begin(address, "r1", src_layout_, 1, absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

// A peer that takes the connection and reads the hello, then goes silent as a frozen
// (SIGSTOPped) decode worker does: it never answers the hello, or answers it and reads nothing
// more (the socket buffers fill and the sender's writes block), or reads every byte and never
// answers Finish.
class SilentPeer {
 public:
  enum class Mode { kNoHelloAnswer, kStopReading, kDrainNoVerdict };
  explicit SilentPeer(Mode mode) {
    auto listener = Listen("127.0.0.1", 0);
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (!listener.ok()) return;
    address_ = "127.0.0.1:" + std::to_string(*LocalPort(*listener));
    thread_ = std::thread([this, mode, l = std::move(*listener)]() mutable {
      auto s = Accept(l, absl::Now() + absl::Seconds(10));
      if (!s.ok()) return;
      if (!kv_wire::ReadFrame(*s, absl::Now() + absl::Seconds(10)).ok()) return;
      if (mode != Mode::kNoHelloAnswer) {
        (void)kv_wire::WriteFrame(*s, kv_wire::FrameType::kStatus,
                                  kv_wire::EncodeStatus(absl::OkStatus()),
                                  absl::Now() + absl::Seconds(1));
      }
      if (mode == Mode::kDrainNoVerdict) {
        char byte;  // until the sender closes
        while (ReadAll(*s, &byte, 1, absl::Now() + absl::Seconds(10)).ok()) {
        }
        return;
      }
      release_.WaitForNotificationWithTimeout(absl::Seconds(20));
    });
  }
  ~SilentPeer() {
    release_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  absl::Notification release_;
  std::thread thread_;
};

// Sets a cancel flag after `after` (from another thread, as the worker's loop thread does when
// the router aborts the request) and records when.
class DelayedCancel {
 public:
  explicit DelayedCancel(absl::Duration after) {
    thread_ = std::thread([this, after] {
      absl::SleepFor(after);
      set_at_ = absl::Now();
      flag_.store(true);
    });
  }
  ~DelayedCancel() { Join(); }
  std::function<bool()> Check() {
    return [this] { return flag_.load(); };
  }
  // Waits for the flag to be set; returns the time since it was.
  absl::Duration SinceSet() {
    Join();
    return absl::Now() - set_at_;
  }

 private:
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  std::atomic<bool> flag_{false};
  absl::Time set_at_;
  std::thread thread_;
};

// Each wait a transfer to a frozen receiver can block in — the handshake's answer, a send the
// receiver does not drain, Finish's acknowledgment — ends within milliseconds of the cancel
// check turning true, with Cancelled, although the transfer's timeout is 30 s.
TEST_F(TcpKvTransportTest, CancelCheckEndsEveryWaitOnAFrozenReceiverAtOnce) {
  constexpr absl::Duration kTimeout = absl::Seconds(30);
  constexpr absl::Duration kPrompt = absl::Milliseconds(500);  // cancel to return, at most
  {
    SilentPeer peer(SilentPeer::Mode::kNoHelloAnswer);
    DelayedCancel cancel(absl::Milliseconds(100));
    auto op = sender_.Begin(peer.address(), "r1", src_layout_, 2, kTimeout, cancel.Check());
    EXPECT_EQ(op.status().code(), absl::StatusCode::kCancelled) << op.status();
    EXPECT_LT(cancel.SinceSet(), kPrompt);
  }
  {
    // Pages of 1 MiB, 48 of them in one SendLayer: more than loopback's socket buffers hold.
    KvLayout big = src_layout_;
    big.num_layers = 1;
    big.page_size = 256;
    big.num_kv_heads = 8;
    big.head_dim = 128;
    big.num_pages = 48;
    ASSERT_EQ(big.PageBytes(), 1 << 20);
    std::vector<char> pool(static_cast<size_t>(big.PoolBytes()), 1);
    std::vector<int32_t> pages(48);
    for (int i = 0; i < 48; ++i) pages[i] = i;
    SilentPeer peer(SilentPeer::Mode::kStopReading);
    DelayedCancel cancel(absl::Milliseconds(200));
    auto op = sender_.Begin(peer.address(), "r1", big, 48, kTimeout, cancel.Check());
    ASSERT_TRUE(op.ok()) << op.status();
    const absl::Status st = (*op)->SendLayer(0, pool.data(), pages, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
    EXPECT_LT(cancel.SinceSet(), kPrompt);
    // The op is over: nothing more goes out, and dropping it does not block.
    EXPECT_EQ((*op)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    SilentPeer peer(SilentPeer::Mode::kDrainNoVerdict);
    DelayedCancel cancel(absl::Milliseconds(100));
    auto op = sender_.Begin(peer.address(), "r1", src_layout_, 2, kTimeout, cancel.Check());
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<int32_t> src = {1, 3};
    for (int layer = 0; layer < 3; ++layer) {
      ASSERT_TRUE((*op)->SendLayer(layer, src_pool_.data(), src, 0).ok());
    }
    EXPECT_EQ((*op)->Finish().status().code(), absl::StatusCode::kCancelled);
    EXPECT_LT(cancel.SinceSet(), kPrompt);
  }
  // A check that is already true ends Begin before it connects.
  std::atomic<bool> given_up{true};
  auto listener = Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  EXPECT_EQ(sender_
                .Begin("127.0.0.1:" + std::to_string(*LocalPort(*listener)), "r1", src_layout_, 2,
                       kTimeout, [&given_up] { return given_up.load(); })
                .status()
                .code(),
            absl::StatusCode::kCancelled);
}

TEST_F(TcpKvTransportTest, ReceiverDeathFailsTheSender) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  const std::vector<int32_t> src = {1, 3};
  auto op = sender_.Begin(receiver_->address(), "r1", src_layout_, 2, absl::Seconds(5));
  ASSERT_TRUE(op.ok());
  receiver_.reset();
  absl::Status st;
  for (int layer = 0; layer < 3 && st.ok(); ++layer) {
    st = (*op)->SendLayer(layer, src_pool_.data(), src, 0);
  }
  if (st.ok()) st = (*op)->Finish().status();
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(outcomes_.Count(), 0u);  // dropped silently on destruction
  EXPECT_EQ(sender_.Begin("127.0.0.1:1", "r1", src_layout_, 2, absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TcpKvTransportTest, ManyConcurrentTransfers) {
  constexpr int kN = 16;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kN; ++i) {
    const std::string id = "r" + std::to_string(i);
    ASSERT_TRUE(receiver_->Expect(id, {i}, clock_.Now() + absl::Seconds(10)).ok());
    threads.emplace_back([&, id, i] {
      const std::vector<int32_t> src = {i % 8};
      auto op = sender_.Begin(receiver_->address(), id, src_layout_, 1, absl::Seconds(10));
      if (!op.ok()) return;
      for (int layer = 0; layer < 3; ++layer) {
        if (!(*op)->SendLayer(layer, src_pool_.data(), src, 0).ok()) return;
      }
      if ((*op)->Finish().ok()) ok++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kN);
  ASSERT_TRUE(outcomes_.WaitFor(kN).ok());
  for (int i = 0; i < kN; ++i) {
    for (int layer = 0; layer < 3; ++layer) EXPECT_TRUE(PageEquals(layer, i % 8, i));
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// A pool that is not host memory (the CUDA backend's): every page goes through the pool copies
// on both sides — counted here — and lands as with memcpy; a failing copy fails the transfer on
// both sides instead of landing a page.
TEST(TcpKvPoolCopyTest, PagesGoThroughThePoolCopiesOnBothSides) {
  const KvLayout src_layout = MakeLayout(4), dst_layout = MakeLayout(6);
  std::vector<char> src_pool(src_layout.PoolBytes()), dst_pool(dst_layout.PoolBytes(), 0);
  std::mt19937 rng(3);
  for (auto& b : src_pool) b = static_cast<char>(rng());
  std::atomic<int> reads{0}, writes{0};
  std::atomic<bool> fail_writes{false};
  KvPoolCopy read = [&](void* dst, const void* src, int64_t n) {
    ++reads;
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  };
  KvPoolCopy write = [&](void* dst, const void* src, int64_t n) {
    ++writes;
    if (fail_writes) return absl::InternalError("device copy failed");
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  };
  Outcomes outcomes;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_pool.data(), dst_layout,
                                        outcomes.Callback(), Clock::Real(), write);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  TcpKvSender sender(read);
  const absl::Time deadline = Clock::Real()->Now() + absl::Seconds(5);
  ASSERT_TRUE((*receiver)->Expect("ok", {4, 1}, deadline).ok());
  auto op = sender.Begin((*receiver)->address(), "ok", src_layout, 2, absl::Seconds(5));
  ASSERT_TRUE(op.ok()) << op.status();
  const std::vector<int32_t> src = {3, 0};
  for (int layer = 0; layer < src_layout.num_layers; ++layer) {
    ASSERT_TRUE((*op)->SendLayer(layer, src_pool.data(), src, 0).ok());
  }
  ASSERT_TRUE((*op)->Finish().ok());
  ASSERT_TRUE(outcomes.WaitFor(1).ok());
  EXPECT_EQ(reads, 2 * src_layout.num_layers);
  EXPECT_EQ(writes, 2 * src_layout.num_layers);
  const int dst[] = {4, 1};
  for (int layer = 0; layer < src_layout.num_layers; ++layer) {
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(std::memcmp(src_pool.data() + src_layout.PageOffset(layer, src[i]) * 2,
                            dst_pool.data() + dst_layout.PageOffset(layer, dst[i]) * 2,
                            src_layout.PageBytes()),
                0)
          << layer << " " << i;
    }
  }
  // A copy into the pool that fails: the transfer fails on both sides.
  fail_writes = true;
  ASSERT_TRUE((*receiver)->Expect("bad", {2}, deadline).ok());
  auto bad = sender.Begin((*receiver)->address(), "bad", src_layout, 1, absl::Seconds(5));
  ASSERT_TRUE(bad.ok()) << bad.status();
  absl::Status st = (*bad)->SendLayer(0, src_pool.data(), std::vector<int32_t>{1}, 0);
  for (int layer = 1; st.ok() && layer < src_layout.num_layers; ++layer) {
    st = (*bad)->SendLayer(layer, src_pool.data(), std::vector<int32_t>{1}, 0);
  }
  if (st.ok()) st = (*bad)->Finish().status();
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(outcomes.WaitFor(2).ok());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Finding 1 of [hardening]: with a cluster token set, a sender without it (or with another, or
// with another layout too) is refused at the handshake before the transfer is looked up: the
// transfer stays pending, no byte lands, no outcome is reported; the right token then works.
TEST_F(TcpKvTransportTest, HandshakeWithoutTheClusterTokenIsRefusedWithNoEffect) {
  const std::string token = "kv-test-cluster-token-0123";
  auto r = TcpKvReceiver::Create("127.0.0.1", 0, dst_pool_.data(), dst_layout_,
                                 outcomes_.Callback(), &clock_, {}, token);
  ASSERT_TRUE(r.ok()) << r.status();
  std::unique_ptr<TcpKvReceiver> receiver = *std::move(r);
  ASSERT_TRUE(receiver->Expect("r1", {5, 2}, clock_.Now() + absl::Seconds(5)).ok());
  KvLayout other = src_layout_;
  other.head_dim = 16;  // a mismatch that would fail the transfer if it were looked at
  for (const std::string& wrong :
       {std::string(), std::string("kv-test-cluster-token-0124"), std::string("short")}) {
    for (const KvLayout& layout : {src_layout_, other}) {
      TcpKvSender intruder({}, wrong);
      auto op = intruder.Begin(receiver->address(), "r1", layout, 2, absl::Seconds(5));
      EXPECT_EQ(op.status().code(), absl::StatusCode::kUnauthenticated) << op.status();
    }
  }
  EXPECT_EQ(receiver->NumPending(), 1);
  EXPECT_EQ(outcomes_.Count(), 0u);
  EXPECT_TRUE(DstAllZero());
  TcpKvSender sender({}, token);
  const std::vector<int32_t> src = {1, 3};
  auto op = sender.Begin(receiver->address(), "r1", src_layout_, 2, absl::Seconds(5));
  ASSERT_TRUE(op.ok()) << op.status();
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_TRUE((*op)->SendLayer(layer, src_pool_.data(), src, 0).ok());
  }
  ASSERT_TRUE((*op)->Finish().ok());
  EXPECT_TRUE(outcomes_.WaitFor(1).ok());
  EXPECT_TRUE(PageEquals(2, 3, 2));
}

TEST(ClusterTokenTest, MatchesOnlyTheExactToken) {
  EXPECT_TRUE(TokenMatches("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", "0123456789abcdeF"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", "0123456789abcde"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", "0123456789abcdef0"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", "0123456789abcdef0123456789abcdef"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", ""));
  EXPECT_FALSE(TokenMatches("", ""));  // no secret: nothing matches
}

TEST(ClusterTokenTest, LoadsFromAnOwnerOnlyFileOrTheEnvironment) {
  const std::string path = ::testing::TempDir() + "/cluster_token_" + RandomHex(4);
  std::ofstream(path) << "file-token-0123456789\n";
  chmod(path.c_str(), 0644);
  EXPECT_EQ(LoadClusterToken(path).status().code(), absl::StatusCode::kInvalidArgument);
  chmod(path.c_str(), 0600);
  EXPECT_EQ(*LoadClusterToken(path), "file-token-0123456789");
  EXPECT_FALSE(LoadClusterToken(path + ".missing").ok());
  setenv(kClusterTokenEnv, "env-token-0123456789", 1);
  EXPECT_EQ(*LoadClusterToken(""), "env-token-0123456789");
  setenv(kClusterTokenEnv, "short", 1);
  EXPECT_EQ(LoadClusterToken("").status().code(), absl::StatusCode::kInvalidArgument);
  unsetenv(kClusterTokenEnv);
  EXPECT_EQ(*LoadClusterToken(""), "");
  std::remove(path.c_str());
}

TEST(ClusterTokenTest, RandomHexIsFreshAndOfTheAskedLength) {
  const std::string a = RandomHex(16), b = RandomHex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

}  // namespace
}  // namespace tandem

// Warm connections (kv_wire.h version 7): the connection of a transfer that ended OK carries the
// sender's next transfer to the same receiver (kNext instead of a connect and a hello); every
// other outcome closes it; a receiver that closed it meanwhile (a restart, its idle timeout) is
// met again on a fresh connection, transparently; both sides' idle timeouts close idle ones.
namespace tandem {
namespace {

class WarmConnectionTest : public TcpKvTransportTest {
 protected:
  // One transfer of `pages` (sender pages src_pages[i] -> receiver page dst_pages[i]), every
  // layer, Finished; the sender's stats.
  absl::StatusOr<KvTransferStats> Transfer(TcpKvSender& sender, const std::string& id,
                                           const std::vector<int32_t>& src,
                                           const std::vector<int32_t>& dst,
                                           TcpKvReceiver* receiver = nullptr) {
    if (receiver == nullptr) receiver = receiver_.get();
    if (absl::Status st = receiver->Expect(id, dst, clock_.Now() + absl::Seconds(10)); !st.ok())
      return st;
    auto op = sender.Begin(receiver->address(), id, src_layout_, static_cast<int>(src.size()),
                           absl::Seconds(10));
    if (!op.ok()) return op.status();
    for (int layer = 0; layer < src_layout_.num_layers; ++layer) {
      if (absl::Status st = (*op)->SendLayer(layer, src_pool_.data(), src, 0); !st.ok()) return st;
    }
    return (*op)->Finish();
  }
  bool Landed(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) const {
    for (int layer = 0; layer < src_layout_.num_layers; ++layer) {
      for (size_t i = 0; i < src.size(); ++i) {
        if (!PageEquals(layer, src[i], dst[i])) return false;
      }
    }
    return true;
  }
  // The receiver's open connections reach `n` (its threads notice a close asynchronously).
  static bool AwaitConnections(TcpKvReceiver& receiver, int n) {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (receiver.NumConnections() != n) {
      if (absl::Now() > end) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }
  KvTransferStats ReceiverStats() {
    absl::MutexLock l(&outcomes_.mu);
    return outcomes_.last_stats;
  }
};

TEST_F(WarmConnectionTest, LaterTransfersToTheSameReceiverReuseTheConnection) {
  // Awkward sizes: 1, 3 and 8 pages (every sender page), each into its own receiver pages.
  const std::vector<std::vector<int32_t>> src = {{5}, {1, 3, 0}, {7, 6, 5, 4, 3, 2, 1, 0}};
  const std::vector<std::vector<int32_t>> dst = {{15}, {2, 9, 11}, {0, 1, 3, 4, 5, 6, 7, 8}};
  for (size_t i = 0; i < src.size(); ++i) {
    SCOPED_TRACE(i);
    auto stats = Transfer(sender_, "r" + std::to_string(i), src[i], dst[i]);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->warm, i > 0);
    EXPECT_EQ(stats->bytes, static_cast<int64_t>(src[i].size()) * 3 * src_layout_.PageBytes());
    ASSERT_TRUE(outcomes_.WaitFor(i + 1).ok());
    EXPECT_EQ(ReceiverStats().warm, i > 0);
    EXPECT_EQ(ReceiverStats().pages, static_cast<int64_t>(src[i].size()) * 3);
    EXPECT_TRUE(Landed(src[i], dst[i]));
    const TcpKvSender::ConnectionCounters c = sender_.connection_counters();
    EXPECT_EQ(c.opened, 1);
    EXPECT_EQ(c.reused, static_cast<int64_t>(i));
    EXPECT_EQ(c.idle, 1);
  }
  EXPECT_EQ(receiver_->NumConnections(), 1);  // one connection served all three
  EXPECT_EQ(receiver_->NumPending(), 0);
  // A sender keeping none opens a connection per transfer.
  TcpKvSender cold;
  cold.SetWarmConnections(0, absl::Seconds(30));
  for (int i = 0; i < 2; ++i) {
    auto stats = Transfer(cold, "c" + std::to_string(i), {2}, {10});
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_FALSE(stats->warm);
  }
  EXPECT_EQ(cold.connection_counters().opened, 2);
  EXPECT_EQ(cold.connection_counters().reused, 0);
  EXPECT_EQ(cold.connection_counters().idle, 0);
}

TEST_F(WarmConnectionTest, AReceiverRestartedBetweenTransfersIsMetOnAFreshConnection) {
  auto first = Transfer(sender_, "r1", {1, 3}, {5, 2});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(sender_.connection_counters().idle, 1);
  // The decode worker restarts on the same port: its end of the warm connection is gone.
  const std::string address = receiver_->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  receiver_.reset();
  std::fill(dst_pool_.begin(), dst_pool_.end(), 0);
  auto r = TcpKvReceiver::Create("127.0.0.1", port, dst_pool_.data(), dst_layout_,
                                 outcomes_.Callback(), &clock_);
  ASSERT_TRUE(r.ok()) << r.status();
  receiver_ = *std::move(r);
  auto second = Transfer(sender_, "r2", {0, 6, 7}, {9, 12, 4});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->warm);
  EXPECT_TRUE(outcomes_.WaitFor(2).ok());
  EXPECT_TRUE(Landed({0, 6, 7}, {9, 12, 4}));
  const TcpKvSender::ConnectionCounters c = sender_.connection_counters();
  EXPECT_EQ(c.reuse_failed, 1);  // tried the old one once, then fresh
  EXPECT_EQ(c.opened, 2);
  EXPECT_EQ(c.reused, 0);
  EXPECT_EQ(c.idle, 1);
  // And the fresh one is warm in turn.
  auto third = Transfer(sender_, "r3", {2}, {1});
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(third->warm);
  // A receiver that is gone for good: the warm connection fails, the fresh connect too.
  receiver_.reset();
  auto gone = sender_.Begin(address, "r4", src_layout_, 1, absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(gone.status())) << gone.status();
  EXPECT_EQ(sender_.connection_counters().reuse_failed, 2);
  EXPECT_EQ(sender_.connection_counters().idle, 0);
}

TEST_F(WarmConnectionTest, FailedAbortedCancelledOrRefusedTransfersCloseTheirConnection) {
  ASSERT_TRUE(Transfer(sender_, "ok1", {1}, {5}).ok());
  ASSERT_EQ(sender_.connection_counters().idle, 1);
  // Aborted on the warm connection: it is not reused.
  ASSERT_TRUE(receiver_->Expect("abort", {6}, clock_.Now() + absl::Seconds(10)).ok());
  {
    auto op = sender_.Begin(receiver_->address(), "abort", src_layout_, 1, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), std::vector<int32_t>{2}, 0).ok());
    (*op)->Abort("prefill gave up");
  }
  EXPECT_TRUE(absl::IsAborted(outcomes_.WaitFor(2)));
  EXPECT_EQ(sender_.connection_counters().reused, 1);
  EXPECT_EQ(sender_.connection_counters().idle, 0);
  EXPECT_TRUE(AwaitConnections(*receiver_, 0));
  // Missing pages (DataLoss) on a fresh connection: closed too.
  ASSERT_TRUE(receiver_->Expect("short", {7}, clock_.Now() + absl::Seconds(10)).ok());
  {
    auto op = sender_.Begin(receiver_->address(), "short", src_layout_, 1, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), std::vector<int32_t>{2}, 0).ok());
    EXPECT_TRUE(absl::IsDataLoss((*op)->Finish().status()));
  }
  EXPECT_EQ(sender_.connection_counters().opened, 2);
  EXPECT_EQ(sender_.connection_counters().idle, 0);
  // Cancelled by the decode side mid-transfer: closed.
  ASSERT_TRUE(Transfer(sender_, "ok2", {3}, {8}).ok());
  ASSERT_TRUE(receiver_->Expect("cancel", {9}, clock_.Now() + absl::Seconds(10)).ok());
  {
    auto op = sender_.Begin(receiver_->address(), "cancel", src_layout_, 1, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), std::vector<int32_t>{2}, 0).ok());
    EXPECT_TRUE(receiver_->Cancel("cancel"));
    absl::Status st;
    for (int layer = 1; layer < 3 && st.ok(); ++layer) {
      st = (*op)->SendLayer(layer, src_pool_.data(), std::vector<int32_t>{2}, 0);
    }
    if (st.ok()) st = (*op)->Finish().status();
    EXPECT_TRUE(absl::IsCancelled(st)) << st;
  }
  EXPECT_EQ(sender_.connection_counters().reused, 2);
  EXPECT_EQ(sender_.connection_counters().idle, 0);
  // Refused on a warm connection (no such transfer; more pages than reserved): closed, and the
  // refusal is the caller's answer (no retry on a fresh connection).
  ASSERT_TRUE(Transfer(sender_, "ok3", {4}, {10}).ok());
  EXPECT_TRUE(absl::IsNotFound(
      sender_.Begin(receiver_->address(), "nobody", src_layout_, 1, absl::Seconds(5)).status()));
  EXPECT_EQ(sender_.connection_counters().idle, 0);
  ASSERT_TRUE(Transfer(sender_, "ok4", {4}, {11}).ok());
  ASSERT_TRUE(receiver_->Expect("big", {12}, clock_.Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      sender_.Begin(receiver_->address(), "big", src_layout_, 2, absl::Seconds(5)).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(outcomes_.WaitFor(7)));  // failed at once, not later
  const TcpKvSender::ConnectionCounters c = sender_.connection_counters();
  EXPECT_EQ(c.idle, 0);
  EXPECT_EQ(c.reuse_failed, 0);
  EXPECT_EQ(c.opened, 5);  // ok1, short, ok2, ok3, ok4: never a broken connection reused
  EXPECT_TRUE(AwaitConnections(*receiver_, 0));
  EXPECT_EQ(receiver_->NumPending(), 0);
  EXPECT_TRUE(Landed({1}, {5}) && Landed({3}, {8}) && Landed({4}, {10}) && Landed({4}, {11}));
}

TEST_F(WarmConnectionTest, IdleTimeoutsCloseIdleConnectionsOnBothSides) {
  // The sender's, on its clock: a connection idle for the timeout is closed, not reused.
  testing::FakeClock sender_clock;
  TcpKvSender sender;
  sender.SetWarmConnections(2, absl::Seconds(30), &sender_clock);
  ASSERT_TRUE(Transfer(sender, "a", {1}, {1}).ok());
  sender_clock.Advance(absl::Seconds(29));
  auto warm = Transfer(sender, "b", {2}, {2});
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_TRUE(warm->warm);  // 29 s idle: still warm
  sender_clock.Advance(absl::Seconds(30));
  auto fresh = Transfer(sender, "c", {3}, {3});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->warm);
  TcpKvSender::ConnectionCounters c = sender.connection_counters();
  EXPECT_EQ(c.expired, 1);
  EXPECT_EQ(c.opened, 2);
  EXPECT_EQ(c.reused, 1);
  EXPECT_TRUE(AwaitConnections(*receiver_, 1));  // the receiver saw the expired one close
  // At most 2 idle per peer: three transfers at once leave two connections warm.
  std::vector<std::unique_ptr<KvSendOp>> ops;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "p" + std::to_string(i);
    ASSERT_TRUE(receiver_->Expect(id, {4 + i}, clock_.Now() + absl::Seconds(10)).ok());
    auto op = sender.Begin(receiver_->address(), id, src_layout_, 1, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    ops.push_back(*std::move(op));
  }
  for (auto& op : ops) {
    for (int layer = 0; layer < 3; ++layer) {
      ASSERT_TRUE(op->SendLayer(layer, src_pool_.data(), std::vector<int32_t>{5}, 0).ok());
    }
    ASSERT_TRUE(op->Finish().ok());
  }
  c = sender.connection_counters();
  EXPECT_EQ(c.idle, 2);
  EXPECT_EQ(c.opened, 4);  // the warm one and two fresh ones
  EXPECT_TRUE(AwaitConnections(*receiver_, 2));
  // The receiver's (real time): it closes a connection idle that long; the sender's next
  // transfer finds it closed and goes fresh, once.
  receiver_->SetIdleTimeout(absl::Milliseconds(50));
  TcpKvSender other;
  ASSERT_TRUE(Transfer(other, "d", {6}, {13}).ok());  // connections made from now wait 50 ms
  EXPECT_TRUE(AwaitConnections(*receiver_, 2));       // its one closed; the two older remain
  auto again = Transfer(other, "e", {7}, {14});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->warm);
  EXPECT_EQ(other.connection_counters().reuse_failed, 1);
  EXPECT_EQ(other.connection_counters().opened, 2);
  EXPECT_TRUE(Landed({6, 7}, {13, 14}));
}

}  // namespace
}  // namespace tandem
