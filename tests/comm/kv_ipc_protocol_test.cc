// The CUDA IPC path of the KV transport (comm/kv_ipc.h, kv_wire.h) with a fake device over host
// memory: the control protocol and its state handling, on the CPU. The fake "maps" a pool by
// its address and copies with memcpy, so a transfer moves real bytes without a GPU. Checked:
// every byte lands in the reserved pages and nowhere else, none goes over the socket; ipc fails
// at Begin with a clear error when the receiver exports no pool or its pool cannot be mapped
// (and the receiver fails the transfer rather than wait for its deadline); auto falls back to
// TCP; one grant covers the transfer, each layer's copy is ordered after its event with no wait
// per layer and the copies are waited for once; a Cancel during the grant returns at once and
// releases the pages only after the sender's copies; Abort waits for the enqueued copies.
// (tests/comm/cuda_kv_ipc_test.cc runs the real device half across two processes on a GPU.)
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "comm/kv_ipc.h"
#include "comm/tcp_kv_receiver.h"
#include "comm/tcp_kv_sender.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr absl::Duration kBound = absl::Seconds(10);  // only a bug waits this long

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

// A device event of the fake: "completes" when fired.
struct FakeEvent {
  absl::Notification fired;
};

// An asynchronous fake device: copies run in order on a thread of their own (the "copy
// stream"), each after its event fired, as cudaStreamWaitEvent orders them; WaitCopies waits
// for every copy enqueued so far (the tests drive one sender thread).
class FakeIpc : public KvIpcDevice {
 public:
  FakeIpc() : stream_([this] { Run(); }) {}
  ~FakeIpc() override {
    {
      absl::MutexLock l(&mu);
      stopping_ = true;
    }
    stream_.join();
  }

  absl::StatusOr<std::string> ExportPool(void* pool) override {
    return std::string(reinterpret_cast<const char*>(&pool), sizeof(pool));
  }
  absl::StatusOr<void*> OpenPool(const std::string& handle) override {
    if (!mappable) return absl::FailedPreconditionError("peer on another device");
    void* pool = nullptr;
    std::memcpy(&pool, handle.data(), sizeof(pool));
    return pool;
  }
  absl::Status CopyLayerAsync(void* dst_pool, const KvLayout& dst, const void* src_pool,
                              const KvLayout& src, int layer, absl::Span<const int32_t> dst_pages,
                              absl::Span<const int32_t> src_pages, void* after_event) override {
    std::vector<int32_t> d(dst_pages.begin(), dst_pages.end());
    std::vector<int32_t> sp(src_pages.begin(), src_pages.end());
    auto* event = static_cast<FakeEvent*>(after_event);
    absl::MutexLock l(&mu);
    ++enqueued;
    queue_.push_back([=] {
      if (event != nullptr) event->fired.WaitForNotificationWithTimeout(kBound);
      const int64_t elem = DTypeSize(src.dtype);
      for (size_t i = 0; i < sp.size(); ++i) {
        std::memcpy(static_cast<char*>(dst_pool) + dst.PageOffset(layer, d[i]) * elem,
                    static_cast<const char*>(src_pool) + src.PageOffset(layer, sp[i]) * elem,
                    src.PageBytes());
      }
    });
    return absl::OkStatus();
  }
  // Counts the multi-layer launches, each as the per-layer copies it stands for.
  absl::Status CopyLayersAsync(void* dst_pool, const KvLayout& dst, const void* src_pool,
                               const KvLayout& src, int layer, int num_layers,
                               absl::Span<const int32_t> dst_pages,
                               absl::Span<const int32_t> src_pages, void* after_event) override {
    {
      absl::MutexLock l(&mu);
      launches.push_back(num_layers);
    }
    return KvIpcDevice::CopyLayersAsync(dst_pool, dst, src_pool, src, layer, num_layers, dst_pages,
                                        src_pages, after_event);
  }
  absl::Status WaitCopies() override {
    absl::MutexLock l(&mu);
    ++waits;
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return copies == enqueued; };
    if (!mu.AwaitWithTimeout(absl::Condition(&idle), kBound)) {
      return absl::DeadlineExceededError("fake copies never ran");
    }
    return absl::OkStatus();
  }

  std::atomic<bool> mappable{true};
  absl::Mutex mu;
  int enqueued ABSL_GUARDED_BY(mu) = 0;
  int copies ABSL_GUARDED_BY(mu) = 0;             // landed
  int waits ABSL_GUARDED_BY(mu) = 0;              // WaitCopies calls
  std::vector<int> launches ABSL_GUARDED_BY(mu);  // CopyLayersAsync calls: their layer counts
  std::vector<std::string> log ABSL_GUARDED_BY(mu);

 private:
  void Run() {
    while (true) {
      std::function<void()> copy;
      {
        absl::MutexLock l(&mu);
        auto ready = [this]()
                         ABSL_SHARED_LOCKS_REQUIRED(mu) { return stopping_ || !queue_.empty(); };
        mu.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        copy = std::move(queue_.front());
        queue_.pop_front();
      }
      copy();
      absl::MutexLock l(&mu);
      ++copies;
      log.push_back("copy end");
    }
  }

  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu);
  bool stopping_ ABSL_GUARDED_BY(mu) = false;
  std::thread stream_;
};

struct Outcomes {
  absl::Mutex mu;
  std::vector<absl::Status> done ABSL_GUARDED_BY(mu);
  KvTransferStats stats ABSL_GUARDED_BY(mu);
  KvReceiver::DoneCallback Callback() {
    return [this](const std::string&, absl::Status st, KvTransferStats s) {
      absl::MutexLock l(&mu);
      done.push_back(st);
      stats = s;
    };
  }
  absl::Status Wait() {
    absl::MutexLock l(&mu);
    auto has = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return !done.empty(); };
    if (!mu.AwaitWithTimeout(absl::Condition(&has), kBound)) return absl::UnknownError("none");
    return done[0];
  }
};

class KvIpcProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_layout_ = MakeLayout(8);
    dst_layout_ = MakeLayout(16);
    src_pool_.resize(src_layout_.PoolBytes());
    std::mt19937 rng(3);
    for (char& b : src_pool_) b = static_cast<char>(rng());
    dst_pool_.assign(dst_layout_.PoolBytes(), '\x5a');
    {
      absl::MutexLock l(&outcomes_.mu);
      outcomes_.done.clear();
    }
    receiver_.reset();
    auto r =
        TcpKvReceiver::Create("127.0.0.1", 0, dst_pool_.data(), dst_layout_, outcomes_.Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
  }
  void Export() { receiver_->SetIpcExport(*ipc_->ExportPool(dst_pool_.data())); }
  TcpKvSender Sender(KvTransportKind kind) { return TcpKvSender({}, "", kind, ipc_); }
  void Expect() {
    ASSERT_TRUE(receiver_->Expect("t", dst_pages_, absl::Now() + absl::Seconds(30)).ok());
  }
  // Sends src_pages_ of every layer in two ranges and finishes.
  absl::Status SendAll(KvSendOp& op) {
    for (int l = 0; l < src_layout_.num_layers; ++l) {
      const absl::Span<const int32_t> pages(src_pages_);
      if (absl::Status st = op.SendLayer(l, src_pool_.data(), pages.subspan(0, 2), 0); !st.ok())
        return st;
      if (absl::Status st = op.SendLayer(l, src_pool_.data(), pages.subspan(2), 2); !st.ok())
        return st;
    }
    return op.Finish().status();
  }
  // Every byte of the reserved pages equals the sender's page, every other byte is untouched.
  void ExpectLanded() {
    std::vector<char> want(dst_layout_.PoolBytes(), '\x5a');
    const int64_t elem = DTypeSize(src_layout_.dtype);
    for (int l = 0; l < src_layout_.num_layers; ++l) {
      for (size_t i = 0; i < src_pages_.size(); ++i) {
        std::memcpy(want.data() + dst_layout_.PageOffset(l, dst_pages_[i]) * elem,
                    src_pool_.data() + src_layout_.PageOffset(l, src_pages_[i]) * elem,
                    src_layout_.PageBytes());
      }
    }
    EXPECT_TRUE(want == dst_pool_);
  }
  int Copies() {
    absl::MutexLock l(&ipc_->mu);
    return ipc_->copies;
  }

  KvLayout src_layout_, dst_layout_;
  std::vector<char> src_pool_, dst_pool_;
  std::vector<int32_t> src_pages_ = {6, 1, 2, 3, 7};
  std::vector<int32_t> dst_pages_ = {9, 4, 5, 6, 15, 0};  // one more reserved than sent
  std::shared_ptr<FakeIpc> ipc_ = std::make_shared<FakeIpc>();
  Outcomes outcomes_;
  std::unique_ptr<TcpKvReceiver> receiver_;
};

TEST_F(KvIpcProtocolTest, IpcLandsEveryByteInTheReservedPagesAndNothingElse) {
  Export();
  Expect();
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE(SendAll(**op).ok());
  ASSERT_TRUE(outcomes_.Wait().ok());
  ExpectLanded();
  EXPECT_EQ(Copies(), 2 * src_layout_.num_layers);  // every range went by the device copy
  {
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->waits, 1);  // one wait for the transfer, not one per range
  }
  absl::MutexLock l(&outcomes_.mu);
  EXPECT_EQ(outcomes_.stats.bytes, 5 * src_layout_.num_layers * src_layout_.PageBytes());
}

TEST_F(KvIpcProtocolTest, IpcWithoutAnExportedPoolFailsAtBeginOnBothSides) {
  Expect();  // no SetIpcExport
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_FALSE(op.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(op.status())) << op.status();
  EXPECT_NE(op.status().message().find("not exported for CUDA IPC"), std::string::npos);
  EXPECT_TRUE(absl::IsFailedPrecondition(outcomes_.Wait()));  // not left to its deadline
  EXPECT_EQ(receiver_->NumPending(), 0);
}

TEST_F(KvIpcProtocolTest, IpcThatCannotMapThePeerFailsAtBeginOnBothSides) {
  Export();
  Expect();
  ipc_->mappable = false;
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_FALSE(op.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(op.status())) << op.status();
  EXPECT_NE(op.status().message().find("cannot map"), std::string::npos);
  EXPECT_TRUE(absl::IsAborted(outcomes_.Wait()));
}

TEST_F(KvIpcProtocolTest, IpcWithoutADeviceFailsBeforeConnecting) {
  Expect();
  TcpKvSender sender({}, "", KvTransportKind::kIpc, nullptr);
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  EXPECT_TRUE(absl::IsFailedPrecondition(op.status())) << op.status();
  EXPECT_EQ(receiver_->NumPending(), 1);  // nothing reached the receiver
}

TEST_F(KvIpcProtocolTest, AutoFallsBackToTcpWhenThePeerCannotBeMappedOrExportsNothing) {
  for (bool exported : {true, false}) {
    SetUp();
    if (exported) Export();
    Expect();
    ipc_->mappable = false;
    TcpKvSender sender = Sender(KvTransportKind::kAuto);
    auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    ASSERT_TRUE(SendAll(**op).ok());
    ASSERT_TRUE(outcomes_.Wait().ok());
    ExpectLanded();
    EXPECT_EQ(Copies(), 0);  // all over the socket
  }
}

// Groups of different TP (comm/kv_head_map.h): IPC copies pages unchanged, so the receiver
// offers no pool to such a sender and auto sends the pages over TCP through the head map (every
// head where the TP 1 pool wants it); ipc is refused at Begin on both sides.
TEST_F(KvIpcProtocolTest, GroupsOfDifferentSizesGoOverTcpUnderAutoAndAreRefusedUnderIpc) {
  const KvGroupShape two{2, 2, 3, 4, 8, DType::kBF16};  // this model at TP 2: a head per rank
  const KvLayout two_layout = two.PoolLayout(8);
  std::vector<char> pool(static_cast<size_t>(two_layout.PoolBytes()));
  std::mt19937 rng(11);
  for (char& b : pool) b = static_cast<char>(rng());
  Export();
  Expect();
  TcpKvSender sender = Sender(KvTransportKind::kAuto);
  ASSERT_TRUE(sender.SetGroupShape(two).ok());
  auto op = sender.Begin(receiver_->address(), "t", two_layout, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  for (int l = 0; l < two_layout.num_layers; ++l) {
    ASSERT_TRUE((*op)->SendLayer(l, pool.data(), src_pages_, 0).ok());
  }
  ASSERT_TRUE((*op)->Finish().ok());
  ASSERT_TRUE(outcomes_.Wait().ok());
  EXPECT_EQ(Copies(), 0);  // all over the socket
  {
    absl::MutexLock l(&outcomes_.mu);
    EXPECT_EQ(outcomes_.stats.path, "tcp");
  }
  // Decode layer l, head h is the TP 2 pool's stacked layer h * 3 + l (rank h), its one head.
  const int64_t head = 4 * 8 * 2;
  for (int l = 0; l < 3; ++l) {
    for (size_t i = 0; i < src_pages_.size(); ++i) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < 2; ++h) {
          const char* want =
              pool.data() + two_layout.PageOffset(h * 3 + l, src_pages_[i]) * 2 + kv * head;
          const char* got =
              dst_pool_.data() + dst_layout_.PageOffset(l, dst_pages_[i]) * 2 + (kv * 2 + h) * head;
          EXPECT_EQ(std::memcmp(want, got, head), 0) << l << " " << i << " " << kv << " " << h;
        }
      }
    }
  }
  SetUp();
  Export();
  Expect();
  TcpKvSender ipc = Sender(KvTransportKind::kIpc);
  ASSERT_TRUE(ipc.SetGroupShape(two).ok());
  auto refused = ipc.Begin(receiver_->address(), "t", two_layout, 5, absl::Seconds(10));
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("kv_transport ipc moves KV pages unchanged"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(outcomes_.Wait()));
  EXPECT_EQ(Copies(), 0);
}

// Each layer's copy is enqueued after its event and SendLayerAfterEvent returns at once: no layer
// waits for its event or for a round trip (one grant for the transfer); the copies run after
// their events, so the bytes stored after the enqueue (as the compute stream stores them) are
// the ones that land; the transfer waits for its copies once, in Finish.
TEST_F(KvIpcProtocolTest, LayersGoAfterTheirEventsWithoutWaitingAndAreWaitedForOnce) {
  Export();
  Expect();
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE((*op)->OrdersAfterEvents());
  const std::vector<char> stored = src_pool_;  // what the "compute" stores, layer by layer
  std::fill(src_pool_.begin(), src_pool_.end(), '\x11');  // nothing stored yet
  std::vector<FakeEvent> events(static_cast<size_t>(src_layout_.num_layers));
  for (int l = 0; l < src_layout_.num_layers; ++l) {
    ASSERT_TRUE((*op)->SendLayerAfterEvent(l, src_pool_.data(), src_pages_, 0, &events[l]).ok());
  }
  {
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->enqueued, src_layout_.num_layers);
    EXPECT_EQ(ipc_->copies, 0);  // every layer is still waiting for its event
    EXPECT_EQ(ipc_->waits, 0);
  }
  EXPECT_EQ(receiver_->NumPending(), 1);
  const int64_t elem = DTypeSize(src_layout_.dtype);
  const int64_t layer_bytes = src_layout_.PageBytes() * src_layout_.num_pages;
  for (int l = 0; l < src_layout_.num_layers; ++l) {
    const int64_t off = src_layout_.PageOffset(l, 0) * elem;
    std::memcpy(src_pool_.data() + off, stored.data() + off, layer_bytes);
    events[l].fired.Notify();
  }
  auto stats = (*op)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_TRUE(outcomes_.Wait().ok());
  ExpectLanded();
  absl::MutexLock l(&ipc_->mu);
  EXPECT_EQ(ipc_->copies, src_layout_.num_layers);
  EXPECT_EQ(ipc_->waits, 1);
  EXPECT_EQ(stats->bytes, 5 * src_layout_.num_layers * src_layout_.PageBytes());
}

// SendLayer (every layer stored already) holds the same pages of consecutive layers back and
// enqueues them as one multi-layer launch when the run reaches the last layer (so before
// Finish, and before a --kv-transfer-hold-ms wait), breaks, or Finish comes; bytes exact.
TEST_F(KvIpcProtocolTest, StoredLayersOfTheSamePagesGoAsOneLaunch) {
  Export();
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  // In order: layers 0 and 1 held, layer 2 launches all three at once.
  Expect();
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  for (int l = 0; l < src_layout_.num_layers; ++l) {
    ASSERT_TRUE((*op)->SendLayer(l, src_pool_.data(), src_pages_, 0).ok());
    absl::MutexLock lock(&ipc_->mu);
    EXPECT_EQ(ipc_->enqueued, l + 1 == src_layout_.num_layers ? 3 : 0) << l;
  }
  ASSERT_TRUE((*op)->Finish().ok());
  ASSERT_TRUE(outcomes_.Wait().ok());
  ExpectLanded();
  {
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->launches, std::vector<int>{3});
    EXPECT_EQ(ipc_->waits, 1);
  }
  // Out of order: layer 2 goes alone (the last), 0 and 1 are one run launched by Finish.
  SetUp();
  ipc_ = std::make_shared<FakeIpc>();
  Export();
  Expect();
  TcpKvSender again = Sender(KvTransportKind::kIpc);
  op = again.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  for (int l : {2, 0, 1}) ASSERT_TRUE((*op)->SendLayer(l, src_pool_.data(), src_pages_, 0).ok());
  {
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->launches, std::vector<int>{1});  // 0 and 1 still held
  }
  ASSERT_TRUE((*op)->Finish().ok());
  ASSERT_TRUE(outcomes_.Wait().ok());
  ExpectLanded();
  {
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->launches, (std::vector<int>{1, 2}));
    EXPECT_EQ(ipc_->copies, 3);
  }
  // Aborted while layers are held: they are never launched, nothing lands.
  SetUp();
  ipc_ = std::make_shared<FakeIpc>();
  Export();
  Expect();
  TcpKvSender third = Sender(KvTransportKind::kIpc);
  op = third.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE((*op)->SendLayer(0, src_pool_.data(), src_pages_, 0).ok());
  (*op)->Abort("test abort");
  EXPECT_TRUE(absl::IsAborted(outcomes_.Wait()));
  absl::MutexLock l(&ipc_->mu);
  EXPECT_TRUE(ipc_->launches.empty());
  EXPECT_EQ(ipc_->copies, 0);
  EXPECT_TRUE(std::all_of(dst_pool_.begin(), dst_pool_.end(), [](char c) { return c == '\x5a'; }));
}

// A second transfer to the same receiver goes over the warm connection (kv_wire.h version 7):
// no new hello, no map, and the grant comes with the kNext answer; bytes exact and nothing
// else touched, one wait per transfer. A Cancel during a warm grant still releases the pages
// only after the sender's copies, and that connection is not reused.
TEST_F(KvIpcProtocolTest, WarmTransfersGetTheirGrantInOneRoundTripAndKeepEveryRule) {
  Export();
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  const std::vector<std::vector<int32_t>> dst = {
      {9, 4, 5, 6, 15}, {0, 1, 2, 3, 7}, {8, 10, 11, 12, 13}};
  for (size_t i = 0; i < dst.size(); ++i) {
    SCOPED_TRACE(i);
    dst_pages_ = dst[i];
    const std::string id = "w" + std::to_string(i);
    ASSERT_TRUE(receiver_->Expect(id, dst_pages_, absl::Now() + absl::Seconds(30)).ok());
    auto op = sender.Begin(receiver_->address(), id, src_layout_, 5, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    ASSERT_TRUE((*op)->OrdersAfterEvents());
    ASSERT_TRUE(SendAll(**op).ok());
    ASSERT_TRUE(outcomes_.Wait().ok());
    {
      absl::MutexLock l(&outcomes_.mu);
      EXPECT_EQ(outcomes_.done.size(), i + 1);
      EXPECT_TRUE(outcomes_.done.back().ok()) << outcomes_.done.back();
      EXPECT_EQ(outcomes_.stats.path, "ipc");
      EXPECT_EQ(outcomes_.stats.warm, i > 0);
      EXPECT_EQ(outcomes_.stats.bytes, 5 * src_layout_.num_layers * src_layout_.PageBytes());
    }
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->copies, static_cast<int>(2 * src_layout_.num_layers * (i + 1)));
    EXPECT_EQ(ipc_->waits, static_cast<int>(i + 1));
  }
  // Every transfer's pages hold the sender's bytes; every other page is untouched.
  std::vector<char> want(dst_layout_.PoolBytes(), '\x5a');
  const int64_t elem = DTypeSize(src_layout_.dtype);
  for (const std::vector<int32_t>& d : dst) {
    for (int l = 0; l < src_layout_.num_layers; ++l) {
      for (size_t i = 0; i < src_pages_.size(); ++i) {
        std::memcpy(want.data() + dst_layout_.PageOffset(l, d[i]) * elem,
                    src_pool_.data() + src_layout_.PageOffset(l, src_pages_[i]) * elem,
                    src_layout_.PageBytes());
      }
    }
  }
  EXPECT_TRUE(want == dst_pool_);
  TcpKvSender::ConnectionCounters c = sender.connection_counters();
  EXPECT_EQ(c.opened, 1);
  EXPECT_EQ(c.reused, 2);
  // A Cancel while a warm transfer holds its grant: returns at once, releases after the copies.
  ASSERT_TRUE(receiver_->Expect("cancel", {14}, absl::Now() + absl::Seconds(30)).ok());
  auto op = sender.Begin(receiver_->address(), "cancel", src_layout_, 1, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  std::vector<FakeEvent> events(static_cast<size_t>(src_layout_.num_layers));
  for (int l = 0; l < src_layout_.num_layers; ++l) {
    ASSERT_TRUE((*op)
                    ->SendLayerAfterEvent(l, src_pool_.data(),
                                          absl::MakeConstSpan(src_pages_).subspan(0, 1), 0,
                                          &events[l])
                    .ok());
  }
  absl::Notification released;
  EXPECT_TRUE(receiver_->Cancel("cancel", [this, &released] {
    absl::MutexLock l(&ipc_->mu);
    ipc_->log.push_back("released");
    released.Notify();
  }));
  EXPECT_FALSE(released.WaitForNotificationWithTimeout(absl::Milliseconds(100)));  // still lent
  for (FakeEvent& e : events) e.fired.Notify();
  EXPECT_TRUE(absl::IsCancelled((*op)->Finish().status()));
  ASSERT_TRUE(released.WaitForNotificationWithTimeout(kBound));
  {
    absl::MutexLock l(&ipc_->mu);
    ASSERT_GE(ipc_->log.size(), 4u);
    EXPECT_EQ(std::vector<std::string>(ipc_->log.end() - 4, ipc_->log.end()),
              (std::vector<std::string>{"copy end", "copy end", "copy end", "released"}));
  }
  c = sender.connection_counters();
  EXPECT_EQ(c.reused, 3);
  EXPECT_EQ(c.idle, 0);  // the cancelled transfer's connection was closed
  // The next transfer opens a fresh connection, maps nothing new, and lands exactly.
  dst_pages_ = {9, 4, 5, 6, 15};
  std::fill(dst_pool_.begin(), dst_pool_.end(), '\x5a');
  ASSERT_TRUE(receiver_->Expect("after", dst_pages_, absl::Now() + absl::Seconds(30)).ok());
  auto after = sender.Begin(receiver_->address(), "after", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_TRUE(SendAll(**after).ok());
  ExpectLanded();
  EXPECT_EQ(sender.connection_counters().opened, 2);
}

// A Cancel while the sender holds the grant does not wait for it: it returns at once and the
// pages are released (`released` runs) only once every enqueued copy landed and the sender
// confirmed; done() never runs and the sender learns of the cancel. The blocking Cancel(id)
// returns only then.
TEST_F(KvIpcProtocolTest, CancelDuringTheGrantReleasesThePagesOnlyAfterTheSendersCopies) {
  for (bool blocking : {false, true}) {
    SCOPED_TRACE(blocking ? "blocking Cancel" : "Cancel with released");
    SetUp();
    ipc_ = std::make_shared<FakeIpc>();
    Export();
    Expect();
    TcpKvSender sender = Sender(KvTransportKind::kIpc);
    auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    std::vector<FakeEvent> events(static_cast<size_t>(src_layout_.num_layers));
    for (int l = 0; l < src_layout_.num_layers; ++l) {
      ASSERT_TRUE((*op)->SendLayerAfterEvent(l, src_pool_.data(), src_pages_, 0, &events[l]).ok());
    }
    absl::Notification released;
    auto on_released = [this, &released] {
      absl::MutexLock l(&ipc_->mu);
      ipc_->log.push_back("released");
      released.Notify();
    };
    std::thread blocked;
    if (blocking) {
      blocked = std::thread([&] {
        EXPECT_TRUE(receiver_->Cancel("t"));
        on_released();
      });
    } else {
      const absl::Time start = absl::Now();
      EXPECT_TRUE(receiver_->Cancel("t", on_released));
      EXPECT_LT(absl::Now() - start, absl::Seconds(1));  // did not wait for the sender
    }
    EXPECT_FALSE(released.WaitForNotificationWithTimeout(absl::Milliseconds(100)));  // still lent
    EXPECT_EQ(receiver_->NumPending(), 0);
    for (FakeEvent& e : events) e.fired.Notify();
    auto finished = (*op)->Finish();
    EXPECT_TRUE(absl::IsCancelled(finished.status())) << finished.status();
    ASSERT_TRUE(released.WaitForNotificationWithTimeout(kBound));
    if (blocked.joinable()) blocked.join();
    {
      absl::MutexLock l(&ipc_->mu);
      EXPECT_EQ(ipc_->log,
                (std::vector<std::string>{"copy end", "copy end", "copy end", "released"}));
    }
    absl::MutexLock l(&outcomes_.mu);
    EXPECT_TRUE(outcomes_.done.empty());
  }
}

// Abort waits for the copies already enqueued before it ends the grant: when it returns every
// copy has landed, and the receiver fails the transfer (Aborted) only after that.
TEST_F(KvIpcProtocolTest, AbortWaitsForTheEnqueuedCopiesBeforeEndingTheGrant) {
  Export();
  Expect();
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  std::vector<FakeEvent> events(static_cast<size_t>(src_layout_.num_layers));
  for (int l = 0; l < src_layout_.num_layers; ++l) {
    ASSERT_TRUE((*op)->SendLayerAfterEvent(l, src_pool_.data(), src_pages_, 0, &events[l]).ok());
  }
  std::thread compute([&events] {
    absl::SleepFor(absl::Milliseconds(100));
    for (FakeEvent& e : events) e.fired.Notify();
  });
  (*op)->Abort("test abort");
  {
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->copies, src_layout_.num_layers);
  }
  compute.join();
  EXPECT_TRUE(absl::IsAborted(outcomes_.Wait()));
  EXPECT_EQ(receiver_->NumPending(), 0);
}

}  // namespace
}  // namespace tandem
