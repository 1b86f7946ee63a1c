// KV page transfer: how a prefill worker pushes a request's KV pages into the pages a decode
// worker reserved for it. Two implementations share these interfaces: the host transport over
// loopback/LAN TCP (comm/tcp_kv_sender.h, comm/tcp_kv_receiver.h; machines without GPUs), whose
// connection also carries the control frames of the device paths: CUDA IPC (comm/kv_ipc.h) and
// NCCL point-to-point between GPUs (comm/nccl_kv_transport.h).
//
// Addressing: the sender never learns the receiver's page ids. It sends pages by their index in
// the request's page list (index i = tokens [i * page_size, (i + 1) * page_size) of the prompt);
// the receiver maps index i to the i-th page it reserved. Both sides share one KvLayout
// (kernels/common/kv_layout.h) except for num_pages, or, with the host transport, hold the same
// model's KV in groups of other TP / PP sizes (their stacked pools: comm/kv_head_map.h, mapped
// by the receiver); anything else is refused at the handshake.
//
// Granularity: one call per layer and page range, so a sender can push layer l while layer l + 1
// still computes (layer-wise overlap). Page (layer, p) is one contiguous run of PageBytes().
//
// Lifecycle of one transfer (one request), receiver side:
//   Expect(id, pages, deadline)  -> the pages are "receiving"; the transport may write them
//   ... sender connects, sends every (layer, page index) of its pages, then Finish ...
//   done(id, OK)                 -> every page of every layer arrived; commit the request
//   done(id, error)              -> sender aborted or died, layout mismatch, deadline passed
//   Cancel(id)                   -> the caller gives up; once it returns no byte of the pages
//                                   is written any more and done() will not be called for id
// Exactly one of {done(id, ...), Cancel(id) returning true} happens per Expect. done(id, error)
// too comes only once no byte of the sender lands any more (the pages may be freed in it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

// How a host transport reads and writes the pool's bytes: copies `bytes` from src to dst, one of
// them pool memory and the other host memory. Empty (the default): the pool is host memory and
// memcpy does. A pool in device memory (the engine's CUDA backend) passes a copy that goes
// through the device (callable from the transport's threads); the host transport then stages
// each page in host memory.
using KvPoolCopy = std::function<absl::Status(void* dst, const void* src, int64_t bytes)>;

// What one finished (or failed) transfer moved; exported as metrics by the worker shells.
struct KvTransferStats {
  int64_t bytes = 0;
  int64_t pages = 0;  // (layer, page) pairs
  absl::Duration duration;
  std::string path = "tcp";  // the data path the pages took: "tcp", "ipc" or "nccl"
  // The transfer came over a connection kept warm from an earlier one to the same peer (no
  // connect, no hello: comm/kv_wire.h, version 7).
  bool warm = false;
  // Sender, CUDA IPC: the part of Finish spent waiting for the device copies still in flight
  // (the rest of Finish is the confirmation's round trip).
  absl::Duration copy_wait;
};

// One transfer in flight on the sender side. Not thread-safe: one thread drives it.
class KvSendOp {
 public:
  virtual ~KvSendOp() = default;  // without Finish(): behaves as Abort("sender dropped")

  // Sends layer `layer` of the pages `src_pages` (sender's page ids in `pool`, laid out as the
  // layout given at Begin) as page indices [first_index, first_index + src_pages.size()).
  // The host transport copies synchronously; an async transport must not let the caller reuse
  // the source pages before Finish() returns.
  virtual absl::Status SendLayer(int layer, const void* pool, absl::Span<const int32_t> src_pages,
                                 int first_index) = 0;
  // True for a transport whose copies run on a device stream (CUDA IPC): SendLayerAfterEvent
  // orders them after a device event instead of the caller waiting for it.
  virtual bool OrdersAfterEvents() const { return false; }
  // SendLayer, with the copy ordered on the device after `ready_event` (KvPushListener's event
  // for the layer; null: stored now) and no host wait: the copy may still be in flight when it
  // returns, so the source pages stay in use until Finish or Abort returns (or the op is
  // destroyed). Unimplemented unless OrdersAfterEvents().
  virtual absl::Status SendLayerAfterEvent(int layer, const void* pool,
                                           absl::Span<const int32_t> src_pages, int first_index,
                                           void* ready_event) {
    (void)layer, (void)pool, (void)src_pages, (void)first_index, (void)ready_event;
    return absl::UnimplementedError("this KV transport does not order copies after events");
  }
  // Declares the transfer complete and waits for the receiver's acknowledgment: OK means the
  // receiver holds every page and has committed them; the source pages may be freed. Any error
  // means the decode side has given up on the request (and freed or will free its pages).
  virtual absl::StatusOr<KvTransferStats> Finish() = 0;
  // Abandons the transfer; the receiver reports Aborted(reason) for it. Idempotent, never blocks
  // longer than a short best-effort notification, after (device transports) waiting for the
  // copies already enqueued: no byte lands after it returns.
  virtual void Abort(absl::string_view reason) = 0;
};

class KvSender {
 public:
  virtual ~KvSender() = default;
  // Opens a transfer of `num_pages` pages of request `transfer_id` to the receiver at `peer`
  // (the address it advertised, "host:port" for TCP). Every step (connect, handshake, each
  // send, the final acknowledgment) fails with DeadlineExceeded after `timeout` in total.
  // Unavailable: peer unreachable; NotFound: the receiver expects no such transfer;
  // FailedPrecondition: layout mismatch or more pages than the receiver reserved.
  // `cancelled` (may be empty; thread-safe, cheap): once it returns true, whatever this call or
  // the op is waiting on (connect, a send the peer does not drain, the handshake's or Finish's
  // answer) ends within milliseconds with Cancelled and the op is finished (the receiver sees the
  // connection close): a stalled transfer never holds the sender's pages until `timeout`.
  virtual absl::StatusOr<std::unique_ptr<KvSendOp>> Begin(const std::string& peer,
                                                          const std::string& transfer_id,
                                                          const KvLayout& layout, int num_pages,
                                                          absl::Duration timeout,
                                                          std::function<bool()> cancelled) = 0;
};

class KvReceiver {
 public:
  // Called once per transfer that was not cancelled, on a transport thread: never block in it
  // (hand the result to the worker's loop through its queue).
  using DoneCallback =
      std::function<void(const std::string& transfer_id, absl::Status status, KvTransferStats)>;

  virtual ~KvReceiver() = default;  // stops accepting; pending transfers are dropped silently

  // The address senders connect to (give it to the router / prefill worker).
  virtual std::string address() const = 0;
  // Announces a transfer into `pages` (receiver's page ids, request order) of the pool given at
  // construction. AlreadyExists if `transfer_id` is live. After `deadline` the transfer fails
  // with DeadlineExceeded (whether or not a sender ever connected).
  virtual absl::Status Expect(const std::string& transfer_id, std::vector<int32_t> pages,
                              absl::Time deadline) = 0;
  // Gives up on a transfer. Returns true if it was live (then done() is never called for it),
  // false if unknown or already done (then `released` never runs). For a live transfer
  // `released` runs exactly once, when no byte of the sender lands in its pages any more (they
  // may be reused from then on): inside Cancel, or, while a CUDA IPC sender holds the write grant
  // (comm/kv_wire.h), later on a transport thread once the grant ends (the sender's confirmation
  // or abort, its connection closing, or the transfer's deadline). So Cancel never waits for a
  // sender. Never called during the receiver's destruction.
  virtual bool Cancel(const std::string& transfer_id, std::function<void()> released) = 0;
  // Cancel that waits for that point itself: no byte is written to the pages after it returns
  // (blocks while an IPC sender holds the grant).
  bool Cancel(const std::string& transfer_id);
  // Number of live (expected or receiving) transfers.
  virtual int NumPending() const = 0;
};

inline bool KvReceiver::Cancel(const std::string& transfer_id) {
  absl::Notification released;
  const bool live = Cancel(transfer_id, [&released] { released.Notify(); });
  if (live) released.WaitForNotification();
  return live;
}

}  // namespace tandem
