// The whole program path (flags → sweep → files) against the in-process fake server, and
// Ctrl-C (a real SIGINT) keeping what was measured.
#include "loadgen/driver.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "loadgen/fake_server.h"
#include "loadgen/flags.h"

namespace tandem::loadgen {
namespace {

namespace fs = std::filesystem;

struct Server {
  Server(double ttft_ms, double itl_ms) : server(Options(ttft_ms, itl_ms)) {
    port = *server.Start();
  }
  static FakeServerOptions Options(double ttft_ms, double itl_ms) {
    FakeServerOptions o;
    o.script = [=](const FakeRequest&) {
      FakeResponse r;
      r.ttft_ms = ttft_ms;
      r.itl_ms = {itl_ms};
      return r;
    };
    return o;
  }
  FakeServer server;
  int port = 0;
};

int RunCli(std::vector<std::string> args) {
  args.insert(args.begin(), "tandem-loadgen");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Config config;
  int code = ParseFlags(static_cast<int>(argv.size()), argv.data(), &config);
  if (code >= 0) return code;
  return RunLoadgen(config);
}

std::vector<fs::path> FilesEndingWith(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(e.path());
    }
  }
  return out;
}

TEST(DriverTest, RateSweepWritesPointsSweepCsvAndReportThenCompareMergesThem) {
  Server s(2, 1);
  fs::path dir = fs::path(testing::TempDir()) / "lg_sweep";
  fs::remove_all(dir);
  int code = RunCli({"--base-url", "http://127.0.0.1:" + std::to_string(s.port), "--num-prompts",
                     "20", "--random-input-len", "8", "--random-output-len", "4", "--sweep",
                     "rate=50,100", "--goodput", "ttft:500", "--result-dir", dir.string(),
                     "--label", "fake", "--disable-progress"});
  EXPECT_EQ(code, 0);
  EXPECT_EQ(FilesEndingWith(dir, "-rate50.json").size(), 1u);
  EXPECT_EQ(FilesEndingWith(dir, "-rate100.csv").size(), 1u);
  auto sweeps = FilesEndingWith(dir, "-sweep.json");
  ASSERT_EQ(sweeps.size(), 1u);
  std::ifstream in(sweeps[0]);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json sweep = nlohmann::json::parse(text.str());
  ASSERT_EQ(sweep["points"].size(), 2u);
  EXPECT_EQ(sweep["points"][1]["request_rate"], 100.0);
  EXPECT_EQ(sweep["points"][1]["completed"], 20);
  EXPECT_EQ(sweep["points"][0]["model_id"], "fake");  // from GET /v1/models
  EXPECT_EQ(sweep["points"][0]["request_goodput"].get<double>(),
            sweep["points"][0]["request_throughput"].get<double>());
  EXPECT_EQ(FilesEndingWith(dir, "-report.html").size(), 1u);

  fs::path report = dir / "cmp.html";
  EXPECT_EQ(RunCli({"--compare", sweeps[0].string(),
                    FilesEndingWith(dir, "-rate50.json")[0].string(), "--report", report.string()}),
            0);
  EXPECT_TRUE(fs::exists(report));
  EXPECT_NE(RunCli({"--sweep", "speed=1"}), 0);
}

// The random dataset asks for exact output lengths, so ignore_eos is on unless switched off.
TEST(DriverTest, IgnoreEosDefaultsOnForRandomAndCanBeSwitchedOff) {
  for (const auto& [flag, want] : {std::pair<std::string, bool>{"", true},
                                   {"--ignore-eos", true},
                                   {"--no-ignore-eos", false}}) {
    std::atomic<int> seen{0}, with_ignore_eos{0};
    FakeServerOptions o;
    o.script = [&](const FakeRequest& r) {
      ++seen;
      if (r.ignore_eos) ++with_ignore_eos;
      return FakeResponse{};
    };
    FakeServer server(o);
    const int port = *server.Start();
    std::vector<std::string> args = {"--base-url",
                                     "http://127.0.0.1:" + std::to_string(port),
                                     "--model",
                                     "m",
                                     "--num-prompts",
                                     "3",
                                     "--random-input-len",
                                     "4",
                                     "--random-output-len",
                                     "2",
                                     "--disable-progress"};
    if (!flag.empty()) args.push_back(flag);
    ASSERT_EQ(RunCli(args), 0) << flag;
    EXPECT_EQ(seen.load(), 3) << flag;
    EXPECT_EQ(with_ignore_eos.load(), want ? 3 : 0) << flag;
  }
}

TEST(DriverTest, CtrlCStopsTheRunAndSavesWhatWasMeasured) {
  Server s(1, 100);  // each request streams for ~1 s
  fs::path dir = fs::path(testing::TempDir()) / "lg_sigint";
  fs::remove_all(dir);
  std::thread interrupter([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    kill(getpid(), SIGINT);
  });
  auto t0 = std::chrono::steady_clock::now();
  int code = RunCli({"--base-url", "http://127.0.0.1:" + std::to_string(s.port), "--model", "m",
                     "--num-prompts", "100", "--request-rate", "20", "--random-input-len", "4",
                     "--random-output-len", "10", "--save-result", "--result-dir", dir.string(),
                     "--result-filename", "out.json", "--disable-progress"});
  interrupter.join();
  EXPECT_EQ(code, 130);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  std::ifstream in(dir / "out.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_GT(j["not_sent"].get<int>(), 50);
  EXPECT_GT(j["failed_by_cause"]["cancelled"].get<int>(), 0);
}

}  // namespace
}  // namespace tandem::loadgen
