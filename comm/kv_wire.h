// Wire format of the host (TCP) KV transport. One TCP connection carries one transfer:
//
//   sender                                   receiver
//   kHello{version, layout, num_pages, id, token} →
//                                          ← kStatus{code, message}       (handshake verdict)
//   kPages{layer, first_index, count} + count * PageBytes() raw page bytes →   (repeated)
//   kDone                                  →
//                                          ← kStatus{code, message}       (commit verdict)
//   kAbort{reason} may replace any sender frame; either side may close at any time, which the
//   other reads as Unavailable.
//
// Every frame is an 8-byte header {uint32 type, uint32 body_length} and a body; the page bytes
// of kPages follow its 12-byte body (their length is implied by count and the layout). Integers
// are little-endian fixed width (both ends are little-endian hosts; checked at compile time).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/socket_io.h"
#include "kernels/common/kv_layout.h"

namespace tandem::kv_wire {

inline constexpr uint32_t kMagic = 0x31564B54;      // "TKV1"
inline constexpr uint32_t kVersion = 2;             // 2: the hello carries the cluster token
inline constexpr uint32_t kMaxBodyBytes = 1 << 20;  // bodies are small; page bytes are separate

enum class FrameType : uint32_t { kHello = 1, kStatus = 2, kPages = 3, kDone = 4, kAbort = 5 };

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

// True when two layouts describe pages of the same shape and dtype (num_pages may differ).
bool SamePageShape(const KvLayout& a, const KvLayout& b);

}  // namespace tandem::kv_wire
