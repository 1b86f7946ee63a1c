#include "base/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace tandem {
namespace {

LogLevel InitialLevel() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("TANDEM_LOG_LEVEL")) ParseLogLevel(env, &level);
  return level;
}

std::atomic<LogLevel>& Level() {
  static std::atomic<LogLevel> level{InitialLevel()};
  return level;
}

constexpr char kLevelLetters[] = {'D', 'I', 'W', 'E'};

}  // namespace

void SetLogLevel(LogLevel level) { Level().store(level); }
LogLevel GetLogLevel() { return Level().load(std::memory_order_relaxed); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  if (text == "debug")
    *level = LogLevel::kDebug;
  else if (text == "info")
    *level = LogLevel::kInfo;
  else if (text == "warning")
    *level = LogLevel::kWarning;
  else if (text == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int micros = static_cast<int>(
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000);
  std::tm tm;
  gmtime_r(&seconds, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  char prefix[96];
  std::snprintf(prefix, sizeof(prefix), "%c %s.%06d %s:%d] ",
                kLevelLetters[static_cast<int>(level)], stamp, micros, base ? base + 1 : file,
                line);
  stream_ << prefix;
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines never interleave
}

}  // namespace internal
}  // namespace tandem
