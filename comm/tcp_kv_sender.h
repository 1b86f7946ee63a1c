// TcpKvSender: the host KV transport's sender (prefill side). One TCP connection per transfer
// at a time, kept warm after a transfer that succeeded (hello done, the peer's pool mapped, the
// data path chosen) in a bounded per-peer idle pool, so that the next Begin to that peer is one
// round trip (kv_wire.h version 7: kNext) instead of a connect, a hello and a grant;
// SendLayer copies page bytes straight from the pool onto the socket (no staging copy), or,
// with CUDA IPC (comm/kv_ipc.h), device to device into the receiver's mapped pool while the
// socket carries only the grants (kv_wire.h), or, with NCCL (comm/nccl_kv_transport.h), by
// ncclSend to the receiver's GPU while the socket carries one small frame per layer.
// The hello names this sender's group (SetGroupShape; kv_wire.h version 6) so that a decode
// group of other TP / PP sizes maps the pages (the sender sends its pages as they are).
// Thread-safe: Begin may be called from any thread; each KvSendOp is driven by one thread.
// Time is real (Clock::Real()): its deadlines bound socket I/O and its durations measure it.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "comm/kv_head_map.h"
#include "comm/kv_ipc.h"
#include "comm/kv_transport.h"
#include "comm/nccl_kv_transport.h"
#include "comm/socket_io.h"

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
                       std::shared_ptr<NcclKvTransport> nccl = nullptr);
  // Closes the idle connections (an op still running closes its own when it ends).
  ~TcpKvSender() override;

  // Warm connections: at most `max_idle_per_peer` idle connections are kept per peer (0: none,
  // every transfer opens its own connection), each for at most `idle_timeout` since its last
  // transfer, measured on `clock` (expired ones are closed at the next Begin or return to the
  // pool). Only a connection whose transfer ended OK returns to the pool; an error, abort or
  // cancel closes it. A reused connection that the receiver closed meanwhile (it restarted, or
  // its own idle timeout, TcpKvReceiver::SetIdleTimeout) fails at its first frame, and Begin
  // then opens a fresh one, once. Defaults: kDefaultMaxIdlePerPeer, kDefaultIdleTimeout.
  void SetWarmConnections(int max_idle_per_peer, absl::Duration idle_timeout,
                          Clock* clock = Clock::Real());
  static constexpr int kDefaultMaxIdlePerPeer = 4;
  static constexpr absl::Duration kDefaultIdleTimeout = absl::Seconds(30);
  // What the warm pool did so far (tests, metrics).
  struct ConnectionCounters {
    int64_t opened = 0;        // fresh connections (connect + hello)
    int64_t reused = 0;        // transfers begun on a warm connection
    int64_t reuse_failed = 0;  // warm connections found closed by the receiver (then fresh)
    int64_t expired = 0;       // idle connections closed at their idle timeout
    int64_t idle = 0;          // idle connections now
  };
  ConnectionCounters connection_counters() const;

  // This sender's group (its TP and PP sizes, the model's KV heads and layers), named in every
  // hello; Begin refuses a layout that is not its PoolLayout (InvalidArgument). Call before the
  // first Begin. Unset: each transfer's layout is one rank's pool (KvGroupShape::Single).
  absl::Status SetGroupShape(const KvGroupShape& group);

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
  struct WarmConnection;
  class WarmPool;
  // A transfer on a warm connection. `*stale`: the connection had been closed by the receiver
  // before it answered (Begin then goes fresh).
  absl::StatusOr<std::unique_ptr<KvSendOp>> BeginWarm(std::unique_ptr<WarmConnection> conn,
                                                      const std::string& peer,
                                                      const std::string& transfer_id,
                                                      const KvLayout& layout, int num_pages,
                                                      absl::Time deadline,
                                                      const CancelCheck& cancelled, bool* stale);
  // What an op calls after its OK verdict: `info` with the connection goes to the idle pool.
  std::function<void(Socket)> Keeper(std::unique_ptr<WarmConnection> info) const;

  KvPoolCopy read_pool_;
  const std::string cluster_token_;
  const KvTransportKind kind_;
  const std::shared_ptr<KvIpcDevice> ipc_;
  const std::shared_ptr<NcclKvTransport> nccl_;
  const std::shared_ptr<WarmPool> pool_;  // shared with the ops, which may outlive the sender
  std::atomic<bool> logged_fallback_{false};
  absl::Mutex group_mu_;
  std::optional<KvGroupShape> group_ ABSL_GUARDED_BY(group_mu_);
  // The data path last used to each peer: a change is logged (the choice per pair).
  absl::Mutex path_mu_;
  absl::flat_hash_map<std::string, std::string> path_of_peer_ ABSL_GUARDED_BY(path_mu_);
  void LogPath(const std::string& peer, const std::string& path, const std::string& why);
};

}  // namespace tandem
