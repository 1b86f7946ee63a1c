#include "comm/tcp_kv_sender.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "comm/kv_wire.h"

namespace tandem {
namespace {

// Short grace for the best-effort abort notification: never delays the caller for long.
constexpr absl::Duration kAbortNotifyTimeout = absl::Milliseconds(100);

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

  absl::Status SendLayer(int layer, const void* pool, absl::Span<const int32_t> src_pages,
                         int first_index) override {
    if (finished_) return absl::FailedPreconditionError("transfer already finished or aborted");
    if (layer < 0 || layer >= layout_.num_layers || first_index < 0 ||
        first_index + static_cast<int64_t>(src_pages.size()) > num_pages_) {
      return absl::InvalidArgumentError(absl::StrCat("SendLayer(layer ", layer, ", first ",
                                                     first_index, ", count ", src_pages.size(),
                                                     ") outside the transfer"));
    }
    kv_wire::PagesHeader header{layer, first_index, static_cast<int32_t>(src_pages.size())};
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

  absl::StatusOr<KvTransferStats> Finish() override {
    if (finished_) return absl::FailedPreconditionError("transfer already finished or aborted");
    absl::Status st = kv_wire::WriteFrame(socket_, kv_wire::FrameType::kDone, "", deadline_);
    if (!st.ok()) return Fail(st);
    st = ReadVerdict(socket_, deadline_);
    finished_ = true;
    socket_.Close();
    if (!st.ok()) return st;
    stats_.duration = Clock::Real()->Now() - start_;
    return stats_;
  }

  void Abort(absl::string_view reason) override {
    if (finished_) return;
    finished_ = true;
    (void)kv_wire::WriteFrame(socket_, kv_wire::FrameType::kAbort, std::string(reason),
                              std::min(deadline_, Clock::Real()->Now() + kAbortNotifyTimeout));
    socket_.Close();
  }

  // Reads the receiver's kStatus verdict (an early one may arrive instead of a later frame).
  static absl::Status ReadVerdict(const Socket& s, absl::Time deadline) {
    ASSIGN_OR_RETURN(kv_wire::Frame frame, kv_wire::ReadFrame(s, deadline));
    if (frame.type != kv_wire::FrameType::kStatus) {
      return absl::InternalError("KV receiver sent an unexpected frame");
    }
    return kv_wire::DecodeStatus(frame.body);
  }

 private:
  // A failed write usually means the receiver closed after sending its verdict (cancelled,
  // deadline): report that verdict rather than a bare "connection reset" when we can.
  absl::Status Fail(const absl::Status& write_error) {
    finished_ = true;
    absl::Status verdict =
        ReadVerdict(socket_, std::min(deadline_, Clock::Real()->Now() + absl::Milliseconds(50)));
    socket_.Close();
    return verdict.ok() ? write_error : verdict;
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
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvSendOp>> TcpKvSender::Begin(const std::string& peer,
                                                             const std::string& transfer_id,
                                                             const KvLayout& layout, int num_pages,
                                                             absl::Duration timeout) {
  const absl::Time deadline = Clock::Real()->Now() + timeout;
  ASSIGN_OR_RETURN(Socket socket, Connect(peer, deadline));
  kv_wire::Hello hello{layout, num_pages, transfer_id, cluster_token_};
  RETURN_IF_ERROR(kv_wire::WriteFrame(socket, kv_wire::FrameType::kHello,
                                      kv_wire::EncodeHello(hello), deadline));
  RETURN_IF_ERROR(TcpKvSendOp::ReadVerdict(socket, deadline));
  return std::unique_ptr<KvSendOp>(
      new TcpKvSendOp(std::move(socket), layout, num_pages, deadline, read_pool_));
}

}  // namespace tandem
