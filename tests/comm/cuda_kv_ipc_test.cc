// The CUDA IPC KV transport on one GPU, across two processes (label gpu; skips without a
// device): this process is the decode side (a device pool exported once, a TcpKvReceiver),
// and it starts itself again as the prefill side (CudaKvIpcChild.Send: its own device pool,
// TcpKvSender with kv_transport ipc). Qwen3-8B KV shapes (36 layers, 8 KV heads, head_dim
// 128, bf16, 16-token pages), an 8k-token prompt (512 pages, 1.2 GB):
//   - exactness: every byte of the 512 reserved pages equals the sender's page, and every byte
//     of the pages not reserved is untouched, for reserved pages in one run and scattered, and
//     for a layer-wise push (below), six transfers into disjoint pages;
//   - bench: the sender prints the transfer's GB/s (Begin to Finish) for both page orders, every
//     layer stored before the transfer: the first transfer (contiguous: it maps the peer's pool,
//     a new connection, hello and grant), a cold scattered one (a new connection, hello and grant
//     to a pool already mapped: a sender that keeps no warm connection) and three warm scattered
//     ones (the first sender's connection kept warm: one kNext round trip that brings the grant,
//     comm/kv_wire.h version 7), each split into Begin / enqueue (36 SendLayer calls, which the
//     op coalesces into one launch for the 36 layers) / Finish (the wait for the copies still in
//     flight, then the confirmation's round trip);
//   - layer-wise: a compute stream stores each layer of the source pages (from a pristine copy,
//     kComputeCopies page copies per layer, standing in for the layer's compute) and records
//     the layer's event; the layer's IPC copy is enqueued at once, ordered after that event
//     (SendLayerAfterEvent), with no host wait. The source pool holds other bytes until the
//     compute stores them, so a copy that ran before its event would fail the exactness check.
//     Printed: the compute's time, and the exposed transfer time: from the last layer's
//     event completing (seen by the host) to Finish returning (the decode side committed the
//     pages and can run the request).
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/kv_ipc.h"
#include "comm/tcp_kv_receiver.h"
#include "comm/tcp_kv_sender.h"
#include "engine/cuda/cuda_device.h"
#include "engine/model/ops.h"
#include "gtest/gtest.h"
#include "kernels/kv_page_copy/kv_page_copy.h"

extern char** environ;

namespace tandem {
namespace {

constexpr int kTokens = 8192;
constexpr int kPageSize = 16;
constexpr int kPages = kTokens / kPageSize;  // 512 pages per layer
// Page copies of a layer's 512 pages per layer of the stand-in compute (a few ms per layer on
// an H200, the order of a layer of an 8k-token Qwen3-8B prefill).
constexpr int kComputeCopies = 192;
// Room for six transfers of 512 pages, into disjoint pages from 40 + 540 * c (DstPages).
constexpr int kReceiverPages = 3280;

KvLayout Qwen3Layout(int num_pages) {
  KvLayout l;
  l.num_layers = 36;
  l.num_pages = num_pages;
  l.page_size = kPageSize;
  l.num_kv_heads = 8;
  l.head_dim = 128;
  l.dtype = DType::kBF16;
  return l;
}

// The byte pattern of the sender's pool (and of the receiver's untouched pages, seed 2).
void Fill(std::vector<char>& bytes, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
}

// Sender-side page order and receiver-side page order of each case.
std::vector<int32_t> SrcPages() {
  std::vector<int32_t> p(kPages);
  std::iota(p.begin(), p.end(), 3);  // pages 3 .. 514 of a 520-page pool
  return p;
}
// The six transfers, into disjoint receiver pages of a kReceiverPages pool: contiguous
// 40 .. 551 (the first: maps the pool), then four scattered ones (each a shuffle of its own 512
// pages): one cold (a sender keeping no warm connection) and three warm (so the bench has a
// median), and the layer-wise one (warm too).
constexpr const char* kCases[] = {"contiguous",       "scattered_cold",   "scattered_warm",
                                  "scattered_warm_2", "scattered_warm_3", "layerwise"};
constexpr int kNumCases = 6;
constexpr int kColdCase = 1;  // by the sender that keeps no connection warm
std::vector<int32_t> DstPages(int c) {
  std::vector<int32_t> p(kPages);
  std::iota(p.begin(), p.end(), 40 + 540 * c);
  if (c > 0) std::shuffle(p.begin(), p.end(), std::mt19937(9 + 2 * c));
  return p;
}

absl::StatusOr<std::unique_ptr<DeviceAllocation>> DevicePool(const KvLayout& layout, uint64_t seed,
                                                             std::vector<char>* host) {
  absl::StatusOr<std::unique_ptr<Ops>> ops = MakeCudaOps();
  if (!ops.ok()) return ops.status();
  absl::StatusOr<std::unique_ptr<DeviceAllocation>> pool = (*ops)->Allocate(layout.PoolBytes());
  if (!pool.ok()) return pool.status();
  host->resize(static_cast<size_t>(layout.PoolBytes()));
  Fill(*host, seed);
  absl::Status st = CopyDeviceMemory((*pool)->data(), host->data(), layout.PoolBytes());
  if (!st.ok()) return st;
  return pool;
}

// The prefill side, run only as the child this test starts (TANDEM_IPC_CHILD set).
TEST(CudaKvIpcChild, Send) {
  const char* peer = std::getenv("TANDEM_IPC_CHILD");
  if (peer == nullptr) GTEST_SKIP() << "runs as the child of CudaKvIpc tests";
  const KvLayout layout = Qwen3Layout(520);
  std::vector<char> host;
  auto pool = DevicePool(layout, 1, &host);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto ipc = MakeCudaKvIpc();
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  std::shared_ptr<KvIpcDevice> device(*std::move(ipc));
  TcpKvSender sender({}, "", KvTransportKind::kIpc, device);  // keeps its connection warm
  TcpKvSender cold({}, "", KvTransportKind::kIpc, device);    // a connection per transfer
  cold.SetWarmConnections(0, absl::Seconds(30));
  const std::vector<int32_t> src = SrcPages();
  std::vector<double> warm_gbps;
  for (int c = 0; c + 1 < kNumCases; ++c) {
    const char* id = kCases[c];
    TcpKvSender& by = c == kColdCase ? cold : sender;
    const absl::Time start = absl::Now();
    auto op = by.Begin(peer, id, layout, kPages, absl::Seconds(60));
    ASSERT_TRUE(op.ok()) << op.status();
    const absl::Time granted = absl::Now();
    for (int l = 0; l < layout.num_layers; ++l) {
      ASSERT_TRUE((*op)->SendLayer(l, (*pool)->data(), src, 0).ok());
    }
    const absl::Time enqueued = absl::Now();
    auto stats = (*op)->Finish();
    const absl::Time finished = absl::Now();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->warm, c > kColdCase) << id;  // the warm connection was reused
    const double s = absl::ToDoubleSeconds(finished - start);
    const double finish_ms = absl::ToDoubleMilliseconds(finished - enqueued);
    const double wait_ms = absl::ToDoubleMilliseconds(stats->copy_wait);
    std::printf(
        "BENCH cuda_ipc %s (%s): %d tokens, %d layers, %.3f GB in %.3f ms = %.1f GB/s (Begin "
        "%.3f ms, enqueue %.3f ms, Finish %.3f ms = copy wait %.3f + confirm %.3f)\n",
        id, stats->warm ? "warm" : "cold", kTokens, layout.num_layers, stats->bytes / 1e9, s * 1e3,
        stats->bytes / s / 1e9, absl::ToDoubleMilliseconds(granted - start),
        absl::ToDoubleMilliseconds(enqueued - granted), finish_ms, wait_ms, finish_ms - wait_ms);
    std::fflush(stdout);
    if (stats->warm) warm_gbps.push_back(stats->bytes / s / 1e9);
  }
  ASSERT_EQ(warm_gbps.size(), 3u);
  std::sort(warm_gbps.begin(), warm_gbps.end());
  std::printf("BENCH cuda_ipc warm scattered median: %.1f GB/s (target 1500)\n", warm_gbps[1]);
  const TcpKvSender::ConnectionCounters counters = sender.connection_counters();
  EXPECT_EQ(counters.opened, 1);
  EXPECT_EQ(counters.reused, 3);

  // The copy kernel alone, in this process (no IPC mapping, no transport): the 36 layers of
  // 512 pages into a shuffle of the same pages of a second pool, timed by events, median of 5;
  // one launch per layer (as layer-wise pushes go), then one launch for all 36 layers (as the
  // transfers above went: SendLayer of stored layers, coalesced by the op).
  {
    std::vector<char> dst_host;
    auto dst = DevicePool(layout, 4, &dst_host);
    ASSERT_TRUE(dst.ok()) << dst.status();
    std::vector<int32_t> shuffled = src;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(5));
    KvPageCopyArgs a;
    a.page_bytes = layout.PageBytes();
    a.num_pages = kPages;
    std::copy(src.begin(), src.end(), a.src_pages);
    std::copy(shuffled.begin(), shuffled.end(), a.dst_pages);
    const int64_t elem = DTypeSize(layout.dtype);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
    for (bool one_launch : {false, true}) {
      std::vector<float> ms;
      for (int round = 0; round < 6; ++round) {
        ASSERT_EQ(cudaEventRecord(e0, nullptr), cudaSuccess);
        if (one_launch) {
          a.dst_layer = (*dst)->data();
          a.src_layer = (*pool)->data();
          a.num_layers = layout.num_layers;
          a.dst_layer_bytes = layout.LayerBytes();
          a.src_layer_bytes = layout.LayerBytes();
          ASSERT_TRUE(KvPageCopy(a, nullptr).ok());
        } else {
          a.num_layers = 1;
          for (int l = 0; l < layout.num_layers; ++l) {
            a.dst_layer = static_cast<char*>((*dst)->data()) + layout.PageOffset(l, 0) * elem;
            a.src_layer =
                static_cast<const char*>((*pool)->data()) + layout.PageOffset(l, 0) * elem;
            ASSERT_TRUE(KvPageCopy(a, nullptr).ok());
          }
        }
        ASSERT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
        ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
        float t = 0;
        ASSERT_EQ(cudaEventElapsedTime(&t, e0, e1), cudaSuccess);
        if (round > 0) ms.push_back(t);  // round 0 warms up
      }
      std::sort(ms.begin(), ms.end());
      const double bytes = static_cast<double>(layout.PageBytes()) * kPages * layout.num_layers;
      std::printf(
          "BENCH kv_page_copy local (%s): %d layers x %d pages, %.3f GB in %.3f ms (median of "
          "%zu) = %.1f GB/s of pages (reads + writes %.1f GB/s)\n",
          one_launch ? "one launch" : "a launch per layer", layout.num_layers, kPages, bytes / 1e9,
          ms[ms.size() / 2], ms.size(), bytes / (ms[ms.size() / 2] * 1e-3) / 1e9,
          2 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9);
      std::fflush(stdout);
    }
    // The one-launch copy moved the same bytes as the per-layer one.
    std::vector<char> got(dst_host.size());
    ASSERT_TRUE(CopyDeviceMemory(got.data(), (*dst)->data(), layout.PoolBytes()).ok());
    std::vector<char> want = dst_host;
    for (int l = 0; l < layout.num_layers; ++l) {
      for (int i = 0; i < kPages; ++i) {
        std::memcpy(want.data() + layout.PageOffset(l, shuffled[i]) * elem,
                    host.data() + layout.PageOffset(l, src[i]) * elem, layout.PageBytes());
      }
    }
    EXPECT_TRUE(got == want);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }

  // Layer-wise: `scratch` holds other bytes (seed 3) until the compute stream stores each layer
  // of the source pages from the pristine pool.
  std::vector<char> scratch_host;
  auto scratch = DevicePool(layout, 3, &scratch_host);
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  std::vector<cudaEvent_t> events(static_cast<size_t>(layout.num_layers));
  for (cudaEvent_t& e : events) ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  cudaEvent_t compute_start = nullptr;
  ASSERT_EQ(cudaEventCreate(&compute_start), cudaSuccess);
  auto op = sender.Begin(peer, kCases[kNumCases - 1], layout, kPages, absl::Seconds(60));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE((*op)->OrdersAfterEvents());
  const int64_t elem = DTypeSize(layout.dtype);
  KvPageCopyArgs store;
  store.page_bytes = layout.PageBytes();
  store.num_pages = kPages;
  std::copy(src.begin(), src.end(), store.dst_pages);
  std::copy(src.begin(), src.end(), store.src_pages);
  ASSERT_EQ(cudaEventRecord(compute_start, compute), cudaSuccess);
  for (int l = 0; l < layout.num_layers; ++l) {
    store.dst_layer = static_cast<char*>((*scratch)->data()) + layout.PageOffset(l, 0) * elem;
    store.src_layer = static_cast<const char*>((*pool)->data()) + layout.PageOffset(l, 0) * elem;
    for (int i = 0; i < kComputeCopies; ++i) ASSERT_TRUE(KvPageCopy(store, compute).ok());
    ASSERT_EQ(cudaEventRecord(events[l], compute), cudaSuccess);
    ASSERT_TRUE((*op)->SendLayerAfterEvent(l, (*scratch)->data(), src, 0, events[l]).ok());
  }
  ASSERT_EQ(cudaEventSynchronize(events.back()), cudaSuccess);
  const absl::Time last_layer = absl::Now();
  auto stats = (*op)->Finish();
  const absl::Duration exposed = absl::Now() - last_layer;
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->warm);
  float compute_ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&compute_ms, compute_start, events.back()), cudaSuccess);
  std::printf(
      "BENCH cuda_ipc layerwise: %d tokens, %d layers, %.3f GB; compute %.2f ms; exposed "
      "transfer (last layer computed -> decode committed) %.3f ms = %.2f%% of the compute\n",
      kTokens, layout.num_layers, stats->bytes / 1e9, compute_ms,
      absl::ToDoubleMilliseconds(exposed), 100 * absl::ToDoubleMilliseconds(exposed) / compute_ms);
  std::fflush(stdout);
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  cudaEventDestroy(compute_start);
  cudaStreamDestroy(compute);
}

struct Done {
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::Status>> got ABSL_GUARDED_BY(mu);
};

TEST(CudaKvIpc, TwoProcessesOnOneGpuLandEveryByteExactly) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const KvLayout layout = Qwen3Layout(kReceiverPages);
  std::vector<char> before;
  auto pool = DevicePool(layout, 2, &before);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto ipc = MakeCudaKvIpc();
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  auto handle = (*ipc)->ExportPool((*pool)->data());
  ASSERT_TRUE(handle.ok()) << handle.status();
  Done done;
  auto receiver = TcpKvReceiver::Create(
      "127.0.0.1", 0, (*pool)->data(), layout,
      [&done](const std::string& id, absl::Status st, KvTransferStats) {
        absl::MutexLock l(&done.mu);
        done.got.emplace_back(id, st);
      },
      Clock::Real(), [](void* d, const void* s, int64_t n) { return CopyDeviceMemory(d, s, n); });
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  (*receiver)->SetIpcExport(*handle);
  for (int c = 0; c < kNumCases; ++c) {
    ASSERT_TRUE((*receiver)->Expect(kCases[c], DstPages(c), absl::Now() + absl::Seconds(120)).ok());
  }

  // The prefill side: this binary again, as CudaKvIpcChild.Send.
  const std::string self = "/proc/self/exe";
  std::string filter = "--gtest_filter=CudaKvIpcChild.Send";
  std::vector<char*> argv = {const_cast<char*>(self.c_str()), filter.data(), nullptr};
  std::vector<std::string> env_strings = {
      absl::StrCat("TANDEM_IPC_CHILD=", (*receiver)->address())};
  for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, self.c_str(), nullptr, nullptr, argv.data(), envp.data()), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "prefill child failed";
  {
    absl::MutexLock l(&done.mu);
    auto all = [&done]()
                   ABSL_SHARED_LOCKS_REQUIRED(done.mu) { return done.got.size() == kNumCases; };
    ASSERT_TRUE(done.mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30)));
    for (const auto& [id, st] : done.got) EXPECT_TRUE(st.ok()) << id << ": " << st;
  }

  // What the pool must hold: `before`, with the sender's pages (its pattern, seed 1) in the
  // reserved pages of each case.
  const KvLayout src_layout = Qwen3Layout(520);
  std::vector<char> src(static_cast<size_t>(src_layout.PoolBytes()));
  Fill(src, 1);
  std::vector<char> want = before;
  const int64_t elem = DTypeSize(layout.dtype);
  const std::vector<int32_t> src_pages = SrcPages();
  for (int c = 0; c < kNumCases; ++c) {
    const std::vector<int32_t> dst_pages = DstPages(c);
    for (int l = 0; l < layout.num_layers; ++l) {
      for (int i = 0; i < kPages; ++i) {
        std::memcpy(want.data() + layout.PageOffset(l, dst_pages[i]) * elem,
                    src.data() + src_layout.PageOffset(l, src_pages[i]) * elem, layout.PageBytes());
      }
    }
  }
  std::vector<char> got(want.size());
  ASSERT_TRUE(CopyDeviceMemory(got.data(), (*pool)->data(), layout.PoolBytes()).ok());
  size_t mismatched_pages = 0;
  for (int l = 0; l < layout.num_layers; ++l) {
    for (int p = 0; p < layout.num_pages; ++p) {
      const int64_t off = layout.PageOffset(l, p) * elem;
      mismatched_pages += std::memcmp(got.data() + off, want.data() + off, layout.PageBytes()) != 0;
    }
  }
  EXPECT_EQ(mismatched_pages, 0u);
}

}  // namespace
}  // namespace tandem
