#include "engine/model/device_placement.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {

absl::StatusOr<std::vector<int>> PlaceRanksOnDevices(int num_ranks, const std::vector<int>& devices,
                                                     int visible, bool allow_sharing) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a group of ", num_ranks, " ranks"));
  }
  if (visible < 1) {
    return absl::FailedPreconditionError("the cuda backend needs a CUDA device; none is visible");
  }
  std::vector<int> placed = devices;
  if (placed.empty()) {
    if (num_ranks > visible && !allow_sharing) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a group of ", num_ranks, " ranks (tensor_parallel x pipeline_parallel) needs ",
          num_ranks, " GPUs and ", visible,
          " are visible; give it more GPUs, or allow ranks to share one "
          "(allow_device_sharing, --allow-device-sharing: slower, for tests)"));
    }
    for (int r = 0; r < num_ranks; ++r) placed.push_back(r % visible);
    return placed;
  }
  if (static_cast<int>(placed.size()) != num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices [", absl::StrJoin(placed, ", "), "] name ", placed.size(),
                     " devices for a group of ", num_ranks, " ranks (one per rank)"));
  }
  std::set<int> seen;
  for (int r = 0; r < num_ranks; ++r) {
    const int d = placed[r];
    if (d < 0 || d >= visible) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, "'s device ", d, " is not visible (", visible, " visible: 0 to ",
                       visible - 1, ", as CUDA_VISIBLE_DEVICES numbers them)"));
    }
    if (!seen.insert(d).second && !allow_sharing) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices [", absl::StrJoin(placed, ", "), "] put two ranks on GPU ", d,
                       "; allow it explicitly (allow_device_sharing, --allow-device-sharing) or "
                       "give each rank its own GPU"));
    }
  }
  return placed;
}

DeviceMemoryInfo CombineRankMemory(const std::vector<DeviceMemoryInfo>& ranks,
                                   const std::vector<int>& devices,
                                   const std::vector<int64_t>& shares) {
  struct PerDevice {
    DeviceMemoryInfo info;
    int64_t ranks = 0;
    int64_t share = 0;
  };
  std::map<int, PerDevice> by_device;
  int64_t total = 0;
  for (size_t r = 0; r < ranks.size() && r < devices.size(); ++r) {
    PerDevice& d = by_device[devices[r]];
    if (d.ranks == 0)
      d.info = ranks[r];
    else
      d.info.own_bytes += ranks[r].own_bytes;
    ++d.ranks;
    const int64_t share = r < shares.size() ? std::max<int64_t>(shares[r], 0) : 1;
    d.share += share;
    total += share;
  }
  DeviceMemoryInfo out;
  bool first = true;
  for (const auto& [device, d] : by_device) {
    // Scaled by T / k (exact in a double for any memory size there is); a device holding no
    // share of the pool does not limit it.
    if (d.share == 0) continue;
    auto scale = [&](int64_t x) {
      return static_cast<int64_t>(static_cast<double>(x) * static_cast<double>(total) /
                                  static_cast<double>(d.share));
    };
    const DeviceMemoryInfo s{scale(d.info.free_bytes), scale(d.info.total_bytes),
                             scale(d.info.own_bytes)};
    out.free_bytes = first ? s.free_bytes : std::min(out.free_bytes, s.free_bytes);
    out.total_bytes = first ? s.total_bytes : std::min(out.total_bytes, s.total_bytes);
    out.own_bytes = first ? s.own_bytes : std::max(out.own_bytes, s.own_bytes);
    first = false;
  }
  return out;
}

std::vector<PoolChunk> SplitPoolChunks(const std::vector<int64_t>& slice_bytes,
                                       int64_t granularity) {
  std::vector<PoolChunk> chunks;
  int64_t total = 0;
  for (int64_t b : slice_bytes) total += b;
  if (granularity < 1 || total <= 0) return chunks;
  const int64_t granules = (total + granularity - 1) / granularity;
  int slice = 0;
  int64_t slice_end = slice_bytes.empty() ? 0 : slice_bytes[0];  // exclusive
  for (int64_t g = 0; g < granules; ++g) {
    const int64_t start = g * granularity;
    // The slice holding byte `start` (empty slices hold none).
    while (slice + 1 < static_cast<int>(slice_bytes.size()) && start >= slice_end) {
      ++slice;
      slice_end += slice_bytes[slice];
    }
    if (!chunks.empty() && chunks.back().slice == slice) {
      chunks.back().bytes += granularity;
    } else {
      chunks.push_back(PoolChunk{start, granularity, slice});
    }
  }
  return chunks;
}

bool SharesDevice(const std::vector<int>& devices) {
  return std::set<int>(devices.begin(), devices.end()).size() != devices.size();
}

bool OnOneDevice(const std::vector<int>& devices) {
  return std::set<int>(devices.begin(), devices.end()).size() <= 1;
}

DeviceCommKind ChooseDeviceComm(const std::vector<int>& devices, bool nccl_available) {
  if (SharesDevice(devices) || !nccl_available) return DeviceCommKind::kPeer;
  return DeviceCommKind::kNccl;
}

}  // namespace tandem
