// Backend: where the engine's model and sampler run. Its own header so that the sampler can name
// it without the Model interface.
#pragma once

namespace tandem {

enum class Backend { kCpu, kCuda };

// "cpu", "cuda": logs, flags and messages.
constexpr const char* BackendName(Backend backend) {
  return backend == Backend::kCuda ? "cuda" : "cpu";
}

}  // namespace tandem
