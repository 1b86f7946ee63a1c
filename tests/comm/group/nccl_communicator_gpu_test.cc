// The NCCL group communicator (comm/group/nccl_communicator.h) on two real GPUs with libnccl
// (engine/cuda/cuda_nccl.cc; label gpu; skips, saying so, with fewer than two GPUs: NCCL runs one
// rank per GPU). One process, one thread per rank, rank r on GPU r, the CPU test's checks
// (tests/comm/group/nccl_communicator_test.cc) on device memory:
//   - all-reduce f32 (values whose sums are exact: one right answer), bf16 (small integers:
//     exact; random values: exactly the sum rounded once, the interface's result at 2 ranks),
//     all-gather (and in place), send / recv in order, for 1, 7 and 1000003 elements;
//   - the enqueue-only all-reduce, waited for with Synchronize, and captured into a CUDA graph
//     on each rank's stream and replayed;
//   - a rank that never arrives: the other fails with DeadlineExceeded at the (2 s) deadline;
//     Abort from another thread mid-collective ends it with the reason; later calls fail at once.
// Printed: the time of a blocking 4 MB f32 all-reduce (information, not checked).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "comm/group/nccl_communicator.h"
#include "comm/nccl_api.h"
#include "gtest/gtest.h"
#include "kernels/common/dtype.h"

namespace tandem {
namespace {

#define CUDA_OK(expr)                                                               \
  do {                                                                              \
    const cudaError_t cuda_ok_ = (expr);                                            \
    ASSERT_EQ(cuda_ok_, cudaSuccess) << #expr ": " << cudaGetErrorString(cuda_ok_); \
  } while (0)

constexpr int kRanks = 2;

float Exact(int rank, int64_t i) {
  return static_cast<float>(((i * 37 + rank * 11) % 101) - 50) * 0.5f;
}
float SmallInt(int rank, int64_t i) { return static_cast<float>(((i * 13 + rank * 7) % 31) - 15); }

void RunRanks(const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

class NcclCommunicatorGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    if (n < kRanks) {
      GTEST_SKIP() << "needs 2 GPUs (NCCL runs one rank per GPU); this machine has " << n;
    }
    absl::StatusOr<std::shared_ptr<NcclApi>> api = MakeCudaNccl();
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *api;
    MakeGroup(absl::Seconds(60));
  }

  void MakeGroup(absl::Duration timeout) {
    comms_.clear();
    group_.reset();
    absl::StatusOr<std::shared_ptr<NcclCommGroup>> g =
        MakeNcclGroup(api_, {{.device = 0}, {.device = 1}}, {.timeout = timeout});
    ASSERT_TRUE(g.ok()) << g.status();
    group_ = *g;
    for (int r = 0; r < kRanks; ++r) comms_.push_back(group_->ForRank(r));
  }

  void TearDown() override {
    comms_.clear();
    group_.reset();
  }

  // Copies `host` to a new buffer on GPU `rank` (the calling thread's device becomes it).
  template <typename T>
  static void* ToDevice(int rank, const std::vector<T>& host, size_t extra_bytes = 0) {
    void* d = nullptr;
    const size_t bytes = host.size() * sizeof(T);
    if (cudaSetDevice(rank) != cudaSuccess ||
        cudaMalloc(&d, bytes + extra_bytes + 1) != cudaSuccess ||
        cudaMemcpy(d, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      ADD_FAILURE() << "device buffer on GPU " << rank;
      return nullptr;
    }
    return d;
  }
  template <typename T>
  static std::vector<T> ToHost(int rank, const void* d, size_t count) {
    std::vector<T> host(count);
    if (cudaSetDevice(rank) != cudaSuccess ||
        cudaMemcpy(host.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
      ADD_FAILURE() << "copy back from GPU " << rank;
    }
    return host;
  }

  std::shared_ptr<NcclApi> api_;
  std::shared_ptr<NcclCommGroup> group_;
  std::vector<std::unique_ptr<NcclCommunicator>> comms_;
};

TEST_F(NcclCommunicatorGpuTest, AllReduceF32) {
  for (int64_t count : {1, 7, 1000003}) {
    std::vector<std::vector<float>> got(kRanks);
    RunRanks([&](int r) {
      std::vector<float> v(count);
      for (int64_t i = 0; i < count; ++i) v[i] = Exact(r, i);
      void* d = ToDevice(r, v);
      absl::Status s = comms_[r]->AllReduceSum(d, count, DType::kF32);
      EXPECT_TRUE(s.ok()) << s;
      got[r] = ToHost<float>(r, d, count);
      cudaFree(d);
    });
    for (int r = 0; r < kRanks; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[r][i], Exact(0, i) + Exact(1, i))
            << "count " << count << " rank " << r << " element " << i;
      }
    }
  }
}

TEST_F(NcclCommunicatorGpuTest, AllReduceBf16) {
  for (int64_t count : {1, 7, 1000003}) {
    std::vector<std::vector<uint16_t>> in(kRanks), exact_in(kRanks), got(kRanks), got_exact(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      std::mt19937 rng(7 * r + static_cast<int>(count));
      std::uniform_real_distribution<float> u(-3.0f, 3.0f);
      in[r].resize(count);
      exact_in[r].resize(count);
      for (int64_t i = 0; i < count; ++i) {
        in[r][i] = F32ToBf16(u(rng));
        exact_in[r][i] = F32ToBf16(SmallInt(r, i));
      }
    }
    RunRanks([&](int r) {
      void* d = ToDevice(r, in[r]);
      void* e = ToDevice(r, exact_in[r]);
      absl::Status s = comms_[r]->AllReduceSum(d, count, DType::kBF16);
      EXPECT_TRUE(s.ok()) << s;
      s = comms_[r]->AllReduceSum(e, count, DType::kBF16);
      EXPECT_TRUE(s.ok()) << s;
      got[r] = ToHost<uint16_t>(r, d, count);
      got_exact[r] = ToHost<uint16_t>(r, e, count);
      cudaFree(d);
      cudaFree(e);
    });
    for (int64_t i = 0; i < count; ++i) {
      const float sum = Bf16ToF32(in[0][i]) + Bf16ToF32(in[1][i]);
      for (int r = 0; r < kRanks; ++r) {
        ASSERT_EQ(got[r][i], F32ToBf16(sum)) << "count " << count << " rank " << r << " " << i;
        ASSERT_EQ(Bf16ToF32(got_exact[r][i]), SmallInt(0, i) + SmallInt(1, i)) << i;
      }
    }
  }
}

TEST_F(NcclCommunicatorGpuTest, AllGatherAlsoInPlace) {
  for (int64_t bytes : {1, 7, 1000003}) {
    auto byte = [](int r, int64_t i) { return static_cast<uint8_t>((r * 31 + i * 7 + 3) & 0xff); };
    std::vector<std::vector<uint8_t>> got(kRanks), got_in_place(kRanks);
    RunRanks([&](int r) {
      std::vector<uint8_t> send(bytes);
      for (int64_t i = 0; i < bytes; ++i) send[i] = byte(r, i);
      void* s_dev = ToDevice(r, send);
      void* recv = ToDevice(r, std::vector<uint8_t>(bytes * kRanks, 0xee));
      absl::Status s = comms_[r]->AllGather(s_dev, recv, bytes);
      EXPECT_TRUE(s.ok()) << s;
      got[r] = ToHost<uint8_t>(r, recv, bytes * kRanks);
      std::vector<uint8_t> staged(bytes * kRanks, 0xee);
      std::memcpy(staged.data() + r * bytes, send.data(), bytes);
      void* in_place = ToDevice(r, staged);
      s = comms_[r]->AllGather(static_cast<uint8_t*>(in_place) + r * bytes, in_place, bytes);
      EXPECT_TRUE(s.ok()) << s;
      got_in_place[r] = ToHost<uint8_t>(r, in_place, bytes * kRanks);
      cudaFree(s_dev);
      cudaFree(recv);
      cudaFree(in_place);
    });
    for (int r = 0; r < kRanks; ++r) {
      for (int q = 0; q < kRanks; ++q) {
        for (int64_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(got[r][q * bytes + i], byte(q, i)) << bytes << " rank " << r << " part " << q;
          ASSERT_EQ(got_in_place[r][q * bytes + i], byte(q, i)) << bytes << " rank " << r;
        }
      }
    }
  }
}

TEST_F(NcclCommunicatorGpuTest, SendRecvInOrder) {
  for (int64_t bytes : {1, 7, 1000003}) {
    auto byte = [](int m, int64_t i) { return static_cast<uint8_t>((m * 101 + i * 13) & 0xff); };
    std::vector<std::vector<uint8_t>> got(2);
    RunRanks([&](int r) {
      for (int m = 0; m < 2; ++m) {
        std::vector<uint8_t> msg(bytes);
        for (int64_t i = 0; i < bytes; ++i) msg[i] = r == 0 ? byte(m, i) : 0;
        void* d = ToDevice(r, msg);
        absl::Status s = r == 0 ? comms_[0]->Send(d, bytes, 1) : comms_[1]->Recv(d, bytes, 0);
        EXPECT_TRUE(s.ok()) << s;
        if (r == 1) got[m] = ToHost<uint8_t>(1, d, bytes);
        cudaFree(d);
      }
    });
    for (int m = 0; m < 2; ++m) {
      for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(got[m][i], byte(m, i)) << bytes << " " << m;
    }
  }
}

TEST_F(NcclCommunicatorGpuTest, AsyncAllReduceSynchronizedAndCapturedInAGraph) {
  const int64_t count = 1000003;
  std::vector<std::vector<float>> direct(kRanks), replayed(kRanks);
  RunRanks([&](int r) {
    std::vector<float> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = Exact(r, i);
    void* d = ToDevice(r, v);
    NcclCommunicator& c = *comms_[r];
    auto stream = static_cast<cudaStream_t>(c.stream());
    absl::Status s = c.AllReduceSumAsync(d, count, DType::kF32, c.stream());
    EXPECT_TRUE(s.ok()) << s;
    s = c.Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    direct[r] = ToHost<float>(r, d, count);
    // Captured: the enqueue-only call inside a capture of the rank's stream, then replayed twice
    // from the original values (the second replay checks the graph stays usable).
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    s = c.AllReduceSumAsync(d, count, DType::kF32, c.stream());
    EXPECT_TRUE(s.ok()) << s;
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      CUDA_OK(cudaMemcpy(d, v.data(), count * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_OK(cudaGraphLaunch(exec, stream));
      s = c.Synchronize();
      EXPECT_TRUE(s.ok()) << s;
    }
    replayed[r] = ToHost<float>(r, d, count);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(d);
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(direct[r][i], Exact(0, i) + Exact(1, i)) << "rank " << r << " element " << i;
      ASSERT_EQ(replayed[r][i], Exact(0, i) + Exact(1, i)) << "rank " << r << " element " << i;
    }
  }
}

TEST_F(NcclCommunicatorGpuTest, AMissingRankEndsAtTheDeadlineAndAbortEndsACollective) {
  // (1) Rank 1 never arrives: rank 0's all-reduce fails at the deadline.
  MakeGroup(absl::Seconds(2));
  {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    void* d = ToDevice(0, std::vector<float>(1000003, 1.0f));
    const absl::Time start = absl::Now();
    absl::Status s = comms_[0]->AllReduceSum(d, 1000003, DType::kF32);
    std::printf("missing rank: rank 0 failed after %.2f s: %s\n",
                absl::ToDoubleSeconds(absl::Now() - start), s.ToString().c_str());
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    float x = 0.0f;
    EXPECT_EQ(comms_[1]->AllReduceSum(&x, 1, DType::kF32).code(),
              absl::StatusCode::kDeadlineExceeded);  // at once: the group is aborted
    cudaFree(d);
  }
  // (2) A fresh group; rank 0 waits in an all-reduce rank 1 never joins; another thread aborts.
  MakeGroup(absl::Seconds(600));
  {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    void* d = ToDevice(0, std::vector<float>(1000003, 1.0f));
    absl::Status s;
    absl::Notification returned;
    std::thread rank0([&] {
      s = comms_[0]->AllReduceSum(d, 1000003, DType::kF32);
      returned.Notify();
    });
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_FALSE(returned.HasBeenNotified());
    const absl::Time start = absl::Now();
    std::thread([&] { group_->Abort(absl::CancelledError("operator stop")); }).join();
    rank0.join();
    std::printf("abort: rank 0 returned %.3f s after the abort: %s\n",
                absl::ToDoubleSeconds(absl::Now() - start), s.ToString().c_str());
    EXPECT_EQ(s, absl::CancelledError("operator stop"));
    EXPECT_EQ(comms_[1]->Send(d, 4, 0), absl::CancelledError("operator stop"));
    cudaFree(d);
  }
}

TEST_F(NcclCommunicatorGpuTest, PrintsTheTimeOfABlockingAllReduce) {
  const int64_t count = 1 << 20;  // 4 MB of f32
  RunRanks([&](int r) {
    void* d = ToDevice(r, std::vector<float>(count, 1.0f));
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(comms_[r]->AllReduceSum(d, count, DType::kF32).ok());
    const int iters = 50;
    const absl::Time start = absl::Now();
    for (int i = 0; i < iters; ++i) {
      ASSERT_TRUE(comms_[r]->AllReduceSum(d, count, DType::kF32).ok());
    }
    const double us = absl::ToDoubleMicroseconds(absl::Now() - start) / iters;
    if (r == 0) std::printf("blocking all-reduce of 4 MB f32 on 2 GPUs: %.1f us\n", us);
    cudaFree(d);
  });
}

}  // namespace
}  // namespace tandem
