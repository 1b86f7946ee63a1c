// Layer-wise KV push: how the engine tells a prefill worker, during a step, that a layer's KV of
// the prompts the step completes is stored, so that layer l can move to the decode worker while
// layers l + 1.. still compute (prefill_worker/prefill_service.h drives the transfer).
//
// The rule (chunked prefill): a prefill-only request's pages are announced only in the step
// that computes its last prompt token (its final chunk). Earlier chunks' layers are stored too,
// but their pages are not safe to read outside that step: until the prompt is done the
// scheduler may preempt the request and hand its pages to another one. The final chunk's step
// ends with kPrefillDone (pages held until ReleaseRequest), a stop / length (pages freed) or a
// failure (pages freed); after layer l of that step, layer l of every page of the prompt is
// stored (the earlier chunks wrote theirs in earlier steps, a prefix-cache hit before that), so
// one push per layer covers the whole prompt. The page that the final chunk starts in is
// written by two steps; it is complete only after the final one, which is the step announced.
//
// Page safety: the engine frees an announced request's pages (stop, length, abort, a failed
// batch, a broken backend, ReleaseRequest) only after BeforeFree(id) returned, and
// BeforeFree returns only once nothing reads them any more. So a push never reads pages that a
// later step reuses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// A prompt whose KV the current step completes.
struct KvPush {
  std::string id;
  std::vector<int32_t> pages;  // the prompt's pages, prompt order: ceil(prompt / page_size)
  int num_prompt_tokens = 0;
};

// Implemented by the prefill role. Called on the engine's (loop) thread, inside Step() except
// BeforeFree, which runs wherever the engine frees pages (Step, Abort's next step,
// ReleaseRequest). Must not call back into the engine.
class KvPushListener {
 public:
  virtual ~KvPushListener() = default;
  // Before the forward pass of a step that computes the last prompt token of these prefill-only
  // requests (never empty).
  virtual void OnPushBegin(const std::vector<KvPush>& pushes) = 0;
  // Layer `layer` of this step's KV is stored, for every request of OnPushBegin, once `event`
  // has completed: on the CUDA backend a cudaEvent_t (as void*) recorded on the compute stream
  // after the layer's KV store (wait for it with WaitKvEvent, engine/cuda/cuda_device.h, before
  // reading the pages); null when the layer is already stored (the CPU backend runs each op to
  // completion). Layers come in order 0, 1, ..., num_layers - 1, all before Step() returns,
  // unless the step fails first (then the pages are freed: BeforeFree).
  virtual void OnLayerStored(int layer, void* event) = 0;
  // The engine is about to free the pages of announced request `id`: returns only once no
  // transfer reads them any more (a push still running is abandoned).
  virtual void BeforeFree(const std::string& id) = 0;
};

}  // namespace tandem
