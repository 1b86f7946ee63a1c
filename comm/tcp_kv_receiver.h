// TcpKvReceiver: the host KV transport's receiver (decode side). Listens on a TCP port; each
// sender connection carries a transfer announced earlier with Expect(), and, kept warm after
// one that succeeded, the sender's next ones in sequence (kv_wire.h version 7: kNext; the
// connection ends at any other outcome, or after SetIdleTimeout with no transfer). Page bytes are
// read into a one-page staging buffer and copied into the pool under the transfer's lock, so
// Cancel() can guarantee that no byte lands in the pages after it returns (the pages may then be
// reused); a CUDA IPC sender writes them itself under a grant (kv_wire.h), and Cancel's `released`
// waits for the grant's end; with NCCL (comm/nccl_kv_transport.h) the connection thread
// enqueues ncclRecvs into the pages, which stay lent likewise until they completed or the
// communicator was aborted.
//
// Groups of different TP / PP (kv_wire.h version 6): the receiver knows its own group
// (SetGroupShape; by default one rank whose pool is the layout) and the sender's (its hello);
// pages of groups of one shape land as they come, others through comm/kv_head_map.h: each
// sender page is staged and its head runs copied into this pool's pages (the pages of source
// ranks whose replicated heads a lower rank gives are read and dropped). Groups whose KV is not
// the same model's (layers, KV heads, page shape) are refused at the handshake
// (FailedPrecondition), as is CUDA IPC or NCCL required between groups of different shapes.
//
// Time: transfer deadlines (Expect) and the transfer durations are on the Clock given at
// Create; the socket reads and writes under them are bounded in real time (socket_io.h).
//
// Threads: one accept thread, one reaper thread (deadlines), one thread per live connection
// (a warm one included).
// All public methods are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "comm/kv_head_map.h"
#include "comm/kv_transport.h"
#include "comm/kv_wire.h"
#include "comm/nccl_kv_transport.h"
#include "comm/socket_io.h"

namespace tandem {

class TcpKvReceiver : public KvReceiver {
 public:
  // Listens on host:port (port 0: any free port) and writes transfers into `pool`, laid out as
  // `layout`; `pool` must outlive the receiver. `done` reports each transfer's outcome.
  // Deadlines passed to Expect are on `clock`, which must outlive the receiver.
  // `write_pool`: how pages land in a pool that is not host memory (kv_transport.h).
  // `cluster_token` non-empty: a sender's hello must carry it, else the connection is refused
  // (Unauthenticated) without touching any transfer.
  static absl::StatusOr<std::unique_ptr<TcpKvReceiver>> Create(
      const std::string& host, int port, void* pool, const KvLayout& layout, DoneCallback done,
      Clock* clock = Clock::Real(), KvPoolCopy write_pool = {}, std::string cluster_token = "");
  ~TcpKvReceiver() override;

  // CUDA IPC (comm/kv_ipc.h): the handle of this receiver's exported pool (KvIpcDevice::
  // ExportPool), given to senders that ask for IPC. Call once, before the first Expect.
  void SetIpcExport(std::string handle);
  // NCCL (comm/nccl_kv_transport.h): senders that ask for it may send the pages by NCCL from
  // another GPU. Call once, before the first Expect.
  void SetNccl(std::shared_ptr<NcclKvTransport> nccl);
  // This receiver's group: its TP and PP sizes and the model's KV heads and layers; its
  // PoolLayout must have the layout's page shape (else InvalidArgument, nothing changed). Call
  // once, before the first Expect. Unset: KvGroupShape::Single(layout).
  absl::Status SetGroupShape(const KvGroupShape& group);
  // How long a warm connection may wait for its sender's next transfer before this side closes
  // it (real time; default kDefaultIdleTimeout, longer than the sender's own default so that
  // the sender, which knows when it wants the connection, normally closes first).
  void SetIdleTimeout(absl::Duration timeout);
  static constexpr absl::Duration kDefaultIdleTimeout = absl::Seconds(60);
  // Open sender connections (idle warm ones included).
  int NumConnections() const;

  std::string address() const override { return address_; }
  absl::Status Expect(const std::string& transfer_id, std::vector<int32_t> pages,
                      absl::Time deadline) override;
  using KvReceiver::Cancel;
  bool Cancel(const std::string& transfer_id, std::function<void()> released) override;
  int NumPending() const override;

 private:
  struct Transfer;
  // What the handshake learnt of the sender (Claim).
  struct Incoming {
    int sender_pages = 0;
    bool ipc = false;     // the sender writes the pages by CUDA IPC
    bool nccl = false;    // the sender may send them by NCCL
    KvLayout src_layout;  // the sender's pool layout (num_pages not known)
    // Groups of different shapes: the head map's plan of each source stacked layer; empty:
    // pages land as they come (the groups have one shape).
    std::vector<std::vector<HeadCopy>> plans;
    KvGroupShape src_group;
    KvGroupShape dst_group;  // this receiver's, when the hello came
    // The hello asked for IPC or NCCL: each transfer's page ids go back in a kIpcPool frame
    // (`pool_answer`, with the page ids of the transfer), on a warm connection too.
    bool pool_frame = false;
    kv_wire::IpcPool pool_answer;
  };
  // The NCCL side of one transfer (its connection thread's).
  struct NcclRecv {
    std::shared_ptr<NcclKvTransport::RecvComm> comm;  // lent to this transfer
    bool posted = false;                              // a receive was enqueued
    bool lent = false;                                // this transfer lent the pages (t.lent)
  };

  TcpKvReceiver(Socket listener, std::string address, void* pool, const KvLayout& layout,
                DoneCallback done, Clock* clock, KvPoolCopy write_pool, std::string cluster_token);
  void AcceptLoop();
  void ReaperLoop();
  void ServeConnection(int conn_id, Socket* socket);
  // Handshake: finds and claims the transfer the sender names; sends the verdict; fills `in`.
  absl::StatusOr<std::shared_ptr<Transfer>> Claim(const Socket& socket, Incoming* in);
  // The hello's verdict on the two groups (OK, InvalidArgument for a group that contradicts the
  // hello's layout, or FailedPrecondition); fills in->plans and
  // `*declined` (why IPC / NCCL are not offered) for groups of different shapes.
  absl::Status CheckGroups(const kv_wire::Hello& hello, Incoming* in, std::string* declined) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A warm connection after an OK verdict: waits (up to the idle timeout) for the sender's
  // kNext, claims the transfer it names and answers it in one write (the verdict, the page ids,
  // the IPC grant when asked: `*granted`). Any error ends the connection (a transfer claimed and
  // then failed is completed with it).
  absl::StatusOr<std::shared_ptr<Transfer>> ClaimNext(const Socket& socket, Incoming* in,
                                                      bool* granted);
  // Receives page frames until kDone / kAbort / an error; returns the transfer's outcome.
  // `granted`: the IPC grant was given with the kNext answer (ClaimNext).
  absl::Status ReceivePages(const Socket& socket, Transfer& t, const Incoming& in, bool granted);
  absl::Status ReceiveFrames(const Socket& socket, Transfer& t, const Incoming& in, NcclRecv* nccl,
                             bool granted);
  // kNcclUse / kNcclInit: the pair's communicator, lent to this transfer.
  absl::Status NcclComm(const Socket& socket, const kv_wire::Frame& frame, NcclRecv& nr,
                        absl::Time deadline);
  // kNcclLayer: enqueues the layer's receives into the transfer's pages (one group).
  absl::Status NcclLayer(Transfer& t, const kv_wire::NcclLayer& layer, NcclRecv& nr,
                         absl::Time deadline);
  // Ends the transfer's use of its communicator (aborted unless every receive completed) and
  // of the pages (EndIpcGrant).
  void EndNccl(Transfer& t, NcclRecv& nr, const absl::Status& outcome);
  // Between two NCCL polls while the sender waits for this side: waits about kNcclPollInterval
  // for its frame; an abort (Aborted) or its connection closing (Unavailable) ends the wait.
  absl::Status WatchSender(const Socket& socket, absl::Time deadline);
  std::shared_ptr<NcclKvTransport> nccl_transport() const;
  NcclApi& nccl_api() const { return nccl_transport()->api(); }
  // The whole-transfer kIpcWrite: lends every page to the sender until its kIpcWritten (the
  // ranges it wrote), kAbort or an error; then EndIpcGrant.
  absl::StatusOr<std::vector<kv_wire::PagesHeader>> HoldIpcGrant(const Socket& socket, Transfer& t,
                                                                 absl::Time deadline);
  // Lends every page of the transfer to an IPC sender (Cancelled if it is no longer live).
  static absl::Status LendPages(Transfer& t);
  // The rest of a grant once given: reads the sender's kIpcWritten (after its kIpcFlush hint,
  // spinning a bounded time) or kAbort, ends the grant and returns the ranges written.
  absl::StatusOr<std::vector<kv_wire::PagesHeader>> AwaitIpcWritten(const Socket& socket,
                                                                    Transfer& t,
                                                                    absl::Time deadline);
  // Ends the grant: runs what a Cancel or the deadline left for then (the pages are free).
  void EndIpcGrant(Transfer& t);
  // Whether a range of (sender) layer and page indices is within the transfer.
  static bool InTransfer(const kv_wire::PagesHeader& h, const Incoming& in);
  // Copies one sender page (of sender stacked layer `layer`) into the pool, as it is or through
  // the head map, unless the transfer was cancelled or completed meanwhile (then Cancelled);
  // the pool copy's error if it fails.
  absl::Status WritePage(Transfer& t, const Incoming& in, int layer, int index,
                         const std::vector<char>& staging);
  // Ends a live transfer: removes it and reports `status` (no-op if already ended).
  void Complete(const std::shared_ptr<Transfer>& t, const absl::Status& status);
  void JoinFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Socket listener_;
  const std::string address_;
  char* const pool_;
  KvPoolCopy write_pool_;  // empty: the pool is host memory
  const KvLayout layout_;
  const DoneCallback done_;
  Clock* const clock_;
  const std::string cluster_token_;

  mutable absl::Mutex mu_;
  std::string ipc_handle_ ABSL_GUARDED_BY(mu_);                 // empty: no pool exported
  std::shared_ptr<NcclKvTransport> nccl_ ABSL_GUARDED_BY(mu_);  // null: no NCCL
  KvGroupShape group_ ABSL_GUARDED_BY(mu_);                     // SetGroupShape
  mutable std::atomic<bool> logged_map_{false};  // the head map's first use was logged
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration idle_timeout_ ABSL_GUARDED_BY(mu_) = kDefaultIdleTimeout;
  absl::flat_hash_map<std::string, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  uint64_t num_expected_ ABSL_GUARDED_BY(mu_) = 0;  // Expect calls so far (wakes the reaper)
  // Live connection threads and their sockets (shut down on destruction to unblock them).
  int next_conn_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::thread> conn_threads_ ABSL_GUARDED_BY(mu_);
  std::map<int, Socket*> conn_sockets_ ABSL_GUARDED_BY(mu_);
  std::vector<int> finished_conns_ ABSL_GUARDED_BY(mu_);

  std::thread accept_thread_;
  std::thread reaper_thread_;
};

}  // namespace tandem
