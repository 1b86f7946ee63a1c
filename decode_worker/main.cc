// tandem-decode-worker: receives prefilled KV into reserved pages and runs the decode batch
// (--role decode, the default: decode_service.h), or runs whole requests with no transfer
// (--role mixed, the colocated baseline: mixed_service.h).
#include <memory>

#include "decode_worker/decode_service.h"
#include "decode_worker/mixed_service.h"
#include "worker/run_worker.h"

int main(int argc, char** argv) {
  return tandem::RunWorker(
      argc, argv, tandem::WorkerRole::kDecode,
      [](const tandem::WorkerEnv& env) -> absl::StatusOr<std::unique_ptr<tandem::WorkerService>> {
        if (env.options->role == tandem::WorkerRole::kMixed) {
          return std::make_unique<tandem::MixedService>(env);
        }
        auto s = tandem::DecodeService::Create(env);
        if (!s.ok()) return s.status();
        return std::unique_ptr<tandem::WorkerService>(*std::move(s));
      });
}
