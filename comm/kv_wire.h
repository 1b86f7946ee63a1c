// Wire format of the host (TCP) KV transport. One TCP connection carries one transfer:
//
//   sender                                   receiver
//   kHello{version, layout, num_pages, id, token} →
//                                          ← kStatus{code, message}       (handshake verdict)
//   kPages{layer, first_index, count} + count * PageBytes() raw page bytes →   (repeated)
//   kDone                                  →
//                                          ← kStatus{code, message}       (commit verdict)
//   With CUDA IPC (comm/kv_ipc.h; the hello's ipc field not kNone), right after an OK verdict:
//                                          ← kIpcPool{handle, receiver num_pages, page ids}
//   (an empty handle: the receiver exports no pool; the sender sends kPages, or fails under
//   kRequired), and instead of kPages, per layer and page range:
//   kIpcWrite{layer, first_index, count}   →
//                                          ← kStatus (OK: the pages are the sender's to write
//                                            until kIpcWritten; the receiver's Cancel waits)
//   ... the sender copies device to device into the mapped pool and waits for the copies ...
//   kIpcWritten                            →
//   kAbort{reason} may replace any sender frame; either side may close at any time, which the
//   other reads as Unavailable.
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
#include "comm/socket_io.h"
#include "kernels/common/kv_layout.h"

namespace tandem::kv_wire {

inline constexpr uint32_t kMagic = 0x31564B54;  // "TKV1"
inline constexpr uint32_t kVersion = 3;  // 2: the hello carries the cluster token; 3: CUDA IPC
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
};

// What the sender asks of the data path: kNone, page bytes on the socket; kRequired, CUDA IPC
// or no transfer; kPreferred, CUDA IPC where the receiver exports its pool, else the socket.
enum class IpcMode : uint32_t { kNone = 0, kRequired = 1, kPreferred = 2 };

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
};

// The receiver's answer to an IPC hello: its exported pool (empty: none) and where the
// transfer's pages are in it (page index i of the transfer is page_ids[i]).
struct IpcPool {
  std::string handle;
  int num_pages = 0;  // the receiver pool's num_pages (its layout; the page shape is shared)
  std::vector<int32_t> page_ids;
};

struct PagesHeader {
  int32_t layer = 0;
  int32_t first_index = 0;
  int32_t count = 0;
};

absl::Status WriteFrame(const Socket& s, FrameType type, const std::string& body,
                        absl::Time deadline);
// InvalidArgument on an unknown type or an oversized body (a corrupt or foreign peer).
absl::StatusOr<Frame> ReadFrame(const Socket& s, absl::Time deadline);

std::string EncodeHello(const Hello& hello);
absl::StatusOr<Hello> DecodeHello(const std::string& body);

// A Status travels as {uint32 code, message}.
std::string EncodeStatus(const absl::Status& status);
absl::Status DecodeStatus(const std::string& body);

std::string EncodePagesHeader(const PagesHeader& header);
absl::StatusOr<PagesHeader> DecodePagesHeader(const std::string& body);

std::string EncodeIpcPool(const IpcPool& pool);
absl::StatusOr<IpcPool> DecodeIpcPool(const std::string& body);

// True when two layouts describe pages of the same shape and dtype (num_pages may differ).
bool SamePageShape(const KvLayout& a, const KvLayout& b);

}  // namespace tandem::kv_wire
