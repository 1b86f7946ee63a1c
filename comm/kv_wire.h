// Wire format of the host (TCP) KV transport. A TCP connection carries one transfer at a time
// (and, warm, several in sequence: below):
//
//   sender                                   receiver
//   kHello{version, layout, num_pages, id, token, data paths, group} →
//                                          ← kStatus{code, message}       (handshake verdict)
//   kPages{layer, first_index, count} + count * PageBytes() raw page bytes →   (repeated)
//   kDone                                  →
//                                          ← kStatus{code, message}       (commit verdict)
//   With CUDA IPC (comm/kv_ipc.h; the hello's ipc field not kNone), right after an OK verdict:
//                                          ← kIpcPool{handle, receiver num_pages, page ids}
//   (an empty handle: the receiver exports no pool; the sender sends kPages, or fails under
//   kRequired), and instead of kPages, once for the whole transfer:
//   kIpcWrite{kAllLayers, 0, num_pages}    →
//                                          ← kStatus (OK: every reserved page of every layer is
//                                            the sender's to write until kIpcWritten; a Cancel
//                                            meanwhile defers the pages' release to its end)
//   ... the sender enqueues each layer's device copy into the mapped pool as the layer is
//   computed (ordered after the layer's compute event), then waits for all of them once ...
//   kIpcWritten{ranges written}            →  (no reply; kDone follows at once)
//   With NCCL (comm/nccl_kv_transport.h; the hello's nccl field not kNone) the receiver sends
//   the same kIpcPool frame (its handle empty unless IPC was asked too), which also says whether
//   it has NCCL and which GPU holds its pool; when the sender picks NCCL, instead of kPages:
//   kNcclUse{key, generation}               →   (the pair's communicator, as the sender has it)
//                                          ← kStatus (OK: the receiver has it too and lends it to
//                                            this transfer; FailedPrecondition: it has none)
//   or, when the sender has none or the receiver answered FailedPrecondition:
//   kNcclInit{key, generation, unique id}  →   (both ranks init non-blocking: rank 0 sender)
//                                          ← kStatus (the receiver's init verdict)
//   then per SendLayer call:
//   kNcclLayer{layer, first_index, count, run lengths} →  (one ncclSend / ncclRecv per run,
//                                            in one group; sent before the sender's group)
//   kDone                                  →
//                                          ← kStatus (commit verdict: every run received)
//   kAbort{reason} may replace any sender frame; either side may close at any time, which the
//   other reads as Unavailable.
//   With CUDA IPC, Finish first sends kIpcFlush (no body, no reply: every copy is enqueued and
//   kIpcWritten follows once they landed) so that the receiver wakes while the last copies run
//   and waits for the confirmation awake (a bounded spin), not asleep in poll(2).
//
// Warm connections (version 7): after an OK commit verdict both sides may keep the connection
// (hello done, the receiver's pool mapped, the data path chosen) and carry the next transfer
// on it, instead of a new connection and hello:
//   kNext{id, num_pages, grant}            →
//                                          ← kStatus (the hello's verdict for this transfer)
//                                          ← kIpcPool (when the hello asked for IPC or NCCL: the
//                                            transfer's page ids; no handle)
//                                          ← kStatus (grant set, the connection's path is IPC:
//                                            the kIpcWrite{kAllLayers} grant, already given)
//   the answers written back to back in one write, so a warm IPC transfer is one round trip
//   before its first copy; then the frames of the connection's path as above (TCP: kPages; IPC:
//   the copies, kIpcFlush, kIpcWritten; NCCL: kNcclUse or kNcclInit, kNcclLayer), kDone and the
//   verdict. The hello's layout, group, token and data paths hold for every transfer of the
//   connection. Any other outcome than an OK verdict (an error, an abort, a cancel, a refused
//   kNext) ends the connection; either side may close an idle one at any time (idle timeouts),
//   and a sender whose kNext finds it closed retries once on a fresh connection.
//
// Groups of different TP / PP (version 6): the hello's group (its TP and PP sizes, the model's
// KV heads and layers) tells the receiver how the sender's stacked pool is laid out
// (comm/kv_head_map.h); kPages then carries the sender's pages (its stacked layers, its page
// shape) and the receiver lands each through the head map into its own ranks' pages. Groups
// of one shape skip the map (each page lands as it came). IPC and NCCL move pages unchanged:
// between groups of different shapes the receiver offers neither (kIpcPool's `declined` says
// why; the sender logs it and sends kPages), and refuses a hello that requires one
// (FailedPrecondition).
//
// Every frame is an 8-byte header {uint32 type, uint32 body_length} and a body; the page bytes
// of kPages follow its 12-byte body (their length is implied by count and the layout). Integers
// are little-endian fixed width (both ends are little-endian hosts; checked at compile time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/kv_head_map.h"
#include "comm/socket_io.h"
#include "kernels/common/kv_layout.h"

namespace tandem::kv_wire {

inline constexpr uint32_t kMagic = 0x31564B54;  // "TKV1"
// 2: the hello carries the cluster token; 3: CUDA IPC; 4: one IPC grant per transfer; 5: NCCL;
// 6: the hello carries the sender's group (TP, PP, KV heads, layers), pages map between groups;
// 7: warm connections (kNext) and kIpcFlush.
// A receiver refuses any other version (FailedPrecondition, naming both).
inline constexpr uint32_t kVersion = 7;
inline constexpr uint32_t kMaxBodyBytes = 1 << 20;  // bodies are small; page bytes are separate

enum class FrameType : uint32_t {
  kHello = 1,
  kStatus = 2,
  kPages = 3,
  kDone = 4,
  kAbort = 5,
  kIpcPool = 6,
  kIpcWrite = 7,
  kIpcWritten = 8,
  kNcclUse = 9,
  kNcclInit = 10,
  kNcclLayer = 11,
  kNext = 12,
  kIpcFlush = 13,
};

// What the sender asks of the data path: kNone, page bytes on the socket; kRequired, CUDA IPC
// or no transfer; kPreferred, CUDA IPC where the receiver exports its pool, else the socket.
enum class IpcMode : uint32_t { kNone = 0, kRequired = 1, kPreferred = 2 };
// The same for NCCL between two GPUs (the values of IpcMode).
using NcclMode = IpcMode;

struct Frame {
  FrameType type;
  std::string body;
};

struct Hello {
  KvLayout layout;  // num_pages is the sender's pool size (not compared)
  int num_pages = 0;
  std::string transfer_id;
  // The deployment's cluster token (base/cluster_token.h); the receiver refuses a hello without
  // it (Unauthenticated) before looking at anything else.
  std::string cluster_token;
  IpcMode ipc = IpcMode::kNone;
  NcclMode nccl = NcclMode::kNone;
  // Version 6: the sender's group. Its page shape and dtype are the layout's (DecodeHello fills
  // them from it); CheckHelloGroup refuses a group whose PoolLayout contradicts the layout.
  KvGroupShape group;
};

// The receiver's answer to an IPC hello: its exported pool (empty: none) and where the
// transfer's pages are in it (page index i of the transfer is page_ids[i]).
struct IpcPool {
  std::string handle;
  int num_pages = 0;  // the receiver pool's num_pages (its layout; the page shape is shared)
  std::vector<int32_t> page_ids;
  // NCCL (version 5): whether the receiver takes NCCL transfers, and the id (UUID) of the GPU
  // that holds its pool (empty: unknown), so that a sender can tell "same GPU" from "another".
  bool nccl = false;
  std::string device_id;
  // Version 6: why the receiver offers neither IPC nor NCCL to this sender though it asked
  // (empty: not declined; e.g. groups of different TP / PP: pages must go through the head map).
  std::string declined;
};

// kNcclUse / kNcclInit: the pair's communicator, named by the sender's key (one per sender
// process) and a generation the sender raises at each rebuild; kNcclInit carries the unique id.
struct NcclComm {
  std::string key;
  uint32_t generation = 0;
  std::string unique_id;  // kNcclInit only
};

// kNcclLayer: page indices [first_index, first_index + count) of `layer`, as runs of pages that
// are contiguous in both pools (lengths in order; they sum to count).
struct NcclLayer {
  int32_t layer = 0;
  int32_t first_index = 0;
  int32_t count = 0;
  std::vector<int32_t> runs;
};

// kNext: the next transfer on a warm connection (what the hello said of the transfer itself;
// the rest of the hello holds). `grant`: answer with the whole-transfer IPC grant too.
struct Next {
  std::string transfer_id;
  int num_pages = 0;
  bool grant = false;
};

struct PagesHeader {
  int32_t layer = 0;
  int32_t first_index = 0;
  int32_t count = 0;
};

// kIpcWrite's layer for the whole-transfer grant (the only one a v4 receiver accepts).
inline constexpr int32_t kAllLayers = -1;
// The most ranges one kIpcWritten lists (its body stays under kMaxBodyBytes).
inline constexpr size_t kMaxIpcRanges = (kMaxBodyBytes - 4) / 12;

absl::Status WriteFrame(const Socket& s, FrameType type, const std::string& body,
                        absl::Time deadline);
// Appends one frame to `out`: frames sent back to back go out in one write (one segment, one
// wake-up of the peer) with WriteAll.
void AppendFrame(std::string* out, FrameType type, const std::string& body);
// InvalidArgument on an unknown type or an oversized body (a corrupt or foreign peer).
// `spin` > 0: a frame due within microseconds (a reply the peer sends at once): first spins up
// to `spin` for it (SpinUntilReadable) instead of sleeping in poll(2) at once.
absl::StatusOr<Frame> ReadFrame(const Socket& s, absl::Time deadline,
                                absl::Duration spin = absl::ZeroDuration());

std::string EncodeHello(const Hello& hello);
// FailedPrecondition for another wire version; InvalidArgument for a corrupt (short) hello.
absl::StatusOr<Hello> DecodeHello(const std::string& body);
// InvalidArgument unless the hello's group is one a TP / PP group has and its stacked pool has
// the hello's page shape (the receiver checks it after the cluster token).
absl::Status CheckHelloGroup(const Hello& hello);

// A Status travels as {uint32 code, message}.
std::string EncodeStatus(const absl::Status& status);
absl::Status DecodeStatus(const std::string& body);

std::string EncodeNext(const Next& next);
// InvalidArgument for a truncated body or a negative page count.
absl::StatusOr<Next> DecodeNext(const std::string& body);

std::string EncodePagesHeader(const PagesHeader& header);
absl::StatusOr<PagesHeader> DecodePagesHeader(const std::string& body);

// kIpcWritten's body: the (layer, first_index, count) ranges the sender wrote.
std::string EncodeIpcWritten(const std::vector<PagesHeader>& ranges);
absl::StatusOr<std::vector<PagesHeader>> DecodeIpcWritten(const std::string& body);

std::string EncodeIpcPool(const IpcPool& pool);
absl::StatusOr<IpcPool> DecodeIpcPool(const std::string& body);

std::string EncodeNcclComm(const NcclComm& comm);
absl::StatusOr<NcclComm> DecodeNcclComm(const std::string& body);
std::string EncodeNcclLayer(const NcclLayer& layer);
// InvalidArgument unless every run is positive and they sum to count.
absl::StatusOr<NcclLayer> DecodeNcclLayer(const std::string& body);
// The most runs one kNcclLayer lists (its body stays under kMaxBodyBytes).
inline constexpr size_t kMaxNcclRuns = (kMaxBodyBytes - 16) / 4;

// True when two layouts describe pages of the same shape and dtype (num_pages may differ).
bool SamePageShape(const KvLayout& a, const KvLayout& b);

}  // namespace tandem::kv_wire
