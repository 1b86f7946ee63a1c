#include "comm/kv_wire.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::kv_wire {
namespace {

static_assert(std::endian::native == std::endian::little, "the KV wire format assumes LE hosts");

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }

// Reads fixed-width fields from a body, remembering whether it ran short.
class Reader {
 public:
  explicit Reader(const std::string& body) : body_(body) {}
  uint32_t U32() {
    uint32_t v = 0;
    if (pos_ + 4 > body_.size()) {
      short_ = true;
      return 0;
    }
    std::memcpy(&v, body_.data() + pos_, 4);
    pos_ += 4;
    return v;
  }
  int32_t I32() { return static_cast<int32_t>(U32()); }
  std::string Str() {
    const uint32_t n = U32();
    if (short_ || pos_ + n > body_.size()) {
      short_ = true;
      return {};
    }
    std::string s = body_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool ok() const { return !short_; }

 private:
  const std::string& body_;
  size_t pos_ = 0;
  bool short_ = false;
};

}  // namespace

void AppendFrame(std::string* out, FrameType type, const std::string& body) {
  PutU32(out, static_cast<uint32_t>(type));
  PutU32(out, static_cast<uint32_t>(body.size()));
  *out += body;
}

absl::Status WriteFrame(const Socket& s, FrameType type, const std::string& body,
                        absl::Time deadline) {
  std::string buf;
  buf.reserve(8 + body.size());
  AppendFrame(&buf, type, body);
  return WriteAll(s, buf.data(), buf.size(), deadline);
}

absl::StatusOr<Frame> ReadFrame(const Socket& s, absl::Time deadline, absl::Duration spin) {
  if (spin > absl::ZeroDuration()) (void)SpinUntilReadable(s, spin, deadline);
  uint32_t header[2];
  if (absl::Status st = ReadAll(s, header, sizeof(header), deadline); !st.ok()) return st;
  if (header[0] < static_cast<uint32_t>(FrameType::kHello) ||
      header[0] > static_cast<uint32_t>(FrameType::kIpcFlush) || header[1] > kMaxBodyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad KV frame header: type ", header[0], " length ", header[1]));
  }
  Frame frame{static_cast<FrameType>(header[0]), std::string(header[1], '\0')};
  if (absl::Status st = ReadAll(s, frame.body.data(), frame.body.size(), deadline); !st.ok()) {
    return st;
  }
  return frame;
}

std::string EncodeHello(const Hello& hello) {
  std::string out;
  PutU32(&out, kMagic);
  PutU32(&out, kVersion);
  PutU32(&out, static_cast<uint32_t>(hello.layout.num_layers));
  PutU32(&out, static_cast<uint32_t>(hello.layout.page_size));
  PutU32(&out, static_cast<uint32_t>(hello.layout.num_kv_heads));
  PutU32(&out, static_cast<uint32_t>(hello.layout.head_dim));
  PutU32(&out, static_cast<uint32_t>(hello.layout.dtype));
  PutU32(&out, static_cast<uint32_t>(hello.num_pages));
  PutU32(&out, static_cast<uint32_t>(hello.transfer_id.size()));
  out += hello.transfer_id;
  PutU32(&out, static_cast<uint32_t>(hello.cluster_token.size()));
  out += hello.cluster_token;
  PutU32(&out, static_cast<uint32_t>(hello.ipc));
  PutU32(&out, static_cast<uint32_t>(hello.nccl));
  PutU32(&out, static_cast<uint32_t>(hello.group.tensor_parallel));
  PutU32(&out, static_cast<uint32_t>(hello.group.pipeline_parallel));
  PutU32(&out, static_cast<uint32_t>(hello.group.total_kv_heads));
  PutU32(&out, static_cast<uint32_t>(hello.group.num_layers));
  return out;
}

absl::StatusOr<Hello> DecodeHello(const std::string& body) {
  Reader r(body);
  const uint32_t magic = r.U32();
  const uint32_t version = r.U32();
  if (!r.ok() || magic != kMagic) return absl::InvalidArgumentError("not a tandem KV transfer");
  if (version != kVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV wire version ", version, " but this receiver speaks ", kVersion,
                     " (prefill and decode workers of different builds: run one build on both)"));
  }
  Hello h;
  h.layout.num_layers = r.I32();
  h.layout.page_size = r.I32();
  h.layout.num_kv_heads = r.I32();
  h.layout.head_dim = r.I32();
  h.layout.dtype = static_cast<DType>(r.U32());
  h.num_pages = r.I32();
  h.transfer_id = r.Str();
  h.cluster_token = r.Str();
  const uint32_t ipc = r.U32();
  const uint32_t nccl = r.U32();
  h.group.tensor_parallel = r.I32();
  h.group.pipeline_parallel = r.I32();
  h.group.total_kv_heads = r.I32();
  h.group.num_layers = r.I32();
  h.group.page_size = h.layout.page_size;
  h.group.head_dim = h.layout.head_dim;
  h.group.dtype = h.layout.dtype;
  if (!r.ok() || h.num_pages < 0) return absl::InvalidArgumentError("truncated KV hello");
  if (ipc > static_cast<uint32_t>(IpcMode::kPreferred) ||
      nccl > static_cast<uint32_t>(NcclMode::kPreferred)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown KV hello data path: ipc ", ipc, ", nccl ", nccl));
  }
  h.ipc = static_cast<IpcMode>(ipc);
  h.nccl = static_cast<NcclMode>(nccl);
  return h;
}

absl::Status CheckHelloGroup(const Hello& h) {
  if (absl::Status st = CheckKvGroupShape(h.group); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("KV hello: ", st.message()));
  }
  if (!SamePageShape(h.group.PoolLayout(0), h.layout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV hello: a ", h.group.SizesString(), " group of ", h.group.total_kv_heads,
        " KV heads and ", h.group.num_layers, " layers has no pool of ", h.layout.num_layers,
        " stacked layers of ", h.layout.num_kv_heads, " KV heads"));
  }
  return absl::OkStatus();
}

std::string EncodeStatus(const absl::Status& status) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(status.code()));
  const std::string msg(status.message());
  PutU32(&out, static_cast<uint32_t>(msg.size()));
  out += msg;
  return out;
}

absl::Status DecodeStatus(const std::string& body) {
  Reader r(body);
  const uint32_t code = r.U32();
  std::string msg = r.Str();
  if (!r.ok() || code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError("truncated KV status frame");
  }
  return absl::Status(static_cast<absl::StatusCode>(code), msg);
}

std::string EncodeNext(const Next& next) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(next.transfer_id.size()));
  out += next.transfer_id;
  PutU32(&out, static_cast<uint32_t>(next.num_pages));
  PutU32(&out, next.grant ? 1 : 0);
  return out;
}

absl::StatusOr<Next> DecodeNext(const std::string& body) {
  Reader r(body);
  Next next;
  next.transfer_id = r.Str();
  next.num_pages = r.I32();
  const uint32_t grant = r.U32();
  if (!r.ok() || next.num_pages < 0 || grant > 1) {
    return absl::InvalidArgumentError("truncated KV next-transfer frame");
  }
  next.grant = grant != 0;
  return next;
}

std::string EncodePagesHeader(const PagesHeader& header) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(header.layer));
  PutU32(&out, static_cast<uint32_t>(header.first_index));
  PutU32(&out, static_cast<uint32_t>(header.count));
  return out;
}

absl::StatusOr<PagesHeader> DecodePagesHeader(const std::string& body) {
  Reader r(body);
  PagesHeader h;
  h.layer = r.I32();
  h.first_index = r.I32();
  h.count = r.I32();
  if (!r.ok()) return absl::InvalidArgumentError("truncated KV pages header");
  return h;
}

std::string EncodeIpcWritten(const std::vector<PagesHeader>& ranges) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(ranges.size()));
  for (const PagesHeader& h : ranges) out += EncodePagesHeader(h);
  return out;
}

absl::StatusOr<std::vector<PagesHeader>> DecodeIpcWritten(const std::string& body) {
  Reader r(body);
  const uint32_t n = r.U32();
  if (!r.ok() || n > body.size() / 12) return absl::InvalidArgumentError("truncated KV ipc ranges");
  std::vector<PagesHeader> ranges(n);
  for (PagesHeader& h : ranges) {
    h.layer = r.I32();
    h.first_index = r.I32();
    h.count = r.I32();
  }
  if (!r.ok()) return absl::InvalidArgumentError("truncated KV ipc ranges");
  return ranges;
}

std::string EncodeIpcPool(const IpcPool& pool) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(pool.handle.size()));
  out += pool.handle;
  PutU32(&out, static_cast<uint32_t>(pool.num_pages));
  PutU32(&out, static_cast<uint32_t>(pool.page_ids.size()));
  for (int32_t id : pool.page_ids) PutU32(&out, static_cast<uint32_t>(id));
  PutU32(&out, pool.nccl ? 1 : 0);
  PutU32(&out, static_cast<uint32_t>(pool.device_id.size()));
  out += pool.device_id;
  PutU32(&out, static_cast<uint32_t>(pool.declined.size()));
  out += pool.declined;
  return out;
}

absl::StatusOr<IpcPool> DecodeIpcPool(const std::string& body) {
  Reader r(body);
  IpcPool pool;
  pool.handle = r.Str();
  pool.num_pages = r.I32();
  const uint32_t n = r.U32();
  if (!r.ok() || n > body.size() / 4) return absl::InvalidArgumentError("truncated KV ipc pool");
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t id = r.I32();
    if (id < 0 || id >= pool.num_pages) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV ipc pool names page ", id, " of ", pool.num_pages));
    }
    pool.page_ids.push_back(id);
  }
  pool.nccl = r.U32() != 0;
  pool.device_id = r.Str();
  pool.declined = r.Str();
  if (!r.ok()) return absl::InvalidArgumentError("truncated KV ipc pool");
  return pool;
}

std::string EncodeNcclComm(const NcclComm& comm) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(comm.key.size()));
  out += comm.key;
  PutU32(&out, comm.generation);
  PutU32(&out, static_cast<uint32_t>(comm.unique_id.size()));
  out += comm.unique_id;
  return out;
}

absl::StatusOr<NcclComm> DecodeNcclComm(const std::string& body) {
  Reader r(body);
  NcclComm comm;
  comm.key = r.Str();
  comm.generation = r.U32();
  comm.unique_id = r.Str();
  if (!r.ok() || comm.key.empty()) return absl::InvalidArgumentError("truncated KV nccl comm");
  return comm;
}

std::string EncodeNcclLayer(const NcclLayer& layer) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(layer.layer));
  PutU32(&out, static_cast<uint32_t>(layer.first_index));
  PutU32(&out, static_cast<uint32_t>(layer.count));
  PutU32(&out, static_cast<uint32_t>(layer.runs.size()));
  for (int32_t run : layer.runs) PutU32(&out, static_cast<uint32_t>(run));
  return out;
}

absl::StatusOr<NcclLayer> DecodeNcclLayer(const std::string& body) {
  Reader r(body);
  NcclLayer l;
  l.layer = r.I32();
  l.first_index = r.I32();
  l.count = r.I32();
  const uint32_t n = r.U32();
  if (!r.ok() || n > body.size() / 4) return absl::InvalidArgumentError("truncated KV nccl layer");
  int64_t sum = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t run = r.I32();
    if (run <= 0) return absl::InvalidArgumentError("KV nccl layer with an empty run");
    sum += run;
    l.runs.push_back(run);
  }
  if (!r.ok()) return absl::InvalidArgumentError("truncated KV nccl layer");
  if (sum != l.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV nccl layer runs sum to ", sum, ", not its count ", l.count));
  }
  return l;
}

bool SamePageShape(const KvLayout& a, const KvLayout& b) {
  return a.num_layers == b.num_layers && a.page_size == b.page_size &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim && a.dtype == b.dtype;
}

}  // namespace tandem::kv_wire
