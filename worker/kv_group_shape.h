// The KV transport's view of an engine's group (comm/kv_head_map.h): its TP and PP sizes and the
// model's KV heads and layers, so that prefill and decode groups of different sizes map their
// pages (comm/kv_wire.h version 6).
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "comm/kv_head_map.h"
#include "comm/kv_wire.h"
#include "engine/engine.h"

namespace tandem {

// Internal when the engine's pool is not the group's stacked pool (the transport's map would
// not describe it).
inline absl::StatusOr<KvGroupShape> KvGroupShapeFor(const EngineOptions& options,
                                                    const Engine& engine) {
  const KvLayout& layout = engine.kv_layout();
  KvGroupShape g;
  g.tensor_parallel = options.tensor_parallel;
  g.pipeline_parallel = options.pipeline_parallel;
  g.total_kv_heads = engine.model_config().num_kv_heads;
  g.num_layers = engine.model_config().num_layers;
  g.page_size = layout.page_size;
  g.head_dim = layout.head_dim;
  g.dtype = layout.dtype;
  if (absl::Status st = CheckKvGroupShape(g); !st.ok()) return st;
  if (!kv_wire::SamePageShape(g.PoolLayout(layout.num_pages), layout)) {
    return absl::InternalError(absl::StrCat(
        "the engine's KV pool (", layout.num_layers, " stacked layers of ", layout.num_kv_heads,
        " KV heads) is not the stacked pool of its ", g.SizesString(), " group"));
  }
  return g;
}

}  // namespace tandem
