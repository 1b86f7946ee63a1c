// How many bytes of KV pool an engine takes (EngineOptions::kv_memory_bytes and
// gpu_memory_utilization, vLLM's meaning): on the CUDA backend the process may use
// gpu_memory_utilization of the GPU's memory in all — its weights, step buffers and graphs
// included — whatever other processes on the GPU hold; the pool is what is left of that budget,
// and never more than is free on the device now.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/model/ops.h"

namespace tandem {

// Device memory kept out of the KV pool for the CUDA graphs captured after it (their
// instantiated kernel nodes), and left free on the device beside the pool.
inline constexpr int64_t kGraphReserveBytes = int64_t{512} << 20;
inline constexpr int64_t kFreeMarginBytes = int64_t{256} << 20;
// The CPU backend's pool when kv_memory_bytes is 0.
inline constexpr int64_t kDefaultCpuKvBytes = int64_t{256} << 20;

// kv_memory_bytes when set; 256 MiB on the CPU backend; else (CUDA)
//   min(gpu_memory_utilization * total - own - kGraphReserveBytes, free - kFreeMarginBytes).
// InvalidArgument for a utilization outside (0, 1]; ResourceExhausted, with the numbers, when
// that leaves no room.
absl::StatusOr<int64_t> KvPoolBytes(const EngineOptions& options, const DeviceMemoryInfo& memory);

// The KV pool dtype EngineOptions::kv_cache_dtype names: "auto" -> `model_default`, "bf16",
// "fp8" (kF8E4M3); anything else is InvalidArgument.
absl::StatusOr<DType> KvCacheDtype(std::string_view kv_cache_dtype, DType model_default);
// The --kv-cache-dtype spelling of a pool dtype: "bf16", "fp32", "fp8".
std::string_view KvCacheDtypeName(DType dtype);

}  // namespace tandem
