#include "comm/nccl_kv_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/secure_random.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

// How often a sender waiting for its pair re-reads its cancel check.
constexpr absl::Duration kLeaseCheckInterval = absl::Milliseconds(10);
// Why the destructor aborts what is left (the process ends its communicators; never blocks).
constexpr absl::string_view kDestroyed = "transport destroyed";

}  // namespace

struct NcclKvTransport::SendLease::Peer {
  absl::Mutex mu;
  bool busy ABSL_GUARDED_BY(mu) = false;
  NcclPairComm pair;  // touched only by the lease holder (and the destructor)
};

absl::StatusOr<std::shared_ptr<NcclKvTransport>> NcclKvTransport::Create(
    std::shared_ptr<NcclApi> api, const void* pool) {
  if (api == nullptr) return absl::InvalidArgumentError("NcclKvTransport without an NcclApi");
  ASSIGN_OR_RETURN(int device, api->DeviceOf(pool));
  ASSIGN_OR_RETURN(std::string id, api->DeviceId(device));
  return std::shared_ptr<NcclKvTransport>(
      new NcclKvTransport(std::move(api), device, std::move(id)));
}

NcclKvTransport::NcclKvTransport(std::shared_ptr<NcclApi> api, int device, std::string device_id)
    : api_(std::move(api)),
      device_(device),
      device_id_(std::move(device_id)),
      key_(RandomHex(16)) {}

NcclKvTransport::~NcclKvTransport() {
  // No transfer runs any more (the sender and receiver that use this transport are gone).
  absl::MutexLock l(&mu_);
  for (auto& [peer, p] : send_peers_) AbortComm(p->pair, kDestroyed);
  for (auto& [key, c] : recv_comms_) AbortComm(c->pair, kDestroyed);
}

void NcclKvTransport::AbortComm(NcclPairComm& c, absl::string_view why) {
  if (c.comm == nullptr) return;
  if (why == kDestroyed) {
    LOG(DEBUG) << "NCCL KV transport: communicator generation " << c.generation << " ended";
  } else {
    LOG(INFO) << "NCCL KV transport: aborting communicator generation " << c.generation << ": "
              << why;
  }
  api_->CommAbort(c.comm);
  if (c.stream != nullptr) api_->DestroyStream(c.stream);
  c.comm = nullptr;
  c.stream = nullptr;
}

int NcclKvTransport::NumComms() const {
  absl::MutexLock l(&mu_);
  int n = static_cast<int>(recv_comms_.size());
  for (const auto& [peer, p] : send_peers_) n += p->pair.comm != nullptr ? 1 : 0;
  return n;
}

// --- Sender side ---

absl::StatusOr<std::unique_ptr<NcclKvTransport::SendLease>> NcclKvTransport::LeaseSend(
    const std::string& peer, absl::Time deadline, const std::function<bool()>& cancelled) {
  std::shared_ptr<SendLease::Peer> p;
  {
    absl::MutexLock l(&mu_);
    auto& slot = send_peers_[peer];
    if (slot == nullptr) slot = std::make_shared<SendLease::Peer>();
    p = slot;
  }
  absl::MutexLock l(&p->mu);
  auto free = [&p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu) { return !p->busy; };
  while (!Clock::Real()->AwaitWithDeadline(
      &p->mu, absl::Condition(&free),
      std::min(deadline, Clock::Real()->Now() + kLeaseCheckInterval))) {
    if (cancelled && cancelled()) {
      return absl::CancelledError("KV transfer given up while waiting for its NCCL pair");
    }
    if (Clock::Real()->Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("another KV transfer to ", peer, " held the NCCL pair until the deadline"));
    }
  }
  p->busy = true;
  return std::unique_ptr<SendLease>(new SendLease(this, std::move(p)));
}

NcclKvTransport::SendLease::~SendLease() {
  absl::MutexLock l(&peer_->mu);
  peer_->busy = false;
}

NcclPairComm& NcclKvTransport::SendLease::comm() { return peer_->pair; }

absl::StatusOr<std::string> NcclKvTransport::SendLease::StartInit() {
  NcclApi& api = transport_->api();
  NcclPairComm& c = peer_->pair;
  const uint32_t generation = c.generation + 1;
  transport_->AbortComm(c, "rebuilt");
  c.generation = generation;  // kept even if this init fails: the next one is newer still
  ASSIGN_OR_RETURN(std::string id, api.GetUniqueId());
  ASSIGN_OR_RETURN(NcclApi::Stream stream, api.CreateStream(transport_->device()));
  absl::StatusOr<NcclApi::Comm> comm = api.CommInitRank(id, 2, 0, transport_->device());
  if (!comm.ok()) {
    api.DestroyStream(stream);
    return comm.status();
  }
  c.comm = *comm;
  c.stream = stream;
  return id;
}

void NcclKvTransport::SendLease::Break(absl::string_view why) {
  transport_->AbortComm(peer_->pair, why);
}

// --- Receiver side ---

absl::StatusOr<std::shared_ptr<NcclKvTransport::RecvComm>> NcclKvTransport::StartRecvInit(
    const std::string& key, uint32_t generation, const std::string& unique_id) {
  auto c = std::make_shared<RecvComm>();
  c->key = key;
  c->pair.generation = generation;
  c->lent = true;
  {
    // The sender asks for a new communicator: whatever this side had for it is stale.
    absl::MutexLock l(&mu_);
    auto it = recv_comms_.find(key);
    if (it != recv_comms_.end()) {
      if (it->second->lent) {
        it->second->stale = true;  // its transfer aborts it when it returns it
      } else {
        AbortComm(it->second->pair, "the sender rebuilds the pair");
      }
      recv_comms_.erase(it);
    }
  }
  ASSIGN_OR_RETURN(NcclApi::Stream stream, api_->CreateStream(device_));
  absl::StatusOr<NcclApi::Comm> comm = api_->CommInitRank(unique_id, 2, 1, device_);
  if (!comm.ok()) {
    api_->DestroyStream(stream);
    return comm.status();
  }
  c->pair.comm = *comm;
  c->pair.stream = stream;
  absl::MutexLock l(&mu_);
  recv_comms_[key] = c;
  return c;
}

absl::StatusOr<std::shared_ptr<NcclKvTransport::RecvComm>> NcclKvTransport::UseRecv(
    const std::string& key, uint32_t generation) {
  absl::MutexLock l(&mu_);
  auto it = recv_comms_.find(key);
  if (it == recv_comms_.end() || it->second->pair.comm == nullptr) {
    return absl::FailedPreconditionError("the decode worker has no NCCL communicator for you");
  }
  const std::shared_ptr<RecvComm>& c = it->second;
  if (c->pair.generation != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("the decode worker's NCCL communicator is "
                     "generation ",
                     c->pair.generation, ", not ", generation));
  }
  if (c->lent) {
    return absl::FailedPreconditionError("the NCCL communicator is in use by another transfer");
  }
  c->lent = true;
  return c;
}

void NcclKvTransport::ReturnRecv(const std::shared_ptr<RecvComm>& c, bool broken,
                                 absl::string_view why) {
  absl::MutexLock l(&mu_);
  c->lent = false;
  if (!broken && !c->stale) return;
  AbortComm(c->pair, c->stale ? "replaced by a newer generation" : why);
  auto it = recv_comms_.find(c->key);
  if (it != recv_comms_.end() && it->second == c) recv_comms_.erase(it);
}

// --- Helpers ---

std::vector<int32_t> NcclPageRuns(absl::Span<const int32_t> src, absl::Span<const int32_t> dst) {
  std::vector<int32_t> runs;
  const size_t n = std::min(src.size(), dst.size());
  size_t start = 0;
  for (size_t i = 1; i <= n; ++i) {
    if (i == n || src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1) {
      runs.push_back(static_cast<int32_t>(i - start));
      start = i;
    }
  }
  return runs;
}

absl::Status NcclPoll(const std::function<absl::StatusOr<bool>()>& done,
                      const std::function<absl::Status()>& between, absl::Time deadline,
                      absl::string_view what) {
  while (true) {
    ASSIGN_OR_RETURN(bool finished, done());
    if (finished) return absl::OkStatus();
    if (Clock::Real()->Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what,
                                                      " did not complete before the KV "
                                                      "transfer's deadline"));
    }
    if (between) {
      RETURN_IF_ERROR(between());
    } else {
      Clock::Real()->SleepFor(kNcclPollInterval);
    }
  }
}

}  // namespace tandem
