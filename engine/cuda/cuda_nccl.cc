// NcclApi (comm/nccl_api.h) over libnccl and the CUDA runtime: non-blocking communicators
// (ncclConfig_t::blocking = 0), each remembering its device so that every call runs with that
// device current; one non-blocking CUDA stream per communicator (the KV transport and the group
// communicator create it; the group communicator may use its caller's stream instead).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/cuda_check.h"
#include "base/logging.h"
#include "comm/nccl_api.h"

namespace tandem {
namespace {

// How long DestroyStream waits for what the stream still holds (an aborted communicator's
// kernels have ended; a compute event it waits for completes on its own).
constexpr absl::Duration kStreamDrainBound = absl::Seconds(5);

struct CommBox {
  ncclComm_t comm = nullptr;
  int device = 0;
};

// A failed NCCL call, with the communicator's last error text when there is one.
absl::Status NcclError(const char* what, ncclResult_t r, ncclComm_t comm) {
  std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(r));
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') absl::StrAppend(&msg, " (", last, ")");
  }
  // A remote error (a peer that died, a network fault) is the transfer's peer's fault.
  return r == ncclRemoteError ? absl::UnavailableError(msg) : absl::InternalError(msg);
}

class CudaNccl final : public NcclApi {
 public:
  absl::StatusOr<int> DeviceOf(const void* ptr) override {
    cudaPointerAttributes attr{};
    CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, ptr));
    if (attr.type != cudaMemoryTypeDevice) {
      return absl::FailedPreconditionError("the KV pool is not device memory: no NCCL");
    }
    return attr.device;
  }

  absl::StatusOr<std::string> DeviceId(int device) override {
    cudaDeviceProp prop{};
    CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
    std::string id = "GPU-";
    for (int i = 0; i < 16; ++i) {
      absl::StrAppend(&id,
                      absl::Hex(static_cast<unsigned char>(prop.uuid.bytes[i]), absl::kZeroPad2));
    }
    return id;
  }

  absl::StatusOr<std::string> GetUniqueId() override {
    ncclUniqueId id;
    NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
  }

  absl::StatusOr<Comm> CommInitRank(const std::string& unique_id, int nranks, int rank,
                                    int device) override {
    if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
      return absl::InvalidArgumentError("not an NCCL unique id");
    }
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    auto box = std::make_unique<CommBox>();
    box->device = device;
    const ncclResult_t r = ncclCommInitRankConfig(&box->comm, nranks, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      absl::Status st = NcclError("ncclCommInitRankConfig", r, box->comm);
      if (box->comm != nullptr) ncclCommAbort(box->comm);
      return st;
    }
    return static_cast<Comm>(box.release());
  }

  absl::StatusOr<bool> CommReady(Comm comm) override {
    auto* box = static_cast<CommBox*>(comm);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(box->comm, &state);
    if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r, box->comm);
    if (state == ncclSuccess) return true;
    if (state == ncclInProgress) return false;
    return NcclError("NCCL communicator", state, box->comm);
  }

  absl::Status GroupStart() override {
    NCCL_RETURN_IF_ERROR(ncclGroupStart());
    return absl::OkStatus();
  }
  absl::Status GroupEnd() override {
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclGroupEnd", r, nullptr);
    return absl::OkStatus();
  }

  absl::Status Send(const void* buf, int64_t bytes, int peer, Comm comm, Stream stream) override {
    auto* box = static_cast<CommBox*>(comm);
    CUDA_RETURN_IF_ERROR(cudaSetDevice(box->device));
    const ncclResult_t r = ncclSend(buf, static_cast<size_t>(bytes), ncclInt8, peer, box->comm,
                                    static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclSend", r, box->comm);
    return absl::OkStatus();
  }
  absl::Status Recv(void* buf, int64_t bytes, int peer, Comm comm, Stream stream) override {
    auto* box = static_cast<CommBox*>(comm);
    CUDA_RETURN_IF_ERROR(cudaSetDevice(box->device));
    const ncclResult_t r = ncclRecv(buf, static_cast<size_t>(bytes), ncclInt8, peer, box->comm,
                                    static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclRecv", r, box->comm);
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(const void* send, void* recv, int64_t count, ReduceType type, Comm comm,
                            Stream stream) override {
    auto* box = static_cast<CommBox*>(comm);
    CUDA_RETURN_IF_ERROR(cudaSetDevice(box->device));
    const ncclDataType_t dt = type == ReduceType::kF32 ? ncclFloat32 : ncclBfloat16;
    const ncclResult_t r = ncclAllReduce(send, recv, static_cast<size_t>(count), dt, ncclSum,
                                         box->comm, static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclAllReduce", r, box->comm);
    return absl::OkStatus();
  }
  absl::Status AllGather(const void* send, void* recv, int64_t bytes, Comm comm,
                         Stream stream) override {
    auto* box = static_cast<CommBox*>(comm);
    CUDA_RETURN_IF_ERROR(cudaSetDevice(box->device));
    const ncclResult_t r = ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclInt8,
                                         box->comm, static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess && r != ncclInProgress) return NcclError("ncclAllGather", r, box->comm);
    return absl::OkStatus();
  }

  void CommAbort(Comm comm) override {
    std::unique_ptr<CommBox> box(static_cast<CommBox*>(comm));
    (void)cudaSetDevice(box->device);
    const ncclResult_t r = ncclCommAbort(box->comm);
    if (r != ncclSuccess) {
      LOG(WARNING) << "ncclCommAbort: " << ncclGetErrorString(r);
    }
  }
  absl::Status CommDestroy(Comm comm) override {
    std::unique_ptr<CommBox> box(static_cast<CommBox*>(comm));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(box->device));
    NCCL_RETURN_IF_ERROR(ncclCommDestroy(box->comm));
    return absl::OkStatus();
  }

  absl::StatusOr<Stream> CreateStream(int device) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaStream_t stream = nullptr;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return static_cast<Stream>(stream);
  }
  void DestroyStream(Stream stream) override {
    auto s = static_cast<cudaStream_t>(stream);
    const absl::Time bound = Clock::Real()->Now() + kStreamDrainBound;
    while (cudaStreamQuery(s) == cudaErrorNotReady && Clock::Real()->Now() < bound) {
      Clock::Real()->SleepFor(absl::Microseconds(100));
    }
    (void)cudaGetLastError();
    if (cudaStreamDestroy(s) != cudaSuccess) {
      LOG(WARNING) << "cudaStreamDestroy of an NCCL KV stream failed";
      (void)cudaGetLastError();
    }
  }
  absl::Status StreamWaitEvent(Stream stream, void* event) override {
    CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> StreamDone(Stream stream) override {
    const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      return false;
    }
    return absl::InternalError(absl::StrCat("cudaStreamQuery: ", cudaGetErrorString(e)));
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<NcclApi>> MakeCudaNccl() {
  return std::shared_ptr<NcclApi>(new CudaNccl());
}

}  // namespace tandem
