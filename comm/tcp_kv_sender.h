// TcpKvSender: the host KV transport's sender (prefill side). One TCP connection per transfer;
// SendLayer copies page bytes straight from the pool onto the socket (no staging copy), or,
// with CUDA IPC (comm/kv_ipc.h), device to device into the receiver's mapped pool while the
// socket carries only the grants (kv_wire.h).
// Thread-safe: Begin may be called from any thread; each KvSendOp is driven by one thread.
// Time is real (Clock::Real()): its deadlines bound socket I/O and its durations measure it.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "comm/kv_ipc.h"
#include "comm/kv_transport.h"

namespace tandem {

class TcpKvSender : public KvSender {
 public:
  // `read_pool`: how SendLayer reads pages of a pool that is not host memory (kv_transport.h).
  // `cluster_token` goes in every transfer's hello (the receiver checks it).
  // `kind` picks the data path (kv_ipc.h); kIpc and kAuto use `ipc` (null: this
  // pool cannot be shared, e.g. host memory: kIpc fails every transfer saying so, kAuto is TCP).
  explicit TcpKvSender(KvPoolCopy read_pool = {}, std::string cluster_token = "",
                       KvTransportKind kind = KvTransportKind::kTcp,
                       std::shared_ptr<KvIpcDevice> ipc = nullptr)
      : read_pool_(std::move(read_pool)),
        cluster_token_(std::move(cluster_token)),
        kind_(kind),
        ipc_(std::move(ipc)) {}

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
  std::atomic<bool> logged_fallback_{false};
};

}  // namespace tandem
