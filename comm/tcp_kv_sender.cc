#include "comm/tcp_kv_sender.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/kv_wire.h"

namespace tandem {
namespace {

// Short grace for the best-effort abort notification: never delays the caller for long.
constexpr absl::Duration kAbortNotifyTimeout = absl::Milliseconds(100);
// How long to spin for an answer the receiver sends at once (a warm kNext's, Finish's verdict)
// before sleeping in poll(2): the answer is then read as it arrives, not after a wake-up.
constexpr absl::Duration kReplySpin = absl::Milliseconds(1);

class TcpKvSendOp : public KvSendOp {
 public:
  TcpKvSendOp(Socket socket, const KvLayout& layout, int num_pages, absl::Time deadline,
              KvPoolCopy read_pool)
      : socket_(std::move(socket)),
        read_pool_(std::move(read_pool)),
        layout_(layout),
        num_pages_(num_pages),
        deadline_(deadline),
        start_(Clock::Real()->Now()) {}
  ~TcpKvSendOp() override {
    if (!finished_) Abort("sender dropped the transfer");
  }

  // CUDA IPC: page index i lands in page peer_pages[i] of `peer_pool` (laid out as `peer`),
  // under the receiver's grant of the whole transfer (asked here, once).
  absl::Status UseIpc(KvIpcDevice* ipc, void* peer_pool, const KvLayout& peer,
                      std::vector<int32_t> peer_pages) {
    kv_wire::PagesHeader all{kv_wire::kAllLayers, 0, num_pages_};
    absl::Status st = kv_wire::WriteFrame(socket_, kv_wire::FrameType::kIpcWrite,
                                          kv_wire::EncodePagesHeader(all), deadline_);
    if (!st.ok()) return Fail(st);
    st = ReadVerdict(socket_, deadline_);  // the grant, or the receiver's verdict (cancelled)
    if (!st.ok()) {
      finished_ = true;
      socket_.Close();
      return st;
    }
    AdoptIpcGrant(ipc, peer_pool, peer, std::move(peer_pages));
    return absl::OkStatus();
  }
  // The grant is held already (a warm connection's kNext answer carried it).
  void AdoptIpcGrant(KvIpcDevice* ipc, void* peer_pool, const KvLayout& peer,
                     std::vector<int32_t> peer_pages) {
    ipc_ = ipc;
    stats_.path = "ipc";
    peer_pool_ = peer_pool;
    peer_layout_ = peer;
    peer_pages_ = std::move(peer_pages);
  }

  // After an OK verdict the connection goes to `keep` (the sender's warm pool) instead of
  // being closed.
  void KeepWarm(std::function<void(Socket)> keep) { keep_ = std::move(keep); }
  void MarkWarm() { stats_.warm = true; }

  // NCCL: page index i lands in the receiver's page peer_pages[i], by the pair's communicator
  // (`lease`; built here when this side has none or the receiver refuses the one it has).
  absl::Status UseNccl(NcclKvTransport* nccl, std::unique_ptr<NcclKvTransport::SendLease> lease,
                       std::vector<int32_t> peer_pages) {
    nccl_ = nccl;
    lease_ = std::move(lease);
    peer_pages_ = std::move(peer_pages);
    stats_.path = "nccl";
    NcclPairComm& c = lease_->comm();
    if (c.comm != nullptr) {
      absl::Status st =
          kv_wire::WriteFrame(socket_, kv_wire::FrameType::kNcclUse,
                              kv_wire::EncodeNcclComm({nccl_->key(), c.generation, ""}), deadline_);
      if (!st.ok()) return Fail(st);
      st = ReadVerdict(socket_, deadline_);
      if (st.ok()) return st;
      if (!absl::IsFailedPrecondition(st)) return EndWithVerdict(st);
      // The receiver lost it (it restarted, or aborted it after a failure): build a new one.
      lease_->Break(st.message());
    }
    absl::StatusOr<std::string> id = lease_->StartInit();
    if (!id.ok()) {
      const absl::Status error = absl::UnavailableError(
          absl::StrCat("NCCL communicator init failed: ", id.status().message()));
      Abort(error.message());
      return error;
    }
    absl::Status st =
        kv_wire::WriteFrame(socket_, kv_wire::FrameType::kNcclInit,
                            kv_wire::EncodeNcclComm({nccl_->key(), c.generation, *id}), deadline_);
    if (!st.ok()) return Fail(st);
    // Both ranks init at once; the receiver's verdict on its init may come before ours is done.
    std::optional<absl::Status> verdict;
    st = NcclPoll([&] { return nccl_->api().CommReady(c.comm); },
                  [&] { return WatchPeer(&verdict); }, deadline_, "the NCCL communicator's init");
    if (st.ok() && !verdict.has_value()) {
      verdict = ReadVerdict(socket_, deadline_);
      st = *verdict;
    }
    if (!st.ok()) {
      lease_->Break(st.message());
      if (verdict.has_value() && !verdict->ok()) return EndWithVerdict(*verdict);
      Abort(absl::StrCat("NCCL communicator init failed: ", st.message()));
      return absl::IsDeadlineExceeded(st) || absl::IsCancelled(st)
                 ? st
                 : absl::UnavailableError(
                       absl::StrCat("NCCL communicator init failed: ", st.message()));
    }
    return absl::OkStatus();
  }

  bool OrdersAfterEvents() const override { return ipc_ != nullptr || nccl_ != nullptr; }

  absl::Status SendLayer(int layer, const void* pool, absl::Span<const int32_t> src_pages,
                         int first_index) override {
    RETURN_IF_ERROR(CheckLayer(layer, src_pages, first_index));
    kv_wire::PagesHeader header{layer, first_index, static_cast<int32_t>(src_pages.size())};
    if (ipc_ != nullptr) return EnqueueIpc(header, pool, src_pages, nullptr, /*coalesce=*/true);
    if (nccl_ != nullptr) return SendNccl(header, pool, src_pages, nullptr);
    absl::Status st = kv_wire::WriteFrame(socket_, kv_wire::FrameType::kPages,
                                          kv_wire::EncodePagesHeader(header), deadline_);
    const char* base = static_cast<const char*>(pool);
    const int64_t elem = DTypeSize(layout_.dtype);
    for (size_t i = 0; st.ok() && i < src_pages.size(); ++i) {
      const char* page = base + layout_.PageOffset(layer, src_pages[i]) * elem;
      if (read_pool_) {  // a device pool: through a host staging page
        staging_.resize(static_cast<size_t>(layout_.PageBytes()));
        st = read_pool_(staging_.data(), page, layout_.PageBytes());
        page = staging_.data();
      }
      if (st.ok())
        st = WriteAll(socket_, page, static_cast<size_t>(layout_.PageBytes()), deadline_);
    }
    if (!st.ok()) return Fail(st);
    stats_.bytes += layout_.PageBytes() * static_cast<int64_t>(src_pages.size());
    stats_.pages += static_cast<int64_t>(src_pages.size());
    return absl::OkStatus();
  }

  absl::Status SendLayerAfterEvent(int layer, const void* pool, absl::Span<const int32_t> src_pages,
                                   int first_index, void* ready_event) override {
    if (ipc_ == nullptr && nccl_ == nullptr) {
      return KvSendOp::SendLayerAfterEvent(layer, pool, src_pages, first_index, ready_event);
    }
    RETURN_IF_ERROR(CheckLayer(layer, src_pages, first_index));
    kv_wire::PagesHeader header{layer, first_index, static_cast<int32_t>(src_pages.size())};
    if (nccl_ != nullptr) return SendNccl(header, pool, src_pages, ready_event);
    return EnqueueIpc(header, pool, src_pages, ready_event, /*coalesce=*/false);
  }

  absl::StatusOr<KvTransferStats> Finish() override {
    if (finished_) return absl::FailedPreconditionError("transfer already finished or aborted");
    absl::Status st;
    if (nccl_ != nullptr) return FinishNccl();
    std::string frames;
    if (ipc_ != nullptr) {
      st = FlushIpc();
      if (!st.ok()) {
        Abort(absl::StrCat("CUDA IPC copy failed: ", st.message()));
        return st;
      }
      // Wakes the receiver while the last copies run, so that it takes the confirmation awake.
      st = kv_wire::WriteFrame(socket_, kv_wire::FrameType::kIpcFlush, "", deadline_);
      if (!st.ok()) return Fail(st);
      // The one wait of the transfer: every layer's copy has landed, then one confirmation
      // (kIpcWritten and kDone in one write: the verdict is the only round trip).
      const absl::Time wait_start = Clock::Real()->Now();
      st = ipc_->WaitCopies();
      stats_.copy_wait = Clock::Real()->Now() - wait_start;
      if (!st.ok()) {
        Abort(absl::StrCat("CUDA IPC copy failed: ", st.message()));
        return st;
      }
      kv_wire::AppendFrame(&frames, kv_wire::FrameType::kIpcWritten,
                           kv_wire::EncodeIpcWritten(ranges_));
    }
    kv_wire::AppendFrame(&frames, kv_wire::FrameType::kDone, "");
    st = WriteAll(socket_, frames.data(), frames.size(), deadline_);
    if (!st.ok()) return Fail(st);
    st = ReadVerdict(socket_, deadline_, kReplySpin);
    finished_ = true;
    EndConnection(st.ok());
    if (!st.ok()) return st;
    stats_.duration = Clock::Real()->Now() - start_;
    return stats_;
  }

  void Abort(absl::string_view reason) override {
    if (finished_) return;
    finished_ = true;
    WaitIpcCopies();  // the grant ends with this frame: nothing may land after it
    EndNccl(reason);  // likewise: no send reads the source pages after it
    (void)kv_wire::WriteFrame(socket_, kv_wire::FrameType::kAbort, std::string(reason),
                              std::min(deadline_, Clock::Real()->Now() + kAbortNotifyTimeout));
    socket_.Close();
  }

  // Reads the receiver's kStatus verdict (an early one may arrive instead of a later frame).
  static absl::Status ReadVerdict(const Socket& s, absl::Time deadline,
                                  absl::Duration spin = absl::ZeroDuration()) {
    ASSIGN_OR_RETURN(kv_wire::Frame frame, kv_wire::ReadFrame(s, deadline, spin));
    if (frame.type != kv_wire::FrameType::kStatus) {
      return absl::InternalError("KV receiver sent an unexpected frame");
    }
    return kv_wire::DecodeStatus(frame.body);
  }

 private:
  // The transfer ended: an OK one leaves its connection warm (keep_), any other closes it.
  void EndConnection(bool ok) {
    if (ok && keep_) {
      keep_(std::move(socket_));
    } else {
      socket_.Close();
    }
    keep_ = nullptr;
  }

  // A failed write usually means the receiver closed after sending its verdict (cancelled,
  // deadline): report that verdict rather than a bare "connection reset" when we can.
  absl::Status Fail(const absl::Status& write_error) {
    finished_ = true;
    WaitIpcCopies();
    EndNccl(write_error.message());
    absl::Status verdict =
        ReadVerdict(socket_, std::min(deadline_, Clock::Real()->Now() + absl::Milliseconds(50)));
    socket_.Close();
    return verdict.ok() ? write_error : verdict;
  }

  absl::Status CheckLayer(int layer, absl::Span<const int32_t> src_pages, int first_index) const {
    if (finished_) return absl::FailedPreconditionError("transfer already finished or aborted");
    if (layer < 0 || layer >= layout_.num_layers || first_index < 0 ||
        first_index + static_cast<int64_t>(src_pages.size()) > num_pages_) {
      return absl::InvalidArgumentError(absl::StrCat("SendLayer(layer ", layer, ", first ",
                                                     first_index, ", count ", src_pages.size(),
                                                     ") outside the transfer"));
    }
    return absl::OkStatus();
  }

  // Enqueues the device copy of one range under the grant (no socket traffic, no host wait).
  // A failure aborts the transfer (the receiver reads kAbort and fails it). `coalesce`
  // (SendLayer: the layer is stored already): the same pages of consecutive layers are held
  // back and go as one launch (KvIpcDevice::CopyLayersAsync) once the run reaches the last
  // layer, breaks, or Finish comes: a prompt whose every layer was stored is then one launch
  // that streams all layers, instead of one launch per layer draining the GPU in between.
  absl::Status EnqueueIpc(const kv_wire::PagesHeader& header, const void* pool,
                          absl::Span<const int32_t> src_pages, void* ready_event, bool coalesce) {
    absl::Status st;
    if (ranges_.size() >= kv_wire::kMaxIpcRanges) {
      st = absl::ResourceExhaustedError("too many page ranges in one CUDA IPC transfer");
    } else if (coalesce && held_.num_layers > 0 && held_.pool == pool &&
               held_.first_index == header.first_index &&
               held_.layer + held_.num_layers == header.layer &&
               std::equal(src_pages.begin(), src_pages.end(), held_.src_pages.begin(),
                          held_.src_pages.end())) {
      ++held_.num_layers;
    } else {
      st = FlushIpc();
      if (st.ok() && coalesce) {
        held_ = {header.layer, 1, pool, header.first_index,
                 std::vector<int32_t>(src_pages.begin(), src_pages.end())};
      } else if (st.ok()) {
        const absl::Span<const int32_t> dst_pages =
            absl::MakeConstSpan(peer_pages_).subspan(header.first_index, src_pages.size());
        st = ipc_->CopyLayerAsync(peer_pool_, peer_layout_, pool, layout_, header.layer, dst_pages,
                                  src_pages, ready_event);
      }
    }
    if (st.ok() && coalesce && header.layer == layout_.num_layers - 1) st = FlushIpc();
    if (!st.ok()) {
      Abort(absl::StrCat("CUDA IPC copy failed: ", st.message()));
      return st;
    }
    ranges_.push_back(header);
    stats_.bytes += layout_.PageBytes() * static_cast<int64_t>(src_pages.size());
    stats_.pages += static_cast<int64_t>(src_pages.size());
    return absl::OkStatus();
  }

  // Enqueues the held run of layers (EnqueueIpc), if any, as one launch.
  absl::Status FlushIpc() {
    if (held_.num_layers == 0) return absl::OkStatus();
    HeldLayers run = std::move(held_);
    held_ = HeldLayers{};
    const absl::Span<const int32_t> dst_pages =
        absl::MakeConstSpan(peer_pages_).subspan(run.first_index, run.src_pages.size());
    return ipc_->CopyLayersAsync(peer_pool_, peer_layout_, run.pool, layout_, run.layer,
                                 run.num_layers, dst_pages, run.src_pages, nullptr);
  }

  // The receiver ended the transfer with `verdict` before this side sent anything it must wait
  // for: close and report it.
  absl::Status EndWithVerdict(const absl::Status& verdict) {
    finished_ = true;
    EndNccl(verdict.message());
    socket_.Close();
    return verdict;
  }

  // Between two NCCL polls: waits about kNcclPollInterval for the receiver's verdict. One that
  // came is kept in `*verdict` (an error also ends the wait with it: the receiver gave up, or
  // closed the connection: Unavailable); once it came, just sleeps.
  absl::Status WatchPeer(std::optional<absl::Status>* verdict) {
    if (verdict->has_value()) {
      Clock::Real()->SleepFor(kNcclPollInterval);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(bool readable, PollReadable(socket_, kNcclPollInterval));
    if (!readable) return absl::OkStatus();
    *verdict = ReadVerdict(socket_, deadline_);
    return **verdict;
  }

  // One layer by NCCL: its frame (the runs), then one group of sends, after `ready_event`. No
  // wait for the data: only for NCCL's enqueueing (non-blocking comms), which is quick.
  absl::Status SendNccl(const kv_wire::PagesHeader& header, const void* pool,
                        absl::Span<const int32_t> src_pages, void* ready_event) {
    if (src_pages.empty()) return absl::OkStatus();
    const absl::Span<const int32_t> dst_pages =
        absl::MakeConstSpan(peer_pages_).subspan(header.first_index, src_pages.size());
    kv_wire::NcclLayer frame{header.layer, header.first_index, header.count,
                             NcclPageRuns(src_pages, dst_pages)};
    absl::Status st = kv_wire::WriteFrame(socket_, kv_wire::FrameType::kNcclLayer,
                                          kv_wire::EncodeNcclLayer(frame), deadline_);
    if (!st.ok()) return Fail(st);
    NcclApi& api = nccl_->api();
    NcclPairComm& c = lease_->comm();
    if (ready_event != nullptr) st = api.StreamWaitEvent(c.stream, ready_event);
    if (st.ok()) st = api.GroupStart();
    if (st.ok()) {
      nccl_posted_ = true;
      const char* base = static_cast<const char*>(pool);
      const int64_t elem = DTypeSize(layout_.dtype);
      size_t start = 0;
      for (int32_t run : frame.runs) {
        if (st.ok()) {
          st = api.Send(base + layout_.PageOffset(header.layer, src_pages[start]) * elem,
                        layout_.PageBytes() * run, /*peer=*/1, c.comm, c.stream);
        }
        start += static_cast<size_t>(run);
      }
      const absl::Status ended = api.GroupEnd();
      if (st.ok()) st = ended;
    }
    std::optional<absl::Status> verdict;
    if (st.ok()) {
      st = NcclPoll([&] { return api.CommReady(c.comm); }, [&] { return WatchPeer(&verdict); },
                    deadline_, "enqueueing the NCCL sends");
    }
    if (!st.ok()) {
      if (verdict.has_value()) return EndWithVerdict(st);
      // This side's NCCL failed: tell the receiver (it aborts its half too).
      const absl::Status error =
          absl::UnavailableError(absl::StrCat("NCCL send failed: ", st.message()));
      Abort(error.message());
      return error;
    }
    stats_.bytes += layout_.PageBytes() * static_cast<int64_t>(src_pages.size());
    stats_.pages += static_cast<int64_t>(src_pages.size());
    return absl::OkStatus();
  }

  // kDone, then the sends' completion (polled, under the deadline) and the receiver's verdict.
  absl::StatusOr<KvTransferStats> FinishNccl() {
    absl::Status st = kv_wire::WriteFrame(socket_, kv_wire::FrameType::kDone, "", deadline_);
    if (!st.ok()) return Fail(st);
    NcclApi& api = nccl_->api();
    NcclPairComm& c = lease_->comm();
    std::optional<absl::Status> verdict;
    st = NcclPoll(
        [&]() -> absl::StatusOr<bool> {
          RETURN_IF_ERROR(api.CommReady(c.comm).status());
          return api.StreamDone(c.stream);
        },
        [&] { return WatchPeer(&verdict); }, deadline_, "the NCCL sends");
    if (st.ok() && !verdict.has_value()) st = ReadVerdict(socket_, deadline_);
    if (!st.ok() && !verdict.has_value()) {
      Abort(st.message());  // our failure (deadline, NCCL error, cancel): tell the receiver
      return st;
    }
    finished_ = true;
    EndNccl(st.message());
    EndConnection(st.ok());
    if (!st.ok()) return st;
    stats_.duration = Clock::Real()->Now() - start_;
    return stats_;
  }

  // Ends this op's use of the pair: the communicator is kept when every send enqueued has
  // completed (the receiver matched them all) and it has no error, else aborted (ncclCommAbort:
  // no send reads the source pages after it; the pair rebuilds at its next transfer).
  void EndNccl(absl::string_view why) {
    if (lease_ == nullptr) return;
    NcclApi& api = nccl_->api();
    NcclPairComm& c = lease_->comm();
    bool intact = c.comm != nullptr && api.CommReady(c.comm).ok();
    if (intact && nccl_posted_) {
      const absl::StatusOr<bool> done = api.StreamDone(c.stream);
      intact = done.ok() && *done;
    }
    if (!intact) lease_->Break(absl::StrCat("KV transfer ended with NCCL sends in flight: ", why));
    lease_.reset();
  }

  void WaitIpcCopies() {
    if (ipc_ == nullptr) return;
    if (absl::Status st = ipc_->WaitCopies(); !st.ok()) {
      LOG(WARNING) << "CUDA IPC copies of an ended KV transfer failed: " << st;
    }
  }

  Socket socket_;
  KvPoolCopy read_pool_;       // empty: the pool is host memory
  std::vector<char> staging_;  // one page, for read_pool_
  KvLayout layout_;
  int num_pages_;
  absl::Time deadline_;
  absl::Time start_;
  bool finished_ = false;
  KvTransferStats stats_;
  KvIpcDevice* ipc_ = nullptr;  // non-null: pages go by CUDA IPC
  void* peer_pool_ = nullptr;
  KvLayout peer_layout_;
  std::vector<int32_t> peer_pages_;
  std::vector<kv_wire::PagesHeader> ranges_;  // what went by CUDA IPC (kIpcWritten)
  // SendLayer's consecutive layers of the same pages, not enqueued yet (EnqueueIpc). Dropped
  // unlaunched by an abort: nothing of them ever lands.
  struct HeldLayers {
    int layer = 0;
    int num_layers = 0;  // 0: none held
    const void* pool = nullptr;
    int first_index = 0;
    std::vector<int32_t> src_pages;
  };
  HeldLayers held_;
  NcclKvTransport* nccl_ = nullptr;                    // non-null: pages go by NCCL
  std::unique_ptr<NcclKvTransport::SendLease> lease_;  // the pair, until the op ends
  bool nccl_posted_ = false;                           // a send was enqueued
  std::function<void(Socket)> keep_;                   // empty: the connection is not kept
};

}  // namespace

// An idle warm connection and what its hello settled.
struct TcpKvSender::WarmConnection {
  Socket socket;
  std::string key;            // the peer and the hello (less the transfer's id and pages)
  std::string path = "tcp";   // the data path its transfers take: "tcp", "ipc" or "nccl"
  bool pool_frame = false;    // the hello asked for IPC or NCCL: kNext is answered with kIpcPool
  void* peer_pool = nullptr;  // IPC: the receiver's pool, mapped
  KvLayout peer_layout;
  absl::Time idle_since;
};

// The idle warm connections, per key, the most recently used last.
class TcpKvSender::WarmPool {
 public:
  void Configure(int max_idle_per_peer, absl::Duration idle_timeout, Clock* clock) {
    std::vector<std::unique_ptr<WarmConnection>> closed;
    absl::MutexLock l(&mu_);
    max_idle_ = std::max(0, max_idle_per_peer);
    idle_timeout_ = idle_timeout;
    clock_ = clock;
    for (auto& [key, q] : idle_) {
      while (static_cast<int>(q.size()) > max_idle_) {
        closed.push_back(std::move(q.front()));
        q.pop_front();
        --counters_.idle;
      }
    }
    SweepLocked(&closed);  // drops the emptied keys too
  }
  // The most recently used idle connection of `key` (null: none). Expired ones are closed.
  std::unique_ptr<WarmConnection> Take(const std::string& key) {
    std::vector<std::unique_ptr<WarmConnection>> closed;  // closed outside the lock
    absl::MutexLock l(&mu_);
    SweepLocked(&closed);
    auto it = idle_.find(key);
    if (it == idle_.end()) return nullptr;
    std::unique_ptr<WarmConnection> conn = std::move(it->second.back());
    it->second.pop_back();
    if (it->second.empty()) idle_.erase(it);
    --counters_.idle;
    return conn;
  }
  // A connection whose transfer ended OK. Beyond max_idle_per_peer the oldest is closed.
  void Put(std::unique_ptr<WarmConnection> conn) {
    std::vector<std::unique_ptr<WarmConnection>> closed;
    absl::MutexLock l(&mu_);
    if (closed_ || max_idle_ == 0) {
      closed.push_back(std::move(conn));
      return;
    }
    conn->socket.SetCancel({});  // the transfer's cancel check ends with it
    conn->idle_since = clock_->Now();
    std::deque<std::unique_ptr<WarmConnection>>& q = idle_[conn->key];
    q.push_back(std::move(conn));
    ++counters_.idle;
    if (static_cast<int>(q.size()) > max_idle_) {
      closed.push_back(std::move(q.front()));
      q.pop_front();
      --counters_.idle;
    }
    SweepLocked(&closed);
  }
  void Close() {
    absl::flat_hash_map<std::string, std::deque<std::unique_ptr<WarmConnection>>> idle;
    absl::MutexLock l(&mu_);
    closed_ = true;
    idle.swap(idle_);
    counters_.idle = 0;
  }
  void CountOpened() {
    absl::MutexLock l(&mu_);
    ++counters_.opened;
  }
  void CountReuse(bool stale) {
    absl::MutexLock l(&mu_);
    ++(stale ? counters_.reuse_failed : counters_.reused);
  }
  ConnectionCounters counters() const {
    absl::MutexLock l(&mu_);
    return counters_;
  }

 private:
  void SweepLocked(std::vector<std::unique_ptr<WarmConnection>>* closed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = clock_->Now();
    for (auto it = idle_.begin(); it != idle_.end();) {
      std::deque<std::unique_ptr<WarmConnection>>& q = it->second;
      while (!q.empty() && now - q.front()->idle_since >= idle_timeout_) {
        closed->push_back(std::move(q.front()));
        q.pop_front();
        --counters_.idle;
        ++counters_.expired;
      }
      if (q.empty()) {
        idle_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  mutable absl::Mutex mu_;
  int max_idle_ ABSL_GUARDED_BY(mu_) = kDefaultMaxIdlePerPeer;
  absl::Duration idle_timeout_ ABSL_GUARDED_BY(mu_) = kDefaultIdleTimeout;
  Clock* clock_ ABSL_GUARDED_BY(mu_) = Clock::Real();
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::deque<std::unique_ptr<WarmConnection>>> idle_
      ABSL_GUARDED_BY(mu_);
  ConnectionCounters counters_ ABSL_GUARDED_BY(mu_);
};

TcpKvSender::TcpKvSender(KvPoolCopy read_pool, std::string cluster_token, KvTransportKind kind,
                         std::shared_ptr<KvIpcDevice> ipc, std::shared_ptr<NcclKvTransport> nccl)
    : read_pool_(std::move(read_pool)),
      cluster_token_(std::move(cluster_token)),
      kind_(kind),
      ipc_(std::move(ipc)),
      nccl_(std::move(nccl)),
      pool_(std::make_shared<WarmPool>()) {}

TcpKvSender::~TcpKvSender() { pool_->Close(); }

void TcpKvSender::SetWarmConnections(int max_idle_per_peer, absl::Duration idle_timeout,
                                     Clock* clock) {
  pool_->Configure(max_idle_per_peer, idle_timeout, clock);
}

TcpKvSender::ConnectionCounters TcpKvSender::connection_counters() const {
  return pool_->counters();
}

std::function<void(Socket)> TcpKvSender::Keeper(std::unique_ptr<WarmConnection> info) const {
  std::shared_ptr<WarmConnection> shared(std::move(info));
  return [pool = pool_, shared](Socket socket) {
    auto conn = std::make_unique<WarmConnection>(std::move(*shared));
    conn->socket = std::move(socket);
    pool->Put(std::move(conn));
  };
}

absl::StatusOr<std::unique_ptr<KvSendOp>> TcpKvSender::BeginWarm(
    std::unique_ptr<WarmConnection> conn, const std::string& peer, const std::string& transfer_id,
    const KvLayout& layout, int num_pages, absl::Time deadline, const CancelCheck& cancelled,
    bool* stale) {
  Socket socket = std::move(conn->socket);
  socket.SetCancel(cancelled);
  const bool grant = conn->path == "ipc";
  absl::Status st =
      kv_wire::WriteFrame(socket, kv_wire::FrameType::kNext,
                          kv_wire::EncodeNext({transfer_id, num_pages, grant}), deadline);
  // The receiver answers at once (verdict, page ids, grant: one write).
  absl::StatusOr<kv_wire::Frame> answer = st.ok() ? kv_wire::ReadFrame(socket, deadline, kReplySpin)
                                                  : absl::StatusOr<kv_wire::Frame>(st);
  if (!answer.ok()) {
    // Closed or reset before any answer: the receiver closed the idle connection (its idle
    // timeout) or went away (a restart). No receiver holds this transfer for it: go fresh.
    *stale = absl::IsUnavailable(answer.status());
    return answer.status();
  }
  st = answer->type == kv_wire::FrameType::kStatus
           ? kv_wire::DecodeStatus(answer->body)
           : absl::InternalError("KV receiver sent an unexpected frame");
  if (!st.ok()) return st;  // refused: the connection ends (the receiver closes it too)
  std::vector<int32_t> page_ids;
  if (conn->pool_frame) {
    absl::StatusOr<kv_wire::Frame> frame = kv_wire::ReadFrame(socket, deadline);
    absl::StatusOr<kv_wire::IpcPool> pool =
        !frame.ok() ? absl::StatusOr<kv_wire::IpcPool>(frame.status())
        : frame->type == kv_wire::FrameType::kIpcPool
            ? kv_wire::DecodeIpcPool(frame->body)
            : absl::InternalError("KV receiver sent no IPC pool frame");
    if (pool.ok() && static_cast<int>(pool->page_ids.size()) < num_pages) {
      pool = absl::InternalError("KV receiver's IPC pool frame lists too few pages");
    }
    st = pool.status();
    if (pool.ok()) page_ids = std::move(pool->page_ids);
  }
  if (st.ok() && grant) st = TcpKvSendOp::ReadVerdict(socket, deadline);
  auto op =
      std::make_unique<TcpKvSendOp>(std::move(socket), layout, num_pages, deadline, read_pool_);
  op->MarkWarm();
  if (!st.ok()) {
    op->Abort(st.message());
    return st;
  }
  if (conn->path == "ipc") {
    op->AdoptIpcGrant(ipc_.get(), conn->peer_pool, conn->peer_layout, std::move(page_ids));
  } else if (conn->path == "nccl") {
    absl::StatusOr<std::unique_ptr<NcclKvTransport::SendLease>> lease =
        nccl_->LeaseSend(peer, deadline, cancelled);
    if (!lease.ok()) {
      op->Abort(lease.status().message());
      return lease.status();
    }
    RETURN_IF_ERROR(op->UseNccl(nccl_.get(), *std::move(lease), std::move(page_ids)));
  }
  op->KeepWarm(Keeper(std::move(conn)));
  return std::unique_ptr<KvSendOp>(std::move(op));
}

absl::StatusOr<std::unique_ptr<KvSendOp>> TcpKvSender::Begin(const std::string& peer,
                                                             const std::string& transfer_id,
                                                             const KvLayout& layout, int num_pages,
                                                             absl::Duration timeout,
                                                             std::function<bool()> cancelled) {
  if (kind_ == KvTransportKind::kIpc && ipc_ == nullptr) {
    return absl::FailedPreconditionError(
        "kv_transport ipc: this prefill worker's KV pool cannot be shared by CUDA IPC (a host "
        "pool, or a build without CUDA); use kv_transport tcp or auto");
  }
  if (kind_ == KvTransportKind::kNccl && nccl_ == nullptr) {
    return absl::FailedPreconditionError(
        "kv_transport nccl: this prefill worker has no NCCL transport (a host pool, or a build "
        "without NCCL); use kv_transport tcp or auto");
  }
  KvGroupShape group = KvGroupShape::Single(layout);
  bool set = false;
  {
    absl::MutexLock l(&group_mu_);
    if (group_.has_value()) group = *group_, set = true;
  }
  if (set && !kv_wire::SamePageShape(group.PoolLayout(layout.num_pages), layout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV sender: the layout (", layout.num_layers, " stacked layers of ", layout.num_kv_heads,
        " KV heads) is not the pool of its ", group.SizesString(), " group"));
  }
  if (cancelled && cancelled()) return absl::CancelledError("KV transfer given up before it began");
  const absl::Time deadline = Clock::Real()->Now() + timeout;
  const CancelCheck cancel_check = cancelled;
  kv_wire::Hello hello;
  hello.layout = layout;
  hello.cluster_token = cluster_token_;
  hello.group = group;
  if (ipc_ != nullptr && (kind_ == KvTransportKind::kIpc || kind_ == KvTransportKind::kAuto)) {
    hello.ipc =
        kind_ == KvTransportKind::kIpc ? kv_wire::IpcMode::kRequired : kv_wire::IpcMode::kPreferred;
  }
  if (nccl_ != nullptr && (kind_ == KvTransportKind::kNccl || kind_ == KvTransportKind::kAuto)) {
    hello.nccl = kind_ == KvTransportKind::kNccl ? kv_wire::NcclMode::kRequired
                                                 : kv_wire::NcclMode::kPreferred;
  }
  // A warm connection to this peer whose hello said the same (the transfer's id and pages
  // aside: kNext carries them).
  auto info = std::make_unique<WarmConnection>();
  info->key = absl::StrCat(peer, "\n", kv_wire::EncodeHello(hello));
  info->pool_frame = hello.ipc != kv_wire::IpcMode::kNone || hello.nccl != kv_wire::NcclMode::kNone;
  if (std::unique_ptr<WarmConnection> conn = pool_->Take(info->key)) {
    bool stale = false;
    absl::StatusOr<std::unique_ptr<KvSendOp>> op = BeginWarm(
        std::move(conn), peer, transfer_id, layout, num_pages, deadline, cancel_check, &stale);
    pool_->CountReuse(stale);
    if (!stale) return op;
    LOG(DEBUG) << "KV sender: the warm connection to " << peer
               << " was closed by the receiver; opening a fresh one: " << op.status();
  }
  hello.transfer_id = transfer_id;
  hello.num_pages = num_pages;
  // The socket carries the cancel check: every wait below and in the op observes it.
  ASSIGN_OR_RETURN(Socket socket, Connect(peer, deadline, std::move(cancelled)));
  pool_->CountOpened();
  RETURN_IF_ERROR(kv_wire::WriteFrame(socket, kv_wire::FrameType::kHello,
                                      kv_wire::EncodeHello(hello), deadline));
  RETURN_IF_ERROR(TcpKvSendOp::ReadVerdict(socket, deadline));
  absl::StatusOr<kv_wire::IpcPool> pool = kv_wire::IpcPool{};
  if (info->pool_frame) {
    ASSIGN_OR_RETURN(kv_wire::Frame frame, kv_wire::ReadFrame(socket, deadline));
    pool = frame.type == kv_wire::FrameType::kIpcPool
               ? kv_wire::DecodeIpcPool(frame.body)
               : absl::InternalError("KV receiver sent no IPC pool frame");
    if (pool.ok() && static_cast<int>(pool->page_ids.size()) < num_pages) {
      pool = absl::InternalError("KV receiver's IPC pool frame lists too few pages");
    }
  }
  auto op =
      std::make_unique<TcpKvSendOp>(std::move(socket), layout, num_pages, deadline, read_pool_);
  if (!pool.ok()) {
    op->Abort(pool.status().message());
    return pool.status();
  }
  // NCCL where both sides have it and the pools are on different GPUs (kv_ipc.h).
  const bool same_gpu =
      nccl_ != nullptr && !pool->device_id.empty() && pool->device_id == nccl_->device_id();
  if (hello.nccl != kv_wire::NcclMode::kNone && pool->nccl && !same_gpu) {
    absl::StatusOr<std::unique_ptr<NcclKvTransport::SendLease>> lease =
        nccl_->LeaseSend(peer, deadline, cancel_check);
    if (!lease.ok()) {
      op->Abort(lease.status().message());
      return lease.status();
    }
    RETURN_IF_ERROR(op->UseNccl(nccl_.get(), *std::move(lease), std::move(pool->page_ids)));
    LogPath(peer, "nccl", "the decode pool is on another GPU");
    info->path = "nccl";
    op->KeepWarm(Keeper(std::move(info)));
    return std::unique_ptr<KvSendOp>(std::move(op));
  }
  if (hello.nccl == kv_wire::NcclMode::kRequired) {
    const absl::Status error = absl::FailedPreconditionError(
        same_gpu ? "kv_transport nccl: the decode worker's KV pool is on this GPU and NCCL "
                   "needs two; use kv_transport ipc or auto"
                 : "kv_transport nccl: the decode worker takes no NCCL transfers; use "
                   "kv_transport tcp or auto");
    op->Abort(error.message());
    return error;
  }
  if (!pool->handle.empty()) {
    absl::StatusOr<void*> mapped = ipc_->OpenPool(pool->handle);
    if (mapped.ok()) {
      KvLayout peer_layout = layout;
      peer_layout.num_pages = pool->num_pages;
      RETURN_IF_ERROR(op->UseIpc(ipc_.get(), *mapped, peer_layout, std::move(pool->page_ids)));
      LogPath(peer, "ipc", same_gpu ? "same GPU" : "the decode pool can be mapped");
      info->path = "ipc";
      info->peer_pool = *mapped;
      info->peer_layout = peer_layout;
      op->KeepWarm(Keeper(std::move(info)));
      return std::unique_ptr<KvSendOp>(std::move(op));
    } else if (kind_ == KvTransportKind::kIpc) {
      const absl::Status error = absl::FailedPreconditionError(absl::StrCat(
          "kv_transport ipc: cannot map the decode worker's KV pool (", mapped.status().message(),
          "); the workers must share a GPU or be peers; use kv_transport tcp or auto"));
      op->Abort(error.message());
      return error;
    } else if (!logged_fallback_.exchange(true)) {
      LOG(WARNING) << "KV transport auto: CUDA IPC to " << peer
                   << " is impossible, using TCP: " << mapped.status();
    }
  }
  // A receiver that declined IPC / NCCL (groups of different sizes) says why.
  LogPath(peer, "tcp", pool->declined);
  op->KeepWarm(Keeper(std::move(info)));
  return std::unique_ptr<KvSendOp>(std::move(op));
}

absl::Status TcpKvSender::SetGroupShape(const KvGroupShape& group) {
  if (absl::Status st = CheckKvGroupShape(group); !st.ok()) return st;
  absl::MutexLock l(&group_mu_);
  group_ = group;
  return absl::OkStatus();
}

void TcpKvSender::LogPath(const std::string& peer, const std::string& path,
                          const std::string& why) {
  absl::MutexLock l(&path_mu_);
  std::string& last = path_of_peer_[peer];
  if (last == path) return;
  last = path;
  LOG(INFO) << "KV transport to " << peer << ": " << path << (why.empty() ? "" : " (") << why
            << (why.empty() ? "" : ")");
}

}  // namespace tandem
