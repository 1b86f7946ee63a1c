// Engine: the model-execution core both workers (and `tandem generate`) drive. It owns the model,
// the paged KV cache, the scheduler and the sampler; a caller adds requests and calls Step() in a
// loop. Thread-compatible, NOT thread-safe: one loop thread owns an Engine; RPC threads hand work
// to that loop through a queue (see the worker shells).
//
// Disaggregation hooks: a prefill worker adds requests with `prefill_only`; once their prompt is
// computed they finish with FinishReason::kPrefillDone holding their pages, which the worker
// reads with KvPages()/kv_pool() for the transfer, then ReleaseRequest(). A decode worker first
// ReservePages() for a request, lets the transfer write into them, then AddPrefilledRequest() so
// the request joins the running batch at its first decode step (or ReleaseRequest() on abort).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv_push.h"
#include "engine/model/model.h"
#include "engine/request.h"
#include "engine/spec/speculative_config.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

struct EngineOptions {
  std::string model_dir;
  Backend backend = Backend::kCpu;
  // Ranks each layer's heads are split over inside this engine's group (one thread per rank:
  // engine/model/parallel_model.h). CPU and CUDA (one GPU per rank; each rank captures and
  // replays its own CUDA graphs, parallel_model.h).
  // A draft model (speculative decoding) runs unsplit.
  int tensor_parallel = 1;
  // CUDA ranks: each rank's device (empty: rank r on device r mod the visible count), and whether
  // ranks may share a GPU (--allow-device-sharing; engine/model/device_placement.h).
  std::vector<int> devices = {};
  bool allow_device_sharing = false;
  // Pipeline stages (contiguous layer ranges), each of tensor_parallel ranks; CPU and CUDA (one
  // GPU per rank, as for tensor_parallel; eager steps).
  int pipeline_parallel = 1;
  // With pipeline_parallel > 1: batches (micro-batches of disjoint sequences) in flight at once,
  // so that stage s runs one while stage s + 1 runs the one before (vLLM's batch queue); 0:
  // pipeline_parallel; 1: one at a time, the stages one after another. Needs async_scheduling
  // (the engine runs one batch at a time without it, and with speculative decoding).
  int pipeline_micro_batches = 0;
  int page_size = 16;  // tokens per KV page
  int num_pages = 0;   // 0: derive from kv_memory_bytes
  // KV pool bytes. 0: the CPU backend takes 256 MiB; the CUDA backend sizes the pool so the
  // process uses gpu_memory_utilization of the GPU's memory (vLLM's flag: weights, the step
  // buffers and the graphs included).
  int64_t kv_memory_bytes = 0;
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;             // running sequences per step
  int max_num_batched_tokens = 2048;  // token budget per step (chunked prefill)
  int max_model_len = 0;              // 0: the model's max_position_embeddings
  // Decode batch sizes that get a CUDA graph (vLLM's --cuda-graph-sizes); empty: the default
  // 1, 2, 4, 8, 16, 24, ... (steps of 8) up to max_num_seqs. Ignored on the CPU backend.
  std::vector<int> cuda_graph_sizes;
  bool enforce_eager = false;  // no CUDA graphs: every step runs op by op
  // vLLM's --quantization: "" or fp8 / int8 / int4, applied at load time to an unquantized
  // checkpoint (engine/model/quant_config.h); a quantized checkpoint is read in its own format.
  // Applies to the target model, not a draft.
  std::string quantization = "";
  // vLLM's --kv-cache-dtype: "auto" (the model's: bf16, or fp32 for an fp32 model), "bf16" or
  // "fp8" (e4m3 codes with one fp32 scale per token and KV head: kernels/common/kv_layout.h;
  // about 1.9x the pages of bf16 in the same memory). Target and draft pools alike; a model or
  // backend that cannot run the dtype is refused at Create (never a silent fallback).
  std::string kv_cache_dtype = "auto";
  // Automatic prefix caching (vLLM's --enable-prefix-caching, on by default): full pages of a
  // request's tokens stay cached after it ends, keyed by their chained hash (base/page_hash.h),
  // and a new request reuses its longest cached prefix. Requests added with AddRequest use it;
  // prefilled requests (decode side) keep no cache: every page of theirs was transferred.
  bool enable_prefix_caching = true;
  // Async scheduling (vLLM's --async-scheduling; SGLang's overlap scheduler): on a backend that
  // computes on a device (Model::SupportsAsyncSteps), Step() launches the next step before it
  // returns the outputs of the one just collected, so the caller's handling of those outputs
  // (streaming, metrics) runs while the device computes. The next step is scheduled only after
  // the previous one's tokens are appended and stop-checked: outputs are those of synchronous
  // steps, one step later in wall time by no more than the host's launch. Off with speculative
  // decoding (its verification needs the host).
  bool async_scheduling = true;
  // Speculative decoding (engine/spec/README.md): off by default. A draft model gets its own KV
  // pool with as many pages as the target's (the pool budget is split between the two).
  SpeculativeConfig speculative;
};

// The graph sizes `options` asks for, ascending and without repeats (the default list when
// cuda_graph_sizes is empty); empty with enforce_eager or on the CPU backend. A size outside
// [1, max_num_seqs] is InvalidArgument.
absl::StatusOr<std::vector<int>> CudaGraphSizes(const EngineOptions& options);

// Counters and gauges a shell exports (the engine knows nothing of Prometheus).
struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_pages_total = 0;
  int num_pages_free = 0;
  int num_pages_reserved = 0;  // reserved or receiving for incoming transfers
  int num_pages_owned = 0;
  // Prefix caching: pages holding a cached prefix that no request holds (evictable: Allocate
  // takes them when no page is free), and of the owned ones those a cached prefix names.
  int num_pages_cached = 0;
  int64_t prefix_cache_queries_total = 0;  // tokens of requests admitted with a lookup
  int64_t prefix_cache_hits_total = 0;     // of them, tokens found in the cache
  int64_t num_prompt_tokens_total = 0;
  // Prompt positions run through the model (prefill work): a prefix hit's and a sibling's
  // shared tokens are not computed, a preempted sequence's recomputation is.
  int64_t num_prompt_tokens_computed_total = 0;
  // Siblings (EngineRequest::siblings) that forked from their parent's prompt KV.
  int64_t num_forked_sequences_total = 0;
  int64_t num_generated_tokens_total = 0;
  int64_t num_steps_total = 0;
  int64_t num_preemptions_total = 0;
  // Wall time of the Step() calls that ran (or collected) a batch, and the part of it the host
  // spent blocked on the backend: 1 - device_wait / step_time is the share of the engine
  // thread's host work the device waits for (with async scheduling the caller's handling of
  // the outputs overlaps the next step and is not in it; without, it adds to it).
  int64_t step_time_ns_total = 0;
  int64_t device_wait_ns_total = 0;
  int64_t num_graph_steps_total = 0;  // steps that replayed a CUDA graph
  int64_t num_async_steps_total = 0;  // steps launched before their predecessor's outputs
                                      // were returned (async scheduling)
  // Batches launched and not yet collected (a gauge: at most 1 with async scheduling, up to
  // pipeline_micro_batches with pipeline parallelism), and the most seen so far.
  int num_batches_in_flight = 0;
  int max_batches_in_flight = 0;
  // Speculative decoding (vLLM's spec_decode_* counters): sequence-steps that verified at least
  // one proposal, proposals verified, proposals accepted, and tokens those steps emitted
  // (accepted + the target's own token, less what a stop cut off). Acceptance rate =
  // accepted / draft tokens; mean accepted length = emitted / drafts.
  int64_t spec_decode_num_drafts = 0;
  int64_t spec_decode_num_draft_tokens = 0;
  int64_t spec_decode_num_accepted_tokens = 0;
  int64_t spec_decode_num_emitted_tokens = 0;
  // The draft model's own KV pool (0 / 0 without one).
  int num_draft_pages_total = 0;
  int num_draft_pages_free = 0;
};

class Engine {
 public:
  // Loads the model from options.model_dir. EOS ids come from its config.json and
  // generation_config.json; a checkpoint naming its EOS only in tokenizer_config.json gets the
  // tokenizer's (read once here: the engine keeps no tokenizer).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // Like Create, over a model the caller already has: a test's fake, or a model loaded
  // elsewhere (EOS ids from its config only). options.model_dir is ignored. With the draft
  // method, `draft` is the draft model (null: loaded from options.speculative.draft_model).
  static absl::StatusOr<std::unique_ptr<Engine>> CreateWithModel(
      const EngineOptions& options, std::unique_ptr<Model> model,
      std::unique_ptr<Model> draft = nullptr);
  virtual ~Engine() = default;

  // Queues a request and its siblings. InvalidArgument: empty prompt, bad sampling params,
  // prompt + max_tokens beyond max_model_len, token id out of range, a sibling id repeated or
  // empty; AlreadyExists: the id or a sibling's is live.
  virtual absl::Status AddRequest(EngineRequest request) = 0;
  // Finishes a request with kAbort at the next Step() and frees its pages. NotFound if unknown.
  // Works in every state, including kPrefillDone and reserved: do not abort a request whose
  // pages a transfer is still reading or writing (finish the transfer, or cancel it, first).
  virtual absl::Status Abort(const std::string& id) = 0;
  // Runs one scheduling step: schedule → build inputs → forward → sample → post-process.
  //
  // Failures (engine/model/model.h, Forward). An error confined to the batch ends the batch's
  // requests with kError outputs; the others continue and Step() succeeds. An error that makes
  // the backend unusable (IsBackendUnusable: a sticky device error fails every later step too)
  // breaks the engine, not the batch: Step() returns it, having ended every request it held —
  // waiting, running, prefilled, reserved — with no output and their pages freed (nothing runs
  // on them again, so a transfer still writing reserved pages is harmless). From then on Step()
  // returns that error, AddRequest / ReservePages / AddPrefilledRequest return
  // FailedPrecondition and HasWork() is false. The caller fails its own requests and stops
  // serving (a worker reports itself unhealthy).
  //
  // With async scheduling (EngineOptions::async_scheduling) a Step() collects the step the
  // previous Step() launched, post-processes it, then schedules and launches the next one and
  // returns; HasWork() stays true while a step is launched. Between two Step() calls the caller
  // may call anything on the engine as before: a launched step's sequences change only inside
  // Step() (Abort() takes effect at the next Step(), after the launched step is collected).
  // With pipeline micro-batches (pipeline_parallel > 1, pipeline_micro_batches) up to that
  // many steps of disjoint sequences are in flight: a Step() collects the oldest only when the
  // pipeline is full or nothing else can be scheduled, so the outputs of a step come back up to
  // that many Step() calls after it was launched, in order per request; an abort of a request
  // in flight takes effect once its step is collected.
  virtual absl::StatusOr<std::vector<RequestOutput>> Step() = 0;
  virtual bool HasWork() const = 0;

  // --- disaggregation hooks ---
  // Decode side: reserves pages for a request of `num_tokens` prompt tokens (plus room for its
  // first decode token). ResourceExhausted when the pool cannot hold it now.
  virtual absl::StatusOr<std::vector<int32_t>> ReservePages(const std::string& id,
                                                            int num_tokens) = 0;
  // Decode side: the reserved pages now hold the prompt's KV; `first_token` was sampled by the
  // prefill worker. The request joins the running batch. Its siblings (n / best_of) fork from
  // the reserved pages at once, as in AddRequest: each shares the full prompt pages and
  // recomputes the last prompt page to sample its own first token. `first_token_finished`: that
  // token already ended the request on the prefill worker (kept there for the siblings,
  // EngineRequest::keep_kv_when_finished); the request ends here, with no output, once its
  // siblings forked (it needs siblings then, and max_tokens may be 1).
  virtual absl::Status AddPrefilledRequest(EngineRequest request, int32_t first_token,
                                           bool first_token_finished = false) = 0;
  // Page ids holding a request's KV (prefill side after kPrefillDone; decode side after reserve).
  virtual absl::StatusOr<std::vector<int32_t>> KvPages(const std::string& id) const = 0;
  // Frees the pages of a finished-prefill or reserved request. NotFound if unknown.
  virtual absl::Status ReleaseRequest(const std::string& id) = 0;
  // The KV pool (host memory on the CPU backend, device memory on CUDA) and its layout.
  virtual void* kv_pool() = 0;
  virtual const KvLayout& kv_layout() const = 0;
  // Whether kv_pool() is device memory (the CUDA backend), and a copy between it and host
  // memory that any thread may call (the host KV transport's page reads and writes). The pages
  // copied must not be in use by a step: a finished prefill's pages, or pages receiving a
  // transfer.
  virtual bool kv_pool_on_device() const = 0;
  virtual absl::Status CopyKvMemory(void* dst, const void* src, int64_t bytes) const = 0;
  // Prefill side, layer-wise push (engine/kv_push.h): the listener told of every step that
  // completes prefill-only prompts, of each layer as it is stored, and before their pages are
  // freed. Null (the default): none. Set before the first Step(); must outlive the engine's use.
  virtual void SetKvPushListener(KvPushListener* listener) = 0;

  virtual const ModelConfig& model_config() const = 0;
  virtual int max_model_len() const = 0;
  virtual EngineStats Stats() const = 0;

  // --- prefix caching ---
  // Every cached (evictable) page becomes free; pages requests hold keep their hashes. Returns
  // the number of pages freed (vLLM's reset_prefix_cache).
  virtual int ResetPrefixCache() = 0;
  // Hashes of the pages this engine's cache holds (held by requests or evictable), and a
  // version that changes whenever that set does: what a worker publishes for KV-aware routing.
  virtual std::vector<uint64_t> PrefixCacheHashes() const = 0;
  virtual uint64_t prefix_cache_version() const = 0;
};

}  // namespace tandem
