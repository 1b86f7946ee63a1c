// `tandem serve` as a user runs it: with no layout and no model it generates the tiny model,
// brings up 1 prefill + 1 decode worker, prints where to point a client, serves; SIGTERM drains
// the request in flight (it completes) and stops every process with exit code 0.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/socket_io.h"
#include "deploy/launcher/child_process.h"
#include "deploy/launcher/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

// An IPv4 address of this machine that is not loopback, or "" when it has none.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &a, text, sizeof(text)) != nullptr) found = text;
  }
  freeifaddrs(list);
  return found;
}

// The local addresses (hex, as /proc/net/tcp writes them: "0100007F" is 127.0.0.1) that listen
// on `port`. gRPC listens on IPv6 sockets: /proc/net/tcp6 too, a v4-mapped address
// (::ffff:a.b.c.d) read as its IPv4 part and "::" (every interface) as "::".
std::vector<std::string> ListenAddresses(int port) {
  std::vector<std::string> out;
  char want[8];
  snprintf(want, sizeof(want), "%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state;
      in >> slot >> local >> remote >> state;
      if (state != "0A") continue;  // TCP_LISTEN
      const size_t colon = local.find(':');
      if (colon == std::string::npos || local.substr(colon + 1) != want) continue;
      std::string address = local.substr(0, colon);
      if (address.size() == 32) {
        if (address == std::string(32, '0')) {
          address = "::";
        } else if (address.substr(0, 24) == "0000000000000000FFFF0000") {
          address = address.substr(24);
        }
      }
      out.push_back(address);
    }
  }
  return out;
}

bool Connects(const std::string& address) {
  return Connect(address, absl::Now() + absl::Seconds(2)).ok();
}

struct Served {
  std::unique_ptr<launcher::ChildProcess> process;
  std::string out;
  std::string http;  // host:port from the ready line
  std::string grpc;
};

// Starts `tandem serve` with `extra` flags and waits for its ready line.
Served StartServe(const std::string& dir, std::vector<std::string> extra) {
  const std::string bin = std::string(std::getenv("TANDEM_BINARY_DIR")) + "/bin";
  std::vector<std::string> argv = {bin + "/tandem", "serve",      "--port", "0",
                                   "--log-dir",     dir + "/logs"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Served s;
  auto serve = launcher::ChildProcess::Start(argv, {{"TANDEM_CACHE_DIR", dir + "/cache"}},
                                             dir + "/serve.out");
  EXPECT_TRUE(serve.ok()) << serve.status();
  if (!serve.ok()) return s;
  s.process = *std::move(serve);
  const std::regex ready_re("ready at http://([0-9.]+:[0-9]+)");
  const std::regex grpc_re("gRPC API +([0-9.]+:[0-9]+)");
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  std::smatch http, grpc_addr;
  while (absl::Now() < deadline && s.process->Running()) {
    s.out = ReadFile(dir + "/serve.out");
    if (std::regex_search(s.out, http, ready_re) && std::regex_search(s.out, grpc_addr, grpc_re)) {
      s.http = http[1];
      s.grpc = grpc_addr[1];
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return s;
}

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// `--host 0.0.0.0` (what a container needs for `docker run -p`): the OpenAI API listens on every
// interface — reachable through a non-loopback address of this machine — while the router's
// gRPC port and the workers' ports stay on loopback.
TEST(ServeCommand, HostFlagListensOnEveryInterfaceInternalPortsStayLoopback) {
  char tmpl[] = "/tmp/tandem-serve-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Served s = StartServe(dir, {"--host", "0.0.0.0"});
  ASSERT_FALSE(s.http.empty()) << s.out;
  EXPECT_EQ(s.http.substr(0, s.http.rfind(':')), "127.0.0.1") << s.out;  // where to connect
  EXPECT_NE(s.out.find("listening on   0.0.0.0:"), std::string::npos) << s.out;
  const int http_port = PortOf(s.http);
  EXPECT_THAT(ListenAddresses(http_port), testing::ElementsAre("00000000")) << s.out;
  EXPECT_THAT(ListenAddresses(PortOf(s.grpc)), testing::ElementsAre("0100007F")) << s.out;
  std::smatch registry;  // the worker registry's mutual-TLS port
  ASSERT_TRUE(std::regex_search(s.out, registry, std::regex("registry +([0-9.]+:[0-9]+)")))
      << s.out;
  EXPECT_THAT(ListenAddresses(PortOf(registry[1])), testing::ElementsAre("0100007F")) << s.out;
  const std::regex worker_re("\\(([a-z]+-[0-9]+), grpc ([0-9.]+:[0-9]+)");
  int workers = 0;
  for (std::sregex_iterator it(s.out.begin(), s.out.end(), worker_re), end; it != end; ++it) {
    ++workers;
    EXPECT_THAT(ListenAddresses(PortOf((*it)[2])), testing::ElementsAre("0100007F")) << (*it)[1];
  }
  EXPECT_EQ(workers, 2) << s.out;
  const std::string other = NonLoopbackAddress();
  if (!other.empty()) {
    auto models =
        launcher::HttpGet(absl::StrCat(other, ":", http_port), "/v1/models", absl::Seconds(5));
    ASSERT_TRUE(models.ok()) << other << ": " << models.status();
    EXPECT_EQ(models->status, 200) << models->body;
    EXPECT_FALSE(Connects(absl::StrCat(other, ":", PortOf(s.grpc)))) << "gRPC left loopback";
  } else {
    std::cout << "no non-loopback IPv4 address here: checked the bound address only\n";
  }
  s.process->Signal(SIGTERM);
  EXPECT_EQ(s.process->Wait(absl::Seconds(30)), std::optional<int>(0))
      << ReadFile(dir + "/serve.out");
}

// Bad --host values stop `tandem serve` before it starts anything, saying why (exit code 2).
TEST(ServeCommand, BadHostIsRefused) {
  const std::string bin = std::string(std::getenv("TANDEM_BINARY_DIR")) + "/bin";
  for (const char* bad : {"localhost", "0.0.0.0.0", "::", "256.1.1.1"}) {
    char tmpl[] = "/tmp/tandem-serve-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    auto serve = launcher::ChildProcess::Start(
        {bin + "/tandem", "serve", "--host", bad, "--port", "0", "--log-dir", dir + "/logs"},
        {{"TANDEM_CACHE_DIR", dir + "/cache"}}, dir + "/serve.out");
    ASSERT_TRUE(serve.ok()) << serve.status();
    const std::optional<int> code = (*serve)->Wait(absl::Seconds(30));
    const std::string out = ReadFile(dir + "/serve.out");
    EXPECT_EQ(code, std::optional<int>(2)) << bad << ": " << out;
    EXPECT_NE(out.find(absl::StrCat("--host '", bad, "' is not an IPv4 address")),
              std::string::npos)
        << out;
    EXPECT_FALSE(std::filesystem::exists(dir + "/logs/router.log")) << "something was started";
  }
}

TEST(ServeCommand, DefaultLayoutServesAndDrainsOnSigterm) {
  char tmpl[] = "/tmp/tandem-serve-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string bin = std::string(std::getenv("TANDEM_BINARY_DIR")) + "/bin";
  auto serve =
      launcher::ChildProcess::Start({bin + "/tandem", "serve", "--port", "0", "--log-dir",
                                     dir + "/logs", "--drain-timeout-s", "10"},
                                    {{"TANDEM_CACHE_DIR", dir + "/cache"}}, dir + "/serve.out");
  ASSERT_TRUE(serve.ok()) << serve.status();
  // Ready line and the addresses it prints.
  std::smatch http, grpc_addr;
  std::string out;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  const std::regex ready_re("ready at http://([0-9.]+:[0-9]+)");
  const std::regex grpc_re("gRPC API +([0-9.]+:[0-9]+)");
  while (absl::Now() < deadline && (*serve)->Running()) {
    out = ReadFile(dir + "/serve.out");
    if (std::regex_search(out, http, ready_re) && std::regex_search(out, grpc_addr, grpc_re)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(!http.empty() && !grpc_addr.empty()) << out;
  EXPECT_NE(out.find("/metrics"), std::string::npos) << out;
  // Loopback only by default: not reachable through another address of this machine.
  EXPECT_THAT(ListenAddresses(PortOf(http[1])), testing::ElementsAre("0100007F"));
  if (const std::string other = NonLoopbackAddress(); !other.empty()) {
    EXPECT_FALSE(Connects(absl::StrCat(other, ":", PortOf(http[1]))));
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/cache/models/tiny/config.json"));
  auto models = launcher::HttpGet(http[1], "/v1/models", absl::Seconds(5));
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_EQ(models->status, 200);
  EXPECT_NE(models->body.find("tiny"), std::string::npos) << models->body;
  // Same text as `tandem generate` (one engine, no RPC) for the same prompt, greedy.
  auto completion = launcher::HttpPostJson(
      http[1], "/v1/completions",
      R"({"model": "tiny", "prompt": "Hello world", "max_tokens": 12, "temperature": 0,
          "ignore_eos": true})",
      absl::Seconds(30));
  ASSERT_TRUE(completion.ok()) << completion.status();
  ASSERT_EQ(completion->status, 200) << completion->body;
  const nlohmann::json body = nlohmann::json::parse(completion->body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << completion->body;
  auto generate = launcher::ChildProcess::Start(
      {bin + "/tandem", "generate", "--model", dir + "/cache/models/tiny", "--prompt",
       "Hello world", "--max-tokens", "12", "--temperature", "0", "--ignore-eos"},
      {}, dir + "/generate.out");
  ASSERT_TRUE(generate.ok());
  ASSERT_EQ((*generate)->Wait(absl::Seconds(30)), std::optional<int>(0));
  const std::string generated = ReadFile(dir + "/generate.out");
  const std::string text = body["choices"][0]["text"].get<std::string>();
  EXPECT_FALSE(text.empty());
  EXPECT_NE(generated.find(text), std::string::npos)
      << "served: '" << text << "' generate: '" << generated << "'";
  // Worker pids printed by serve: they must all be gone after the stop.
  std::vector<int> pids;
  const std::regex pid_re("pid ([0-9]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), pid_re), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  EXPECT_EQ(pids.size(), 2u) << out;
  // A request in flight when SIGTERM arrives still completes.
  StreamResult in_flight;
  std::thread client([&] {
    GenerateArgs args;
    args.prompt = Prompt(30, 1);
    args.max_tokens = 200;
    in_flight = Generate(grpc_addr[1], args);
  });
  absl::SleepFor(absl::Milliseconds(150));
  (*serve)->Signal(SIGTERM);
  client.join();
  EXPECT_TRUE(in_flight.status.ok()) << in_flight.status.error_message();
  EXPECT_EQ(in_flight.tokens.size(), 200u);
  const std::optional<int> code = (*serve)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << ReadFile(dir + "/serve.out");
  for (int pid : pids) EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " still running";
}

}  // namespace
}  // namespace tandem::e2e
