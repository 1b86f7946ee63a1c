// The host KV transport's view of an engine's pool: a copy through the device when the pool is
// device memory (comm/kv_transport.h, KvPoolCopy), nothing (memcpy) when it is host memory.
#pragma once

#include "comm/kv_transport.h"
#include "engine/engine.h"

namespace tandem {

// `engine` must outlive the transport that uses the copy.
inline KvPoolCopy PoolCopyFor(const Engine* engine) {
  if (!engine->kv_pool_on_device()) return {};
  return [engine](void* dst, const void* src, int64_t bytes) {
    return engine->CopyKvMemory(dst, src, bytes);
  };
}

}  // namespace tandem
