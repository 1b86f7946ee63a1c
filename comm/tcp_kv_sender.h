// TcpKvSender: the host KV transport's sender (prefill side). One TCP connection per transfer;
// SendLayer copies page bytes straight from the pool onto the socket (no staging copy), or,
// with CUDA IPC (comm/kv_ipc.h), device to device into the receiver's mapped pool while the
// socket carries only the grants (kv_wire.h), or, with NCCL (comm/nccl_kv_transport.h), by
// ncclSend to the receiver's GPU while the socket carries one small frame per layer.
// Thread-safe: Begin may be called from any thread; each KvSendOp is driven by one thread.
// Time is real (Clock::Real()): its deadlines bound socket I/O and its durations measure it.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "comm/kv_ipc.h"
#include "comm/kv_transport.h"
#include "comm/nccl_kv_transport.h"

namespace tandem {

class TcpKvSender : public KvSender {
 public:
  // `read_pool`: how SendLayer reads pages of a pool that is not host memory (kv_transport.h).
  // `cluster_token` goes in every transfer's hello (the receiver checks it).
  // `kind` picks the data path (kv_ipc.h); kIpc and kAuto use `ipc` (null: this
  // pool cannot be shared, e.g. host memory: kIpc fails every transfer saying so, kAuto is TCP),
  // kNccl and kAuto use `nccl` likewise (null: kNccl fails every transfer saying so).
  explicit TcpKvSender(KvPoolCopy read_pool = {}, std::string cluster_token = "",
                       KvTransportKind kind = KvTransportKind::kTcp,
                       std::shared_ptr<KvIpcDevice> ipc = nullptr,
                       std::shared_ptr<NcclKvTransport> nccl = nullptr)
      : read_pool_(std::move(read_pool)),
        cluster_token_(std::move(cluster_token)),
        kind_(kind),
        ipc_(std::move(ipc)),
        nccl_(std::move(nccl)) {}

  absl::StatusOr<std::unique_ptr<KvSendOp>> Begin(const std::string& peer,
                                                  const std::string& transfer_id,
                                                  const KvLayout& layout, int num_pages,
                                                  absl::Duration timeout,
                                                  std::function<bool()> cancelled) override;
  // Without a cancel check (tests, tools).
  absl::StatusOr<std::unique_ptr<KvSendOp>> Begin(const std::string& peer,
                                                  const std::string& transfer_id,
                                                  const KvLayout& layout, int num_pages,
                                                  absl::Duration timeout) {
    return Begin(peer, transfer_id, layout, num_pages, timeout, {});
  }

 private:
  KvPoolCopy read_pool_;
  const std::string cluster_token_;
  const KvTransportKind kind_;
  const std::shared_ptr<KvIpcDevice> ipc_;
  const std::shared_ptr<NcclKvTransport> nccl_;
  std::atomic<bool> logged_fallback_{false};
  // The data path last used to each peer: a change is logged (the choice per pair).
  absl::Mutex path_mu_;
  absl::flat_hash_map<std::string, std::string> path_of_peer_ ABSL_GUARDED_BY(path_mu_);
  void LogPath(const std::string& peer, const std::string& path, const std::string& why);
};

}  // namespace tandem
