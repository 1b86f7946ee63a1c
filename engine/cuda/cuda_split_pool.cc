// AllocateSplitDevicePool (cuda_group.h) over CUDA's virtual memory management: one reserved
// address range, chunks of physical memory created on their slices' devices and mapped into it
// (SplitPoolChunks, device_placement.h), read-write access for every device of the group. The
// driver calls are looked up through the runtime (cudaGetDriverEntryPointByVersion), so nothing
// links libcuda and a machine without a driver still runs the CPU backend.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_group.h"
#include "engine/model/device_placement.h"

namespace tandem {
namespace {

// The driver entry points this file calls (CUDA 12.0 ABI).
struct VmmApi {
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) free_range = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
};

template <typename F>
absl::Status Lookup(const char* name, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CUDA_RETURN_IF_ERROR(
      cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver has no ", name, " (virtual memory management)"));
  }
  *fn = reinterpret_cast<F>(p);
  return absl::OkStatus();
}

absl::StatusOr<VmmApi> LoadVmm() {
  VmmApi v;
  RETURN_IF_ERROR(Lookup("cuMemGetAllocationGranularity", &v.granularity));
  RETURN_IF_ERROR(Lookup("cuMemAddressReserve", &v.reserve));
  RETURN_IF_ERROR(Lookup("cuMemAddressFree", &v.free_range));
  RETURN_IF_ERROR(Lookup("cuMemCreate", &v.create));
  RETURN_IF_ERROR(Lookup("cuMemRelease", &v.release));
  RETURN_IF_ERROR(Lookup("cuMemMap", &v.map));
  RETURN_IF_ERROR(Lookup("cuMemUnmap", &v.unmap));
  RETURN_IF_ERROR(Lookup("cuMemSetAccess", &v.set_access));
  return v;
}

absl::Status Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of device memory"));
  }
  return absl::InternalError(absl::StrCat(what, ": CUDA driver error ", static_cast<int>(r)));
}

CUmemAllocationProp DeviceProp(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// The range and its chunks; unmapped, released and freed when it goes (the engine drops the
// pool only once no step uses it).
class SplitPool final : public DeviceAllocation {
 public:
  SplitPool(VmmApi api, int64_t bytes) : api_(api), bytes_(bytes) {}
  ~SplitPool() override {
    for (const auto& [offset, bytes] : mapped_) api_.unmap(base_ + offset, bytes);
    for (CUmemGenericAllocationHandle h : handles_) api_.release(h);
    if (reserved_ > 0) api_.free_range(base_, reserved_);
  }
  void* data() override { return reinterpret_cast<void*>(base_); }
  int64_t bytes() const override { return bytes_; }

  absl::Status Build(const std::vector<int>& devices, const std::vector<int64_t>& slices) {
    size_t granularity = 0;
    for (int d : devices) {
      const CUmemAllocationProp prop = DeviceProp(d);
      size_t g = 0;
      RETURN_IF_ERROR(Check(api_.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                            "cuMemGetAllocationGranularity"));
      granularity = std::max(granularity, g);
    }
    const std::vector<PoolChunk> chunks =
        SplitPoolChunks(slices, static_cast<int64_t>(granularity));
    if (chunks.empty()) return absl::InvalidArgumentError("a split KV pool of 0 bytes");
    const size_t total = static_cast<size_t>(chunks.back().offset + chunks.back().bytes);
    RETURN_IF_ERROR(
        Check(api_.reserve(&base_, total, granularity, 0, 0), "cuMemAddressReserve (KV pool)"));
    reserved_ = total;
    for (const PoolChunk& c : chunks) {
      const CUmemAllocationProp prop = DeviceProp(devices[c.slice]);
      CUmemGenericAllocationHandle h{};
      RETURN_IF_ERROR(
          Check(api_.create(&h, static_cast<size_t>(c.bytes), &prop, 0), "cuMemCreate (KV pool)"));
      handles_.push_back(h);
      RETURN_IF_ERROR(Check(api_.map(base_ + c.offset, static_cast<size_t>(c.bytes), 0, h, 0),
                            "cuMemMap (KV pool)"));
      mapped_.emplace_back(static_cast<size_t>(c.offset), static_cast<size_t>(c.bytes));
    }
    std::vector<CUmemAccessDesc> access;
    for (int d : std::set<int>(devices.begin(), devices.end())) {
      CUmemAccessDesc a{};
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = d;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access.push_back(a);
    }
    RETURN_IF_ERROR(Check(api_.set_access(base_, total, access.data(), access.size()),
                          "cuMemSetAccess (KV pool: every rank's GPU must reach every slice)"));
    CUDA_RETURN_IF_ERROR(cudaMemset(data(), 0, static_cast<size_t>(bytes_)));
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }

 private:
  VmmApi api_;
  int64_t bytes_;
  CUdeviceptr base_ = 0;
  size_t reserved_ = 0;
  std::vector<std::pair<size_t, size_t>> mapped_;  // (offset, bytes) of each mapped chunk
  std::vector<CUmemGenericAllocationHandle> handles_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceAllocation>> AllocateSplitDevicePool(
    const std::vector<int>& devices, const std::vector<int64_t>& slice_bytes) {
  if (devices.empty() || devices.size() != slice_bytes.size()) {
    return absl::InvalidArgumentError("a split KV pool needs one device per slice");
  }
  for (int d : devices) {
    for (int e : devices) {
      if (d == e) continue;
      int can = 0;
      CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, d, e));
      if (can == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("a KV pool over GPUs ", d, " and ", e, " needs peer access between them"));
      }
    }
  }
  CUDA_RETURN_IF_ERROR(cudaFree(nullptr));  // the calling thread's device has its context
  ASSIGN_OR_RETURN(VmmApi api, LoadVmm());
  int64_t bytes = 0;
  for (int64_t b : slice_bytes) bytes += b;
  auto pool = std::make_unique<SplitPool>(api, bytes);
  RETURN_IF_ERROR(pool->Build(devices, slice_bytes));
  return std::unique_ptr<DeviceAllocation>(std::move(pool));
}

}  // namespace tandem
