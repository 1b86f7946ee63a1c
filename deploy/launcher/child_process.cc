#include "deploy/launcher/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/clock.h"

namespace tandem::launcher {
namespace {

// In the forked child: never returns.
[[noreturn]] void ExecChild(const std::vector<std::string>& argv,
                            const std::vector<std::pair<std::string, std::string>>& env, int log_fd,
                            pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
  // The launcher blocks SIGTERM/SIGINT to take them synchronously; the child must not inherit it.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null_fd = open("/dev/null", O_RDONLY);
  dup2(null_fd, STDIN_FILENO);
  dup2(log_fd, STDOUT_FILENO);
  dup2(log_fd, STDERR_FILENO);
  for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  dprintf(log_fd, "exec %s failed: %s\n", args[0], std::strerror(errno));
  _exit(127);
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env, const std::string& log_path) {
  if (argv.empty() || access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot execute '", argv.empty() ? "" : argv[0], "' (not built?)"));
  }
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open log ", log_path, ": ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) ExecChild(argv, env, log_fd, parent);
  close(log_fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() {
  if (Running()) {
    Signal(SIGKILL);
    Wait(absl::Seconds(5));
  }
}

bool ChildProcess::Running() {
  if (exit_code_.has_value()) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = DecodeWaitStatus(status);
    return false;
  }
  return r == 0;
}

void ChildProcess::Signal(int signal) {
  if (Running()) kill(pid_, signal);
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = Clock::Real()->Now() + timeout;
  while (Running()) {
    if (Clock::Real()->Now() >= deadline) return std::nullopt;
    Clock::Real()->SleepFor(absl::Milliseconds(10));
  }
  return exit_code_;
}

std::string ChildProcess::LogTail(size_t max_bytes) const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

}  // namespace tandem::launcher
