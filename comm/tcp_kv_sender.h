// TcpKvSender: the host KV transport's sender (prefill side). One TCP connection per transfer;
// SendLayer copies page bytes straight from the pool onto the socket (no staging copy).
// Thread-safe: Begin may be called from any thread; each KvSendOp is driven by one thread.
// Time is real (Clock::Real()): its deadlines bound socket I/O and its durations measure it.
#pragma once

#include <memory>
#include <string>

#include "comm/kv_transport.h"

namespace tandem {

class TcpKvSender : public KvSender {
 public:
  // `read_pool`: how SendLayer reads pages of a pool that is not host memory (kv_transport.h).
  // `cluster_token` goes in every transfer's hello (the receiver checks it).
  explicit TcpKvSender(KvPoolCopy read_pool = {}, std::string cluster_token = "")
      : read_pool_(std::move(read_pool)), cluster_token_(std::move(cluster_token)) {}

  absl::StatusOr<std::unique_ptr<KvSendOp>> Begin(const std::string& peer,
                                                  const std::string& transfer_id,
                                                  const KvLayout& layout, int num_pages,
                                                  absl::Duration timeout) override;

 private:
  KvPoolCopy read_pool_;
  const std::string cluster_token_;
};

}  // namespace tandem
