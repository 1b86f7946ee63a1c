// The device barrier kernel (kernels/peer_barrier/peer_barrier.h) on GPU 0, each rank on a
// stream of its own (label gpu; part of engine_cuda_tp_test): N = 2, 4 and 8 ranks pass 2000
// barriers each, launched back to back with no host synchronisation between them, every epoch
// counted and no error; the abort word (host-mapped memory written by the host) releases a rank
// spinning for a peer that never comes; the deadline ends the wait on its own and sets the
// abort word. Then the peer communicator over it inside per-rank CUDA graphs: each rank captures
// one all-reduce into a graph of its own, and replays interleaved with eager all-reduces (one
// epoch count for both) multiply the buffers exactly by N each time, on every rank.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "base/check.h"
#include "comm/group/peer_communicator.h"
#include "engine/cuda/cuda_group.h"
#include "gtest/gtest.h"
#include "kernels/peer_barrier/peer_barrier.h"
#include "tests/engine/cuda_skip.h"

namespace tandem {
namespace {

#define CUDA_OK(expr) CHECK_EQ((expr), cudaSuccess) << #expr

// Barrier memory of n ranks on GPU 0: [rank][epoch | slots] on the device, abort | errors in
// host-mapped memory, and a stream per rank.
struct DeviceWords {
  explicit DeviceWords(int n) : n(n) {
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc(&device, n * kStride * sizeof(uint32_t)));
    CUDA_OK(cudaMemset(device, 0, n * kStride * sizeof(uint32_t)));
    CUDA_OK(cudaHostAlloc(&host, (1 + n) * sizeof(int32_t), cudaHostAllocMapped));
    for (int i = 0; i <= n; ++i) host[i] = 0;
    streams.resize(n);
    for (cudaStream_t& s : streams) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaDeviceSynchronize());
  }
  ~DeviceWords() {
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    cudaFree(device);
    cudaFreeHost(host);
  }
  PeerBarrierArgs For(int rank, int64_t timeout_ns) const {
    PeerBarrierArgs a;
    a.epoch = device + rank * kStride;
    for (int q = 0; q < n; ++q) a.slots[q] = device + q * kStride + 1;
    a.rank = rank;
    a.num_ranks = n;
    a.abort = host;
    a.error = host + 1 + rank;
    a.timeout_ns = timeout_ns;
    return a;
  }
  uint32_t Epoch(int rank) const {
    uint32_t e = 0;
    CUDA_OK(cudaMemcpy(&e, device + rank * kStride, sizeof(e), cudaMemcpyDeviceToHost));
    return e;
  }
  int32_t Abort() const { return reinterpret_cast<volatile int32_t*>(host)[0]; }
  int32_t Error(int rank) const { return reinterpret_cast<volatile int32_t*>(host)[1 + rank]; }

  static constexpr int kStride = 1 + kMaxPeerBarrierRanks;
  int n;
  uint32_t* device = nullptr;
  int32_t* host = nullptr;
  std::vector<cudaStream_t> streams;
};

constexpr int64_t kLongTimeoutNs = int64_t{20} * 1000 * 1000 * 1000;

TEST(CudaPeerBarrierTest, RanksOnOneGpuPassThousandsOfEpochs) {
  SKIP_WITHOUT_GPU();
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    DeviceWords words(n);
    constexpr int kEpochs = 2000;
    // Round by round, so each rank's barrier k waits for launches the host makes after its own
    // (rank by rank would fill a stream's launch queue while its first barrier waits for a
    // peer not launched yet: the host would block in the launch).
    for (int k = 0; k < kEpochs; ++k) {
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(PeerBarrier(words.For(r, kLongTimeoutNs), words.streams[r]).ok());
      }
    }
    const auto start = std::chrono::steady_clock::now();
    for (cudaStream_t s : words.streams) CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(words.Epoch(r), uint32_t{kEpochs}) << "rank " << r;
      EXPECT_EQ(words.Error(r), kPeerBarrierOk) << "rank " << r;
    }
    EXPECT_EQ(words.Abort(), 0);
  }
}

TEST(CudaPeerBarrierTest, TheAbortWordReleasesASpinningRank) {
  SKIP_WITHOUT_GPU();
  DeviceWords words(2);
  ASSERT_TRUE(PeerBarrier(words.For(0, kLongTimeoutNs), words.streams[0]).ok());  // rank 1 never
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(cudaStreamQuery(words.streams[0]), cudaErrorNotReady) << "it did not wait";
  const auto start = std::chrono::steady_clock::now();
  reinterpret_cast<volatile int32_t*>(words.host)[0] = 1;
  CUDA_OK(cudaStreamSynchronize(words.streams[0]));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(words.Error(0), kPeerBarrierAborted);
  EXPECT_EQ(words.Error(1), kPeerBarrierOk);
}

TEST(CudaPeerBarrierTest, TheDeadlineEndsTheWaitAndSetsTheAbortWord) {
  SKIP_WITHOUT_GPU();
  DeviceWords words(3);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(PeerBarrier(words.For(2, int64_t{300} * 1000 * 1000), words.streams[2]).ok());
  CUDA_OK(cudaStreamSynchronize(words.streams[2]));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_EQ(words.Error(2), kPeerBarrierTimedOut);
  EXPECT_EQ(words.Abort(), 1);
}

TEST(CudaPeerBarrierTest, PerRankGraphsOfAnAllReduceReplayWithEagerCallsBetween) {
  SKIP_WITHOUT_GPU();
  for (int n : {2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    std::vector<CudaRankOps> ops;
    std::vector<PeerRank> places;
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<CudaRankOps> o = MakeCudaRankOps(0);
      CHECK_OK(o.status());
      places.push_back(PeerRank{0, o->stream});
      ops.push_back(*std::move(o));
    }
    absl::StatusOr<std::shared_ptr<PeerCommGroup>> group =
        PeerCommGroup::Create(MakeCudaPeerApi(), places);
    ASSERT_TRUE(group.ok()) << group.status();
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < n; ++r) comms.push_back((*group)->ForRank(r));
    constexpr int64_t kCount = 3001;
    // x <- n·x per all-reduce, from 1: n^k stays exact in f32 while below 2^127.
    const int rounds = n == 2 ? 50 : 25;  // a replay and an eager call each: 2 · rounds
    std::vector<std::vector<float>> got(n, std::vector<float>(kCount));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        CHECK_OK(SetCudaDevice(0));
        cudaStream_t stream = static_cast<cudaStream_t>(ops[r].stream);
        absl::StatusOr<std::unique_ptr<DeviceAllocation>> buf = ops[r].ops->Allocate(kCount * 4);
        CHECK_OK(buf.status());
        const std::vector<float> ones(kCount, 1.0f);
        CHECK_OK(CopyDeviceMemory((*buf)->data(), ones.data(), kCount * 4));
        ASSERT_TRUE(comms[r]->SupportsGraphCapture());
        cudaGraph_t graph = nullptr;
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        const absl::Status captured =
            comms[r]->EnqueueAllReduceSum((*buf)->data(), kCount, DType::kF32);
        CUDA_OK(cudaStreamEndCapture(stream, &graph));
        ASSERT_TRUE(captured.ok()) << captured;
        cudaGraphExec_t exec = nullptr;
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int k = 0; k < rounds; ++k) {
          ASSERT_TRUE(comms[r]->BeginGraphReplay(1).ok());
          CUDA_OK(cudaGraphLaunch(exec, stream));
          ASSERT_TRUE(comms[r]->AllReduceSum((*buf)->data(), kCount, DType::kF32).ok());
        }
        CHECK_OK(ops[r].ops->CopyToHost(got[r].data(), (*buf)->data(), kCount * 4));
        EXPECT_TRUE(comms[r]->EndGraphReplay().ok());
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      });
    }
    for (std::thread& t : threads) t.join();
    const float want = std::pow(static_cast<float>(n), 2.0f * rounds);
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < kCount; ++i) ASSERT_EQ(got[r][i], want) << "rank " << r << " " << i;
    }
    EXPECT_TRUE((*group)->status().ok()) << (*group)->status();
  }
}

}  // namespace
}  // namespace tandem
