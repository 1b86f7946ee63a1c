#include "engine/kv_budget.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "base/logging.h"

namespace tandem {

absl::StatusOr<int64_t> KvPoolBytes(const EngineOptions& o, const DeviceMemoryInfo& m) {
  if (o.kv_memory_bytes > 0) return o.kv_memory_bytes;
  if (o.backend == Backend::kCpu) return kDefaultCpuKvBytes;
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gpu_memory_utilization must be in (0, 1], got %g", o.gpu_memory_utilization));
  }
  const int64_t budget = static_cast<int64_t>(o.gpu_memory_utilization * m.total_bytes);
  const int64_t by_budget = budget - m.own_bytes - kGraphReserveBytes;
  const int64_t by_free = m.free_bytes - kFreeMarginBytes;
  const int64_t kv = std::min(by_budget, by_free);
  LOG(INFO) << "device memory: " << (m.total_bytes >> 20) << " MiB, " << (m.free_bytes >> 20)
            << " MiB free; this engine holds " << (m.own_bytes >> 20)
            << " MiB (weights, step buffers, context); KV pool " << (std::max<int64_t>(kv, 0) >> 20)
            << " MiB (gpu_memory_utilization " << o.gpu_memory_utilization << ", "
            << (kGraphReserveBytes >> 20) << " MiB kept for graphs)";
  if (kv <= 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("no room for a KV pool: this engine holds %d MiB of a %d MiB budget "
                        "(gpu_memory_utilization %g of %d MiB) and %d MiB are free on the device",
                        m.own_bytes >> 20, budget >> 20, o.gpu_memory_utilization,
                        m.total_bytes >> 20, m.free_bytes >> 20));
  }
  return kv;
}

absl::StatusOr<DType> KvCacheDtype(std::string_view kv_cache_dtype, DType model_default) {
  if (kv_cache_dtype == "auto") return model_default;
  if (kv_cache_dtype == "bf16") return DType::kBF16;
  if (kv_cache_dtype == "fp8") return DType::kF8E4M3;
  return absl::InvalidArgumentError(absl::StrFormat(
      "kv_cache_dtype must be auto, bf16 or fp8, got '%s'", std::string(kv_cache_dtype)));
}

std::string_view KvCacheDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "fp32";
    case DType::kF8E4M3:
      return "fp8";
    default:
      return DTypeName(dtype);
  }
}

}  // namespace tandem
