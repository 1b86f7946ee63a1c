#include "comm/group/nccl_communicator.h"

#include <algorithm>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/check.h"
#include "base/logging.h"

namespace tandem {
namespace {

absl::Status CheckReduce(int64_t count, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-reduce of ", std::string(DTypeName(dtype)), ": F32 or BF16 only"));
  }
  if (count < 0) return absl::InvalidArgumentError("all-reduce of a negative count");
  return absl::OkStatus();
}

absl::Status CheckPeer(const char* what, int rank, int size, int peer, int64_t bytes) {
  if (peer < 0 || peer >= size || peer == rank || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " between rank ", rank, " and rank ", peer,
                                                   " of ", size, ", ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

NcclApi::ReduceType ReduceTypeOf(DType dtype) {
  return dtype == DType::kF32 ? NcclApi::ReduceType::kF32 : NcclApi::ReduceType::kBF16;
}

}  // namespace

// --- NcclCommunicator: one rank's calls, forwarded to the group ---

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclCommGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

int NcclCommunicator::size() const { return group_->size(); }
int NcclCommunicator::device() const { return group_->ranks_[rank_]->device; }
NcclApi::Stream NcclCommunicator::stream() const { return group_->ranks_[rank_]->stream; }
void NcclCommunicator::Abort(const absl::Status& reason) { group_->Abort(reason); }
absl::Status NcclCommunicator::status() const { return group_->status(); }

absl::Status NcclCommunicator::AllReduceSum(void* data, int64_t count, DType dtype) {
  return Enqueue(Op::kAllReduce, data, data, count, dtype, -1, nullptr, /*wait=*/true);
}
absl::Status NcclCommunicator::AllGather(const void* send, void* recv, int64_t bytes) {
  return Enqueue(Op::kAllGather, send, recv, bytes, DType::kU8, -1, nullptr, true);
}
absl::Status NcclCommunicator::Send(const void* data, int64_t bytes, int peer) {
  return Enqueue(Op::kSend, data, nullptr, bytes, DType::kU8, peer, nullptr, true);
}
absl::Status NcclCommunicator::Recv(void* data, int64_t bytes, int peer) {
  return Enqueue(Op::kRecv, nullptr, data, bytes, DType::kU8, peer, nullptr, true);
}
absl::Status NcclCommunicator::AllReduceSumAsync(void* data, int64_t count, DType dtype,
                                                 NcclApi::Stream stream) {
  return Enqueue(Op::kAllReduce, data, data, count, dtype, -1, stream, /*wait=*/false);
}
absl::Status NcclCommunicator::AllGatherAsync(const void* send, void* recv, int64_t bytes,
                                              NcclApi::Stream stream) {
  return Enqueue(Op::kAllGather, send, recv, bytes, DType::kU8, -1, stream, false);
}
absl::Status NcclCommunicator::SendAsync(const void* data, int64_t bytes, int peer,
                                         NcclApi::Stream stream) {
  return Enqueue(Op::kSend, data, nullptr, bytes, DType::kU8, peer, stream, false);
}
absl::Status NcclCommunicator::RecvAsync(void* data, int64_t bytes, int peer,
                                         NcclApi::Stream stream) {
  return Enqueue(Op::kRecv, nullptr, data, bytes, DType::kU8, peer, stream, false);
}

absl::Status NcclCommunicator::Enqueue(Op op, const void* send, void* recv, int64_t n, DType dtype,
                                       int peer, NcclApi::Stream stream, bool wait) {
  static constexpr const char* kNames[2][4] = {
      {"all-reduce (async)", "all-gather (async)", "send (async)", "recv (async)"},
      {"all-reduce", "all-gather", "send", "recv"}};
  const char* what = kNames[wait ? 1 : 0][static_cast<int>(op)];
  absl::Status valid;
  switch (op) {
    case Op::kAllReduce:
      valid = CheckReduce(n, dtype);
      break;
    case Op::kAllGather:
      if (n < 0) valid = absl::InvalidArgumentError("all-gather of a negative size");
      break;
    case Op::kSend:
    case Op::kRecv:
      valid = CheckPeer(what, rank_, size(), peer, n);
      break;
  }
  if (!valid.ok()) return valid;
  if (n == 0) return group_->Empty(rank_);  // nothing to move, on every rank alike
  const absl::Time deadline = group_->options_.clock->Now() + group_->options_.timeout;
  NcclApi* api = group_->api_.get();
  auto call = [&](NcclApi::Comm comm, NcclApi::Stream s) -> absl::Status {
    switch (op) {
      case Op::kAllReduce:
        return api->AllReduceSum(send, recv, n, ReduceTypeOf(dtype), comm, s);
      case Op::kAllGather:
        return api->AllGather(send, recv, n, comm, s);
      case Op::kSend:
        return api->Send(send, n, peer, comm, s);
      case Op::kRecv:
        return api->Recv(recv, n, peer, comm, s);
    }
    return absl::InternalError("unknown operation");
  };
  return group_->Run(rank_, what, call,
                     wait ? NcclCommGroup::Wait::kStream : NcclCommGroup::Wait::kComm, stream,
                     deadline);
}

absl::Status NcclCommunicator::Synchronize(NcclApi::Stream stream) {
  const absl::Time deadline = group_->options_.clock->Now() + group_->options_.timeout;
  return group_->Await(rank_, "synchronize", NcclCommGroup::Wait::kStream,
                       stream != nullptr ? stream : this->stream(), deadline);
}

// --- NcclCommGroup ---

absl::StatusOr<std::shared_ptr<NcclCommGroup>> MakeNcclGroup(std::shared_ptr<NcclApi> api,
                                                             std::vector<NcclRank> ranks,
                                                             NcclGroupOptions options) {
  if (api == nullptr) return absl::InvalidArgumentError("an NCCL group needs an NcclApi");
  if (ranks.empty()) return absl::InvalidArgumentError("an NCCL group of 0 ranks");
  if (options.clock == nullptr || options.timeout <= absl::ZeroDuration() ||
      options.poll_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "an NCCL group needs a clock, a timeout > 0 and a poll interval >= 0");
  }
  std::set<int> devices;
  for (const NcclRank& r : ranks) {
    if (r.device < 0 || !devices.insert(r.device).second) {
      std::vector<int> all;
      for (const NcclRank& q : ranks) all.push_back(q.device);
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL runs one rank per GPU: the ranks' devices [", absl::StrJoin(all, ", "),
                       "] repeat one, or name a negative one"));
    }
  }
  std::shared_ptr<NcclCommGroup> group(new NcclCommGroup(std::move(api), options, ranks));
  if (absl::Status s = group->Init(); !s.ok()) return s;  // the group's end aborts what was made
  return group;
}

NcclCommGroup::NcclCommGroup(std::shared_ptr<NcclApi> api, NcclGroupOptions options,
                             const std::vector<NcclRank>& ranks)
    : api_(std::move(api)), options_(options) {
  for (const NcclRank& r : ranks) {
    auto state = std::make_unique<RankState>();
    state->device = r.device;
    state->stream = r.stream;
    ranks_.push_back(std::move(state));
  }
}

NcclCommGroup::~NcclCommGroup() {
  AbortComms();
  for (const std::unique_ptr<RankState>& r : ranks_) {
    if (r->owns_stream) api_->DestroyStream(r->stream);
  }
}

absl::Status NcclCommGroup::Init() {
  const int n = size();
  for (const std::unique_ptr<RankState>& r : ranks_) {
    if (r->stream != nullptr) continue;
    absl::StatusOr<NcclApi::Stream> s = api_->CreateStream(r->device);
    if (!s.ok()) {
      return absl::Status(s.status().code(),
                          absl::StrCat("a stream for the NCCL group's rank on GPU ", r->device,
                                       ": ", s.status().message()));
    }
    r->stream = *s;
    r->owns_stream = true;
  }
  absl::StatusOr<std::string> id = api_->GetUniqueId();
  if (!id.ok()) {
    return absl::Status(id.status().code(), absl::StrCat("ncclGetUniqueId for an NCCL group of ", n,
                                                         " ranks: ", id.status().message()));
  }
  // Every rank's init in one group: the documented way to init several ranks from one thread.
  absl::Status init = api_->GroupStart();
  if (init.ok()) {
    for (int rank = 0; rank < n && init.ok(); ++rank) {
      RankState& r = *ranks_[rank];
      absl::StatusOr<NcclApi::Comm> comm = api_->CommInitRank(*id, n, rank, r.device);
      if (!comm.ok()) {
        init = absl::Status(comm.status().code(),
                            absl::StrCat("NCCL init of rank ", rank, " of ", n, " on GPU ",
                                         r.device, ": ", comm.status().message()));
        break;
      }
      absl::MutexLock lock(&r.mu);
      r.comm = *comm;
    }
    // The group is closed whatever happened inside it.
    if (absl::Status end = api_->GroupEnd(); !end.ok() && init.ok()) {
      init = absl::Status(
          end.code(), absl::StrCat("NCCL init of ", n, " ranks (ncclGroupEnd): ", end.message()));
    }
  }
  if (!init.ok()) {
    Abort(init);
    return init;
  }
  // Poll every comm until all are ready.
  const absl::Time deadline = options_.clock->Now() + options_.timeout;
  std::vector<bool> ready(n, false);
  for (;;) {
    std::vector<int> waiting;
    for (int rank = 0; rank < n; ++rank) {
      if (ready[rank]) continue;
      RankState& r = *ranks_[rank];
      absl::StatusOr<bool> ok;
      {
        absl::MutexLock lock(&r.mu);
        ok = api_->CommReady(r.comm);
      }
      if (!ok.ok()) {
        absl::Status st(ok.status().code(),
                        absl::StrCat("NCCL init of rank ", rank, " of ", n, " on GPU ", r.device,
                                     ": ", ok.status().message()));
        Abort(st);
        return st;
      }
      ready[rank] = *ok;
      if (!*ok) waiting.push_back(rank);
    }
    if (waiting.empty()) return absl::OkStatus();
    if (options_.clock->Now() >= deadline) {
      absl::Status st = absl::DeadlineExceededError(
          absl::StrCat("NCCL init of ", n, " ranks: rank(s) ", absl::StrJoin(waiting, ", "),
                       " not ready after ", absl::FormatDuration(options_.timeout)));
      Abort(st);
      return st;
    }
    if (options_.poll_interval > absl::ZeroDuration()) {
      Clock::Real()->SleepFor(options_.poll_interval);
    } else {
      std::this_thread::yield();
    }
  }
}

std::unique_ptr<NcclCommunicator> NcclCommGroup::ForRank(int rank) {
  CHECK(rank >= 0 && rank < size()) << "rank " << rank << " of an NCCL group of " << size();
  return std::make_unique<NcclCommunicator>(shared_from_this(), rank);
}

void NcclCommGroup::Abort(const absl::Status& reason) {
  bool first = false;
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) {
      status_ = reason.ok() ? absl::AbortedError("communicator aborted") : reason;
      first = true;
      why = status_;
    }
  }
  if (first) {
    LOG(WARNING) << "NCCL group of " << size() << " ranks aborted: " << why;
  }
  AbortComms();
}

absl::Status NcclCommGroup::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void NcclCommGroup::AbortComm(int rank) {
  RankState& r = *ranks_[rank];
  absl::MutexLock lock(&r.mu);
  if (r.comm == nullptr) return;
  api_->CommAbort(r.comm);
  r.comm = nullptr;
}

void NcclCommGroup::AbortComms() {
  for (int rank = 0; rank < size(); ++rank) AbortComm(rank);
}

absl::Status NcclCommGroup::Failed(int rank) {
  // Whoever aborted the group is aborting the comms; this rank does not return before its own
  // is, so no kernel of it touches the caller's buffers afterwards.
  AbortComm(rank);
  return status();
}

absl::Status NcclCommGroup::Fail(int rank, const char* what, const absl::Status& error) {
  Abort(absl::Status(error.code(), absl::StrCat("rank ", rank, " of ", size(), " in ", what, ": ",
                                                error.message())));
  return Failed(rank);
}

template <typename Call>
absl::Status NcclCommGroup::Run(int rank, const char* what, Call call, Wait wait,
                                NcclApi::Stream stream, absl::Time deadline) {
  RankState& r = *ranks_[rank];
  bool failed = false;
  absl::Status enqueued;
  {
    absl::MutexLock lock(&r.mu);
    failed = r.comm == nullptr || !status().ok();
    if (!failed) enqueued = call(r.comm, stream != nullptr ? stream : r.stream);
  }
  if (failed) return Failed(rank);
  if (!enqueued.ok()) return Fail(rank, what, enqueued);
  return Await(rank, what, wait, stream, deadline);
}

absl::Status NcclCommGroup::Empty(int rank) {
  if (!status().ok()) return Failed(rank);
  return absl::OkStatus();
}

absl::Status NcclCommGroup::Await(int rank, const char* what, Wait wait, NcclApi::Stream stream,
                                  absl::Time deadline) {
  RankState& r = *ranks_[rank];
  if (stream == nullptr) stream = r.stream;
  for (;;) {
    absl::Status error;
    bool done = false;
    {
      absl::MutexLock lock(&r.mu);
      if (r.comm == nullptr) break;  // aborted
      absl::StatusOr<bool> ready = api_->CommReady(r.comm);
      if (!ready.ok()) {
        error = ready.status();
      } else if (*ready && wait == Wait::kStream) {
        absl::StatusOr<bool> idle = api_->StreamDone(stream);
        if (!idle.ok()) {
          error = idle.status();
        } else {
          done = *idle;
        }
      } else {
        done = *ready;
      }
    }
    if (!error.ok()) return Fail(rank, what, error);
    if (!status().ok()) break;  // another rank failed: this one's comm is being aborted
    if (done) return absl::OkStatus();
    if (options_.clock->Now() >= deadline) {
      return Fail(rank, what,
                  absl::DeadlineExceededError(absl::StrCat(
                      "not complete after ", absl::FormatDuration(options_.timeout),
                      wait == Wait::kStream ? " (its peers never arrived, or the GPU hangs)"
                                            : " (NCCL never took the operation)")));
    }
    if (options_.poll_interval > absl::ZeroDuration()) {
      Clock::Real()->SleepFor(options_.poll_interval);
    } else {
      std::this_thread::yield();
    }
  }
  return Failed(rank);
}

}  // namespace tandem
