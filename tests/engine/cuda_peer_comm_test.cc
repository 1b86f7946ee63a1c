// The in-process peer communicator (comm/group/peer_communicator.h) over the real CUDA device
// API (MakeCudaPeerApi) with every rank on GPU 0, each on its own CudaOps stream (label gpu;
// part of engine_cuda_tp_test): all-reduce of 2-4 ranks on awkward counts, bf16 and f32, is the
// rank-order fp32 sum rounded once, bitwise on every rank; 12 all-reduces back to back on the
// same buffers (the events reused call after call) stay exact; all-gather concatenates; Send /
// Recv between two ranks' streams keep 16 micro-batches of growing and shrinking sizes in order
// and bitwise, the sender overwriting its buffer on its stream right after each Send and
// running all its sends before the receiver takes any.
// Uploads go through CopyDeviceMemory (the legacy stream, after Allocate's zero fill there, and
// complete before the rank's stream is used).
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/check.h"
#include "comm/group/peer_communicator.h"
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/cuda_group.h"
#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "tests/engine/cuda_skip.h"

namespace tandem {
namespace {

struct Ranks {
  std::vector<CudaRankOps> ops;
  std::shared_ptr<PeerCommGroup> group;
  std::vector<std::unique_ptr<Communicator>> comms;
};

Ranks MakeRanks(int n) {
  Ranks r;
  std::vector<PeerRank> places;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<CudaRankOps> ops = MakeCudaRankOps(0);
    CHECK_OK(ops.status());
    places.push_back(PeerRank{0, ops->stream});
    r.ops.push_back(*std::move(ops));
  }
  absl::StatusOr<std::shared_ptr<PeerCommGroup>> g =
      PeerCommGroup::Create(MakeCudaPeerApi(), places);
  CHECK_OK(g.status());
  r.group = *g;
  for (int i = 0; i < n; ++i) r.comms.push_back(r.group->ForRank(i));
  return r;
}

// Runs fn(rank) on one thread per rank (GPU 0 current) and joins them.
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CHECK_OK(SetCudaDevice(0));
      fn(r);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(CudaPeerCommTest, AllReduceOnOneGpuIsTheRankOrderSumOnEveryRank) {
  SKIP_WITHOUT_GPU();
  for (int n : {2, 3, 4}) {
    for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{(1 << 20) + 3}}) {
      for (DType dtype : {DType::kBF16, DType::kF32}) {
        SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(count) +
                     (dtype == DType::kF32 ? " f32" : " bf16"));
        Ranks ranks = MakeRanks(n);
        const int64_t bytes = count * DTypeSize(dtype);
        std::vector<std::vector<float>> values(n, std::vector<float>(count));
        std::vector<std::vector<uint8_t>> host(n, std::vector<uint8_t>(bytes));
        for (int r = 0; r < n; ++r) {
          std::mt19937 rng(100 + r);
          std::uniform_real_distribution<float> u(-2.0f, 2.0f);
          for (int64_t i = 0; i < count; ++i) {
            float v = u(rng);
            if (dtype == DType::kBF16) {
              reinterpret_cast<uint16_t*>(host[r].data())[i] = F32ToBf16(v);
              v = RoundToBf16(v);
            } else {
              reinterpret_cast<float*>(host[r].data())[i] = v;
            }
            values[r][i] = v;
          }
        }
        std::vector<std::vector<uint8_t>> got(n, std::vector<uint8_t>(bytes));
        OnRanks(n, [&](int r) {
          Ops& ops = *ranks.ops[r].ops;
          absl::StatusOr<std::unique_ptr<DeviceAllocation>> buf = ops.Allocate(bytes);
          CHECK_OK(buf.status());
          CHECK_OK(CopyDeviceMemory((*buf)->data(), host[r].data(), bytes));
          EXPECT_TRUE(ranks.comms[r]->AllReduceSum((*buf)->data(), count, dtype).ok());
          CHECK_OK(ops.CopyToHost(got[r].data(), (*buf)->data(), bytes));
        });
        std::vector<uint8_t> want(bytes);
        for (int64_t i = 0; i < count; ++i) {
          float sum = 0.0f;
          for (int r = 0; r < n; ++r) sum += values[r][i];
          if (dtype == DType::kBF16) {
            reinterpret_cast<uint16_t*>(want.data())[i] = F32ToBf16(sum);
          } else {
            reinterpret_cast<float*>(want.data())[i] = sum;
          }
        }
        for (int r = 0; r < n; ++r) EXPECT_TRUE(got[r] == want) << "rank " << r;
      }
    }
  }
}

TEST(CudaPeerCommTest, BackToBackAllReducesAndAllGatherStayExact) {
  SKIP_WITHOUT_GPU();
  const int n = 3;
  const int64_t count = 5000;
  Ranks ranks = MakeRanks(n);
  std::vector<std::vector<float>> got(n, std::vector<float>(count));
  std::vector<std::vector<float>> gathered(n, std::vector<float>(n * count));
  OnRanks(n, [&](int r) {
    Ops& ops = *ranks.ops[r].ops;
    absl::StatusOr<std::unique_ptr<DeviceAllocation>> buf = ops.Allocate(count * 4);
    absl::StatusOr<std::unique_ptr<DeviceAllocation>> all = ops.Allocate(n * count * 4);
    CHECK_OK(buf.status());
    CHECK_OK(all.status());
    // Small integers: every sum below is exact in f32.
    std::vector<float> x(count, static_cast<float>(r + 1));
    CHECK_OK(CopyDeviceMemory((*buf)->data(), x.data(), count * 4));
    // x <- Σ x, 12 times without a host sync between: 6 · 3^11 at the end.
    for (int k = 0; k < 12; ++k) {
      EXPECT_TRUE(ranks.comms[r]->AllReduceSum((*buf)->data(), count, DType::kF32).ok());
    }
    EXPECT_TRUE(ranks.comms[r]->AllGather((*buf)->data(), (*all)->data(), count * 4).ok());
    CHECK_OK(ops.CopyToHost(got[r].data(), (*buf)->data(), count * 4));
    CHECK_OK(ops.CopyToHost(gathered[r].data(), (*all)->data(), n * count * 4));
  });
  const float want = 6.0f * std::pow(3.0f, 11.0f);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[r][i], want) << "rank " << r << " " << i;
    for (int64_t i = 0; i < n * count; ++i) ASSERT_EQ(gathered[r][i], want) << "rank " << r;
  }
  EXPECT_TRUE(ranks.group->status().ok());
}

TEST(CudaPeerCommTest, SendRecvKeepMicroBatchesInOrderAcrossStreams) {
  SKIP_WITHOUT_GPU();
  const int kBatches = 16;
  const std::vector<int64_t> sizes = {1, 7, 4099, (1 << 20) + 3, 13, 100003, 2, (1 << 22) + 1};
  auto size_of = [&](int k) { return sizes[k % sizes.size()]; };
  const int64_t max_bytes = (1 << 22) + 1;
  Ranks ranks = MakeRanks(2);
  std::shared_ptr<PeerDeviceApi> api = MakeCudaPeerApi();
  std::vector<std::vector<uint8_t>> want(kBatches), got(kBatches);
  for (int k = 0; k < kBatches; ++k) {
    std::mt19937 rng(500 + k);
    want[k].resize(size_of(k));
    for (uint8_t& b : want[k]) b = static_cast<uint8_t>(rng());
  }
  // The sender's sources, uploaded before the threads start.
  std::vector<std::unique_ptr<DeviceAllocation>> sources;
  for (int k = 0; k < kBatches; ++k) {
    absl::StatusOr<std::unique_ptr<DeviceAllocation>> a = ranks.ops[0].ops->Allocate(size_of(k));
    CHECK_OK(a.status());
    CHECK_OK(CopyDeviceMemory((*a)->data(), want[k].data(), size_of(k)));
    sources.push_back(*std::move(a));
  }
  absl::Notification all_sent;
  OnRanks(2, [&](int r) {
    Ops& ops = *ranks.ops[r].ops;
    absl::StatusOr<std::unique_ptr<DeviceAllocation>> work = ops.Allocate(max_bytes);
    CHECK_OK(work.status());
    // A synchronous upload: Allocate's zero fill (the legacy stream) is done before the rank's
    // stream writes the buffer.
    const std::vector<uint8_t> zeros(max_bytes, 0);
    CHECK_OK(CopyDeviceMemory((*work)->data(), zeros.data(), max_bytes));
    if (r == 0) {
      // One working buffer, rewritten on the stream right after each Send: the message must be
      // the bytes at the Send, not at the receiver's copy.
      for (int k = 0; k < kBatches; ++k) {
        CHECK_OK(api->Copy((*work)->data(), sources[k]->data(), size_of(k), ranks.ops[0].stream));
        EXPECT_TRUE(ranks.comms[0]->Send((*work)->data(), size_of(k), 1).ok()) << k;
      }
      all_sent.Notify();
      return;
    }
    all_sent.WaitForNotification();  // every message queued before the first is taken
    for (int k = 0; k < kBatches; ++k) {
      EXPECT_TRUE(ranks.comms[1]->Recv((*work)->data(), size_of(k), 0).ok()) << k;
      got[k].resize(size_of(k));
      CHECK_OK(ops.CopyToHost(got[k].data(), (*work)->data(), size_of(k)));
    }
  });
  for (int k = 0; k < kBatches; ++k) EXPECT_TRUE(got[k] == want[k]) << "micro-batch " << k;
  EXPECT_TRUE(ranks.group->status().ok()) << ranks.group->status();
}

}  // namespace
}  // namespace tandem
