// NCCL for the KV transport, when a prefill and a decode worker have their KV pools on different
// GPUs: the page bytes go GPU to GPU by ncclSend / ncclRecv, and the TCP transport's connection
// (comm/kv_wire.h) carries only the control frames: the pair's communicator (its unique id, at
// the pair's first transfer and after a failure), one small frame per layer saying which page
// runs follow, and the verdict. So the page-ownership rules are the TCP and IPC paths': the
// decode worker's pages stay `reserved` until the transfer's verdict, and KvReceiver::Cancel's
// `released` runs only once no byte lands any more (the receiver's receives have completed or
// its communicator was aborted).
//
// One communicator per (prefill process, decode process) pair, two ranks: the sender is rank 0,
// the receiver rank 1. It is created when the pair first meets (the first transfer between them)
// and kept: later transfers reuse it after one kNcclUse round trip that checks both sides still
// hold the same generation. Init is non-blocking (blocking = 0) and polled under the transfer's
// deadline. Any failure of a transfer that may leave the pair's operations unmatched — an NCCL
// error (init or async), the deadline, the peer's death (its connection closes) or its abort
// while operations are in flight — aborts the communicator on that side (ncclCommAbort; the peer
// aborts its own when it sees the transfer fail), and the pair's next transfer builds a new one
// (a higher generation): a broken communicator is rebuilt when the peer comes back.
//
// No deadlock, with any number of prefill and decode workers transferring at once. The rule:
//   1. one communicator per pair, and each side enqueues a communicator's operations on a stream
//      of its own that nothing else uses (no transfer of one pair waits behind another pair's);
//   2. transfers of one pair are serialized: the sender holds the pair (LeaseSend) from its
//      kNcclUse / kNcclInit until the receiver's verdict, and the receiver lends a communicator
//      to one transfer at a time, so both ranks enqueue a communicator's operations in the same
//      order — the order of the kNcclLayer frames on that transfer's connection;
//   3. each layer's sends (the receiver's receives) are one group, and the sender writes the
//      layer's frame before enqueueing its group: the receiver enqueues the matching receives as
//      soon as it reads the frame, waiting for nothing else (not its engine, not another pair);
//   4. the NCCL streams never feed back into compute: the sender's stream waits for the engine's
//      per-layer event, nothing waits for the NCCL streams but the transport's own host polls.
// So every wait is "a send for its matching receive (always enqueued)" or "a send for an event of
// compute (which does not wait for NCCL)": no cycle. What the rule cannot exclude (the GPU not
// co-scheduling kernels of different communicators, an implicit device synchronization) ends at
// the transfer's deadline: every wait here is a host poll under it, and the abort frees the pair.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/nccl_api.h"

namespace tandem {

// How often the transport polls a communicator or a stream it waits for (host side).
inline constexpr absl::Duration kNcclPollInterval = absl::Microseconds(100);

// One side's communicator of a pair and the stream its operations go on.
struct NcclPairComm {
  NcclApi::Comm comm = nullptr;
  NcclApi::Stream stream = nullptr;
  uint32_t generation = 0;
};

class NcclKvTransport {
 public:
  // The transport of a worker whose KV pool is `pool` (device memory; its device is where every
  // communicator and stream is created). FailedPrecondition when the pool is not device memory.
  static absl::StatusOr<std::shared_ptr<NcclKvTransport>> Create(std::shared_ptr<NcclApi> api,
                                                                 const void* pool);
  ~NcclKvTransport();  // aborts every communicator still held

  NcclApi& api() const { return *api_; }
  int device() const { return device_; }
  // The GPU's id (NcclApi::DeviceId): the receiver advertises it, the sender compares.
  const std::string& device_id() const { return device_id_; }
  // This process's name as a sender (random, fixed for the transport's life): the receiver
  // keeps one communicator per key.
  const std::string& key() const { return key_; }

  // --- Sender side (rank 0) ---

  // Exclusive use of the pair with the receiver at `peer` for one transfer: while a lease is
  // held, no other transfer to `peer` starts (rule 2 above). The communicator it holds (none at
  // first, or after Break) is kept for the pair's next transfer when the lease ends.
  class SendLease {
   public:
    ~SendLease();
    SendLease(const SendLease&) = delete;
    SendLease& operator=(const SendLease&) = delete;
    // The pair's communicator (comm null: none yet, or broken).
    NcclPairComm& comm();
    // Starts a new communicator (generation one higher; the old one, if any, aborted): a unique
    // id and this side's non-blocking init. Returns the id for the receiver (kNcclInit); poll
    // CommReady before use. On error nothing is left to abort.
    absl::StatusOr<std::string> StartInit();
    // Aborts the communicator (if any): the pair's next transfer builds a new one.
    void Break(absl::string_view why);

   private:
    friend class NcclKvTransport;
    struct Peer;
    SendLease(NcclKvTransport* transport, std::shared_ptr<Peer> peer)
        : transport_(transport), peer_(std::move(peer)) {}
    NcclKvTransport* transport_;
    std::shared_ptr<Peer> peer_;
  };
  // Waits until no other transfer holds the pair with `peer`: DeadlineExceeded at `deadline`,
  // Cancelled within kCancelCheckInterval-ish (10 ms) of `cancelled()` turning true.
  absl::StatusOr<std::unique_ptr<SendLease>> LeaseSend(const std::string& peer, absl::Time deadline,
                                                       const std::function<bool()>& cancelled);

  // --- Receiver side (rank 1) ---

  // A communicator lent to one transfer (rule 2): Return it when the transfer ends.
  struct RecvComm;
  // kNcclInit: starts this side's init of a new communicator for sender `key`, replacing the one
  // it had (aborted now unless a transfer still holds it: then when that one returns it); lent
  // to the caller. Poll CommReady on it before use.
  absl::StatusOr<std::shared_ptr<RecvComm>> StartRecvInit(const std::string& key,
                                                          uint32_t generation,
                                                          const std::string& unique_id);
  // kNcclUse: the ready communicator of sender `key` at `generation`, lent to the caller;
  // FailedPrecondition when there is none (never built, broken, another generation) or another
  // transfer holds it.
  absl::StatusOr<std::shared_ptr<RecvComm>> UseRecv(const std::string& key, uint32_t generation);
  // Ends the loan. `broken`: abort it (a failure that may leave operations unmatched), so the
  // sender's next kNcclUse is refused and the pair rebuilds.
  void ReturnRecv(const std::shared_ptr<RecvComm>& comm, bool broken, absl::string_view why);

  // Communicators this side holds now (sender: pairs with one; receiver: keys with one).
  int NumComms() const;

 private:
  NcclKvTransport(std::shared_ptr<NcclApi> api, int device, std::string device_id);
  // Aborts `c` and clears it (no-op when empty).
  void AbortComm(NcclPairComm& c, absl::string_view why);

  const std::shared_ptr<NcclApi> api_;
  const int device_;
  const std::string device_id_;
  const std::string key_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<SendLease::Peer>> send_peers_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<RecvComm>> recv_comms_ ABSL_GUARDED_BY(mu_);
};

struct NcclKvTransport::RecvComm {
  std::string key;
  NcclPairComm pair;   // touched only by the transfer it is lent to
  bool lent = false;   // guarded by the transport's mu_
  bool stale = false;  // replaced while lent: aborted when returned (transport's mu_)
};

// Splits page indices [0, n) into runs contiguous in both page lists (src[i + 1] == src[i] + 1
// and dst[i + 1] == dst[i] + 1 inside a run): the lengths, in order. Both lists have n entries.
std::vector<int32_t> NcclPageRuns(absl::Span<const int32_t> src, absl::Span<const int32_t> dst);

// Polls `done` until it is true (OK) or an error (returned). After each false poll it runs
// `between`, which should wait about kNcclPollInterval (the transport watches its socket there)
// and whose error is returned (a peer that gave up, a cancel); empty: it sleeps that long.
// DeadlineExceeded("<what> ...") once `deadline` (real time) passed.
absl::Status NcclPoll(const std::function<absl::StatusOr<bool>()>& done,
                      const std::function<absl::Status()>& between, absl::Time deadline,
                      absl::string_view what);

}  // namespace tandem
