// FakePeerApi: a host fake of PeerDeviceApi (comm/group/peer_communicator.h) for the peer
// communicator's CPU tests. Memory is host memory and an enqueue runs at once (ReduceSum and
// Copy on the host), which is what a stream that has waited for its events sees. Streams are rank
// tags (StreamOf(rank)); events remember their device and a serial (creation order from 0).
// Every stream call is logged per stream: "record <serial>", "wait <serial>", "barrier",
// "reduce", "copy <bytes>". A Barrier runs the CPU reference PeerBarrierRef on the calling rank
// thread (it returns once every peer's barrier has run, or the reference gave up), so the
// device barrier's protocol runs for real between the rank threads. Faults: a failing ReduceSum,
// Copy or Allocate on one rank or device, refused peer access, and a rank whose barriers never
// run (StallBarriersOn: a rank thread that died after its enqueue, a kernel that never started).
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "comm/group/peer_communicator.h"
#include "kernels/peer_barrier/peer_barrier.h"
#include "kernels/peer_reduce/peer_reduce.h"

namespace tandem {

class FakePeerApi : public PeerDeviceApi {
 public:
  struct FakeEvent {
    int device;
    int serial;
  };
  ~FakePeerApi() override {
    for (uint8_t* m : live_) delete[] m;
    for (uint8_t* m : barrier_live_) delete[] m;
  }

  absl::Status EnablePeers(int device, const std::vector<int>& devices) override {
    return refuse_peers_ ? absl::FailedPreconditionError("no peer access") : absl::OkStatus();
  }
  absl::StatusOr<Event> CreateEvent(int device) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::make_unique<FakeEvent>(FakeEvent{device, next_serial_++}));
    return events_.back().get();
  }
  void DestroyEvent(Event) override {}
  absl::Status Record(Event e, Stream s) override { return Log(s, "record", e); }
  absl::Status Wait(Stream s, Event e) override { return Log(s, "wait", e); }
  absl::Status ReduceSum(const std::vector<void*>& buffers, int64_t begin, int64_t end, DType dtype,
                         Stream s) override {
    {
      absl::MutexLock lock(&mu_);
      if (fail_reduce_on_ == StreamRank(s)) return absl::InternalError("fake launch failure");
    }
    PeerReduceArgs a;
    for (size_t i = 0; i < buffers.size(); ++i) a.buffers[i] = buffers[i];
    a.num_buffers = static_cast<int>(buffers.size());
    a.begin = begin;
    a.end = end;
    a.dtype = dtype;
    RETURN_IF_ERROR(CheckPeerReduce(a));
    PeerReduceSumRef(a);
    return Log(s, "reduce", nullptr);
  }
  absl::Status Barrier(const BarrierArgs& b, Stream s) override {
    {
      absl::MutexLock lock(&mu_);
      if (stall_barriers_on_ == StreamRank(s)) {
        logs_[StreamRank(s)].push_back("barrier (stalled)");
        return absl::OkStatus();
      }
    }
    PeerBarrierArgs a;
    a.epoch = b.epoch;
    for (size_t q = 0; q < b.slots.size(); ++q) a.slots[q] = b.slots[q];
    a.rank = b.rank;
    a.num_ranks = static_cast<int>(b.slots.size());
    a.abort = b.abort;
    a.error = b.error;
    a.timeout_ns = absl::ToInt64Nanoseconds(b.timeout);
    RETURN_IF_ERROR(CheckPeerBarrier(a));
    PeerBarrierRef(a);
    return Log(s, "barrier", nullptr);
  }
  absl::Status Copy(void* dst, const void* src, int64_t bytes, Stream s) override {
    {
      absl::MutexLock lock(&mu_);
      if (fail_copy_on_ == StreamRank(s)) return absl::InternalError("fake copy failure");
    }
    std::memcpy(dst, src, bytes);
    return Log(s, ("copy " + std::to_string(bytes)).c_str(), nullptr);
  }
  absl::StatusOr<void*> Allocate(int device, int64_t bytes) override {
    absl::MutexLock lock(&mu_);
    if (fail_allocate_) return absl::ResourceExhaustedError("fake device full");
    uint8_t* m = new uint8_t[bytes];
    std::memset(m, 0xAB, bytes);  // undefined contents: never zeros a test could rely on
    live_.insert(m);
    ++allocations_;
    return static_cast<void*>(m);
  }
  void Free(int device, void* memory) override {
    absl::MutexLock lock(&mu_);
    uint8_t* m = static_cast<uint8_t*>(memory);
    if (live_.erase(m) == 1 || barrier_live_.erase(m) == 1) delete[] m;
  }

  absl::StatusOr<void*> AllocateZeroed(int device, int64_t bytes) override { return Zeroed(bytes); }
  absl::StatusOr<void*> AllocateHostMapped(int64_t bytes) override { return Zeroed(bytes); }
  void FreeHostMapped(void* memory) override { Free(-1, memory); }

  static Stream StreamOf(int rank) { return reinterpret_cast<Stream>(uintptr_t(rank + 1)); }
  static int StreamRank(Stream s) { return static_cast<int>(reinterpret_cast<uintptr_t>(s)) - 1; }
  std::vector<std::string> LogOf(int rank) {
    absl::MutexLock lock(&mu_);
    return logs_[rank];
  }
  void ClearLogs() {
    absl::MutexLock lock(&mu_);
    logs_.clear();
  }
  int NumEvents() {
    absl::MutexLock lock(&mu_);
    return next_serial_;
  }
  int64_t allocations() {
    absl::MutexLock lock(&mu_);
    return allocations_;
  }
  int64_t live_allocations() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(live_.size());
  }
  void set_refuse_peers(bool v) { refuse_peers_ = v; }
  void FailReduceOn(int rank) {
    absl::MutexLock lock(&mu_);
    fail_reduce_on_ = rank;
  }
  void FailCopyOn(int rank) {
    absl::MutexLock lock(&mu_);
    fail_copy_on_ = rank;
  }
  // Rank `rank`'s barriers log "barrier (stalled)" and do nothing (-1: none).
  void StallBarriersOn(int rank) {
    absl::MutexLock lock(&mu_);
    stall_barriers_on_ = rank;
  }
  void set_fail_allocate(bool v) {
    absl::MutexLock lock(&mu_);
    fail_allocate_ = v;
  }

 private:
  absl::StatusOr<void*> Zeroed(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    uint8_t* m = new uint8_t[bytes]();  // new[]: aligned for the words' atomics
    barrier_live_.insert(m);
    return static_cast<void*>(m);
  }
  absl::Status Log(Stream s, const std::string& what, Event e) {
    absl::MutexLock lock(&mu_);
    std::string entry = what;
    if (e != nullptr) entry += " " + std::to_string(static_cast<FakeEvent*>(e)->serial);
    logs_[StreamRank(s)].push_back(entry);
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  std::vector<std::unique_ptr<FakeEvent>> events_ ABSL_GUARDED_BY(mu_);
  int next_serial_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::vector<std::string>> logs_ ABSL_GUARDED_BY(mu_);
  std::set<uint8_t*> live_ ABSL_GUARDED_BY(mu_);          // Allocate's
  std::set<uint8_t*> barrier_live_ ABSL_GUARDED_BY(mu_);  // AllocateZeroed's, AllocateHostMapped's
  int64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_reduce_on_ ABSL_GUARDED_BY(mu_) = -1;
  int fail_copy_on_ ABSL_GUARDED_BY(mu_) = -1;
  int stall_barriers_on_ ABSL_GUARDED_BY(mu_) = -1;
  bool fail_allocate_ ABSL_GUARDED_BY(mu_) = false;
  bool refuse_peers_ = false;
};

// A group of `size` ranks on device 0 over `api`, rank r on stream StreamOf(r).
inline std::shared_ptr<PeerCommGroup> MakeFakePeerGroup(const std::shared_ptr<FakePeerApi>& api,
                                                        int size, PeerCommOptions options = {}) {
  std::vector<PeerRank> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(PeerRank{0, FakePeerApi::StreamOf(r)});
  absl::StatusOr<std::shared_ptr<PeerCommGroup>> g = PeerCommGroup::Create(api, ranks, options);
  CHECK_OK(g.status());
  return *g;
}

}  // namespace tandem
