// Where the ranks of a CUDA worker group run, and how they talk (host-side rules, tested on the
// CPU). Rank order is parallel_model.h's (stage s, TP rank r at s · TP + r).
//
// Placement: the layout's (or the worker's --devices) list, one visible device ordinal per rank;
// without one, rank r on device r mod the visible count (CUDA_VISIBLE_DEVICES, which the
// launcher sets from a layout's gpus, picks which GPUs those are). Ranks share a GPU only when
// the user allows it (allow_device_sharing: tests, and trying a layout on one GPU), never by
// accident: a group of more ranks than visible GPUs, or a list naming one twice, is refused.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/ops.h"

namespace tandem {

// The device of each of `num_ranks` ranks. InvalidArgument (naming the rank, the device and what
// is visible) for a list of the wrong length, a device that is not visible, or a shared device
// without `allow_sharing`; FailedPrecondition when no device is visible.
absl::StatusOr<std::vector<int>> PlaceRanksOnDevices(int num_ranks, const std::vector<int>& devices,
                                                     int visible_devices, bool allow_sharing);

// The communicator of a group of ranks on `devices`: NCCL (one rank per GPU, NCCL's rule) when
// every device is distinct and NCCL is built; otherwise the in-process peer communicator
// (comm/group/peer_communicator.h: ranks sharing a GPU, or distinct GPUs with peer access).
enum class DeviceCommKind { kPeer, kNccl };
DeviceCommKind ChooseDeviceComm(const std::vector<int>& devices, bool nccl_available);

// The memory the engine sizes a group's KV pool from (engine/kv_budget.h), given each rank's
// MemoryInfo ([rank], of the rank's device), devices ([rank]) and each rank's share of the pool
// (shares[rank]: its layers in the stacked layout, parallel_model.h — pipeline stages may hold
// different numbers of layers; empty: equal shares). A device whose ranks hold k of the shares'
// total T holds k/T of the pool, so its free, total and own bytes (own: summed over its ranks)
// are scaled by T/k, and the group reports the smallest free and total and the largest own of
// those — the pool the tightest device allows. One device: its own numbers, own summed.
DeviceMemoryInfo CombineRankMemory(const std::vector<DeviceMemoryInfo>& ranks,
                                   const std::vector<int>& devices,
                                   const std::vector<int64_t>& shares = {});

// A KV pool for ranks on several devices is one address range of the ranks' slices laid end to
// end (the stacked layout, parallel_model.h), mapped in chunks of whole granules (the driver's
// allocation granularity): each chunk on the device of the slice that holds its first byte, so
// a slice that does not start on a granule boundary has the granule it starts in on the previous
// slice's device (read through peer access; at most one granule per slice). The last chunk may
// extend past the slices (padding to a granule).
struct PoolChunk {
  int64_t offset = 0;  // from the range's start, a multiple of the granularity
  int64_t bytes = 0;   // a multiple of the granularity
  int slice = 0;       // whose device holds it
  bool operator==(const PoolChunk&) const = default;
};
std::vector<PoolChunk> SplitPoolChunks(const std::vector<int64_t>& slice_bytes,
                                       int64_t granularity);

// Whether any two ranks share a device, and whether all ranks are on one.
bool SharesDevice(const std::vector<int>& devices);
bool OnOneDevice(const std::vector<int>& devices);

}  // namespace tandem
