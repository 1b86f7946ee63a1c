#include "comm/tcp_kv_receiver.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/cluster_token.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/kv_wire.h"

namespace tandem {
namespace {

// How long a fresh connection may take to name its transfer (real time: a socket deadline).
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(5);
// Granularity of the accept loop (bounds shutdown latency), in real time.
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
// After an IPC sender's kIpcFlush (its last copies are running), how long to spin for its
// kIpcWritten before sleeping in poll(2): the confirmation is then read within microseconds of
// its arrival, not after a wake-up from a deep idle state, while a longer tail costs at most
// this much CPU.
constexpr absl::Duration kConfirmSpin = absl::Milliseconds(1);

}  // namespace

struct TcpKvReceiver::Transfer {
  std::string id;
  std::vector<int32_t> pages;  // receiver page ids, request order
  absl::Time deadline;         // on the receiver's clock; set once by Expect
  bool claimed = false;        // a sender connected (guarded by the receiver's mu_)
  absl::Time start;            // when the sender connected (receiver's clock; receiver's mu_)
  absl::Mutex mu;              // held while bytes are copied into `pages`
  bool live ABSL_GUARDED_BY(mu) = true;  // false once cancelled or completed
  KvTransferStats stats ABSL_GUARDED_BY(mu);
  // A CUDA IPC sender holds the write grant of every page (kv_wire.h): until it ends, a Cancel
  // or a deadline only records what to run then (the pages are not free before).
  bool lent ABSL_GUARDED_BY(mu) = false;
  std::function<void()> on_released ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<TcpKvReceiver>> TcpKvReceiver::Create(
    const std::string& host, int port, void* pool, const KvLayout& layout, DoneCallback done,
    Clock* clock, KvPoolCopy write_pool, std::string cluster_token) {
  ASSIGN_OR_RETURN(Socket listener, Listen(host, port));
  ASSIGN_OR_RETURN(int bound, LocalPort(listener));
  return std::unique_ptr<TcpKvReceiver>(
      new TcpKvReceiver(std::move(listener), absl::StrCat(host, ":", bound), pool, layout,
                        std::move(done), clock, std::move(write_pool), std::move(cluster_token)));
}

TcpKvReceiver::TcpKvReceiver(Socket listener, std::string address, void* pool,
                             const KvLayout& layout, DoneCallback done, Clock* clock,
                             KvPoolCopy write_pool, std::string cluster_token)
    : listener_(std::move(listener)),
      address_(std::move(address)),
      pool_(static_cast<char*>(pool)),
      write_pool_(std::move(write_pool)),
      layout_(layout),
      done_(std::move(done)),
      clock_(clock),
      cluster_token_(std::move(cluster_token)),
      group_(KvGroupShape::Single(layout)) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  reaper_thread_ = std::thread([this] { ReaperLoop(); });
}

TcpKvReceiver::~TcpKvReceiver() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [id, socket] : conn_sockets_) socket->Shutdown();
    for (auto& [id, t] : transfers_) {
      absl::MutexLock tl(&t->mu);
      t->live = false;
    }
    transfers_.clear();  // dropped silently: no callbacks during destruction
  }
  accept_thread_.join();
  reaper_thread_.join();
  std::map<int, std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    threads.swap(conn_threads_);
  }
  for (auto& [id, t] : threads) t.join();
}

absl::Status TcpKvReceiver::Expect(const std::string& transfer_id, std::vector<int32_t> pages,
                                   absl::Time deadline) {
  for (int32_t p : pages) {
    if (p < 0 || p >= layout_.num_pages) {
      return absl::InvalidArgumentError(absl::StrCat("page ", p, " outside the pool"));
    }
  }
  auto t = std::make_shared<Transfer>();
  t->id = transfer_id;
  t->pages = std::move(pages);
  t->deadline = deadline;
  absl::MutexLock l(&mu_);
  if (!transfers_.emplace(transfer_id, t).second) {
    return absl::AlreadyExistsError(absl::StrCat("transfer ", transfer_id, " already expected"));
  }
  ++num_expected_;
  return absl::OkStatus();
}

bool TcpKvReceiver::Cancel(const std::string& transfer_id, std::function<void()> released) {
  std::shared_ptr<Transfer> t;
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(transfer_id);
    if (it == transfers_.end()) return false;
    t = std::move(it->second);
    transfers_.erase(it);
  }
  {
    absl::MutexLock l(&t->mu);  // waits out a page copy in progress (TCP: one page)
    t->live = false;
    if (t->lent) {  // an IPC sender may write until its grant ends: release then (EndIpcGrant)
      t->on_released = std::move(released);
      return true;
    }
  }
  if (released) released();
  return true;
}

int TcpKvReceiver::NumPending() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(transfers_.size());
}

void TcpKvReceiver::Complete(const std::shared_ptr<Transfer>& t, const absl::Status& status) {
  absl::Duration duration;
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(t->id);
    if (it == transfers_.end() || it->second != t) return;  // cancelled or already ended
    transfers_.erase(it);
    duration = t->claimed ? clock_->Now() - t->start : absl::ZeroDuration();
  }
  KvTransferStats stats;
  {
    absl::MutexLock l(&t->mu);
    t->live = false;
    stats = t->stats;
    stats.duration = duration;
    if (t->lent) {  // the reaper, while an IPC sender holds the grant: report once it ends
      t->on_released = [this, id = t->id, status, stats] { done_(id, status, stats); };
      return;
    }
  }
  done_(t->id, status, stats);
}

void TcpKvReceiver::EndIpcGrant(Transfer& t) {
  std::function<void()> released;
  {
    absl::MutexLock l(&t.mu);
    t.lent = false;
    released = std::move(t.on_released);
    t.on_released = nullptr;
  }
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;  // no callbacks during destruction
  }
  if (released) released();
}

void TcpKvReceiver::AcceptLoop() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      JoinFinishedLocked();
      if (stopping_) return;
    }
    absl::StatusOr<Socket> accepted = Accept(listener_, Clock::Real()->Now() + kPollInterval * 5);
    if (!accepted.ok()) {
      if (!absl::IsDeadlineExceeded(accepted.status())) {
        LOG(WARNING) << "KV receiver accept: " << accepted.status();
        Clock::Real()->SleepFor(kPollInterval);
      }
      continue;
    }
    auto socket = std::make_unique<Socket>(std::move(*accepted));
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    const int id = next_conn_id_++;
    conn_sockets_[id] = socket.get();
    conn_threads_[id] = std::thread([this, id, s = socket.release()] {
      std::unique_ptr<Socket> owned(s);
      ServeConnection(id, owned.get());
      absl::MutexLock l(&mu_);
      conn_sockets_.erase(id);
      finished_conns_.push_back(id);
    });
  }
}

absl::Status TcpKvReceiver::SetGroupShape(const KvGroupShape& group) {
  if (absl::Status st = CheckKvGroupShape(group); !st.ok()) return st;
  if (!kv_wire::SamePageShape(group.PoolLayout(layout_.num_pages), layout_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV receiver: a ", group.SizesString(), " group of ", group.total_kv_heads,
                     " KV heads and ", group.num_layers, " layers has no pool of ",
                     layout_.num_layers, " stacked layers of ", layout_.num_kv_heads, " KV heads"));
  }
  absl::MutexLock l(&mu_);
  group_ = group;
  return absl::OkStatus();
}

void TcpKvReceiver::SetIdleTimeout(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  idle_timeout_ = timeout;
}

int TcpKvReceiver::NumConnections() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(conn_sockets_.size());
}

void TcpKvReceiver::SetIpcExport(std::string handle) {
  absl::MutexLock l(&mu_);
  ipc_handle_ = std::move(handle);
}

void TcpKvReceiver::JoinFinishedLocked() {
  for (int id : finished_conns_) {
    auto it = conn_threads_.find(id);
    if (it == conn_threads_.end()) continue;
    it->second.join();  // the thread has left ServeConnection; only its epilogue remains
    conn_threads_.erase(it);
  }
  finished_conns_.clear();
}

void TcpKvReceiver::ReaperLoop() {
  absl::MutexLock l(&mu_);
  while (!stopping_) {
    // Sleeps until the earliest deadline; a new transfer (maybe due earlier) or stopping wakes
    // it. Transfers that end meanwhile only make it wake for nothing.
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [id, t] : transfers_) next = std::min(next, t->deadline);
    const uint64_t seen = num_expected_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || num_expected_ != seen;
    };
    if (clock_->AwaitWithDeadline(&mu_, absl::Condition(&changed), next)) continue;
    const absl::Time now = clock_->Now();
    std::vector<std::shared_ptr<Transfer>> expired;
    for (auto& [id, t] : transfers_) {
      if (t->deadline <= now) expired.push_back(t);
    }
    if (expired.empty()) continue;
    mu_.Unlock();
    for (auto& t : expired) {
      Complete(t, absl::DeadlineExceededError(absl::StrCat(
                      "KV transfer ", t->id, t->claimed ? " did not finish" : " never started",
                      " before its deadline")));
    }
    mu_.Lock();
  }
}

void TcpKvReceiver::ServeConnection(int conn_id, Socket* socket) {
  Incoming in;
  absl::StatusOr<std::shared_ptr<Transfer>> claimed = Claim(*socket, &in);
  if (!claimed.ok()) {
    if (absl::IsUnauthenticated(claimed.status())) {
      LOG(WARNING) << "KV receiver refused a connection without the cluster token";
    } else {
      LOG(DEBUG) << "KV receiver refused a transfer: " << claimed.status();
    }
    return;
  }
  std::shared_ptr<Transfer> t = std::move(*claimed);
  bool granted = false;  // the IPC grant came with the claim (a warm kNext)
  while (true) {
    absl::Status outcome = ReceivePages(*socket, *t, in, granted);
    bool was_live;
    {
      absl::MutexLock l(&t->mu);
      was_live = t->live;
    }
    if (!was_live) {
      // Cancelled or timed out while we were receiving: tell the sender, which frees its pages.
      outcome = absl::CancelledError(absl::StrCat("KV transfer ", t->id, " cancelled by decode"));
    } else {
      Complete(t, outcome);
    }
    const absl::Status sent =
        kv_wire::WriteFrame(*socket, kv_wire::FrameType::kStatus, kv_wire::EncodeStatus(outcome),
                            Clock::Real()->Now() + absl::Milliseconds(200));
    // Only a connection whose transfer ended OK, both sides knowing it, stays warm.
    if (!outcome.ok() || !sent.ok()) return;
    t.reset();
    absl::StatusOr<std::shared_ptr<Transfer>> next = ClaimNext(*socket, &in, &granted);
    if (!next.ok()) {
      LOG(DEBUG) << "KV receiver: warm connection ended: " << next.status();
      return;
    }
    t = *std::move(next);
  }
}

absl::StatusOr<std::shared_ptr<TcpKvReceiver::Transfer>> TcpKvReceiver::ClaimNext(
    const Socket& socket, Incoming* in, bool* granted) {
  *granted = false;
  absl::Duration idle;
  {
    absl::MutexLock l(&mu_);
    idle = idle_timeout_;
  }
  // Idle until the sender's next transfer, its close, the idle timeout or our destruction (which
  // shuts the socket down: the read ends at once).
  ASSIGN_OR_RETURN(kv_wire::Frame frame, kv_wire::ReadFrame(socket, Clock::Real()->Now() + idle));
  if (frame.type != kv_wire::FrameType::kNext) {
    return absl::InvalidArgumentError("a warm KV connection carried no kNext");
  }
  const absl::Time deadline = Clock::Real()->Now() + kHandshakeTimeout;
  absl::StatusOr<kv_wire::Next> next = kv_wire::DecodeNext(frame.body);
  std::shared_ptr<Transfer> t;
  std::shared_ptr<Transfer> mismatched;  // refused on its page count: fails at once
  absl::Status verdict = next.status();
  if (verdict.ok() && next->grant && !in->ipc) {
    verdict = absl::InvalidArgumentError("a KV IPC grant asked on a connection without IPC");
  }
  if (verdict.ok()) {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(next->transfer_id);
    if (it == transfers_.end()) {
      verdict = absl::NotFoundError(
          absl::StrCat("decode worker expects no KV transfer '", next->transfer_id, "'"));
    } else if (it->second->claimed) {
      verdict = absl::AlreadyExistsError("a sender is already connected for this transfer");
    } else if (next->num_pages > static_cast<int>(it->second->pages.size())) {
      verdict = absl::FailedPreconditionError(absl::StrCat(
          "sender has ", next->num_pages, " pages but decode reserved ", it->second->pages.size()));
      mismatched = it->second;
    } else {
      t = it->second;
      t->claimed = true;
      t->start = clock_->Now();
      in->sender_pages = next->num_pages;
    }
  }
  if (t != nullptr) {
    absl::MutexLock l(&t->mu);
    t->stats.warm = true;
  }
  // The grant is given before it is announced; a Cancel since the claim answers Cancelled.
  if (t != nullptr && next->grant) verdict = LendPages(*t);
  std::string answer;
  kv_wire::AppendFrame(&answer, kv_wire::FrameType::kStatus, kv_wire::EncodeStatus(verdict));
  if (verdict.ok() && in->pool_frame) {
    kv_wire::IpcPool pool = in->pool_answer;
    pool.handle.clear();  // mapped at the hello
    pool.page_ids = t->pages;
    kv_wire::AppendFrame(&answer, kv_wire::FrameType::kIpcPool, kv_wire::EncodeIpcPool(pool));
  }
  if (verdict.ok() && next->grant) {
    kv_wire::AppendFrame(&answer, kv_wire::FrameType::kStatus,
                         kv_wire::EncodeStatus(absl::OkStatus()));
  }
  const absl::Status sent = WriteAll(socket, answer.data(), answer.size(), deadline);
  if (mismatched != nullptr) Complete(mismatched, verdict);
  if (!verdict.ok()) {
    if (t != nullptr) Complete(t, verdict);  // claimed, then cancelled (no-op) or refused
    return verdict;
  }
  if (!sent.ok()) {
    if (next->grant) EndIpcGrant(*t);
    Complete(t, sent);
    return sent;
  }
  *granted = next->grant;
  return t;
}

absl::Status TcpKvReceiver::CheckGroups(const kv_wire::Hello& hello, Incoming* in,
                                        std::string* declined) const {
  RETURN_IF_ERROR(kv_wire::CheckHelloGroup(hello));
  in->src_group = hello.group;
  in->dst_group = group_;
  in->src_layout = hello.group.PoolLayout(0);
  if (hello.group == group_) return absl::OkStatus();
  if (absl::Status st = CheckMappable(hello.group, group_); !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the prefill group (", hello.group.SizesString(), ") and this decode group (",
                     group_.SizesString(), ") hold other KV: ", st.message()));
  }
  const std::string sizes =
      absl::StrCat("prefill ", hello.group.SizesString(), ", decode ", group_.SizesString());
  if (hello.ipc == kv_wire::IpcMode::kRequired || hello.nccl == kv_wire::NcclMode::kRequired) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv_transport ", hello.ipc == kv_wire::IpcMode::kRequired ? "ipc" : "nccl",
                     " moves KV pages unchanged, but the groups' sizes differ (", sizes,
                     "): their pages map only over tcp; use kv_transport tcp or auto"));
  }
  *declined = absl::StrCat("the groups' sizes differ (", sizes, "): pages go through the head map");
  if (!logged_map_.exchange(true)) {
    LOG(INFO) << "KV receiver: pages from a prefill group of other sizes (" << sizes
              << ") land through the KV head map";
  }
  in->plans.resize(static_cast<size_t>(in->src_layout.num_layers));
  for (int l = 0; l < in->src_layout.num_layers; ++l) {
    ASSIGN_OR_RETURN(in->plans[static_cast<size_t>(l)], PlanHeadCopies(hello.group, group_, l));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<TcpKvReceiver::Transfer>> TcpKvReceiver::Claim(const Socket& socket,
                                                                              Incoming* in) {
  const absl::Time deadline = Clock::Real()->Now() + kHandshakeTimeout;
  ASSIGN_OR_RETURN(kv_wire::Frame frame, kv_wire::ReadFrame(socket, deadline));
  absl::StatusOr<kv_wire::Hello> hello =
      frame.type == kv_wire::FrameType::kHello
          ? kv_wire::DecodeHello(frame.body)
          : absl::InvalidArgumentError("KV transfer did not start with a hello");
  std::shared_ptr<Transfer> t;
  kv_wire::IpcPool ipc_pool;
  std::shared_ptr<NcclKvTransport> nccl_transport;
  std::string declined;  // why IPC / NCCL are not offered
  absl::Status verdict = hello.status();
  if (verdict.ok() && !cluster_token_.empty() &&
      !TokenMatches(cluster_token_, hello->cluster_token)) {
    // Refused before the transfer is looked up: a stranger can neither claim nor fail one.
    verdict = absl::UnauthenticatedError("KV transfer without the cluster token");
    RETURN_IF_ERROR(kv_wire::WriteFrame(socket, kv_wire::FrameType::kStatus,
                                        kv_wire::EncodeStatus(verdict), deadline));
    return verdict;
  }
  if (verdict.ok()) {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(hello->transfer_id);
    if (it == transfers_.end()) {
      verdict = absl::NotFoundError(
          absl::StrCat("decode worker expects no KV transfer '", hello->transfer_id, "'"));
    } else if (it->second->claimed) {
      verdict = absl::AlreadyExistsError("a sender is already connected for this transfer");
    } else if (absl::Status groups = CheckGroups(*hello, in, &declined); !groups.ok()) {
      verdict = groups;
    } else if (hello->num_pages > static_cast<int>(it->second->pages.size())) {
      verdict = absl::FailedPreconditionError(absl::StrCat("sender has ", hello->num_pages,
                                                           " pages but decode reserved ",
                                                           it->second->pages.size()));
    } else if (hello->ipc == kv_wire::IpcMode::kRequired && ipc_handle_.empty()) {
      verdict = absl::FailedPreconditionError(
          "the decode worker's KV pool is not exported for CUDA IPC (a host pool, "
          "--kv-transport tcp, or the export failed: see its log); use kv_transport tcp or auto");
    } else if (hello->nccl == kv_wire::NcclMode::kRequired && nccl_ == nullptr) {
      verdict = absl::FailedPreconditionError(
          "the decode worker takes no NCCL KV transfers (a host pool, --kv-transport tcp or ipc, "
          "or a build without NCCL: see its log); use kv_transport tcp or auto");
    } else {
      t = it->second;
      t->claimed = true;
      if (declined.empty()) {  // IPC and NCCL move pages unchanged: groups of one shape only
        if (hello->ipc != kv_wire::IpcMode::kNone) ipc_pool.handle = ipc_handle_;
        if (hello->nccl != kv_wire::NcclMode::kNone) nccl_transport = nccl_;
      }
      ipc_pool.declined = declined;
      t->start = clock_->Now();
      in->sender_pages = hello->num_pages;
    }
  }
  RETURN_IF_ERROR(kv_wire::WriteFrame(socket, kv_wire::FrameType::kStatus,
                                      kv_wire::EncodeStatus(verdict), deadline));
  if (!verdict.ok()) {
    // A mismatch is fatal for the transfer too: decode would otherwise wait for its deadline.
    if (t == nullptr && hello.ok() && !absl::IsNotFound(verdict) &&
        !absl::IsAlreadyExists(verdict)) {
      std::shared_ptr<Transfer> failed;
      {
        absl::MutexLock l(&mu_);
        auto it = transfers_.find(hello->transfer_id);
        if (it != transfers_.end()) failed = it->second;
      }
      if (failed) Complete(failed, verdict);
    }
    return verdict;
  }
  if (hello->ipc != kv_wire::IpcMode::kNone || hello->nccl != kv_wire::NcclMode::kNone) {
    ipc_pool.num_pages = layout_.num_pages;
    in->ipc = !ipc_pool.handle.empty();
    in->nccl = nccl_transport != nullptr;
    ipc_pool.nccl = in->nccl;
    if (in->nccl) ipc_pool.device_id = nccl_transport->device_id();
    in->pool_frame = true;
    in->pool_answer = ipc_pool;  // the connection's later transfers answer with it too
    ipc_pool.page_ids = t->pages;
    RETURN_IF_ERROR(kv_wire::WriteFrame(socket, kv_wire::FrameType::kIpcPool,
                                        kv_wire::EncodeIpcPool(ipc_pool), deadline));
  }
  return t;
}

absl::Status TcpKvReceiver::ReceivePages(const Socket& socket, Transfer& t, const Incoming& in,
                                         bool granted) {
  NcclRecv nr;
  const absl::Status outcome = ReceiveFrames(socket, t, in, in.nccl ? &nr : nullptr, granted);
  if (in.nccl) EndNccl(t, nr, outcome);
  return outcome;
}

absl::Status TcpKvReceiver::ReceiveFrames(const Socket& socket, Transfer& t, const Incoming& in,
                                          NcclRecv* nccl, bool granted) {
  // Pages and layers are the sender's (its stacked pool; this pool's when the groups have one
  // shape, which IPC and NCCL require).
  const int sender_pages = in.sender_pages;
  const bool ipc = in.ipc;
  std::vector<char> staging;  // one page, for kPages
  // A byte per (layer, page index) received: the count and fill of a range vectorize (the
  // confirmation of a whole IPC transfer marks every page of it, on the transfer's critical path).
  std::vector<uint8_t> received(static_cast<size_t>(in.src_layout.num_layers) * sender_pages, 0);
  int64_t num_received = 0;
  auto mark = [&](int layer, int first_index, int count) {
    const auto begin =
        received.begin() + static_cast<ptrdiff_t>(layer) * sender_pages + first_index;
    num_received += std::count(begin, begin + count, uint8_t{0});
    std::fill(begin, begin + count, uint8_t{1});
  };
  // Reads may run a little past the deadline (the transfer's, carried over to real time); the
  // reaper ends the transfer exactly at it.
  const absl::Time deadline =
      Clock::Real()->Now() + (t.deadline - clock_->Now()) + kPollInterval * 5;
  // The ranges an IPC sender confirmed it wrote under the grant.
  auto written = [&](const std::vector<kv_wire::PagesHeader>& ranges) -> absl::Status {
    int64_t pages = 0;
    for (const kv_wire::PagesHeader& r : ranges) {
      if (!InTransfer(r, in)) {
        return absl::InvalidArgumentError("KV IPC range outside the transfer");
      }
      mark(r.layer, r.first_index, r.count);
      pages += r.count;
    }
    absl::MutexLock l(&t.mu);
    t.stats.bytes += layout_.PageBytes() * pages;
    t.stats.pages += pages;
    return absl::OkStatus();
  };
  if (granted) {  // given with the kNext answer: the grant is the transfer's first step
    ASSIGN_OR_RETURN(std::vector<kv_wire::PagesHeader> ranges,
                     AwaitIpcWritten(socket, t, deadline));
    RETURN_IF_ERROR(written(ranges));
  }
  while (true) {
    ASSIGN_OR_RETURN(kv_wire::Frame frame, kv_wire::ReadFrame(socket, deadline));
    if (frame.type == kv_wire::FrameType::kAbort) {
      return absl::AbortedError(absl::StrCat("prefill aborted the KV transfer: ", frame.body));
    }
    if (frame.type == kv_wire::FrameType::kDone) {
      if (num_received != static_cast<int64_t>(received.size())) {
        return absl::DataLossError(absl::StrCat("KV transfer ended with ", num_received, " of ",
                                                received.size(), " pages"));
      }
      if (nccl != nullptr && nccl->posted) {
        // Every receive enqueued; the verdict waits until they have landed.
        NcclApi& api = nccl_api();
        const NcclPairComm& c = nccl->comm->pair;
        absl::Status st = NcclPoll(
            [&]() -> absl::StatusOr<bool> {
              RETURN_IF_ERROR(api.CommReady(c.comm).status());
              return api.StreamDone(c.stream);
            },
            [&] { return WatchSender(socket, deadline); }, deadline, "the NCCL receives");
        if (!st.ok()) return st;
      }
      return absl::OkStatus();
    }
    if (nccl != nullptr && (frame.type == kv_wire::FrameType::kNcclUse ||
                            frame.type == kv_wire::FrameType::kNcclInit)) {
      RETURN_IF_ERROR(NcclComm(socket, frame, *nccl, deadline));
      continue;
    }
    if (nccl != nullptr && frame.type == kv_wire::FrameType::kNcclLayer) {
      ASSIGN_OR_RETURN(kv_wire::NcclLayer layer, kv_wire::DecodeNcclLayer(frame.body));
      if (!InTransfer({layer.layer, layer.first_index, layer.count}, in)) {
        return absl::InvalidArgumentError("KV nccl layer outside the transfer");
      }
      RETURN_IF_ERROR(NcclLayer(t, layer, *nccl, deadline));
      mark(layer.layer, layer.first_index, layer.count);
      absl::MutexLock l(&t.mu);
      t.stats.bytes += layout_.PageBytes() * layer.count;
      t.stats.pages += layer.count;
      continue;
    }
    const bool ipc_write = ipc && frame.type == kv_wire::FrameType::kIpcWrite;
    if (frame.type != kv_wire::FrameType::kPages && !ipc_write) {
      return absl::InvalidArgumentError("unexpected frame in a KV transfer");
    }
    ASSIGN_OR_RETURN(kv_wire::PagesHeader h, kv_wire::DecodePagesHeader(frame.body));
    if (ipc_write) {
      if (granted || h.layer != kv_wire::kAllLayers || h.first_index != 0 ||
          h.count != sender_pages) {
        return absl::InvalidArgumentError(
            "a KV IPC grant must be asked once, for every page of every layer");
      }
      granted = true;
      ASSIGN_OR_RETURN(std::vector<kv_wire::PagesHeader> ranges, HoldIpcGrant(socket, t, deadline));
      RETURN_IF_ERROR(written(ranges));
      continue;
    }
    if (!InTransfer(h, in)) {
      return absl::InvalidArgumentError("KV pages frame outside the transfer");
    }
    staging.resize(static_cast<size_t>(in.src_layout.PageBytes()));
    for (int i = 0; i < h.count; ++i) {
      RETURN_IF_ERROR(ReadAll(socket, staging.data(), staging.size(), deadline));
      const int index = h.first_index + i;
      RETURN_IF_ERROR(WritePage(t, in, h.layer, index, staging));
      mark(h.layer, index, 1);
    }
  }
}

absl::Status TcpKvReceiver::NcclComm(const Socket& socket, const kv_wire::Frame& frame,
                                     NcclRecv& nr, absl::Time deadline) {
  if (nr.comm != nullptr) {
    return absl::InvalidArgumentError("a second NCCL communicator in one KV transfer");
  }
  ASSIGN_OR_RETURN(kv_wire::NcclComm m, kv_wire::DecodeNcclComm(frame.body));
  NcclKvTransport& nccl = *nccl_transport();
  if (frame.type == kv_wire::FrameType::kNcclUse) {
    // Refused (FailedPrecondition) when this side has no such communicator: the sender then
    // builds a new one in this same transfer (kNcclInit).
    absl::StatusOr<std::shared_ptr<NcclKvTransport::RecvComm>> c =
        nccl.UseRecv(m.key, m.generation);
    RETURN_IF_ERROR(kv_wire::WriteFrame(socket, kv_wire::FrameType::kStatus,
                                        kv_wire::EncodeStatus(c.status()), deadline));
    if (c.ok()) nr.comm = *std::move(c);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<NcclKvTransport::RecvComm>> c =
      nccl.StartRecvInit(m.key, m.generation, m.unique_id);
  if (!c.ok()) {
    return absl::UnavailableError(
        absl::StrCat("NCCL communicator init failed on the decode side: ", c.status().message()));
  }
  nr.comm = *std::move(c);
  const NcclPairComm& pair = nr.comm->pair;
  absl::Status st = NcclPoll([&] { return nccl.api().CommReady(pair.comm); },
                             [&] { return WatchSender(socket, deadline); }, deadline,
                             "the NCCL communicator's init");
  if (!st.ok()) {
    if (absl::IsDeadlineExceeded(st) || absl::IsAborted(st) || absl::IsUnavailable(st)) return st;
    return absl::UnavailableError(
        absl::StrCat("NCCL communicator init failed on the decode side: ", st.message()));
  }
  return kv_wire::WriteFrame(socket, kv_wire::FrameType::kStatus,
                             kv_wire::EncodeStatus(absl::OkStatus()), deadline);
}

absl::Status TcpKvReceiver::NcclLayer(Transfer& t, const kv_wire::NcclLayer& layer, NcclRecv& nr,
                                      absl::Time deadline) {
  if (nr.comm == nullptr) {
    return absl::InvalidArgumentError("a KV nccl layer before the transfer's communicator");
  }
  // Each run must be contiguous in the reserved pages too: a run never writes a page outside
  // the reservation.
  size_t start = static_cast<size_t>(layer.first_index);
  for (int32_t run : layer.runs) {
    for (int32_t k = 1; k < run; ++k) {
      if (t.pages[start + k] != t.pages[start] + k) {
        return absl::InvalidArgumentError(
            "a KV nccl run that is not contiguous in the reserved pages");
      }
    }
    start += static_cast<size_t>(run);
  }
  if (!nr.lent) {
    // From the first receive on, the pages are the communicator's until EndNccl: a Cancel or the
    // deadline meanwhile releases them only then. A transfer cancelled before (its pages may
    // already be reused) enqueues nothing.
    absl::MutexLock l(&t.mu);
    if (!t.live) return absl::CancelledError("cancelled");
    t.lent = true;
    nr.lent = true;
    t.stats.path = "nccl";
  }
  NcclApi& api = nccl_api();
  const NcclPairComm& c = nr.comm->pair;
  const int64_t elem = DTypeSize(layout_.dtype);
  absl::Status st = api.GroupStart();
  if (st.ok()) {
    nr.posted = true;
    start = static_cast<size_t>(layer.first_index);
    for (int32_t run : layer.runs) {
      if (st.ok()) {
        st = api.Recv(pool_ + layout_.PageOffset(layer.layer, t.pages[start]) * elem,
                      layout_.PageBytes() * run, /*peer=*/0, c.comm, c.stream);
      }
      start += static_cast<size_t>(run);
    }
    const absl::Status ended = api.GroupEnd();
    if (st.ok()) st = ended;
  }
  // The sender's next frame may already be on the socket: nothing to watch there meanwhile.
  if (st.ok())
    st = NcclPoll([&] { return api.CommReady(c.comm); }, {}, deadline,
                  "enqueueing the NCCL receives");
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("NCCL receive failed: ", st.message()));
  return absl::OkStatus();
}

void TcpKvReceiver::EndNccl(Transfer& t, NcclRecv& nr, const absl::Status& outcome) {
  if (nr.comm != nullptr) {
    NcclApi& api = nccl_api();
    const NcclPairComm& c = nr.comm->pair;
    bool intact = false;
    if (c.comm != nullptr) {
      const absl::StatusOr<bool> ready = api.CommReady(c.comm);
      intact = ready.ok() && *ready;
    }
    if (intact && nr.posted && !outcome.ok()) {
      const absl::StatusOr<bool> done = api.StreamDone(c.stream);
      intact = done.ok() && *done;
    }
    nccl_transport()->ReturnRecv(
        nr.comm, !intact,
        absl::StrCat("KV transfer ", t.id,
                     " ended with NCCL receives in flight: ", outcome.message()));
    nr.comm = nullptr;
  }
  if (nr.lent) EndIpcGrant(t);  // the pages are free of the communicator now
  nr.lent = false;
}

absl::Status TcpKvReceiver::WatchSender(const Socket& socket, absl::Time deadline) {
  ASSIGN_OR_RETURN(bool readable, PollReadable(socket, kNcclPollInterval));
  if (!readable) return absl::OkStatus();
  // Only an abort may come while the sender waits for this side: anything else is a protocol
  // error; a closed connection (Unavailable) is a sender that died.
  ASSIGN_OR_RETURN(kv_wire::Frame frame, kv_wire::ReadFrame(socket, deadline));
  if (frame.type == kv_wire::FrameType::kAbort) {
    return absl::AbortedError(absl::StrCat("prefill aborted the KV transfer: ", frame.body));
  }
  return absl::InvalidArgumentError("unexpected frame while NCCL operations were in flight");
}

std::shared_ptr<NcclKvTransport> TcpKvReceiver::nccl_transport() const {
  absl::MutexLock l(&mu_);
  return nccl_;
}

void TcpKvReceiver::SetNccl(std::shared_ptr<NcclKvTransport> nccl) {
  absl::MutexLock l(&mu_);
  nccl_ = std::move(nccl);
}

bool TcpKvReceiver::InTransfer(const kv_wire::PagesHeader& h, const Incoming& in) {
  return h.layer >= 0 && h.layer < in.src_layout.num_layers && h.first_index >= 0 && h.count >= 0 &&
         int64_t{h.first_index} + h.count <= in.sender_pages;
}

absl::Status TcpKvReceiver::LendPages(Transfer& t) {
  absl::MutexLock l(&t.mu);
  if (!t.live) {
    return absl::CancelledError(absl::StrCat("KV transfer ", t.id, " cancelled by decode"));
  }
  t.lent = true;
  t.stats.path = "ipc";
  return absl::OkStatus();
}

absl::StatusOr<std::vector<kv_wire::PagesHeader>> TcpKvReceiver::HoldIpcGrant(const Socket& socket,
                                                                              Transfer& t,
                                                                              absl::Time deadline) {
  RETURN_IF_ERROR(LendPages(t));
  // From the grant until EndIpcGrant the sender may write any reserved page; a Cancel or the
  // deadline meanwhile releases the pages only at the grant's end: the sender's confirmation or
  // abort, its connection closing (a sender that dies: its context's copies end with it), or
  // the read deadline (a sender frozen past it is not waited for; kv_wire.h).
  const absl::Status granted = kv_wire::WriteFrame(
      socket, kv_wire::FrameType::kStatus, kv_wire::EncodeStatus(absl::OkStatus()), deadline);
  if (!granted.ok()) {
    EndIpcGrant(t);
    return granted;
  }
  return AwaitIpcWritten(socket, t, deadline);
}

absl::StatusOr<std::vector<kv_wire::PagesHeader>> TcpKvReceiver::AwaitIpcWritten(
    const Socket& socket, Transfer& t, absl::Time deadline) {
  absl::StatusOr<kv_wire::Frame> frame = kv_wire::ReadFrame(socket, deadline);
  if (frame.ok() && frame->type == kv_wire::FrameType::kIpcFlush) {
    // Every copy is enqueued: the confirmation follows as soon as they landed.
    frame = kv_wire::ReadFrame(socket, deadline, kConfirmSpin);
  }
  EndIpcGrant(t);
  if (!frame.ok()) return frame.status();
  if (frame->type == kv_wire::FrameType::kAbort) {
    return absl::AbortedError(absl::StrCat("prefill aborted the KV transfer: ", frame->body));
  }
  if (frame->type != kv_wire::FrameType::kIpcWritten) {
    return absl::InvalidArgumentError("a KV IPC grant was not confirmed");
  }
  return kv_wire::DecodeIpcWritten(frame->body);
}

absl::Status TcpKvReceiver::WritePage(Transfer& t, const Incoming& in, int layer, int index,
                                      const std::vector<char>& staging) {
  absl::MutexLock l(&t.mu);
  if (!t.live) return absl::CancelledError("cancelled");
  auto copy = [&](int64_t offset, const char* src, int64_t bytes) -> absl::Status {
    // A device pool: a failed copy fails the transfer (decode's done() and the sender's verdict).
    if (write_pool_) return write_pool_(pool_ + offset, src, bytes);
    std::memcpy(pool_ + offset, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  };
  if (in.plans.empty()) {  // groups of one shape: the page as it came
    RETURN_IF_ERROR(copy(layout_.PageOffset(layer, t.pages[index]) * DTypeSize(layout_.dtype),
                         staging.data(), static_cast<int64_t>(staging.size())));
  } else {
    for (const ByteRun& r :
         HeadCopyRuns(in.src_group, in.dst_group, in.plans[static_cast<size_t>(layer)], layout_,
                      t.pages[index])) {
      RETURN_IF_ERROR(copy(r.dst_offset, staging.data() + r.src_offset, r.bytes));
    }
  }
  t.stats.bytes += static_cast<int64_t>(staging.size());
  t.stats.pages += 1;
  return absl::OkStatus();
}

}  // namespace tandem
