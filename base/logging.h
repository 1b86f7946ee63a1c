// Minimal leveled logging to stderr: LOG(INFO) << "..."; thread-safe (one write per line).
// The level comes from TANDEM_LOG_LEVEL (debug|info|warning|error, default info) and can be
// changed with SetLogLevel.
#pragma once

#include <sstream>
#include <string_view>

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning", "error"; returns false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace tandem

#define TANDEM_LOG_DEBUG ::tandem::LogLevel::kDebug
#define TANDEM_LOG_INFO ::tandem::LogLevel::kInfo
#define TANDEM_LOG_WARNING ::tandem::LogLevel::kWarning
#define TANDEM_LOG_ERROR ::tandem::LogLevel::kError

#define LOG(severity)                                  \
  if (TANDEM_LOG_##severity < ::tandem::GetLogLevel()) \
    ;                                                  \
  else                                                 \
    ::tandem::internal::LogMessage(TANDEM_LOG_##severity, __FILE__, __LINE__).stream()
