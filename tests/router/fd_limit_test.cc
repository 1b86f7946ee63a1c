// The HTTP accept loop when the process runs out of file descriptors (EMFILE): it must neither
// spin nor flood the log, and /health must answer again once descriptors are free. The server
// runs in a child process (router_fd_limit_server) with RLIMIT_NOFILE lowered; this test holds
// connections open until the child's accepts fail.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/router/http_test_client.h"

extern char** environ;

namespace tandem::router::testing {
namespace {

// utime + stime of `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  if (fields.size() < 13) return -1;
  // After the command: state is field 3 of stat(5); utime and stime are fields 14 and 15.
  return (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
}

int CountLines(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}

TEST(FdLimitTest, AcceptBacksOffWhenOutOfDescriptorsAndServesAgainWhenFreed) {
  const char* bin_dir = std::getenv("TANDEM_BINARY_DIR");
  ASSERT_NE(bin_dir, nullptr);
  const std::string server = absl::StrCat(bin_dir, "/tests/router_fd_limit_server");
  const std::string log = absl::StrCat(::testing::TempDir(), "/fd_limit_server.log");
  int in_pipe[2], out_pipe[2];
  ASSERT_EQ(pipe(in_pipe), 0);
  ASSERT_EQ(pipe(out_pipe), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addclose(&actions, in_pipe[1]);
  posix_spawn_file_actions_addclose(&actions, out_pipe[0]);
  std::string spare = "8";
  char* argv[] = {const_cast<char*>(server.c_str()), spare.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, server.c_str(), &actions, nullptr, argv, environ), 0) << server;
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(out_pipe[1]);
  std::string port_line;
  char c;
  while (read(out_pipe[0], &c, 1) == 1 && c != '\n') port_line += c;
  const int port = std::atoi(port_line.c_str());
  ASSERT_GT(port, 0) << "the server did not start; its log: " << log;

  // 8 spare descriptors: 40 connections leave most of them in the backlog, every accept failing.
  std::vector<std::unique_ptr<HttpConnection>> held;
  for (int i = 0; i < 40; ++i) {
    held.push_back(std::make_unique<HttpConnection>());
    ASSERT_TRUE(held.back()->Connect(port));
  }
  absl::SleepFor(absl::Milliseconds(300));  // the descriptors run out
  const double cpu_before = CpuSeconds(pid);
  absl::SleepFor(absl::Seconds(2));
  const double cpu_used = CpuSeconds(pid) - cpu_before;
  EXPECT_LT(cpu_used, 0.2) << "the accept loop spins while out of descriptors";
  const int logged = CountLines(log, "accept failed");
  EXPECT_GE(logged, 1) << "the descriptors never ran out: the test proves nothing";
  EXPECT_LE(logged, 2) << "the log is flooded";

  // Free them: the backlog drains, /health answers on a new connection.
  held.clear();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool answered = false;
  while (!answered && absl::Now() < deadline) {
    HttpConnection probe;
    if (probe.Connect(port) && probe.Send(KeepAliveRequest("GET", "/health"))) {
      std::optional<HttpResult> r = probe.Read(false, absl::Seconds(1));
      answered = r.has_value() && r->status == 200;
    }
  }
  EXPECT_TRUE(answered) << "/health does not answer after descriptors are free";

  close(in_pipe[1]);  // the server stops
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) kill(pid, SIGKILL);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(out_pipe[0]);
}

}  // namespace
}  // namespace tandem::router::testing
