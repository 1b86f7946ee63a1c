// KV transfers between groups of different TP / PP over the host transport (kv_wire.h version
// 6): the hello names the sender's group and the receiver lands each page through the head map
// (comm/kv_head_map.h). Checked: every element of the destination's tokens is the one of the
// whole model's cache at that (layer, head, token) — for TP 2 -> 1, 1 -> 2, replicated heads,
// other stage splits — with pages outside the transfer untouched, and a source whose ranks
// or layers are exchanged is caught; a device pool gets the runs through its copy; the wire's
// hello round-trips, older versions and inconsistent hellos are refused; groups of other
// models, and IPC required between groups of different sizes, are refused on both sides.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "comm/kv_head_map.h"
#include "comm/kv_wire.h"
#include "comm/socket_io.h"
#include "comm/tcp_kv_receiver.h"
#include "comm/tcp_kv_sender.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int32_t kUnset = -7;
constexpr int kLayers = 3;
constexpr int kPageSize = 4;
constexpr int kHeadDim = 8;

// The value of one K/V element, from its place in the whole (TP 1) cache.
int32_t Value(int layer, int kv, int head, int token, int d) {
  return ((((layer * 2 + kv) * 16 + head) * 1000 + token) * 8) + d;
}

KvGroupShape Group(int heads, int tp, int pp) {
  return KvGroupShape{tp, heads, kLayers, kPageSize, kHeadDim, DType::kI32, pp};
}

// A pool of `g` holding `tokens` tokens in pages `ids`; garbage elsewhere (the unused tail of the
// last page too). `swap`: TP ranks 0 and 1 exchanged (swap_layers: layers 0 and 2).
std::vector<int32_t> Fill(const KvGroupShape& g, int num_pages, const std::vector<int32_t>& ids,
                          int tokens, bool swap_ranks = false, bool swap_layers = false) {
  const KvLayout l = g.PoolLayout(num_pages);
  std::vector<int32_t> pool(static_cast<size_t>(l.PoolBytes() / 4), -3);
  for (int r = 0; r < g.tensor_parallel; ++r) {
    const int data_rank = swap_ranks && r < 2 ? 1 - r : r;
    for (int layer = 0; layer < g.num_layers; ++layer) {
      const int data_layer = swap_layers ? g.num_layers - 1 - layer : layer;
      for (int t = 0; t < tokens; ++t) {
        const int64_t slot = int64_t{ids[t / g.page_size]} * g.page_size + t % g.page_size;
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < l.num_kv_heads; ++h) {
            for (int d = 0; d < g.head_dim; ++d) {
              pool[l.PageOffset(g.StackedLayer(r, layer), 0) + l.SlotOffset(slot, kv, h) + d] =
                  Value(data_layer, kv, g.FirstKvHead(data_rank) + h, t, d);
            }
          }
        }
      }
    }
  }
  return pool;
}

// Elements of the destination's tokens that are not the whole cache's.
int64_t Mismatches(const KvGroupShape& g, const std::vector<int32_t>& pool, int num_pages,
                   const std::vector<int32_t>& ids, int tokens) {
  const KvLayout l = g.PoolLayout(num_pages);
  int64_t bad = 0;
  for (int r = 0; r < g.tensor_parallel; ++r) {
    for (int layer = 0; layer < g.num_layers; ++layer) {
      for (int t = 0; t < tokens; ++t) {
        const int64_t slot = int64_t{ids[t / g.page_size]} * g.page_size + t % g.page_size;
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < l.num_kv_heads; ++h) {
            for (int d = 0; d < g.head_dim; ++d) {
              if (pool[l.PageOffset(g.StackedLayer(r, layer), 0) + l.SlotOffset(slot, kv, h) + d] !=
                  Value(layer, kv, g.FirstKvHead(r) + h, t, d)) {
                ++bad;
              }
            }
          }
        }
      }
    }
  }
  return bad;
}

struct Outcome {
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
  absl::Status Wait(size_t n) {
    absl::MutexLock l(&mu);
    auto has = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return done.size() >= n; };
    if (!mu.AwaitWithTimeout(absl::Condition(&has), absl::Seconds(10))) {
      return absl::UnknownError("no outcome");
    }
    return done[n - 1];
  }
};

// Sends every stacked layer of `pages` of `pool` in two ranges, then finishes.
absl::Status SendAll(KvSendOp& op, const KvLayout& layout, const std::vector<int32_t>& pool,
                     const std::vector<int32_t>& pages) {
  const absl::Span<const int32_t> all(pages);
  for (int l = 0; l < layout.num_layers; ++l) {
    if (absl::Status st = op.SendLayer(l, pool.data(), all.subspan(0, 1), 0); !st.ok()) return st;
    if (absl::Status st = op.SendLayer(l, pool.data(), all.subspan(1), 1); !st.ok()) return st;
  }
  return op.Finish().status();
}

struct Sizes {
  int tp, pp;
};
struct Case {
  int heads;
  Sizes src, dst;
};

class KvMixedGroupsTest : public ::testing::TestWithParam<Case> {};

TEST_P(KvMixedGroupsTest, PagesLandThroughTheHeadMapBytesExact) {
  const Case c = GetParam();
  const KvGroupShape src = Group(c.heads, c.src.tp, c.src.pp);
  const KvGroupShape dst = Group(c.heads, c.dst.tp, c.dst.pp);
  const int tokens = 10;  // 3 pages, the last holding 2 tokens
  const std::vector<int32_t> src_ids = {5, 0, 3};
  const std::vector<int32_t> dst_ids = {7, 2, 9, 4};  // one more reserved than sent
  const KvLayout src_layout = src.PoolLayout(6);
  const KvLayout dst_layout = dst.PoolLayout(12);
  std::vector<int32_t> dst_pool(static_cast<size_t>(dst_layout.PoolBytes() / 4), kUnset);
  Outcome outcome;
  auto receiver =
      TcpKvReceiver::Create("127.0.0.1", 0, dst_pool.data(), dst_layout, outcome.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  ASSERT_TRUE((*receiver)->SetGroupShape(dst).ok());
  TcpKvSender sender;
  ASSERT_TRUE(sender.SetGroupShape(src).ok());

  auto transfer = [&](const std::string& id, const std::vector<int32_t>& src_pool) {
    std::fill(dst_pool.begin(), dst_pool.end(), kUnset);
    EXPECT_TRUE((*receiver)->Expect(id, dst_ids, absl::Now() + absl::Seconds(10)).ok());
    auto op = sender.Begin((*receiver)->address(), id, src_layout, 3, absl::Seconds(10));
    ASSERT_TRUE(op.ok()) << op.status();
    EXPECT_TRUE(SendAll(**op, src_layout, src_pool, src_ids).ok());
  };
  transfer("t", Fill(src, 6, src_ids, tokens));
  ASSERT_TRUE(outcome.Wait(1).ok()) << outcome.Wait(1);
  EXPECT_EQ(Mismatches(dst, dst_pool, 12, dst_ids, tokens), 0);
  // Pages outside the transfer are untouched.
  for (int layer = 0; layer < dst_layout.num_layers; ++layer) {
    for (int p = 0; p < 12; ++p) {
      if (p == 7 || p == 2 || p == 9) continue;
      for (int64_t e = 0; e < dst_layout.PageElems(); ++e) {
        ASSERT_EQ(dst_pool[dst_layout.PageOffset(layer, p) + e], kUnset)
            << "layer " << layer << " page " << p;
      }
    }
  }
  {
    absl::MutexLock l(&outcome.mu);
    EXPECT_EQ(outcome.stats.path, "tcp");
    // Every sender page came (those of replicated heads a lower rank gives too).
    EXPECT_EQ(outcome.stats.pages, int64_t{src_layout.num_layers} * 3);
    EXPECT_EQ(outcome.stats.bytes, int64_t{src_layout.num_layers} * 3 * src_layout.PageBytes());
  }
  // A source whose ranks hold each other's heads is caught (unless they share one head).
  if (c.src.tp >= 2 && src.FirstKvHead(0) != src.FirstKvHead(1)) {
    transfer("swapped ranks", Fill(src, 6, src_ids, tokens, /*swap_ranks=*/true));
    ASSERT_TRUE(outcome.Wait(2).ok());
    EXPECT_GT(Mismatches(dst, dst_pool, 12, dst_ids, tokens), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, KvMixedGroupsTest,
                         ::testing::Values(Case{4, {2, 1}, {1, 1}}, Case{4, {1, 1}, {2, 1}},
                                           Case{2, {2, 1}, {1, 1}}, Case{2, {1, 1}, {2, 1}},
                                           // One KV head, replicated on both TP 2 ranks.
                                           Case{1, {2, 1}, {1, 1}}, Case{1, {1, 1}, {2, 1}},
                                           Case{4, {2, 1}, {4, 1}}, Case{2, {4, 1}, {1, 1}},
                                           // Other stage splits (3 layers), same TP and not.
                                           Case{4, {2, 1}, {2, 3}}, Case{4, {1, 2}, {1, 1}},
                                           Case{2, {2, 2}, {1, 3}}, Case{2, {1, 3}, {2, 2}},
                                           // One shape: the fast path.
                                           Case{4, {2, 2}, {2, 2}}));

// A source whose stages hold each other's layers is caught too (same TP, other PP).
TEST(KvMixedGroups, ExchangedLayersAreCaught) {
  const KvGroupShape src = Group(4, 2, 1), dst = Group(4, 2, 3);
  const std::vector<int32_t> ids = {1, 0};
  const KvLayout sl = src.PoolLayout(2), dl = dst.PoolLayout(2);
  std::vector<int32_t> dst_pool(static_cast<size_t>(dl.PoolBytes() / 4), kUnset);
  Outcome outcome;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_pool.data(), dl, outcome.Callback());
  ASSERT_TRUE(receiver.ok());
  ASSERT_TRUE((*receiver)->SetGroupShape(dst).ok());
  TcpKvSender sender;
  ASSERT_TRUE(sender.SetGroupShape(src).ok());
  ASSERT_TRUE((*receiver)->Expect("t", ids, absl::Now() + absl::Seconds(10)).ok());
  auto op = sender.Begin((*receiver)->address(), "t", sl, 2, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE(SendAll(**op, sl, Fill(src, 2, ids, 6, false, /*swap_layers=*/true), ids).ok());
  ASSERT_TRUE(outcome.Wait(1).ok());
  EXPECT_GT(Mismatches(dst, dst_pool, 2, ids, 6), 0);
}

// A device pool (the receiver's copy function): the head runs go through it, bytes exact.
TEST(KvMixedGroups, DevicePoolGetsTheRunsThroughItsCopy) {
  const KvGroupShape src = Group(4, 2, 1), dst = Group(4, 1, 1);
  const std::vector<int32_t> src_ids = {2, 0}, dst_ids = {3, 1};
  const KvLayout sl = src.PoolLayout(3), dl = dst.PoolLayout(4);
  std::vector<int32_t> dst_pool(static_cast<size_t>(dl.PoolBytes() / 4), kUnset);
  std::atomic<int> copies{0};
  KvPoolCopy write = [&](void* to, const void* from, int64_t bytes) {
    ++copies;
    std::memcpy(to, from, static_cast<size_t>(bytes));
    return absl::OkStatus();
  };
  Outcome outcome;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, dst_pool.data(), dl, outcome.Callback(),
                                        Clock::Real(), write);
  ASSERT_TRUE(receiver.ok());
  ASSERT_TRUE((*receiver)->SetGroupShape(dst).ok());
  TcpKvSender sender;
  ASSERT_TRUE(sender.SetGroupShape(src).ok());
  ASSERT_TRUE((*receiver)->Expect("t", dst_ids, absl::Now() + absl::Seconds(10)).ok());
  auto op = sender.Begin((*receiver)->address(), "t", sl, 2, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE(SendAll(**op, sl, Fill(src, 3, src_ids, 7), src_ids).ok());
  ASSERT_TRUE(outcome.Wait(1).ok());
  EXPECT_EQ(Mismatches(dst, dst_pool, 4, dst_ids, 7), 0);
  // 6 source layers x 2 pages, each one K run and one V run.
  EXPECT_EQ(copies.load(), 6 * 2 * 2);
}

// ---- The wire.

kv_wire::Hello HelloOf(const KvGroupShape& g) {
  kv_wire::Hello h;
  h.layout = g.PoolLayout(10);
  h.num_pages = 5;
  h.transfer_id = "req-1";
  h.cluster_token = "token";
  h.ipc = kv_wire::IpcMode::kPreferred;
  h.group = g;
  return h;
}

TEST(KvWireV6, HelloCarriesTheSendersGroup) {
  const KvGroupShape g{2, 4, 5, 16, 64, DType::kBF16, 3};
  const std::string body = kv_wire::EncodeHello(HelloOf(g));
  absl::StatusOr<kv_wire::Hello> h = kv_wire::DecodeHello(body);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->group, g);
  EXPECT_EQ(h->layout.num_layers, 10);
  EXPECT_EQ(h->layout.num_kv_heads, 2);
  EXPECT_EQ(h->num_pages, 5);
  EXPECT_EQ(h->transfer_id, "req-1");
  EXPECT_EQ(h->ipc, kv_wire::IpcMode::kPreferred);
  // Every shorter body is refused (never read past its end).
  for (size_t n = 0; n < body.size(); ++n) {
    absl::StatusOr<kv_wire::Hello> cut = kv_wire::DecodeHello(body.substr(0, n));
    EXPECT_TRUE(absl::IsInvalidArgument(cut.status())) << n << ": " << cut.status();
  }
}

TEST(KvWireV6, OtherVersionsAreRefusedNamingBoth) {
  std::string body = kv_wire::EncodeHello(HelloOf(Group(4, 1, 1)));
  for (uint32_t version : {1u, 4u, 5u, 6u, 8u}) {
    std::memcpy(body.data() + 4, &version, 4);
    absl::StatusOr<kv_wire::Hello> h = kv_wire::DecodeHello(body);
    ASSERT_TRUE(absl::IsFailedPrecondition(h.status())) << version << ": " << h.status();
    EXPECT_NE(h.status().message().find(absl::StrCat("KV wire version ", version)),
              std::string::npos)
        << h.status();
    EXPECT_NE(h.status().message().find("speaks 7"), std::string::npos) << h.status();
  }
  // A version 5 hello as a version 5 sender wrote it (no group), over the socket: the receiver
  // answers FailedPrecondition and the transfer stays expected (nothing of it was claimed).
  std::vector<int32_t> pool(1024, 0);
  const KvLayout layout = Group(4, 1, 1).PoolLayout(2);
  Outcome outcome;
  auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, pool.data(), layout, outcome.Callback());
  ASSERT_TRUE(receiver.ok());
  ASSERT_TRUE((*receiver)->Expect("req-1", {0}, absl::Now() + absl::Seconds(10)).ok());
  std::string v5 = kv_wire::EncodeHello(HelloOf(Group(4, 1, 1)));
  v5.resize(v5.size() - 16);
  const uint32_t five = 5;
  std::memcpy(v5.data() + 4, &five, 4);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  auto s = Connect((*receiver)->address(), deadline);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(kv_wire::WriteFrame(*s, kv_wire::FrameType::kHello, v5, deadline).ok());
  absl::StatusOr<kv_wire::Frame> verdict = kv_wire::ReadFrame(*s, deadline);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  const absl::Status st = kv_wire::DecodeStatus(verdict->body);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("KV wire version 5 but this receiver speaks 7"), std::string::npos)
      << st;
  EXPECT_EQ((*receiver)->NumPending(), 1);
}

// A group that contradicts the hello's layout, or that no group has (the receiver refuses it
// after the cluster token, InvalidArgument, failing the transfer it names).
absl::Status HelloGroupVerdict(const kv_wire::Hello& h) {
  absl::StatusOr<kv_wire::Hello> d = kv_wire::DecodeHello(kv_wire::EncodeHello(h));
  if (!d.ok()) return d.status();
  return kv_wire::CheckHelloGroup(*d);
}

TEST(KvWireV6, HelloWhoseGroupContradictsItsLayoutIsRefused) {
  EXPECT_TRUE(HelloGroupVerdict(HelloOf(Group(4, 2, 3))).ok());
  kv_wire::Hello h = HelloOf(Group(4, 2, 1));
  h.layout = Group(4, 1, 1).PoolLayout(10);  // a TP 1 pool named TP 2
  absl::Status d = HelloGroupVerdict(h);
  EXPECT_TRUE(absl::IsInvalidArgument(d)) << d;
  EXPECT_NE(d.message().find("has no pool"), std::string::npos) << d;
  h = HelloOf(Group(4, 3, 1));  // TP 3 neither divides nor is a multiple of 4 heads
  d = HelloGroupVerdict(h);
  EXPECT_TRUE(absl::IsInvalidArgument(d)) << d;
  h = HelloOf(Group(4, 1, 4));  // more stages than layers
  d = HelloGroupVerdict(h);
  EXPECT_TRUE(absl::IsInvalidArgument(d)) << d;
  h = HelloOf(Group(4, 1, 1));
  h.group.tensor_parallel = 0;
  d = HelloGroupVerdict(h);
  EXPECT_TRUE(absl::IsInvalidArgument(d)) << d;
  h.group.tensor_parallel = -2;
  d = HelloGroupVerdict(h);
  EXPECT_TRUE(absl::IsInvalidArgument(d)) << d;
}

TEST(KvWireV6, IpcPoolSaysWhyItDeclined) {
  kv_wire::IpcPool pool;
  pool.num_pages = 4;
  pool.page_ids = {3, 1};
  pool.declined = "the groups' sizes differ";
  absl::StatusOr<kv_wire::IpcPool> d = kv_wire::DecodeIpcPool(kv_wire::EncodeIpcPool(pool));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->declined, pool.declined);
  EXPECT_EQ(d->page_ids, pool.page_ids);
  std::string cut = kv_wire::EncodeIpcPool(pool);
  cut.resize(cut.size() - 1);
  EXPECT_TRUE(absl::IsInvalidArgument(kv_wire::DecodeIpcPool(cut).status()));
}

// ---- Refused pairs.

class KvMixedGroupsRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_.assign(static_cast<size_t>(dst_.PoolLayout(8).PoolBytes() / 4), kUnset);
    auto r = TcpKvReceiver::Create("127.0.0.1", 0, pool_.data(), dst_.PoolLayout(8),
                                   outcome_.Callback());
    ASSERT_TRUE(r.ok());
    receiver_ = *std::move(r);
    ASSERT_TRUE(receiver_->SetGroupShape(dst_).ok());
  }
  // Begin from a sender of group `src` (kind `kind`); the transfer is expected first.
  absl::Status Begin(const KvGroupShape& src, KvTransportKind kind = KvTransportKind::kTcp) {
    EXPECT_TRUE(
        receiver_->Expect(absl::StrCat("t", ++n_), {1, 2}, absl::Now() + absl::Seconds(10)).ok());
    TcpKvSender sender({}, "", kind);
    EXPECT_TRUE(sender.SetGroupShape(src).ok());
    return sender
        .Begin(receiver_->address(), absl::StrCat("t", n_), src.PoolLayout(4), 2, absl::Seconds(10))
        .status();
  }
  bool PoolUntouched() const {
    for (int32_t v : pool_) {
      if (v != kUnset) return false;
    }
    return true;
  }

  const KvGroupShape dst_ = Group(4, 1, 1);
  std::vector<int32_t> pool_;
  Outcome outcome_;
  std::unique_ptr<TcpKvReceiver> receiver_;
  int n_ = 0;
};

TEST_F(KvMixedGroupsRefusalTest, GroupsOfOtherModelsAreRefusedOnBothSides) {
  KvGroupShape other = Group(4, 2, 1);
  other.num_layers = 4;  // another model's layers
  absl::Status st = Begin(other);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("hold other KV"), std::string::npos) << st;
  EXPECT_NE(st.message().find("layers 4 vs 3"), std::string::npos) << st;
  EXPECT_TRUE(absl::IsFailedPrecondition(outcome_.Wait(1)));  // not left to its deadline
  other = Group(2, 2, 1);                                     // other KV heads
  st = Begin(other);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::IsFailedPrecondition(outcome_.Wait(2)));
  // A sender of the same TP 1 x PP 1 but another head_dim: another page shape.
  other = Group(4, 1, 1);
  other.head_dim = 16;
  st = Begin(other);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::IsFailedPrecondition(outcome_.Wait(3)));
  EXPECT_TRUE(PoolUntouched());
  EXPECT_EQ(receiver_->NumPending(), 0);
}

// IPC / NCCL copy pages unchanged: required between groups of different sizes they are refused
// with FailedPrecondition (auto would not ask: with no device here the sender asks neither).
TEST_F(KvMixedGroupsRefusalTest, IpcAndNcclRequiredBetweenOtherSizesAreRefused) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (const bool nccl : {false, true}) {
    ASSERT_TRUE(
        receiver_->Expect(absl::StrCat("raw", nccl), {1, 2}, absl::Now() + absl::Seconds(10)).ok());
    kv_wire::Hello h;
    h.group = Group(4, 2, 1);
    h.layout = h.group.PoolLayout(4);
    h.num_pages = 2;
    h.transfer_id = absl::StrCat("raw", nccl);
    (nccl ? h.nccl : h.ipc) = kv_wire::IpcMode::kRequired;
    auto s = Connect(receiver_->address(), deadline);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(
        kv_wire::WriteFrame(*s, kv_wire::FrameType::kHello, kv_wire::EncodeHello(h), deadline)
            .ok());
    absl::StatusOr<kv_wire::Frame> verdict = kv_wire::ReadFrame(*s, deadline);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    const absl::Status st = kv_wire::DecodeStatus(verdict->body);
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_NE(st.message().find(absl::StrCat("kv_transport ", nccl ? "nccl" : "ipc",
                                             " moves KV pages unchanged")),
              std::string::npos)
        << st;
    EXPECT_NE(st.message().find("prefill TP 2 x PP 1, decode TP 1 x PP 1"), std::string::npos)
        << st;
    EXPECT_TRUE(absl::IsFailedPrecondition(outcome_.Wait(nccl ? 2 : 1)));
  }
  // Preferred, the receiver declines both and says why; the pages then go over TCP.
  ASSERT_TRUE(receiver_->Expect("pref", {1, 2}, absl::Now() + absl::Seconds(10)).ok());
  kv_wire::Hello h;
  h.group = Group(4, 2, 1);
  h.layout = h.group.PoolLayout(4);
  h.num_pages = 2;
  h.transfer_id = "pref";
  h.ipc = kv_wire::IpcMode::kPreferred;
  h.nccl = kv_wire::NcclMode::kPreferred;
  receiver_->SetIpcExport("some handle");  // exported, yet not offered to this sender
  auto s = Connect(receiver_->address(), deadline);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(
      kv_wire::WriteFrame(*s, kv_wire::FrameType::kHello, kv_wire::EncodeHello(h), deadline).ok());
  absl::StatusOr<kv_wire::Frame> verdict = kv_wire::ReadFrame(*s, deadline);
  ASSERT_TRUE(verdict.ok());
  EXPECT_TRUE(kv_wire::DecodeStatus(verdict->body).ok());
  absl::StatusOr<kv_wire::Frame> frame = kv_wire::ReadFrame(*s, deadline);
  ASSERT_TRUE(frame.ok());
  ASSERT_EQ(frame->type, kv_wire::FrameType::kIpcPool);
  absl::StatusOr<kv_wire::IpcPool> pool = kv_wire::DecodeIpcPool(frame->body);
  ASSERT_TRUE(pool.ok());
  EXPECT_TRUE(pool->handle.empty());
  EXPECT_FALSE(pool->nccl);
  EXPECT_NE(pool->declined.find("the groups' sizes differ"), std::string::npos) << pool->declined;
  // A kIpcWrite now is a protocol error (IPC was not granted).
  ASSERT_TRUE(kv_wire::WriteFrame(*s, kv_wire::FrameType::kIpcWrite,
                                  kv_wire::EncodePagesHeader({kv_wire::kAllLayers, 0, 2}), deadline)
                  .ok());
  EXPECT_TRUE(absl::IsInvalidArgument(outcome_.Wait(3)));
  EXPECT_TRUE(PoolUntouched());
}

TEST_F(KvMixedGroupsRefusalTest, GroupsThatContradictTheirLayoutAreRefusedLocally) {
  // The receiver's group must describe its pool.
  EXPECT_TRUE(absl::IsInvalidArgument(receiver_->SetGroupShape(Group(4, 2, 1))));
  EXPECT_TRUE(absl::IsInvalidArgument(receiver_->SetGroupShape(Group(4, 3, 1))));
  // The sender's group must describe the layout it sends from: refused before connecting.
  ASSERT_TRUE(receiver_->Expect("t", {1, 2}, absl::Now() + absl::Seconds(10)).ok());
  TcpKvSender sender;
  ASSERT_TRUE(sender.SetGroupShape(Group(4, 2, 1)).ok());
  absl::Status st =
      sender.Begin(receiver_->address(), "t", Group(4, 1, 1).PoolLayout(4), 2, absl::Seconds(10))
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(receiver_->NumPending(), 1);
  EXPECT_TRUE(absl::IsInvalidArgument(sender.SetGroupShape(Group(4, 1, 5))));
}

}  // namespace
}  // namespace tandem
