#include "worker/worker_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>

#include "worker/metrics_http_server.h"

namespace tandem {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// vLLM's time-to-first-token buckets: fine enough for CPU-backend phases and GPU ones alike.
const Histogram::BucketBoundaries& PhaseBuckets() {
  static const auto* b = new Histogram::BucketBoundaries{
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160., 640.0, 2560.0};
  return *b;
}

const Histogram::BucketBoundaries& ByteBuckets() {
  static const auto* b = [] {
    auto* v = new Histogram::BucketBoundaries;
    for (double x = 1024; x <= 16.0 * (1 << 30); x *= 4) v->push_back(x);
    return v;
  }();
  return *b;
}

}  // namespace

WorkerMetrics::~WorkerMetrics() = default;

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    const std::string& host, int port, const std::string& role, const std::string& worker_id,
    const std::string& model_name) {
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics);
  m->registry_ = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start({.host = host, .port = port}, m->registry_);
  if (!server.ok()) return server.status();
  m->server_ = *std::move(server);
  // Constant labels on every family.
  const prometheus::Labels labels = {
      {"model_name", model_name}, {"role", role}, {"worker", worker_id}};
  prometheus::Registry& r = *m->registry_;
  auto hist = [&](const std::string& name, const std::string& help, const auto& buckets) {
    return &BuildHistogram().Name(name).Help(help).Labels(labels).Register(r).Add({}, buckets);
  };
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &BuildGauge().Name(name).Help(help).Labels(labels).Register(r).Add({});
  };
  auto counter = [&](const std::string& name, const std::string& help) {
    return &BuildCounter().Name(name).Help(help).Labels(labels).Register(r).Add({});
  };
  // The KV series name the side of the transfer, so that a sum over workers counts each
  // transfer once per name.
  const std::string kv = role == "prefill" ? "tandem_worker_kv_send" : "tandem_worker_kv_receive";
  m->queue_time_ =
      hist("tandem_worker_queue_time_seconds",
           "Time a request waited in this worker before its prefill began", PhaseBuckets());
  m->prefill_time_ = hist("tandem_worker_prefill_time_seconds",
                          "Prompt compute time up to the first sampled token", PhaseBuckets());
  m->kv_transfer_time_ =
      hist(kv + "_seconds", "KV page transfer time, first byte to acknowledgment", PhaseBuckets());
  m->kv_transfer_bytes_ =
      hist(kv + "_bytes", "Bytes of KV pages moved per transfer", ByteBuckets());
  if (role == "prefill") {
    m->kv_exposed_ = hist(kv + "_exposed_seconds",
                          "KV transfer time not overlapped with the prompt's compute: the prompt's "
                          "result -> acknowledgment (layer-wise push), else the whole transfer",
                          PhaseBuckets());
  }
  m->first_decode_step_ =
      hist("tandem_worker_first_decode_step_seconds",
           "Joining the decode batch to the next sampled token", PhaseBuckets());
  m->request_duration_ = hist("tandem_worker_request_duration_seconds",
                              "Time a request held state on this worker", PhaseBuckets());
  m->outcomes_ = &BuildCounter()
                      .Name("tandem_worker_requests_total")
                      .Help("Requests that ended on this worker, by finished_reason")
                      .Labels(labels)
                      .Register(r);
  m->kv_failures_ = &BuildCounter()
                         .Name(kv + "_failures_total")
                         .Help("KV transfers that failed, by reason")
                         .Labels(labels)
                         .Register(r);
  m->kv_paths_ = &BuildCounter()
                      .Name(kv + "_transfers_total")
                      .Help("KV transfers that completed, by the data path their pages took")
                      .Labels(labels)
                      .Register(r);
  m->kv_transport_ = &BuildGauge()
                          .Name("tandem_worker_kv_transport_info")
                          .Help("The configured KV transport (--kv-transport), as a label")
                          .Labels(labels)
                          .Register(r);
  m->kv_cache_ = &BuildGauge()
                      .Name("tandem_worker_kv_cache_info")
                      .Help("KV pool pages, labelled with their dtype (--kv-cache-dtype) and size")
                      .Labels(labels)
                      .Register(r);
  m->running_ = gauge("tandem:num_requests_running", "Requests in this engine's running batch");
  m->waiting_ = gauge("tandem:num_requests_waiting", "Requests queued in this engine");
  m->batches_in_flight_ =
      gauge("tandem:num_batches_in_flight",
            "Batches launched and not yet collected (pipeline micro-batches, async scheduling)");
  m->kv_usage_ = gauge("tandem:kv_cache_usage_perc",
                       "Fraction of this engine's KV pages held by requests or reserved (cached "
                       "pages are evictable: not counted)");
  m->preemptions_ = counter("tandem:num_preemptions_total", "Requests preempted by this engine");
  m->live_ = gauge("tandem_worker_live_requests", "Requests this worker holds state for");
  m->pages_free_ = gauge("tandem_worker_kv_pages_free", "Free KV pages (cached ones not included)");
  m->pages_cached_ = gauge("tandem_worker_kv_pages_cached",
                           "KV pages holding a cached prefix no request holds (evictable)");
  m->prefix_cache_queries_ = counter("tandem:prefix_cache_queries_total",
                                     "Prompt tokens this engine looked up in its prefix cache");
  m->prefix_cache_hits_ = counter("tandem:prefix_cache_hits_total",
                                  "Prompt tokens found in this engine's prefix cache");
  m->prefix_cache_hit_rate_ =
      gauge("tandem_worker_prefix_cache_hit_rate",
            "tandem:prefix_cache_hits_total / tandem:prefix_cache_queries_total");
  m->pages_reserved_ = gauge("tandem_worker_kv_pages_reserved", "KV pages reserved for transfers");
  m->pages_owned_ = gauge("tandem_worker_kv_pages_owned", "KV pages held by requests");
  m->prompt_tokens_ =
      counter("tandem_worker_prompt_tokens_total", "Prompt tokens of requests this engine took");
  m->generation_tokens_ =
      counter("tandem_worker_generation_tokens_total", "Tokens this engine sampled");
  // Speculative decoding: vLLM's spec_decode_* counters (V1) and acceptance-rate gauge (V0).
  m->spec_drafts_ = counter("tandem:spec_decode_num_drafts_total",
                            "Sequence steps that verified speculative proposals");
  m->spec_draft_tokens_ =
      counter("tandem:spec_decode_num_draft_tokens_total", "Speculative proposals verified");
  m->spec_accepted_tokens_ =
      counter("tandem:spec_decode_num_accepted_tokens_total", "Speculative proposals accepted");
  m->spec_emitted_tokens_ = counter("tandem:spec_decode_num_emitted_tokens_total",
                                    "Tokens emitted by verify steps (accepted + the target's own)");
  m->spec_acceptance_rate_ = gauge("tandem:spec_decode_draft_acceptance_rate",
                                   "Accepted / proposed speculative tokens since start");
  m->spec_mean_accepted_length_ =
      gauge("tandem_worker_spec_decode_mean_accepted_length",
            "Tokens emitted per verify step since start (1 + accepted proposals)");
  m->draft_pages_free_ =
      gauge("tandem_worker_draft_kv_pages_free", "Free KV pages of the draft model");
  // Where a step's time goes (engine/engine.h, EngineStats): the host's share of the engine
  // thread is 1 - device_wait / step, and output handling is the worker's own part of the loop.
  m->steps_ = counter("tandem_worker_engine_steps_total", "Engine steps that ran a batch");
  m->graph_steps_ =
      counter("tandem_worker_engine_graph_steps_total", "Engine steps replayed as a CUDA graph");
  m->async_steps_ = counter("tandem_worker_engine_async_steps_total",
                            "Engine steps launched before the last step's outputs were handled");
  m->step_seconds_ = counter("tandem_worker_engine_step_seconds_total",
                             "Engine thread time in steps (device waits included)");
  m->device_wait_seconds_ = counter("tandem_worker_engine_device_wait_seconds_total",
                                    "Engine thread time blocked on the device within steps");
  m->output_seconds_ = counter("tandem_worker_output_handling_seconds_total",
                               "Loop thread time handing step outputs to their streams");
  return m;
}

void WorkerMetrics::ObserveQueueTime(double s) { queue_time_->Observe(s); }
void WorkerMetrics::ObservePrefillTime(double s) { prefill_time_->Observe(s); }
void WorkerMetrics::ObserveKvTransfer(double s, int64_t bytes, const std::string& path) {
  kv_transfer_time_->Observe(s);
  kv_transfer_bytes_->Observe(static_cast<double>(bytes));
  kv_paths_->Add({{"path", path}}).Increment();
}
void WorkerMetrics::ObserveKvExposed(double s) {
  if (kv_exposed_ != nullptr) kv_exposed_->Observe(s);
}
void WorkerMetrics::SetKvCache(const std::string& kv_cache_dtype, int page_size, int num_pages) {
  kv_cache_->Add({{"kv_cache_dtype", kv_cache_dtype}, {"page_size", std::to_string(page_size)}})
      .Set(num_pages);
}

void WorkerMetrics::SetKvTransport(const std::string& kind) {
  kv_transport_->Add({{"kv_transport", kind}}).Set(1);
}
void WorkerMetrics::CountKvTransferFailure(const std::string& reason) {
  kv_failures_->Add({{"reason", reason}}).Increment();
}
void WorkerMetrics::ObserveFirstDecodeStep(double s) { first_decode_step_->Observe(s); }
void WorkerMetrics::ObserveRequestDuration(double s) { request_duration_->Observe(s); }
void WorkerMetrics::CountRequestOutcome(const std::string& reason) {
  outcomes_->Add({{"finished_reason", reason}}).Increment();
}

void WorkerMetrics::UpdateEngine(const EngineStats& stats, int num_live_requests,
                                 int64_t output_handling_ns_total) {
  running_->Set(stats.num_running);
  waiting_->Set(stats.num_waiting);
  batches_in_flight_->Set(stats.num_batches_in_flight);
  live_->Set(num_live_requests);
  const double total = stats.num_pages_total > 0 ? stats.num_pages_total : 1;
  kv_usage_->Set(1.0 - (stats.num_pages_free + stats.num_pages_cached) / total);
  pages_free_->Set(stats.num_pages_free);
  pages_cached_->Set(stats.num_pages_cached);
  if (stats.prefix_cache_queries_total > last_prefix_queries_) {
    prefix_cache_queries_->Increment(
        static_cast<double>(stats.prefix_cache_queries_total - last_prefix_queries_));
    last_prefix_queries_ = stats.prefix_cache_queries_total;
  }
  if (stats.prefix_cache_hits_total > last_prefix_hits_) {
    prefix_cache_hits_->Increment(
        static_cast<double>(stats.prefix_cache_hits_total - last_prefix_hits_));
    last_prefix_hits_ = stats.prefix_cache_hits_total;
  }
  if (stats.prefix_cache_queries_total > 0) {
    prefix_cache_hit_rate_->Set(static_cast<double>(stats.prefix_cache_hits_total) /
                                static_cast<double>(stats.prefix_cache_queries_total));
  }
  pages_reserved_->Set(stats.num_pages_reserved);
  pages_owned_->Set(stats.num_pages_owned);
  if (stats.num_prompt_tokens_total > last_prompt_tokens_) {
    prompt_tokens_->Increment(
        static_cast<double>(stats.num_prompt_tokens_total - last_prompt_tokens_));
    last_prompt_tokens_ = stats.num_prompt_tokens_total;
  }
  if (stats.num_generated_tokens_total > last_generation_tokens_) {
    generation_tokens_->Increment(
        static_cast<double>(stats.num_generated_tokens_total - last_generation_tokens_));
    last_generation_tokens_ = stats.num_generated_tokens_total;
  }
  if (stats.num_preemptions_total > last_preemptions_) {
    preemptions_->Increment(static_cast<double>(stats.num_preemptions_total - last_preemptions_));
    last_preemptions_ = stats.num_preemptions_total;
  }
  // Counter c follows the engine's total `now` (in units of `scale`: 1e-9 turns ns into s).
  auto advance = [](prometheus::Counter* c, int64_t now, int64_t* last, double scale = 1.0) {
    if (now > *last) c->Increment(static_cast<double>(now - *last) * scale);
    *last = std::max(*last, now);
  };
  advance(spec_drafts_, stats.spec_decode_num_drafts, &last_spec_drafts_);
  advance(spec_draft_tokens_, stats.spec_decode_num_draft_tokens, &last_spec_draft_tokens_);
  advance(spec_accepted_tokens_, stats.spec_decode_num_accepted_tokens,
          &last_spec_accepted_tokens_);
  advance(spec_emitted_tokens_, stats.spec_decode_num_emitted_tokens, &last_spec_emitted_tokens_);
  if (stats.spec_decode_num_draft_tokens > 0) {
    spec_acceptance_rate_->Set(static_cast<double>(stats.spec_decode_num_accepted_tokens) /
                               static_cast<double>(stats.spec_decode_num_draft_tokens));
  }
  if (stats.spec_decode_num_drafts > 0) {
    spec_mean_accepted_length_->Set(static_cast<double>(stats.spec_decode_num_emitted_tokens) /
                                    static_cast<double>(stats.spec_decode_num_drafts));
  }
  draft_pages_free_->Set(stats.num_draft_pages_free);
  advance(steps_, stats.num_steps_total, &last_steps_);
  advance(graph_steps_, stats.num_graph_steps_total, &last_graph_steps_);
  advance(async_steps_, stats.num_async_steps_total, &last_async_steps_);
  advance(step_seconds_, stats.step_time_ns_total, &last_step_ns_, 1e-9);
  advance(device_wait_seconds_, stats.device_wait_ns_total, &last_device_wait_ns_, 1e-9);
  advance(output_seconds_, output_handling_ns_total, &last_output_ns_, 1e-9);
}

}  // namespace tandem
