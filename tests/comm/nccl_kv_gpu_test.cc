// The NCCL KV transport on two GPUs (label gpu; skips, saying so, with fewer than two: NCCL runs
// one rank per GPU): the real libnccl implementation (engine/cuda/cuda_nccl.cc) under the real
// TcpKvSender / TcpKvReceiver over loopback TCP, in one process: the decode side's pool on GPU 1
// (its receiver's connection thread is rank 1), the prefill side's on GPU 0 (this thread is
// rank 0). Qwen3-8B KV shapes (36 layers, 8 KV heads, head_dim 128, bf16, 16-token pages), an
// 8k-token prompt (512 pages, 1.2 GB):
//   - exactness: every byte of the reserved pages equals the sender's page, every byte of the
//     pages not reserved is untouched, for reserved pages scattered (one ncclSend per page) and
//     in one run (one per layer), and for a layer-wise push;
//   - the first transfer builds the pair's communicator, the later ones reuse it;
//   - layer-wise: a compute stream on GPU 0 stores each layer of the source pages (from a
//     pristine copy) and records the layer's event; the layer's sends are enqueued at once,
//     ordered after that event (SendLayerAfterEvent), with no host wait. The source pool holds
//     zeros until the compute stores a layer, so a send that ran before its event fails the
//     exactness check.
//   Printed: each transfer's time (Begin to Finish) and GB/s.
#include <cuda_runtime.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/nccl_api.h"
#include "comm/nccl_kv_transport.h"
#include "comm/tcp_kv_receiver.h"
#include "comm/tcp_kv_sender.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int kPages = 512;  // an 8k-token prompt of 16-token pages
constexpr int kSenderPages = 600;
constexpr int kReceiverPages = 1650;

KvLayout Qwen3Layout(int num_pages) {
  KvLayout l;
  l.num_layers = 36;
  l.num_pages = num_pages;
  l.page_size = 16;
  l.num_kv_heads = 8;
  l.head_dim = 128;
  l.dtype = DType::kBF16;
  return l;
}

#define CUDA_OK(expr)                                                               \
  do {                                                                              \
    const cudaError_t cuda_ok_ = (expr);                                            \
    ASSERT_EQ(cuda_ok_, cudaSuccess) << #expr ": " << cudaGetErrorString(cuda_ok_); \
  } while (0)

struct Outcome {
  absl::Mutex mu;
  bool have ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  KvTransferStats stats ABSL_GUARDED_BY(mu);
  absl::Status Wait() {
    absl::MutexLock l(&mu);
    auto has = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return have; };
    if (!mu.AwaitWithTimeout(absl::Condition(&has), absl::Seconds(60))) {
      return absl::DeadlineExceededError("no outcome");
    }
    have = false;
    return status;
  }
};

class NcclKvGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    (void)cudaGetLastError();
    if (n < 2) {
      GTEST_SKIP() << "needs two GPUs, found " << n
                   << ": NCCL runs one rank per GPU (run it on a machine with two)";
    }
    // Point-to-point needs no NVLink multicast (NVLS): keep it off, as the GPU hosts ask.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    src_layout_ = Qwen3Layout(kSenderPages);
    dst_layout_ = Qwen3Layout(kReceiverPages);
    layer_bytes_ = src_layout_.PageBytes() * kSenderPages;
    // Source: a pattern per byte, layer and page (host copy kept for the checks).
    host_src_.resize(static_cast<size_t>(src_layout_.PoolBytes()));
    for (size_t i = 0; i < host_src_.size(); ++i) {
      host_src_[i] = static_cast<char>((i * 2654435761u) >> 13);
    }
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc(&src_, host_src_.size()));
    CUDA_OK(cudaMalloc(&pristine_, host_src_.size()));
    CUDA_OK(cudaMemcpy(pristine_, host_src_.data(), host_src_.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(src_, host_src_.data(), host_src_.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMalloc(&dst_, static_cast<size_t>(dst_layout_.PoolBytes())));
    CUDA_OK(cudaMemset(dst_, 0x5a, static_cast<size_t>(dst_layout_.PoolBytes())));
    CUDA_OK(cudaDeviceSynchronize());

    auto api = MakeCudaNccl();
    ASSERT_TRUE(api.ok()) << api.status();
    auto send_nccl = NcclKvTransport::Create(*api, src_);
    auto recv_nccl = NcclKvTransport::Create(*api, dst_);
    ASSERT_TRUE(send_nccl.ok()) << send_nccl.status();
    ASSERT_TRUE(recv_nccl.ok()) << recv_nccl.status();
    ASSERT_NE((*send_nccl)->device_id(), (*recv_nccl)->device_id());
    send_nccl_ = *send_nccl;
    recv_nccl_ = *recv_nccl;
    auto r =
        TcpKvReceiver::Create("127.0.0.1", 0, dst_, dst_layout_,
                              [this](const std::string&, absl::Status st, KvTransferStats stats) {
                                absl::MutexLock l(&outcome_.mu);
                                outcome_.have = true;
                                outcome_.status = st;
                                outcome_.stats = stats;
                              });
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
    receiver_->SetNccl(recv_nccl_);
    sender_ = std::make_unique<TcpKvSender>(KvPoolCopy{}, "", KvTransportKind::kNccl, nullptr,
                                            send_nccl_);
  }
  void TearDown() override {
    sender_.reset();
    receiver_.reset();
    send_nccl_.reset();
    recv_nccl_.reset();
    if (src_ != nullptr) cudaFree(src_);
    if (pristine_ != nullptr) cudaFree(pristine_);
    if (dst_ != nullptr) cudaFree(dst_);
  }

  // Moves source pages 0..kPages-1 into `dst_pages`; every layer at once (stored already), or
  // layer by layer behind a compute stream (`layerwise`). Returns the seconds Begin..Finish.
  double Move(const std::string& id, const std::vector<int32_t>& dst_pages, bool layerwise) {
    std::vector<int32_t> src_pages(kPages);
    std::iota(src_pages.begin(), src_pages.end(), 0);
    EXPECT_TRUE(receiver_->Expect(id, dst_pages, absl::Now() + absl::Seconds(60)).ok());
    cudaStream_t compute = nullptr;
    std::vector<cudaEvent_t> events(src_layout_.num_layers, nullptr);
    cudaSetDevice(0);
    if (layerwise) {
      cudaMemset(src_, 0, host_src_.size());
      cudaDeviceSynchronize();
      cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
      for (auto& e : events) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    }
    const absl::Time start = absl::Now();
    auto op = sender_->Begin(receiver_->address(), id, src_layout_, kPages, absl::Seconds(60));
    EXPECT_TRUE(op.ok()) << op.status();
    if (!op.ok()) return 0;
    const int64_t elem = DTypeSize(src_layout_.dtype);
    for (int l = 0; l < src_layout_.num_layers; ++l) {
      absl::Status st;
      if (layerwise) {
        const int64_t off = src_layout_.PageOffset(l, 0) * elem;
        cudaMemcpyAsync(static_cast<char*>(src_) + off, static_cast<char*>(pristine_) + off,
                        static_cast<size_t>(layer_bytes_), cudaMemcpyDeviceToDevice, compute);
        cudaEventRecord(events[l], compute);
        st = (*op)->SendLayerAfterEvent(l, src_, src_pages, 0, events[l]);
      } else {
        st = (*op)->SendLayer(l, src_, src_pages, 0);
      }
      EXPECT_TRUE(st.ok()) << st;
    }
    absl::StatusOr<KvTransferStats> stats = (*op)->Finish();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (stats.ok()) {
      EXPECT_EQ(stats->path, "nccl");
    }
    EXPECT_TRUE(outcome_.Wait().ok());
    if (layerwise) {
      cudaStreamSynchronize(compute);
      for (auto& e : events) cudaEventDestroy(e);
      cudaStreamDestroy(compute);
    }
    return seconds;
  }

  // Every reserved page holds its source page, every other page still 0x5a.
  void ExpectLanded(const std::vector<int32_t>& dst_pages) {
    std::vector<int> src_of(kReceiverPages, -1);
    for (int i = 0; i < kPages; ++i) src_of[dst_pages[i]] = i;
    const int64_t elem = DTypeSize(dst_layout_.dtype);
    const size_t page = static_cast<size_t>(dst_layout_.PageBytes());
    std::vector<char> layer(page * kReceiverPages);
    std::vector<char> untouched(page, '\x5a');
    int bad = 0;
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    for (int l = 0; l < dst_layout_.num_layers && bad < 5; ++l) {
      ASSERT_EQ(
          cudaMemcpy(layer.data(), static_cast<char*>(dst_) + dst_layout_.PageOffset(l, 0) * elem,
                     layer.size(), cudaMemcpyDeviceToHost),
          cudaSuccess);
      for (int p = 0; p < kReceiverPages && bad < 5; ++p) {
        const char* want = src_of[p] < 0
                               ? untouched.data()
                               : host_src_.data() + src_layout_.PageOffset(l, src_of[p]) * elem;
        if (std::memcmp(layer.data() + page * p, want, page) != 0) {
          ADD_FAILURE() << "layer " << l << " page " << p << " (source index " << src_of[p]
                        << ") differs";
          ++bad;
        }
      }
    }
  }
  // Back to 0x5a for the next transfer's untouched check.
  void ResetDestination() {
    cudaSetDevice(1);
    cudaMemset(dst_, 0x5a, static_cast<size_t>(dst_layout_.PoolBytes()));
    cudaDeviceSynchronize();
  }

  KvLayout src_layout_, dst_layout_;
  int64_t layer_bytes_ = 0;
  std::vector<char> host_src_;
  void* src_ = nullptr;
  void* pristine_ = nullptr;
  void* dst_ = nullptr;
  std::shared_ptr<NcclKvTransport> send_nccl_, recv_nccl_;
  std::unique_ptr<TcpKvReceiver> receiver_;
  std::unique_ptr<TcpKvSender> sender_;
  Outcome outcome_;
};

TEST_F(NcclKvGpuTest, PagesMoveBetweenTwoGpusByteExact) {
  const double gb =
      static_cast<double>(src_layout_.PageBytes()) * kPages * src_layout_.num_layers / 1e9;
  std::vector<int32_t> scattered(kReceiverPages);
  std::iota(scattered.begin(), scattered.end(), 0);
  std::shuffle(scattered.begin(), scattered.end(), std::mt19937(7));
  scattered.resize(kPages);
  std::vector<int32_t> run(kPages);
  std::iota(run.begin(), run.end(), 1000);

  const double first = Move("scattered-first", scattered, false);  // builds the communicator
  ExpectLanded(scattered);
  std::printf("nccl GPU0->GPU1 first transfer (communicator init), scattered pages: %.3f ms\n",
              first * 1e3);
  ResetDestination();
  const double s = Move("scattered", scattered, false);
  ExpectLanded(scattered);
  ResetDestination();
  const double c = Move("contiguous", run, false);
  ExpectLanded(run);
  ResetDestination();
  const double lw = Move("layerwise", run, true);
  ExpectLanded(run);
  std::printf(
      "nccl GPU0->GPU1 %.3f GB: scattered %.3f ms = %.1f GB/s; contiguous %.3f ms = "
      "%.1f GB/s; layer-wise behind a compute stream %.3f ms\n",
      gb, s * 1e3, gb / s, c * 1e3, gb / c, lw * 1e3);
  EXPECT_EQ(send_nccl_->NumComms(), 1);  // one communicator for the pair, reused
  EXPECT_EQ(recv_nccl_->NumComms(), 1);
}

}  // namespace
}  // namespace tandem
