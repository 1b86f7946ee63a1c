// PeerBarrier: a device-side barrier between the ranks of an in-process group whose devices
// address each other's memory (ranks sharing a GPU, or peers), capturable into each rank's own
// CUDA graph (comm/group/peer_communicator.h orders its all-reduces with it). One launch of rank
// r, on r's stream, with no host argument that changes between launches:
//   e = ++*epoch                          (r's own counter: it counts r's barriers, so a graph
//                                          replay and an eager launch continue the same count)
//   __threadfence_system(); for every peer q: slots[q][r] = e   (system-scope release stores)
//   for every peer q: spin until slots[r][q] >= e                (system-scope acquire loads)
// so no rank's later work on its stream starts before every rank's earlier work on its own
// stream is done and visible (kernel boundaries order the stream's kernels around the barrier).
// Every rank makes the same sequence of barriers, so the epochs of a barrier agree; a peer is at
// most one barrier ahead (it cannot pass the next without r's flag), hence ">=" and a wrap-safe
// signed difference.
//
// The spin never hangs the device: it also polls `abort` (host-mapped memory: the host sets it
// when the group fails, PeerCommGroup::Abort) and gives up after `timeout_ns` (the device's
// %globaltimer; the CPU reference the steady clock). Giving up writes the reason into r's
// `error` word unless one is there already (host-mapped: the host reads it after the step;
// the first reason stays) and sets `abort`, so every peer
// stops waiting too; the launch itself does not fail (a graph keeps running its later kernels
// over undefined data, and the host fails the group from the error word).
//
// One CTA of one warp: on a GPU shared by the ranks (132 SMs on an H200), up to
// kMaxPeerBarrierRanks - 1 spinning barriers hold one SM slot each, leaving the other ranks'
// kernels the rest of the device, so the rank everyone waits for can always run.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/stream.h"

namespace tandem {

inline constexpr int kMaxPeerBarrierRanks = 8;

// What a rank's `error` word holds.
enum PeerBarrierError : int32_t {
  kPeerBarrierOk = 0,
  kPeerBarrierAborted = 1,   // `abort` was set while it waited
  kPeerBarrierTimedOut = 2,  // a peer did not arrive within timeout_ns
};

struct PeerBarrierArgs {
  uint32_t* epoch = nullptr;  // this rank's counter (memory of its device), zero at the start
  // [q]: rank q's flag slots, [num_ranks] uint32 on q's device, zero at the start; slots[q][r]
  // is written by rank r only, and slots[rank] is the array this rank waits on.
  uint32_t* slots[kMaxPeerBarrierRanks] = {};
  int rank = 0;
  int num_ranks = 0;         // 1..kMaxPeerBarrierRanks
  int32_t* abort = nullptr;  // the group's abort word (host-mapped; 0: keep waiting)
  int32_t* error = nullptr;  // this rank's error word (host-mapped; PeerBarrierError)
  int64_t timeout_ns = 0;    // > 0
};

// InvalidArgument on a bad rank, count, pointer or timeout.
absl::Status CheckPeerBarrier(const PeerBarrierArgs& args);
// The CPU reference: the same protocol over host memory with std::atomic_ref, on the calling
// thread (it returns once the barrier is passed or given up); the CPU tests' fake device.
void PeerBarrierRef(const PeerBarrierArgs& args);
// Launches the 1-CTA barrier kernel on `stream`.
absl::Status PeerBarrier(const PeerBarrierArgs& args, cudaStream_t stream);

}  // namespace tandem
