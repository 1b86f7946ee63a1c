// The CUDA IPC path of the KV transport (comm/kv_ipc.h, kv_wire.h) with a fake device over host
// memory: the control protocol and its state handling, on the CPU. The fake "maps" a pool by
// its address and copies with memcpy, so a transfer moves real bytes without a GPU. Checked:
// every byte lands in the reserved pages and nowhere else, none goes over the socket; ipc fails
// at Begin with a clear error when the receiver exports no pool or its pool cannot be mapped
// (and the receiver fails the transfer rather than wait for its deadline); auto falls back to
// TCP; a receiver's Cancel waits for a granted write and refuses the next one.
// (tests/comm/cuda_kv_ipc_test.cc runs the real device half across two processes on a GPU.)
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
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

class FakeIpc : public KvIpcDevice {
 public:
  absl::StatusOr<std::string> ExportPool(void* pool) override {
    return std::string(reinterpret_cast<const char*>(&pool), sizeof(pool));
  }
  absl::StatusOr<void*> OpenPool(const std::string& handle) override {
    if (!mappable) return absl::FailedPreconditionError("peer on another device");
    void* pool = nullptr;
    std::memcpy(&pool, handle.data(), sizeof(pool));
    return pool;
  }
  absl::Status CopyLayer(void* dst_pool, const KvLayout& dst, const void* src_pool,
                         const KvLayout& src, int layer, absl::Span<const int32_t> dst_pages,
                         absl::Span<const int32_t> src_pages) override {
    {
      absl::MutexLock l(&mu);
      if (hold) {
        held = true;
        auto go = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return !hold; };
        mu.AwaitWithTimeout(absl::Condition(&go), kBound);
      }
    }
    const int64_t elem = DTypeSize(src.dtype);
    for (size_t i = 0; i < src_pages.size(); ++i) {
      std::memcpy(static_cast<char*>(dst_pool) + dst.PageOffset(layer, dst_pages[i]) * elem,
                  static_cast<const char*>(src_pool) + src.PageOffset(layer, src_pages[i]) * elem,
                  src.PageBytes());
    }
    absl::MutexLock l(&mu);
    ++copies;
    log.push_back("copy end");
    return absl::OkStatus();
  }

  std::atomic<bool> mappable{true};
  absl::Mutex mu;
  bool hold ABSL_GUARDED_BY(mu) = false;
  bool held ABSL_GUARDED_BY(mu) = false;
  int copies ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> log ABSL_GUARDED_BY(mu);
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

TEST_F(KvIpcProtocolTest, CancelWaitsForAGrantedWriteAndRefusesTheNext) {
  Export();
  Expect();
  TcpKvSender sender = Sender(KvTransportKind::kIpc);
  auto op = sender.Begin(receiver_->address(), "t", src_layout_, 5, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  {
    absl::MutexLock l(&ipc_->mu);
    ipc_->hold = true;
  }
  absl::Status first;
  std::thread send([&] { first = (*op)->SendLayer(0, src_pool_.data(), src_pages_, 0); });
  {
    absl::MutexLock l(&ipc_->mu);
    auto held = [this]() ABSL_SHARED_LOCKS_REQUIRED(ipc_->mu) { return ipc_->held; };
    ASSERT_TRUE(ipc_->mu.AwaitWithTimeout(absl::Condition(&held), kBound));
  }
  std::thread cancel([&] {
    EXPECT_TRUE(receiver_->Cancel("t"));
    absl::MutexLock l(&ipc_->mu);
    ipc_->log.push_back("cancel returned");
  });
  {
    absl::MutexLock l(&ipc_->mu);
    ipc_->hold = false;
  }
  send.join();
  cancel.join();
  EXPECT_TRUE(first.ok()) << first;
  {
    absl::MutexLock l(&ipc_->mu);
    EXPECT_EQ(ipc_->log, (std::vector<std::string>{"copy end", "cancel returned"}));
  }
  // The next grant is refused: the sender learns the receiver cancelled.
  const absl::Status next = (*op)->SendLayer(1, src_pool_.data(), src_pages_, 0);
  EXPECT_TRUE(absl::IsCancelled(next)) << next;
  EXPECT_EQ(Copies(), 1);
}

}  // namespace
}  // namespace tandem
