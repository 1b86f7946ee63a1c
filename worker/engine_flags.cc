#include "worker/engine_flags.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/cuda/cuda_device.h"

namespace tandem {

void AddEngineFlags(CLI::App& app, EngineFlags* f) {
  EngineOptions& o = f->engine;
  app.add_option("--backend", f->backend, "auto (cuda if a GPU is visible), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--page-size", o.page_size, "Tokens per KV page")->capture_default_str();
  app.add_option("--num-pages", o.num_pages, "KV pages (0: from the memory settings)");
  app.add_option("--kv-memory-bytes", o.kv_memory_bytes,
                 "KV pool bytes (0: 256 MiB on cpu, --gpu-memory-utilization on cuda)");
  app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                 "Fraction of the GPU's memory this engine may use (weights, KV, graphs)")
      ->capture_default_str();
  app.add_option("--max-num-seqs", o.max_num_seqs, "Running sequences per step")
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                 "Token budget per step (chunked prefill)")
      ->capture_default_str();
  app.add_option("--max-model-len", o.max_model_len, "Context length (0: the model's)");
  app.add_option("--cuda-graph-sizes", f->cuda_graph_sizes,
                 "Decode batch sizes to capture CUDA graphs for, comma-separated (default "
                 "1,2,4,8,16,...,max-num-seqs)");
  app.add_flag("--enforce-eager", o.enforce_eager, "No CUDA graphs: run every step op by op");
  app.add_option("--tensor-parallel-size", o.tensor_parallel,
                 "Ranks the model is split over, one thread each (cuda: one GPU each, rank r "
                 "on visible device r)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--allow-device-sharing", o.allow_device_sharing,
               "Let the ranks (TP x PP) share a GPU when fewer are visible (slower; tests)");
  app.add_option(
         "--pipeline-parallel-size", o.pipeline_parallel,
         "Pipeline stages (layer ranges) of --tensor-parallel-size ranks each (one GPU per rank "
         "on cuda)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--pipeline-micro-batches", o.pipeline_micro_batches,
                 "Batches in flight with --pipeline-parallel-size > 1 so that the stages overlap "
                 "(0: one per stage; 1: the stages run one after another)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--quantization", o.quantization,
                 "Quantize an unquantized checkpoint's linear layers at load time: fp8, int8 or "
                 "int4 (a quantized checkpoint is read in its own format)")
      ->check(CLI::IsMember({"fp8", "int8", "int4"}));
  app.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "KV cache dtype: auto (the model's), bf16 or fp8 (e4m3 with a scale per token "
                 "and KV head; ~1.9x the pages)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}))
      ->capture_default_str();
  SpeculativeConfig& s = o.speculative;
  app.add_option("--speculative-method", f->speculative_method,
                 "Speculative decoding: none, ngram (prompt lookup) or draft (a draft model)")
      ->check(CLI::IsMember({"none", "ngram", "draft"}))
      ->capture_default_str();
  app.add_option("--num-speculative-tokens", s.num_speculative_tokens,
                 "Tokens proposed per sequence and step (k)");
  app.add_option("--speculative-draft-model", s.draft_model,
                 "Draft model directory (sharing the target's tokenizer) for --speculative-method "
                 "draft");
  app.add_option("--prompt-lookup-min", s.prompt_lookup_min, "Smallest n-gram the lookup tries")
      ->capture_default_str();
  app.add_option("--prompt-lookup-max", s.prompt_lookup_max, "Largest n-gram the lookup tries")
      ->capture_default_str();
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.enable_prefix_caching,
               "Automatic prefix caching: reuse the KV of cached full pages of earlier prompts "
               "(on by default; --no-enable-prefix-caching or --enable-prefix-caching=false: off)")
      ->capture_default_str();
  app.add_flag("--async-scheduling,!--no-async-scheduling", o.async_scheduling,
               "Launch the next step before handling the outputs of the last one, so that "
               "streaming and bookkeeping overlap the device (CUDA; on by default, off with "
               "speculative decoding)")
      ->capture_default_str();
}

absl::Status ResolveEngineFlags(EngineFlags* f) {
  if (f->backend == "auto") {
    f->engine.backend = CudaDeviceAvailable() ? Backend::kCuda : Backend::kCpu;
  } else {
    f->engine.backend = f->backend == "cuda" ? Backend::kCuda : Backend::kCpu;
  }
  EngineOptions& o = f->engine;
  o.cuda_graph_sizes.clear();
  for (absl::string_view part : absl::StrSplit(f->cuda_graph_sizes, ',', absl::SkipEmpty())) {
    int size = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cuda-graph-sizes: '", part, "' is not a batch size"));
    }
    o.cuda_graph_sizes.push_back(size);
  }
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", o.gpu_memory_utilization));
  }
  for (int s : o.cuda_graph_sizes) {
    if (s < 1 || s > o.max_num_seqs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cuda-graph-sizes: ", s, " outside [1, --max-num-seqs = ", o.max_num_seqs, "]"));
    }
  }
  absl::StatusOr<SpecMethod> method = ParseSpecMethod(f->speculative_method);
  if (!method.ok()) return method.status();
  o.speculative.method = *method;
  if (absl::Status s = ValidateSpeculativeConfig(o.speculative); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("speculative decoding flags: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace tandem
