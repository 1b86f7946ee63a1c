// CHECK / DCHECK: invariants that only a bug can break. A failed check prints file:line, the
// condition and a message, then aborts. Bad input never reaches a CHECK: validate it and return
// an absl::Status instead (docs/style.md, "Errors").
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace tandem::internal {

// Collects the streamed message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": CHECK failed: " << condition << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `CHECK(x) << "msg"` be a statement of type void in both branches of the ternary.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace tandem::internal

#define TANDEM_CHECK_IMPL(cond, text)      \
  (cond) ? (void)0                         \
         : ::tandem::internal::Voidify() & \
               ::tandem::internal::CheckFailure(__FILE__, __LINE__, text).stream()

#define CHECK(cond) TANDEM_CHECK_IMPL(static_cast<bool>(cond), #cond)
#define CHECK_EQ(a, b) CHECK((a) == (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_NE(a, b) CHECK((a) != (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_LT(a, b) CHECK((a) < (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_LE(a, b) CHECK((a) <= (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_GT(a, b) CHECK((a) > (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_GE(a, b) CHECK((a) >= (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_OK(expr)                                        \
  do {                                                        \
    const ::absl::Status _tandem_check_status = (expr);       \
    CHECK(_tandem_check_status.ok()) << _tandem_check_status; \
  } while (0)

#ifdef NDEBUG
#define DCHECK(cond) \
  while (false) CHECK(cond)
#else
#define DCHECK(cond) CHECK(cond)
#endif
