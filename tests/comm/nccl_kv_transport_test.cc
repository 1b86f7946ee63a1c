// The NCCL path of the KV transport (comm/nccl_kv_transport.h, kv_wire.h) through the in-process
// fake (tests/comm/fake_nccl.h), on the CPU: the real TcpKvSender / TcpKvReceiver over loopback
// TCP carry the control frames and the fake moves the page bytes. Each side keeps its pages in a
// BlockAllocator as the workers do (prefill: owned until the transfer ended; decode: reserved,
// committed on OK, freed on an error or once a Cancel's `released` ran), and every test ends
// with every page of both sides free again. Checked: the pages land byte-exact (scattered pages
// as runs, each layer's sends after its event, the communicator built once and reused); an init
// failure (either side, at once or later), an async error mid-transfer, a hang past the
// deadline, the receiver's or the sender's death each end the transfer with an error on both
// sides, abort the communicators, free the pages, and the next transfer builds a new
// communicator and lands its bytes; a decode worker that restarts is met with a rebuilt
// communicator; a cancel keeps it; 2 prefill x 2 decode workers with 4 transfer threads each
// transfer at once without deadlock; same GPU and no-NCCL peers are refused or fall back.
#include "comm/nccl_kv_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "comm/kv_wire.h"
#include "comm/tcp_kv_receiver.h"
#include "comm/tcp_kv_sender.h"
#include "engine/kv/block_allocator.h"
#include "fake_nccl.h"
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

// Makes the allocator's next Allocate / Reserve(pages.size()) return exactly `pages`, in order
// (it hands out the most recently freed pages first).
void Arrange(BlockAllocator& alloc, const std::vector<int32_t>& pages) {
  auto all = alloc.Allocate(alloc.num_pages());
  ASSERT_TRUE(all.ok());
  for (int32_t p : *all) {
    if (std::find(pages.begin(), pages.end(), p) == pages.end()) {
      ASSERT_TRUE(alloc.Free({p}).ok());
    }
  }
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) ASSERT_TRUE(alloc.Free({*it}).ok());
}

// A prefill worker: its (fake) GPU, pool, allocator and sender.
struct Prefill {
  Prefill(FakeNcclWorld* world, const std::string& gpu,
          KvTransportKind kind = KvTransportKind::kNccl)
      : api(std::make_shared<FakeNccl>(world, gpu)), layout(MakeLayout(12)), alloc(12) {
    pool.resize(layout.PoolBytes());
    std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(gpu)));
    for (char& b : pool) b = static_cast<char>(rng());
    auto t = NcclKvTransport::Create(api, pool.data());
    EXPECT_TRUE(t.ok()) << t.status();
    nccl = *t;
    sender = std::make_unique<TcpKvSender>(KvPoolCopy{}, "", kind, nullptr, nccl);
  }
  std::shared_ptr<FakeNccl> api;
  KvLayout layout;
  std::vector<char> pool;
  absl::Mutex mu;  // the allocator (transfer threads)
  BlockAllocator alloc;
  std::shared_ptr<NcclKvTransport> nccl;
  std::unique_ptr<TcpKvSender> sender;

  std::vector<int32_t> Take(int n) {
    absl::MutexLock l(&mu);
    auto pages = alloc.Allocate(n);
    EXPECT_TRUE(pages.ok());
    return pages.ok() ? *pages : std::vector<int32_t>{};
  }
  void Release(const std::vector<int32_t>& pages) {
    absl::MutexLock l(&mu);
    EXPECT_TRUE(alloc.Free(pages).ok());
  }
  int NumFree() {
    absl::MutexLock l(&mu);
    return alloc.num_free();
  }
};

// A decode worker: its (fake) GPU, pool, allocator and receiver; each transfer's outcome
// drives its pages through the ownership state machine as DecodeService does.
struct Decode {
  Decode(FakeNcclWorld* world, const std::string& gpu, int port = 0, bool with_nccl = true)
      : api(std::make_shared<FakeNccl>(world, gpu)), layout(MakeLayout(16)), alloc(16) {
    pool.assign(layout.PoolBytes(), '\x5a');
    auto r = TcpKvReceiver::Create("127.0.0.1", port, pool.data(), layout,
                                   [this](const std::string& id, absl::Status st,
                                          KvTransferStats stats) { OnDone(id, st, stats); });
    EXPECT_TRUE(r.ok()) << r.status();
    receiver = *std::move(r);
    if (with_nccl) {
      auto t = NcclKvTransport::Create(api, pool.data());
      EXPECT_TRUE(t.ok()) << t.status();
      nccl = *t;
      receiver->SetNccl(nccl);
    }
  }
  std::shared_ptr<FakeNccl> api;
  KvLayout layout;
  std::vector<char> pool;
  std::shared_ptr<NcclKvTransport> nccl;
  std::unique_ptr<TcpKvReceiver> receiver;

  absl::Mutex mu;
  BlockAllocator alloc ABSL_GUARDED_BY(mu);
  std::map<std::string, std::vector<int32_t>> pages ABSL_GUARDED_BY(mu);
  std::map<std::string, absl::Status> done ABSL_GUARDED_BY(mu);
  std::map<std::string, KvTransferStats> stats ABSL_GUARDED_BY(mu);

  // ReservePages: reserved pages and the receiver told to expect them.
  std::vector<int32_t> Reserve(const std::string& id, int n,
                               absl::Duration ttl = absl::Seconds(30)) {
    absl::MutexLock l(&mu);
    auto p = alloc.Reserve(n);
    EXPECT_TRUE(p.ok());
    EXPECT_TRUE(receiver->Expect(id, *p, absl::Now() + ttl).ok());
    pages[id] = *p;
    return *p;
  }
  void OnDone(const std::string& id, absl::Status st, KvTransferStats s) {
    absl::MutexLock l(&mu);
    // OK: the claim commits the pages (reserved -> owned) and the request later frees them;
    // an error: the reservation is freed.
    const absl::Status changed = st.ok() ? alloc.Commit(pages[id]) : alloc.Free(pages[id]);
    EXPECT_TRUE(changed.ok()) << changed;
    done[id] = st;
    stats[id] = s;
  }
  absl::Status WaitDone(const std::string& id) {
    absl::MutexLock l(&mu);
    auto has = [this, &id]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return done.contains(id); };
    if (!mu.AwaitWithTimeout(absl::Condition(&has), kBound)) {
      return absl::UnknownError("no outcome");
    }
    return done[id];
  }
  // The request that got its KV finishes: its owned pages are freed.
  void Finish(const std::string& id) {
    absl::MutexLock l(&mu);
    EXPECT_TRUE(alloc.Free(pages[id]).ok());
  }
  // Cancel with the deferred release DecodeService uses.
  bool Cancel(const std::string& id, absl::Notification* released) {
    return receiver->Cancel(id, [this, id, released] {
      absl::MutexLock l(&mu);
      EXPECT_TRUE(alloc.Free(pages[id]).ok());
      released->Notify();
    });
  }
  int NumFree() {
    absl::MutexLock l(&mu);
    return alloc.num_free();
  }
  // Page index i of layer l of transfer `id` equals the sender's page src[i].
  bool Landed(const std::string& id, const Prefill& p, const std::vector<int32_t>& src, int layer) {
    std::vector<int32_t> dst;
    {
      absl::MutexLock l(&mu);
      dst = pages[id];
    }
    const int64_t elem = DTypeSize(layout.dtype);
    for (size_t i = 0; i < src.size(); ++i) {
      if (std::memcmp(pool.data() + layout.PageOffset(layer, dst[i]) * elem,
                      p.pool.data() + p.layout.PageOffset(layer, src[i]) * elem,
                      layout.PageBytes()) != 0) {
        return false;
      }
    }
    return true;
  }
  bool AllLanded(const std::string& id, const Prefill& p, const std::vector<int32_t>& src) {
    for (int l = 0; l < layout.num_layers; ++l) {
      if (!Landed(id, p, src, l)) return false;
    }
    return true;
  }
};

// One transfer of `n` pages, each layer in two ranges; the prefill side frees its pages once it
// ended, whatever the outcome. `src` gets the sender's pages.
absl::Status Transfer(Prefill& p, Decode& d, const std::string& id, int n,
                      std::vector<int32_t>* src = nullptr,
                      absl::Duration timeout = absl::Seconds(10)) {
  const std::vector<int32_t> pages = p.Take(n);
  if (src != nullptr) *src = pages;
  absl::Status st;
  auto op = p.sender->Begin(d.receiver->address(), id, p.layout, n, timeout);
  if (!op.ok()) {
    st = op.status();
  } else {
    const absl::Span<const int32_t> all(pages);
    const size_t half = pages.size() / 2;
    for (int l = 0; st.ok() && l < p.layout.num_layers; ++l) {
      st = (*op)->SendLayer(l, p.pool.data(), all.subspan(0, half), 0);
      if (st.ok()) st = (*op)->SendLayer(l, p.pool.data(), all.subspan(half), half);
    }
    if (st.ok()) st = (*op)->Finish().status();
  }
  op = absl::UnknownError("dropped");  // the op ends before the pages are freed
  p.Release(pages);
  return st;
}

class NcclKvTransportTest : public ::testing::Test {
 protected:
  // After every test: nothing stays reserved or owned on either side.
  void ExpectAllFree(Prefill& p, Decode& d) {
    EXPECT_EQ(p.NumFree(), p.layout.num_pages);
    EXPECT_EQ(d.NumFree(), d.layout.num_pages);
    EXPECT_EQ(d.receiver->NumPending(), 0);
  }
  FakeNcclWorld world_;
};

TEST(NcclPageRunsTest, RunsAreContiguousInBothLists) {
  EXPECT_EQ(NcclPageRuns({3, 4, 5, 9, 1}, {7, 8, 2, 3, 4}), (std::vector<int32_t>{2, 1, 1, 1}));
  EXPECT_EQ(NcclPageRuns({0, 1, 2, 3}, {5, 6, 7, 8}), (std::vector<int32_t>{4}));
  EXPECT_EQ(NcclPageRuns({4, 3, 2}, {0, 1, 2}), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(NcclPageRuns({7}, {0}), (std::vector<int32_t>{1}));
  EXPECT_TRUE(NcclPageRuns({}, {}).empty());
}

TEST(NcclWireTest, LayerFramesRoundTripAndBadRunsAreRefused) {
  kv_wire::NcclLayer l{2, 3, 5, {2, 1, 2}};
  auto back = kv_wire::DecodeNcclLayer(kv_wire::EncodeNcclLayer(l));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layer, 2);
  EXPECT_EQ(back->first_index, 3);
  EXPECT_EQ(back->runs, l.runs);
  l.runs = {2, 2};  // sums to 4, not 5
  EXPECT_EQ(kv_wire::DecodeNcclLayer(kv_wire::EncodeNcclLayer(l)).status().code(),
            absl::StatusCode::kInvalidArgument);
  l.runs = {5, 0};
  EXPECT_EQ(kv_wire::DecodeNcclLayer(kv_wire::EncodeNcclLayer(l)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto comm = kv_wire::DecodeNcclComm(kv_wire::EncodeNcclComm({"k", 7, "id"}));
  ASSERT_TRUE(comm.ok());
  EXPECT_EQ(comm->generation, 7u);
  EXPECT_EQ(comm->unique_id, "id");
  EXPECT_FALSE(kv_wire::DecodeNcclComm("").ok());
}

TEST_F(NcclKvTransportTest, ScatteredPagesLandByteExactAndTheCommunicatorIsReused) {
  Prefill p(&world_, "GPU-0");
  Decode d(&world_, "GPU-1");
  {
    absl::MutexLock l(&p.mu);
    Arrange(p.alloc, {3, 4, 5, 9, 1});
  }
  {
    absl::MutexLock l(&d.mu);
    Arrange(d.alloc, {7, 8, 2, 3, 4});
  }
  ASSERT_EQ(d.Reserve("a", 5), (std::vector<int32_t>{7, 8, 2, 3, 4}));
  std::vector<int32_t> src;
  ASSERT_TRUE(Transfer(p, d, "a", 5, &src).ok());
  ASSERT_EQ(src, (std::vector<int32_t>{3, 4, 5, 9, 1}));
  ASSERT_TRUE(d.WaitDone("a").ok());
  EXPECT_TRUE(d.AllLanded("a", p, src));
  {
    // Nothing but the reserved pages was written.
    absl::MutexLock l(&d.mu);
    const int64_t elem = DTypeSize(d.layout.dtype);
    for (int layer = 0; layer < 3; ++layer) {
      for (int page : {0, 1, 5, 6, 9, 10, 11, 12, 13, 14, 15}) {
        const char* b = d.pool.data() + d.layout.PageOffset(layer, page) * elem;
        EXPECT_TRUE(std::all_of(b, b + d.layout.PageBytes(), [](char c) { return c == '\x5a'; }))
            << "layer " << layer << " page " << page;
      }
    }
    EXPECT_EQ(d.stats["a"].path, "nccl");
    EXPECT_EQ(d.stats["a"].bytes, 3 * 5 * d.layout.PageBytes());
  }
  // Runs: first range {3,4}->{7,8} is one send; second {5,9,1}->{2,3,4} three; per layer.
  EXPECT_EQ(p.api->sends.load(), 3 * 4);
  EXPECT_EQ(d.api->recvs.load(), 3 * 4);
  d.Finish("a");
  // A second transfer reuses the pair's communicator: no new init on either side.
  d.Reserve("b", 4);
  ASSERT_TRUE(Transfer(p, d, "b", 4, &src).ok());
  ASSERT_TRUE(d.WaitDone("b").ok());
  EXPECT_TRUE(d.AllLanded("b", p, src));
  d.Finish("b");
  EXPECT_EQ(p.api->inits.load(), 1);
  EXPECT_EQ(d.api->inits.load(), 1);
  EXPECT_EQ(p.api->aborts.load() + d.api->aborts.load(), 0);
  EXPECT_EQ(p.nccl->NumComms(), 1);
  EXPECT_EQ(d.nccl->NumComms(), 1);
  // ... over the first transfer's connection, kept warm (kNext, then kNcclUse).
  {
    absl::MutexLock l(&d.mu);
    EXPECT_FALSE(d.stats["a"].warm);
    EXPECT_TRUE(d.stats["b"].warm);
    EXPECT_EQ(d.stats["b"].path, "nccl");
  }
  EXPECT_EQ(p.sender->connection_counters().opened, 1);
  EXPECT_EQ(p.sender->connection_counters().reused, 1);
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, EachLayerIsSentAfterItsEventWithoutAHostWait) {
  Prefill p(&world_, "GPU-0");
  Decode d(&world_, "GPU-1");
  d.Reserve("a", 3);
  const std::vector<int32_t> src = p.Take(3);
  auto op = p.sender->Begin(d.receiver->address(), "a", p.layout, 3, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE((*op)->OrdersAfterEvents());
  FakeEvent events[3];
  for (int l = 0; l < 3; ++l) {
    ASSERT_TRUE((*op)->SendLayerAfterEvent(l, p.pool.data(), src, 0, &events[l]).ok());
  }
  // Returned with every layer enqueued and none computed: nothing has moved.
  absl::SleepFor(absl::Milliseconds(30));
  for (int l = 0; l < 3; ++l) EXPECT_FALSE(d.Landed("a", p, src, l)) << l;
  events[0].fired.Notify();
  events[1].fired.Notify();
  events[2].fired.Notify();
  ASSERT_TRUE((*op)->Finish().ok());
  op = absl::UnknownError("dropped");
  p.Release(src);
  ASSERT_TRUE(d.WaitDone("a").ok());
  EXPECT_TRUE(d.AllLanded("a", p, src));
  d.Finish("a");
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, InitFailureOnTheDecodeSideFailsBothAndTheNextTransferRebuilds) {
  Prefill p(&world_, "GPU-0");
  Decode d(&world_, "GPU-1");
  d.api->fail_next_inits_async = 1;
  d.Reserve("a", 3);
  const absl::Status st = Transfer(p, d, "a", 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("init failed"), std::string::npos) << st;
  EXPECT_EQ(d.WaitDone("a").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(p.api->aborts.load(), 1);  // the sender's half of the failed communicator
  EXPECT_EQ(d.api->aborts.load(), 1);
  EXPECT_EQ(p.nccl->NumComms(), 0);
  EXPECT_EQ(d.nccl->NumComms(), 0);
  // The next transfer builds a new communicator and lands its bytes.
  std::vector<int32_t> src;
  d.Reserve("b", 3);
  ASSERT_TRUE(Transfer(p, d, "b", 3, &src).ok());
  ASSERT_TRUE(d.WaitDone("b").ok());
  EXPECT_TRUE(d.AllLanded("b", p, src));
  EXPECT_EQ(p.api->inits.load(), 2);
  EXPECT_EQ(d.api->inits.load(), 2);
  d.Finish("b");
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, InitFailureOnThePrefillSideIsReportedToTheDecodeSide) {
  Prefill p(&world_, "GPU-0");
  Decode d(&world_, "GPU-1");
  p.api->fail_next_inits = 1;  // ncclCommInitRankConfig itself fails
  d.Reserve("a", 2);
  const absl::Status st = Transfer(p, d, "a", 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("injected"), std::string::npos) << st;
  EXPECT_EQ(d.WaitDone("a").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(d.api->inits.load(), 0);  // the receiver never started one
  d.Reserve("b", 2);
  ASSERT_TRUE(Transfer(p, d, "b", 2).ok());
  ASSERT_TRUE(d.WaitDone("b").ok());
  d.Finish("b");
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, AsyncErrorMidTransferAbortsBothAndTheNextTransferRebuilds) {
  Prefill p(&world_, "GPU-0");
  Decode d(&world_, "GPU-1");
  p.api->fail_after_ops = 1;  // the first send completes, then the communicator fails
  d.Reserve("a", 4);
  const absl::Status st = Transfer(p, d, "a", 4);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("remote process exited"), std::string::npos) << st;
  const absl::Status decode = d.WaitDone("a");
  EXPECT_FALSE(decode.ok());
  EXPECT_EQ(p.api->aborts.load(), 1);
  EXPECT_EQ(p.nccl->NumComms(), 0);
  // The decode side aborted its half already when receives were left unmatched; when all it
  // enqueued had completed, it holds it until the sender's rebuild replaces it.
  EXPECT_LE(d.api->aborts.load(), 1);
  std::vector<int32_t> src;
  d.Reserve("b", 4);
  ASSERT_TRUE(Transfer(p, d, "b", 4, &src).ok());
  ASSERT_TRUE(d.WaitDone("b").ok());
  EXPECT_TRUE(d.AllLanded("b", p, src));
  EXPECT_EQ(p.api->inits.load(), 2);
  EXPECT_EQ(d.api->inits.load(), 2);
  EXPECT_EQ(d.api->aborts.load(), 1);
  EXPECT_EQ(d.nccl->NumComms(), 1);
  d.Finish("b");
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, HangPastTheDeadlineAbortsAndNothingLandsAfterIt) {
  Prefill p(&world_, "GPU-0");
  Decode d(&world_, "GPU-1");
  d.api->hang = true;  // the decode GPU never completes a receive
  const std::vector<int32_t> reserved = d.Reserve("a", 3);
  const absl::Time start = absl::Now();
  const absl::Status st = Transfer(p, d, "a", 3, nullptr, absl::Milliseconds(300));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(d.WaitDone("a").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(p.api->aborts.load(), 1);
  EXPECT_EQ(d.api->aborts.load(), 1);
  // The decode GPU comes back to life: the aborted receives are gone, nothing lands in the
  // freed pages; the next transfer rebuilds and lands its own bytes.
  d.api->hang = false;
  std::vector<int32_t> src;
  d.Reserve("b", 2);
  ASSERT_TRUE(Transfer(p, d, "b", 2, &src).ok());
  ASSERT_TRUE(d.WaitDone("b").ok());
  EXPECT_TRUE(d.AllLanded("b", p, src));
  {
    absl::MutexLock l(&d.mu);
    const std::vector<int32_t>& b = d.pages["b"];
    const int64_t elem = DTypeSize(d.layout.dtype);
    for (int32_t page : reserved) {
      if (std::find(b.begin(), b.end(), page) != b.end()) continue;
      for (int layer = 0; layer < 3; ++layer) {
        const char* bytes = d.pool.data() + d.layout.PageOffset(layer, page) * elem;
        EXPECT_TRUE(
            std::all_of(bytes, bytes + d.layout.PageBytes(), [](char c) { return c == '\x5a'; }))
            << "page " << page;
      }
    }
  }
  EXPECT_EQ(p.api->inits.load(), 2);
  d.Finish("b");
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, DecodeDeathMidTransferFailsTheSenderAtOnce) {
  Prefill p(&world_, "GPU-0");
  auto d = std::make_unique<Decode>(&world_, "GPU-1");
  d->Reserve("a", 3);
  const std::vector<int32_t> src = p.Take(3);
  auto op = p.sender->Begin(d->receiver->address(), "a", p.layout, 3, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  FakeEvent computing;  // layer 0's sends are still in flight when the decode side dies
  ASSERT_TRUE((*op)->SendLayerAfterEvent(0, p.pool.data(), src, 0, &computing).ok());
  // The decode process dies: its GPU stops and its connections close.
  d->api->Kill();
  const std::string address = d->receiver->address();
  d->receiver.reset();
  const absl::Time start = absl::Now();
  absl::Status st = (*op)->SendLayer(1, p.pool.data(), src, 0);
  if (st.ok()) st = (*op)->SendLayer(2, p.pool.data(), src, 0);
  if (st.ok()) st = (*op)->Finish().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  op = absl::UnknownError("dropped");
  computing.fired.Notify();
  p.Release(src);
  EXPECT_EQ(p.api->aborts.load(), 1);
  EXPECT_EQ(p.nccl->NumComms(), 0);
  EXPECT_EQ(p.NumFree(), p.layout.num_pages);
}

TEST_F(NcclKvTransportTest, ARestartedDecodeWorkerGetsARebuiltCommunicator) {
  Prefill p(&world_, "GPU-0");
  auto d = std::make_unique<Decode>(&world_, "GPU-1");
  d->Reserve("a", 2);
  ASSERT_TRUE(Transfer(p, *d, "a", 2).ok());
  ASSERT_TRUE(d->WaitDone("a").ok());
  d->Finish("a");
  // The decode process dies while idle and comes back on the same port: the sender's
  // communicator is stale; the receiver refuses it (kNcclUse) and the pair rebuilds.
  int port = 0;
  {
    const std::string address = d->receiver->address();
    port = std::stoi(address.substr(address.rfind(':') + 1));
  }
  d->api->Kill();
  d.reset();
  d = std::make_unique<Decode>(&world_, "GPU-1", port);
  std::vector<int32_t> src;
  d->Reserve("b", 3);
  ASSERT_TRUE(Transfer(p, *d, "b", 3, &src).ok());
  ASSERT_TRUE(d->WaitDone("b").ok());
  EXPECT_TRUE(d->AllLanded("b", p, src));
  EXPECT_EQ(p.api->inits.load(), 2);
  EXPECT_EQ(p.api->aborts.load(), 1);  // the stale one
  EXPECT_EQ(d->api->inits.load(), 1);
  d->Finish("b");
  ExpectAllFree(p, *d);
}

TEST_F(NcclKvTransportTest, PrefillDeathMidTransferFailsTheReceiverAndFreesItsPages) {
  // A prefill process that dies after its first layer's sends: a raw connection speaking the
  // protocol (hello, init, one layer) that vanishes without an abort frame.
  Decode d(&world_, "GPU-1");
  auto dead = std::make_shared<FakeNccl>(&world_, "GPU-0");
  const std::vector<int32_t> reserved = d.Reserve("a", 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  std::vector<char> src(static_cast<size_t>(d.layout.PageBytes()) * 2, '\x11');
  {
    auto s = Connect(d.receiver->address(), deadline);
    ASSERT_TRUE(s.ok());
    kv_wire::Hello hello;
    hello.layout = d.layout;
    hello.num_pages = 2;
    hello.transfer_id = "a";
    hello.group = KvGroupShape::Single(d.layout);
    hello.nccl = kv_wire::NcclMode::kRequired;
    ASSERT_TRUE(
        kv_wire::WriteFrame(*s, kv_wire::FrameType::kHello, kv_wire::EncodeHello(hello), deadline)
            .ok());
    ASSERT_TRUE(kv_wire::ReadFrame(*s, deadline).ok());  // verdict
    ASSERT_TRUE(kv_wire::ReadFrame(*s, deadline).ok());  // pool
    auto id = dead->GetUniqueId();
    auto comm = dead->CommInitRank(*id, 2, 0, 0);
    ASSERT_TRUE(comm.ok());
    ASSERT_TRUE(kv_wire::WriteFrame(*s, kv_wire::FrameType::kNcclInit,
                                    kv_wire::EncodeNcclComm({"dead", 1, *id}), deadline)
                    .ok());
    auto verdict = kv_wire::ReadFrame(*s, deadline);
    ASSERT_TRUE(verdict.ok());
    ASSERT_TRUE(kv_wire::DecodeStatus(verdict->body).ok());
    ASSERT_TRUE(kv_wire::WriteFrame(*s, kv_wire::FrameType::kNcclLayer,
                                    kv_wire::EncodeNcclLayer({0, 0, 2, {1, 1}}), deadline)
                    .ok());
    dead->Kill();  // its one send never goes
    auto stream = dead->CreateStream(0);
    ASSERT_TRUE(dead->Send(src.data(), d.layout.PageBytes(), 1, *comm, *stream).ok());
  }  // the connection closes: the process is gone
  const absl::Time start = absl::Now();
  EXPECT_EQ(d.WaitDone("a").code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(d.api->aborts.load(), 1);  // its receives were in flight
  EXPECT_EQ(d.nccl->NumComms(), 0);
  EXPECT_EQ(d.NumFree(), d.layout.num_pages);
  EXPECT_EQ(d.receiver->NumPending(), 0);
}

TEST_F(NcclKvTransportTest, CancelDuringTheTransferReleasesAfterItAndKeepsTheCommunicator) {
  Prefill p(&world_, "GPU-0");
  Decode d(&world_, "GPU-1");
  d.Reserve("a", 3);
  const std::vector<int32_t> src = p.Take(3);
  auto op = p.sender->Begin(d.receiver->address(), "a", p.layout, 3, absl::Seconds(10));
  ASSERT_TRUE(op.ok()) << op.status();
  FakeEvent held;  // layer 1 is not computed yet: its receive is pending
  ASSERT_TRUE((*op)->SendLayer(0, p.pool.data(), src, 0).ok());
  ASSERT_TRUE((*op)->SendLayerAfterEvent(1, p.pool.data(), src, 0, &held).ok());
  absl::SleepFor(absl::Milliseconds(20));  // the receiver has read both frames
  absl::Notification released;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(d.Cancel("a", &released));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200));  // Cancel never waits for the sender
  EXPECT_FALSE(released.HasBeenNotified());                 // a receive may still land
  EXPECT_EQ(d.NumFree(), d.layout.num_pages - 3);
  held.fired.Notify();
  ASSERT_TRUE((*op)->SendLayer(2, p.pool.data(), src, 0).ok());
  EXPECT_EQ((*op)->Finish().status().code(), absl::StatusCode::kCancelled);
  op = absl::UnknownError("dropped");
  p.Release(src);
  EXPECT_TRUE(released.WaitForNotificationWithTimeout(kBound));
  // Every receive completed: the communicator stays, and the next transfer uses it.
  EXPECT_EQ(p.api->aborts.load() + d.api->aborts.load(), 0);
  d.Reserve("b", 2);
  ASSERT_TRUE(Transfer(p, d, "b", 2).ok());
  ASSERT_TRUE(d.WaitDone("b").ok());
  EXPECT_EQ(p.api->inits.load(), 1);
  d.Finish("b");
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, TwoPrefillAndTwoDecodeWorkersTransferAtOnceWithoutDeadlock) {
  Prefill p0(&world_, "GPU-0"), p1(&world_, "GPU-1");
  Decode d0(&world_, "GPU-2"), d1(&world_, "GPU-3");
  Prefill* prefills[] = {&p0, &p1};
  Decode* decodes[] = {&d0, &d1};
  constexpr int kThreads = 4;    // per prefill worker, as the prefill worker's transfer threads
  constexpr int kTransfers = 6;  // per thread
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int pi = 0; pi < 2; ++pi) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, pi, t] {
        Prefill& p = *prefills[pi];
        for (int k = 0; k < kTransfers; ++k) {
          Decode& d = *decodes[(t + k) % 2];
          const std::string id = absl::StrCat("p", pi, "-t", t, "-", k);
          const int n = 1 + (t + k) % 2;  // 4 threads x 2 pages at most: the 12-page pool
          d.Reserve(id, n);
          std::vector<int32_t> src;
          // Layer by layer, each after an event another thread fires (compute running ahead).
          const std::vector<int32_t> pages = p.Take(n);
          auto op = p.sender->Begin(d.receiver->address(), id, p.layout, n, absl::Seconds(20));
          absl::Status st = op.status();
          FakeEvent events[3];
          std::thread compute([&] {
            for (auto& e : events) {
              absl::SleepFor(absl::Microseconds(200));
              e.fired.Notify();
            }
          });
          for (int l = 0; st.ok() && l < 3; ++l) {
            st = (*op)->SendLayerAfterEvent(l, p.pool.data(), pages, 0, &events[l]);
          }
          if (st.ok()) st = (*op)->Finish().status();
          compute.join();
          op = absl::UnknownError("dropped");
          if (st.ok()) st = d.WaitDone(id);
          if (st.ok() && !d.AllLanded(id, p, pages)) st = absl::DataLossError("bytes differ");
          p.Release(pages);
          if (st.ok()) {
            d.Finish(id);
          } else {
            ADD_FAILURE() << id << ": " << st;
            ++failures;
          }
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // One communicator per pair, built once.
  for (Prefill* p : prefills) {
    EXPECT_EQ(p->api->inits.load(), 2);
    EXPECT_EQ(p->api->aborts.load(), 0);
    EXPECT_EQ(p->nccl->NumComms(), 2);
  }
  for (Decode* d : decodes) EXPECT_EQ(d->nccl->NumComms(), 2);
  for (Prefill* p : prefills) {
    for (Decode* d : decodes) ExpectAllFree(*p, *d);
  }
}

TEST_F(NcclKvTransportTest, SameGpuIsRefusedForNcclAndAutoFallsBackToTcp) {
  Decode d(&world_, "GPU-0");
  {
    Prefill p(&world_, "GPU-0");
    d.Reserve("a", 2);
    const absl::Status st = Transfer(p, d, "a", 2);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("on this GPU"), std::string::npos) << st;
    EXPECT_FALSE(d.WaitDone("a").ok());
    EXPECT_EQ(p.api->inits.load() + d.api->inits.load(), 0);
    ExpectAllFree(p, d);
  }
  Prefill p(&world_, "GPU-0", KvTransportKind::kAuto);
  std::vector<int32_t> src;
  d.Reserve("b", 2);
  ASSERT_TRUE(Transfer(p, d, "b", 2, &src).ok());
  ASSERT_TRUE(d.WaitDone("b").ok());
  EXPECT_TRUE(d.AllLanded("b", p, src));
  {
    absl::MutexLock l(&d.mu);
    EXPECT_EQ(d.stats["b"].path, "tcp");
  }
  d.Finish("b");
  ExpectAllFree(p, d);
}

TEST_F(NcclKvTransportTest, AutoPicksNcclForAnotherGpuAndTcpForAReceiverWithoutNccl) {
  Prefill p(&world_, "GPU-0", KvTransportKind::kAuto);
  {
    Decode d(&world_, "GPU-1");
    d.Reserve("a", 2);
    ASSERT_TRUE(Transfer(p, d, "a", 2).ok());
    ASSERT_TRUE(d.WaitDone("a").ok());
    absl::MutexLock l(&d.mu);
    EXPECT_EQ(d.stats["a"].path, "nccl");
  }
  Decode plain(&world_, "GPU-1", 0, /*with_nccl=*/false);
  std::vector<int32_t> src;
  plain.Reserve("b", 2);
  ASSERT_TRUE(Transfer(p, plain, "b", 2, &src).ok());
  ASSERT_TRUE(plain.WaitDone("b").ok());
  EXPECT_TRUE(plain.AllLanded("b", p, src));
  {
    absl::MutexLock l(&plain.mu);
    EXPECT_EQ(plain.stats["b"].path, "tcp");
  }
  plain.Finish("b");
  // ... and kNccl to that receiver is refused on both sides at once.
  Prefill strict(&world_, "GPU-2");
  plain.Reserve("c", 1);
  const absl::Status st = Transfer(strict, plain, "c", 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("takes no NCCL"), std::string::npos) << st;
  EXPECT_EQ(plain.WaitDone("c").code(), absl::StatusCode::kFailedPrecondition);
  ExpectAllFree(strict, plain);
}

}  // namespace
}  // namespace tandem
