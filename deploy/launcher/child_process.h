// ChildProcess: one started program (router or worker) with its output in a log file. The child
// gets SIGKILL if the launcher dies (PR_SET_PDEATHSIG), so a crashed launcher leaves nothing
// behind; the destructor kills and reaps a child still running. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::launcher {

class ChildProcess {
 public:
  // Runs argv[0] (a path) with argv; stdout and stderr are appended to `log_path`; `env` adds
  // or overrides environment variables.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv,
      const std::vector<std::pair<std::string, std::string>>& env, const std::string& log_path);
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // False once the process has exited (reaps it; exit_code() then tells how).
  bool Running();
  void Signal(int signal);
  // Waits up to `timeout` for the exit; returns the exit code (128 + signal when killed), or
  // nullopt if still running.
  std::optional<int> Wait(absl::Duration timeout);
  std::optional<int> exit_code() const { return exit_code_; }
  // The last `max_bytes` of the log (for error messages).
  std::string LogTail(size_t max_bytes = 2000) const;

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  pid_t pid_;
  std::string log_path_;
  std::optional<int> exit_code_;
};

}  // namespace tandem::launcher
