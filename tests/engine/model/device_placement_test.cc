// Where CUDA ranks go and how their group sizes its KV pool (engine/model/device_placement.h):
// the default placement, explicit lists, every refusal (too few GPUs, a device not visible, a
// list of the wrong length, a GPU named twice) unless sharing is allowed; the communicator
// choice; the memory the engine budgets the pool from, on one GPU and on several.
#include "engine/model/device_placement.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

void ExpectRefused(const absl::StatusOr<std::vector<int>>& got, absl::StatusCode code,
                   const std::string& needle) {
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), code) << got.status();
  EXPECT_NE(got.status().message().find(needle), std::string::npos) << got.status();
}

TEST(DevicePlacementTest, DefaultPlacementIsRankModuloVisible) {
  EXPECT_EQ(*PlaceRanksOnDevices(1, {}, 1, false), std::vector<int>({0}));
  EXPECT_EQ(*PlaceRanksOnDevices(4, {}, 8, false), std::vector<int>({0, 1, 2, 3}));
  EXPECT_EQ(*PlaceRanksOnDevices(2, {}, 2, false), std::vector<int>({0, 1}));
  // More ranks than GPUs only when sharing is allowed: then they wrap around.
  ExpectRefused(PlaceRanksOnDevices(2, {}, 1, false), absl::StatusCode::kInvalidArgument,
                "needs 2 GPUs and 1 are visible");
  EXPECT_EQ(*PlaceRanksOnDevices(2, {}, 1, true), std::vector<int>({0, 0}));
  EXPECT_EQ(*PlaceRanksOnDevices(5, {}, 2, true), std::vector<int>({0, 1, 0, 1, 0}));
}

TEST(DevicePlacementTest, ExplicitListsAreCheckedRankByRank) {
  EXPECT_EQ(*PlaceRanksOnDevices(2, {3, 1}, 4, false), std::vector<int>({3, 1}));
  ExpectRefused(PlaceRanksOnDevices(2, {0, 1, 2}, 4, false), absl::StatusCode::kInvalidArgument,
                "3 devices for a group of 2 ranks");
  ExpectRefused(PlaceRanksOnDevices(2, {0}, 4, true), absl::StatusCode::kInvalidArgument,
                "1 devices for a group of 2 ranks");
  ExpectRefused(PlaceRanksOnDevices(2, {0, 4}, 4, false), absl::StatusCode::kInvalidArgument,
                "rank 1's device 4 is not visible (4 visible");
  ExpectRefused(PlaceRanksOnDevices(2, {-1, 0}, 4, true), absl::StatusCode::kInvalidArgument,
                "rank 0's device -1");
  ExpectRefused(PlaceRanksOnDevices(3, {2, 0, 2}, 4, false), absl::StatusCode::kInvalidArgument,
                "two ranks on GPU 2");
  EXPECT_EQ(*PlaceRanksOnDevices(3, {2, 0, 2}, 4, true), std::vector<int>({2, 0, 2}));
}

TEST(DevicePlacementTest, NoDeviceOrNoRanksIsRefused) {
  ExpectRefused(PlaceRanksOnDevices(2, {}, 0, true), absl::StatusCode::kFailedPrecondition,
                "none is visible");
  ExpectRefused(PlaceRanksOnDevices(0, {}, 2, true), absl::StatusCode::kInvalidArgument, "0 ranks");
}

TEST(DevicePlacementTest, NcclOnlyForDistinctGpusWhenBuilt) {
  EXPECT_EQ(ChooseDeviceComm({0, 1}, true), DeviceCommKind::kNccl);
  EXPECT_EQ(ChooseDeviceComm({0, 1}, false), DeviceCommKind::kPeer);
  EXPECT_EQ(ChooseDeviceComm({0, 0}, true), DeviceCommKind::kPeer);
  EXPECT_EQ(ChooseDeviceComm({0, 1, 1, 2}, true), DeviceCommKind::kPeer);
  EXPECT_TRUE(SharesDevice({1, 2, 1}));
  EXPECT_FALSE(SharesDevice({0}));
  // Whether one allocation can hold the pool: all on one device (sharing it, or a single rank).
  EXPECT_TRUE(OnOneDevice({3}));
  EXPECT_TRUE(OnOneDevice({1, 1, 1}));
  EXPECT_FALSE(OnOneDevice({0, 0, 1}));
  EXPECT_FALSE(OnOneDevice({0, 1}));
}

TEST(DevicePlacementTest, MemoryOfOneGpuSumsWhatItsRanksHold) {
  const int64_t g = int64_t{1} << 30;
  const DeviceMemoryInfo one =
      CombineRankMemory({{100 * g, 140 * g, 3 * g}, {99 * g, 140 * g, 2 * g}}, {0, 0});
  EXPECT_EQ(one.free_bytes, 100 * g);  // the first rank's view of the shared device
  EXPECT_EQ(one.total_bytes, 140 * g);
  EXPECT_EQ(one.own_bytes, 5 * g);
}

TEST(DevicePlacementTest, MemoryOfSeveralGpusIsTheTightestScaledUp) {
  const int64_t g = int64_t{1} << 30;
  // Two GPUs, one rank each: the pool is twice what the tighter one can hold.
  const DeviceMemoryInfo two =
      CombineRankMemory({{100 * g, 140 * g, 3 * g}, {60 * g, 80 * g, 4 * g}}, {0, 1});
  EXPECT_EQ(two.free_bytes, 120 * g);
  EXPECT_EQ(two.total_bytes, 160 * g);
  EXPECT_EQ(two.own_bytes, 8 * g);
  // Three ranks, two on GPU 0 (2/3 of the pool there) and one on GPU 1 (1/3).
  const DeviceMemoryInfo three = CombineRankMemory(
      {{90 * g, 90 * g, 3 * g}, {90 * g, 90 * g, 3 * g}, {90 * g, 90 * g, 3 * g}}, {0, 0, 1});
  EXPECT_EQ(three.free_bytes, 135 * g);  // GPU 0: 90 · 3/2
  EXPECT_EQ(three.total_bytes, 135 * g);
  EXPECT_EQ(three.own_bytes, 9 * g);  // GPU 0: 6 · 3/2 and GPU 1: 3 · 3
  EXPECT_EQ(CombineRankMemory({}, {}).total_bytes, 0);
}

TEST(DevicePlacementTest, PipelineStagesOfUnevenLayersWeighTheirDevices) {
  const int64_t g = int64_t{1} << 30;
  const DeviceMemoryInfo same{90 * g, 90 * g, 3 * g};
  // PP 2 over 5 layers, one rank per GPU: stage 0 holds 3 of the 5 layers' pages, so GPU 0
  // limits the pool to 90 · 5/3 (an even split would claim 180 and overfill GPU 0).
  const DeviceMemoryInfo pp = CombineRankMemory({same, same}, {0, 1}, {3, 2});
  EXPECT_EQ(pp.free_bytes, 150 * g);
  EXPECT_EQ(pp.total_bytes, 150 * g);
  EXPECT_EQ(pp.own_bytes, 15 * g / 2);  // the largest: GPU 1's 3 · 5/2 (GPU 0's is 3 · 5/3)
  // Equal shares are the unweighted rule; every rank on one GPU is its own numbers.
  EXPECT_EQ(CombineRankMemory({same, same}, {0, 1}, {4, 4}).free_bytes, 180 * g);
  EXPECT_EQ(CombineRankMemory({same, same}, {0, 0}, {3, 2}).free_bytes, 90 * g);
  // TP 2 x PP 2 over 5 layers on two GPUs, a stage per GPU: GPU 0 holds 2 · 3 of 10 shares.
  const DeviceMemoryInfo tp_pp =
      CombineRankMemory({same, same, same, same}, {0, 0, 1, 1}, {3, 3, 2, 2});
  EXPECT_EQ(tp_pp.free_bytes, 150 * g);
}

TEST(DevicePlacementTest, SplitPoolChunksFollowTheSlicesByGranule) {
  const int64_t g = 100;
  // Aligned slices: one chunk each, on its own device.
  EXPECT_EQ(SplitPoolChunks({200, 300}, g), (std::vector<PoolChunk>{{0, 200, 0}, {200, 300, 1}}));
  // Slice 1 starts inside granule 1 (byte 150): that granule stays on slice 0's device; the
  // last granule is padding past the end (total 420).
  EXPECT_EQ(SplitPoolChunks({150, 270}, g), (std::vector<PoolChunk>{{0, 200, 0}, {200, 300, 1}}));
  // A slice smaller than a granule that starts mid-granule owns no chunk; an empty slice none.
  EXPECT_EQ(SplitPoolChunks({150, 20, 0, 230}, g),
            (std::vector<PoolChunk>{{0, 200, 0}, {200, 200, 3}}));
  // Every byte is covered, chunks are granule multiples and in order.
  const std::vector<int64_t> slices = {12345, 6789, 40000, 1};
  const std::vector<PoolChunk> chunks = SplitPoolChunks(slices, 4096);
  int64_t end = 0;
  for (const PoolChunk& c : chunks) {
    EXPECT_EQ(c.offset, end);
    EXPECT_EQ(c.bytes % 4096, 0);
    end += c.bytes;
  }
  EXPECT_GE(end, 12345 + 6789 + 40000 + 1);
  EXPECT_LT(end - 4096, 12345 + 6789 + 40000 + 1);
  EXPECT_TRUE(SplitPoolChunks({}, g).empty());
  EXPECT_TRUE(SplitPoolChunks({0, 0}, g).empty());
}

}  // namespace
}  // namespace tandem
