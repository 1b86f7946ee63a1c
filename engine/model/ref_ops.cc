// RefOps: the Ops of the CPU backend, on the reference kernels and host memory.
#include <cstring>
#include <map>
#include <vector>

#include "engine/model/ops.h"

namespace tandem {
namespace {

class RefOps final : public Ops {
 public:
  DType compute_dtype() const override { return DType::kF32; }

  absl::StatusOr<const void*> AdoptWeight(HostTensor tensor) override {
    weights_.push_back(std::move(tensor.bytes));
    return static_cast<const void*>(weights_.back().data());
  }
  absl::StatusOr<void*> Buffer(int id, int64_t bytes) override {
    std::vector<float>& b = buffers_[id];
    const size_t floats = static_cast<size_t>((bytes + 3) / 4);
    if (b.size() < floats) b.resize(floats);
    return static_cast<void*>(b.data());
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status Embedding(const EmbeddingArgs& a) override { return Run(EmbeddingRef, a); }
  absl::Status RmsNorm(const RmsNormArgs& a) override { return Run(RmsNormRef, a); }
  absl::Status Gemm(const GemmArgs& a) override { return Run(GemmRef, a); }
  absl::Status RopeKvStore(const RopeKvStoreArgs& a) override { return Run(RopeKvStoreRef, a); }
  absl::Status PagedAttention(const PagedAttentionArgs& a) override {
    return Run(PagedAttentionRef, a);
  }
  absl::Status SiluMul(const SiluMulArgs& a) override { return Run(SiluMulRef, a); }

 private:
  template <typename Args>
  static absl::Status Run(void (*fn)(const Args&), const Args& args) {
    fn(args);
    return absl::OkStatus();
  }

  // Adopted weight bytes. Each inner buffer keeps its address when the outer vector grows
  // (elements are moved, and a move keeps the heap buffer).
  std::vector<std::vector<uint8_t>> weights_;
  std::map<int, std::vector<float>> buffers_;  // float storage: 4-byte aligned or better
};

}  // namespace

std::unique_ptr<Ops> MakeRefOps() { return std::make_unique<RefOps>(); }

}  // namespace tandem
